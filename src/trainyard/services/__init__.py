"""What the API and the CLI can do, on top of the store: one module per resource.

Routers stay thin (parse, call a service, shape the answer); services hold the rules and write
an event row for every change. A service raises `ServiceError` (→ HTTP 4xx) for bad input or a
forbidden action, never leaves half-written state: each call is one transaction.
"""
