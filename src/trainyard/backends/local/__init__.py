"""The local backend (`backend`): ranks as real processes on this machine, and the in-job tools a
batch script runs (`srun`, `scontrol`, `squeue`, `sinfo`, over `jobview`) — those are standard
library only and run by path from the attempt's run dir (see `rundir.job_tools`)."""
