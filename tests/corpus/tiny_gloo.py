"""A tiny CPU training step for the corpus scripts: gloo, a linear model under DDP, a few steps,
the ranks' parameters equal at the end (what a real trainer's first steps show), and the
uid each rank runs as. Works under
torchrun (TORCHELASTIC env) and under a plain srun task (--env: RANK/WORLD_SIZE from Slurm's)."""

import argparse
import os
import sys

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3)
p.add_argument("--env", action="store_true", help="rank and world from SLURM_PROCID/SLURM_NTASKS")
a = p.parse_args()
if a.env:
    os.environ.setdefault("RANK", os.environ["SLURM_PROCID"])
    os.environ.setdefault("WORLD_SIZE", os.environ["SLURM_NTASKS"])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(a.steps):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
w = model.module.weight.detach().clone()
dist.all_reduce(w, op=dist.ReduceOp.MAX)
same = torch.equal(w, model.module.weight.detach())
# One write per line: the ranks share the agent's stdout, and print() writes the text and its
# newline apart when the output is unbuffered (torchrun's), so two ranks' lines could run together.
sys.stdout.write(f"rank {rank}/{world} steps {a.steps} in-sync {same}\n")
sys.stdout.write(f"owner rank {rank} uid {os.getuid()}\n")  # whose process the rank is
sys.stdout.flush()
dist.barrier()  # no rank tears gloo down while its peer still talks to it (an abort at exit otherwise)
dist.destroy_process_group()
# And no C++ teardown at all: on real Slurm, rank 0 (which hosts the TCP store) was seen twice to
# abort at interpreter exit after all of the above ("terminate called without an active exception":
# a store thread still joinable in a static destructor, torch's, not the job's nor the plane's).
# The work is done and said; end the process here, as many launch scripts do.
os._exit(0)
