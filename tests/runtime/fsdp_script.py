"""FSDP2 (`fully_shard`) on CPU/gloo with the CheckpointManager: sharded save, resharded load.

    fsdp_script.py CKPT_DIR OUT_JSON STEPS SAVE_AT

Trains an MLP for STEPS steps (resuming first if a checkpoint exists), saving at SAVE_AT; rank 0
writes the step losses (hex) to OUT_JSON. On one process the model is a plain module: the FSDP2
shards load into it (DCP reshards).
"""

import json
import os
import sys

import torch
import torch.nn as nn

import trainyard.runtime as yr

ckpt, out, steps, save_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
ctx = yr.init(seed=0, deterministic=True)
net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
if ctx.distributed:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (ctx.world_size,))
    for m in net:
        if isinstance(m, nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(net, mesh=mesh)
opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
mgr = yr.CheckpointManager(ckpt, model=net, optimizer=opt, group=ctx.checkpoint_group, control_group=ctx.control_group)
start = mgr.load_latest() or 0
X = torch.randn(64, 16, generator=torch.Generator().manual_seed(3))
Y = X[:, :1].sin()
losses = {}
for step in range(start + 1, steps + 1):
    # the same global batch whatever the world size: each rank takes its contiguous slice
    rows = torch.arange(8 * (step - 1), 8 * step) % 64
    mine = rows.chunk(ctx.world_size)[ctx.rank]
    loss = (net(X[mine]) - Y[mine]).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    total = loss.detach().clone()
    if ctx.distributed:
        torch.distributed.all_reduce(total, group=ctx.control_group)
        total /= ctx.world_size
    losses[step] = total.item()
    if step == save_at:
        mgr.save(step)
mgr.close()
if ctx.rank == 0:
    with open(out, "w") as fh:
        json.dump({"start": start, "losses": {s: v.hex() for s, v in losses.items()},
                   "floats": losses}, fh)
ctx.close()
# torch 2.13 with FSDP2/DeviceMesh on gloo sometimes aborts in C++ teardown at interpreter exit
# ("terminate called without an active exception", about 1 run in 20, after everything above has
# finished and closed; without fully_shard it never did in 40 runs). Not what this test checks.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
