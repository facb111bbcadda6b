"""The trace simulator: replays a workload through a scheduling policy, with the same engine code
the control loop runs, and reports how the cluster would have fared."""
