"""The control plane's moving parts: the loop that runs the engine on the store, and `yard up`."""
