"""Run times of the Pollux (OSDI'21) workload configurations, for `sim.pollux`.

Pollux's workloads ($TRAINYARD_TRACES/pollux-sia-workloads: name, time, application, num_replicas,
batch_size) say what each job trains and with how many GPUs and what batch size Tiresias ran it
("+TunedJobs"), not how long that takes: Pollux's simulator computes it from measured
throughput and statistical efficiency per application (petuum/adaptdl, branch osdi21-artifact,
simulator/traces/<application>/, Apache-2.0). This table holds the result for every
configuration the eight workloads use: the seconds a job of that application, replica count and
total batch size takes alone on a compact placement (4 GPUs per node, as Pollux's workload
generator assumed when it chose the configurations), i.e. the time to train the application's
epochs at that batch size with the throughput of that placement and the efficiency of that
batch size, epoch by epoch, as Pollux's simulator steps a job. The 30 s Pollux charges for every
(re)allocation is not included (`sim.pollux` adds it).

How it was derived: `bench/pollux_runtimes.py` (needs a checkout of that branch, pandas and
scipy; not needed to use the table). Checked against Pollux's published per-job results
(pollux_results_jobload/tiresias-1.0_summary.json): for every configuration but the three
imagenet ones (whose jobs always waited there), the smallest published JCT less the job's wait
for the next 60 s scheduling round and the 30 s allocation equals the table to the second.
"""

from __future__ import annotations

# (application, num_replicas, batch_size) -> run time in seconds
RUN_S: dict[tuple[str, int, int], float] = {
    ("bert", 6, 384): 3092.0,
    ("bert", 8, 384): 2459.0,
    ("bert", 12, 384): 1594.0,
    ("bert", 16, 384): 1324.0,
    ("cifar10", 6, 2048): 910.0,
    ("cifar10", 8, 2048): 865.0,
    ("cifar10", 12, 4096): 624.0,
    ("cifar10", 16, 4096): 482.0,
    ("deepspeech2", 6, 320): 4142.0,
    ("deepspeech2", 8, 320): 3530.0,
    ("deepspeech2", 12, 640): 2477.0,
    ("imagenet", 24, 3200): 31805.0,
    ("imagenet", 32, 6400): 27431.0,
    ("imagenet", 48, 6400): 19689.0,
    ("ncf", 1, 32768): 47.0,
    ("yolov3", 4, 64): 14102.0,
}
