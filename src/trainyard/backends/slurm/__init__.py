"""The Slurm backend (`backend`), the environments around its attempts (`env`) and the rank
wrapper srun starts on every node (`task`, standard library only, run by path)."""
