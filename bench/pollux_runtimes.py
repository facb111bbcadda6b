"""Derive `trainyard.sim.pollux_runtimes.RUN_S`: how long each Pollux workload configuration runs.

    python bench/pollux_runtimes.py ADAPTDL_CHECKOUT [WORKLOAD_DIR]  > table.csv

ADAPTDL_CHECKOUT is petuum/adaptdl at branch osdi21-artifact (its simulator/traces/<app>/:
validation-<batch>.csv with progress, iterations and gradient statistics per epoch; placements.csv
and scalability.csv with measured step and sync times). WORKLOAD_DIR defaults to
$TRAINYARD_TRACES/pollux-sia-workloads/pollux_workloads. Needs pandas and scipy (not trainyard's
dependencies: this is a one-off derivation, its output is committed).

The model, as Pollux's paper and simulator describe it: a job trains its application's epochs at
a fixed total batch size over a fixed placement (compact: 4 GPUs per node); per epoch, progress
per second is the statistical efficiency of that batch size (from the gradient statistics) over
the step time (measured for the placement, interpolated over the local batch size; placements not
measured are interpolated over nodes, replicas and local batch size). Written for trainyard.
"""
import csv
import glob
import math
import os
import sys

import pandas as pd
from scipy.interpolate import LinearNDInterpolator, interp1d

T = os.path.join(sys.argv[1], "simulator", "traces")
WORKLOADS = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
    os.path.dirname(__file__), "..", "..", "shared", "traces", "pollux-sia-workloads", "pollux_workloads")
MAX_EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
MAX_LOCAL = {"yolov3": 8}

class App:
    """One application's measured traces."""

    def __init__(self, name):
        d = os.path.join(T, name)
        self.val = {}
        for p in glob.glob(os.path.join(d, "validation-*.csv")):
            self.val[int(p.rsplit("-", 1)[1].split(".")[0])] = pd.read_csv(p)
        self.val = dict(sorted(self.val.items()))
        pl = pd.read_csv(os.path.join(d, "placements.csv"))
        pl["num_nodes"] = pl.placement.apply(lambda p: len(str(p)))
        pl["num_replicas"] = pl.placement.apply(lambda p: sum(map(int, str(p))))
        self.pl = pl
        self.sc = pd.read_csv(os.path.join(d, "scalability.csv"))
        self.init_bsz = min(self.val)
        self.max_bsz = max(self.val)
        self.min_local = pl.local_bsz.min()
        self.max_local = MAX_LOCAL.get(name, pl.local_bsz.max())
        self.max_epochs = MAX_EPOCHS[name]

    def bounds(self, b):
        lo = max(k for k in self.val if k <= b)
        hi = min(k for k in self.val if k >= b)
        return lo, hi

    def grad(self, b, epoch):
        lo, hi = self.bounds(b)
        a = self.val[lo].iloc[epoch]
        c = self.val[hi].iloc[epoch]
        if lo == hi:
            return a.grad_sqr, a.grad_var
        w = (b - lo) / (hi - lo)
        return a.grad_sqr * (1 - w) + c.grad_sqr * w, a.grad_var * (1 - w) + c.grad_var * w

    def progress(self, epoch):
        return 0.0 if epoch == 0 else min(df.progress.iloc[epoch - 1] for df in self.val.values())

    def throughput(self, placement, local):
        placement = tuple(x for x in placement if x)
        placement = min(placement[i:] + placement[:i] for i in range(len(placement)))
        pid = int("".join(map(str, placement)))
        if pid in self.pl.placement.values:
            df = self.pl[self.pl.placement == pid]
            return interp1d(df.local_bsz.values, df[["step_time", "sync_time"]].values, axis=0)(local)
        xs = ["num_nodes", "num_replicas", "local_bsz"]
        df = self.pl.groupby(xs)[xs + ["step_time", "sync_time"]].mean()
        df = pd.concat([df, self.sc], ignore_index=True)
        f = LinearNDInterpolator(df[xs].values, df[["step_time", "sync_time"]].values)
        return f([min(len(placement), 16), sum(placement), local])[0]

def runtime(app: App, replicas: int, batch: int) -> float:
    """Seconds to train `app` at `batch` over `replicas` GPUs placed 4 to a node."""
    placement = []
    while sum(placement) < replicas:
        placement.append(min(4, replicas - sum(placement)))
    local = math.ceil(batch / replicas - 1e-8)
    accum = math.ceil(local / app.max_local - 1e-8) - 1
    if replicas == 1 and batch > app.init_bsz:
        accum = max(1, accum)
    atomic = math.ceil(local / (accum + 1) - 1e-8)
    atomic = min(atomic, int(app.max_bsz / (replicas * (accum + 1))))
    t = 0.0
    prog = 0.0
    for epoch in range(app.max_epochs):
        b = replicas * atomic * (accum + 1)
        scale = b / app.init_bsz
        step, sync = app.throughput(placement, atomic)
        sqr, var = app.grad(b, epoch)
        gain = (var + sqr) / (var / scale + sqr)
        total = step + (step - sync) * accum
        goodput = gain / total
        nxt = app.progress(epoch + 1)
        t += round(float((nxt - prog) / goodput))
        prog = nxt
    return t

apps = {n: App(n) for n in MAX_EPOCHS}
configs = set()
for p in sorted(glob.glob(os.path.join(WORKLOADS, "*.csv"))):
    for r in csv.DictReader(open(p)):
        configs.add((r["application"], int(r["num_replicas"]), int(r["batch_size"])))
w = csv.writer(sys.stdout)
w.writerow(["application", "num_replicas", "batch_size", "run_s"])
for a, n, b in sorted(configs):
    w.writerow([a, n, b, runtime(apps[a], n, b)])
