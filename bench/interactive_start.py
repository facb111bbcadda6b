"""Issue 38's benchmark: how long `yard alloc` takes to give a prompt, and how fast a terminal echoes
(bench/README.md, "Interactive work").

    .venv/bin/python bench/interactive_start.py [--rounds 5] [--busy-rounds 3] [--checkpoint-s 1.0]
                                                [--keys 400] [--json FILE]

A real `yard up` on the local backend, emulating 2 nodes x 4 GPUs, two teams (`vision`, `nlp`,
4 GPUs of quota each, lending what they do not use), the `interactive` class (not preemptible,
15 minutes' maximum wait) and a preemptible `training` class with a 30 s notice grace. `yard alloc`
runs on a real pseudo-terminal (pexpect) as a user would type it, its command a bash whose prompt
is known, so the time is from the keystroke that starts `yard alloc` to the prompt on the screen:

1. idle cluster: `yard alloc -G 1 -A vision -- bash`, `--rounds` times (goal: <= 2 s); after each,
   `exit`, and the time until the job is COMPLETED and its GPU free (the acceptance's 2 s);
2. busy cluster: `nlp` fills all 8 GPUs with training jobs (borrowing `vision`'s idle quota) that
   checkpoint on the preemption notice (SIGUSR1: `--checkpoint-s` seconds of "saving", then exit
   75, as the runtime does), then `vision` asks for one GPU: the plane reclaims its quota by
   preempting a borrower by checkpoint. The wait is compared with what the victim itself took from
   the notice to its exit (goal: that plus <= 5 s);
3. keystroke echo through the API on loopback: a terminal in the running allocation, bash with
   readline at the far end, `--keys` keystrokes one frame each (goal: p99 <= 50 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pexpect

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

from _yard import YARD, YardServer, conditions, latency_summary  # noqa: E402

from tests.api.echo_latency import BASH as ECHO_BASH  # noqa: E402
from tests.api.echo_latency import measure  # noqa: E402

PROMPT = "@@> "
SHELL = ["--", "env", f"PS1={PROMPT}", "bash", "--norc", "--noprofile"]
# a training job that checkpoints on the notice: CKPT seconds of saving, then exit 75 (requeue me)
TRAINER = ("import os, signal, sys, time\n"
           "def notice(*_):\n"
           "    time.sleep(float(os.environ['CKPT']))\n"
           "    sys.exit(75)\n"
           "signal.signal(signal.SIGUSR1, notice)\n"
           "while True:\n"
           "    time.sleep(0.2)\n")


def _config(path: Path) -> Path:
    path.write_text("""\
cluster:
  name: bench-interactive
  nodes:
    - {name: node, count: 2, gpus: 4, gpu_model: a100, gpu_mem_gb: 16}
teams:
  - {name: vision, cohort: lab, quotas: {default: {nominal: 4}}}
  - {name: nlp, cohort: lab, quotas: {default: {nominal: 4}}}
classes:
  - {name: interactive, priority: 300, preemptible: false, max_wait: 15m, max_run_time: 1h, grace_period: 0}
  - {name: training, priority: 100, preemptible: true, grace_period: 30s}
interactive:
  connection_grace: 30s
