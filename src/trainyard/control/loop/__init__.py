"""The control loop and its steps: one pass reads the backend's facts once and runs the steps in
order (`orchestrator.py`), each step a module of its own sharing one `context.LoopContext`."""
