"""The durable store: tables, opening/migrating, and nothing else (services hold the logic)."""