""")
    return path


class Bench:
    def __init__(self, server: YardServer):
        self.server = server
        self.http = server.client()
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith(("YARD_", "TRAINYARD_"))},
                    "YARD_URL": server.url, "YARD_TOKEN": server.token}

    def job(self, job_id: int) -> dict[str, Any]:
        r = self.http.get(f"/api/v1/jobs/{job_id}")
        r.raise_for_status()
        return r.json()

    def wait_state(self, job_id: int, states: tuple[str, ...], timeout: float = 120) -> tuple[dict[str, Any], float]:
        t0 = time.perf_counter()
        while True:
            j = self.job(job_id)
            if j["state"] in states:
                return j, time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"job {job_id} is {j['state']} ({j.get('reason')}), not {states}")
            time.sleep(0.02)

    def free_gpus(self) -> int:
        nodes = self.http.get("/api/v1/nodes").json()
        items = nodes if isinstance(nodes, list) else nodes.get("nodes", [])
        return sum(int(n.get("gpus_free", n.get("free_gpus", 0)) or 0) for n in items)

    def alloc(self, *args: str) -> tuple[pexpect.spawn, float, int]:
        """`yard alloc ARGS -- bash` on a pty; the seconds until its prompt, the job id."""
        t0 = time.perf_counter()
        child = pexpect.spawn(YARD, ["alloc", *args, *SHELL], env=self.env, dimensions=(24, 80), timeout=600,
                              encoding="utf-8")
        child.expect_exact(PROMPT)
        took = time.perf_counter() - t0
        child.sendline("echo JOB=$SLURM_JOB_ID.")
        child.expect(r"JOB=(\d+)\.")
        job_id = int(child.match.group(1))
        child.expect_exact(PROMPT)
        return child, took, job_id

    def leave(self, child: pexpect.spawn, job_id: int, *, gpu_back: bool = True) -> float:
        """`exit`; the seconds until the job is COMPLETED with its GPU back (`gpu_back`: on a busy
        cluster a waiting job takes it at once, so only COMPLETED is waited for)."""
        before = self.free_gpus()
        t0 = time.perf_counter()
        child.sendline("exit")
        self.wait_state(job_id, ("COMPLETED",), timeout=60)
        while gpu_back and self.free_gpus() <= before:
            if time.perf_counter() - t0 > 60:
                raise RuntimeError("the allocation's GPU did not come back")
            time.sleep(0.02)
        took = time.perf_counter() - t0
        child.expect(pexpect.EOF)
        child.close()
        return took

    def fill(self, team: str, n: int, ckpt_s: float) -> list[int]:
        ids = []
        for _ in range(n):
            r = self.http.post("/api/v1/jobs", json={
                "name": "trainer", "team": team, "class": "training", "gpus": 1,
                "command": [sys.executable, "-c", TRAINER], "env": {"CKPT": str(ckpt_s)}})
            r.raise_for_status()
            ids.append(int(r.json()["id"]))
        for i in ids:
            self.wait_state(i, ("RUNNING",))
        return ids

    def last_event_id(self) -> int:
        ev = self.http.get("/api/v1/events", params={"newest": True, "limit": 1}).json()["events"]
        return int(ev[-1]["id"]) if ev else 0

    def victim_stop_s(self, since_id: int) -> float | None:
        """The seconds from the preemption notice (`job.preempting`) to the victim's end
        (`job.preempted`), from the audit trail after event `since_id`."""
        events = self.http.get("/api/v1/events", params={"since": since_id, "limit": 10000}).json()["events"]
        notice = {e["job_id"]: e["time"] for e in events if e["kind"] == "job.preempting"}
        spans = [e["time"] - notice[e["job_id"]] for e in events
                 if e["kind"] == "job.preempted" and e["job_id"] in notice]
        return min(spans) if spans else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--busy-rounds", type=int, default=3)
    ap.add_argument("--checkpoint-s", type=float, default=1.0)
    ap.add_argument("--keys", type=int, default=400)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out: dict[str, Any] = {"conditions": conditions()}
    with tempfile.TemporaryDirectory() as d:
        server = YardServer(config=_config(Path(d) / "cluster.yaml")).start()
        try:
            b = Bench(server)
            prompt, leave = [], []
            for _ in range(args.rounds):
                child, took, job_id = b.alloc("-G", "1", "-A", "vision")
                prompt.append(took)
                leave.append(b.leave(child, job_id))
            out["idle"] = {"alloc_to_prompt_s": [round(x, 3) for x in prompt],
                           "median_s": round(statistics.median(prompt), 3),
                           "exit_to_completed_and_gpu_free_s": [round(x, 3) for x in leave]}
            print(json.dumps(out["idle"]), flush=True)

            child, _, job_id = b.alloc("-G", "1", "-A", "vision")
            url = f"ws{server.url[4:]}/api/v1/jobs/{job_id}/terminal?{ECHO_BASH}"
            ms = [x * 1000 for x in asyncio.run(measure(url, server.token, args.keys))]
            out["echo"] = {"keys": args.keys, **latency_summary(ms)}
            print(json.dumps(out["echo"]), flush=True)
            b.leave(child, job_id)

            busy = []
            trainers = b.fill("nlp", 8, args.checkpoint_s)
            for _ in range(args.busy_rounds):
                since = b.last_event_id()
                child, took, job_id = b.alloc("-G", "1", "-A", "vision")
                stop = b.victim_stop_s(since)
                busy.append({"alloc_to_prompt_s": round(took, 3),
                             "victim_notice_to_exit_s": None if stop is None else round(stop, 3),
                             "beyond_the_victims_checkpoint_s": None if stop is None else round(took - stop, 3)})
                print(json.dumps(busy[-1]), flush=True)
                b.leave(child, job_id, gpu_back=False)
                for i in trainers:  # the victim back on its GPU before the next round
                    b.wait_state(i, ("RUNNING",))
            out["busy"] = busy
        finally:
            out["teardown"] = server.stop()
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
