"""Read-only reports the API serves from the loop's own inputs (`priority`: `yard share`, `yard prio`)."""
