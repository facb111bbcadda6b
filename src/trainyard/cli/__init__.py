"""The `yard` command: `main.app` wires the command groups, one module each."""
