"""The REST API: thin FastAPI routers over `trainyard.services` (dstack's shape: routers → services → store)."""
