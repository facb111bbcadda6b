"""Planners that answer sizing questions by simulation (capacity: how many nodes a workload needs)."""
