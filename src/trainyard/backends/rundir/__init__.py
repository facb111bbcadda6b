"""The attempt's run dir, as the local and Slurm backends share it: the rank runner that outlives
the plane (`rank_runner`), its exit records watched (`exit_watch`), processes told by /proc
(`procfs`), the in-job tools copied in (`job_tools`) and loaded by path (`by_path`).

Imports neither `backends.local.backend` nor `backends.slurm.backend` (tests/test_architecture.py)."""
