"""`yard share` (sshare) and `yard prio` (sprio): fair share per team, and why a waiting job sits
where it does in the engine's order (control/reports/priority.py says what each column means)."""

from __future__ import annotations

import json
from typing import Optional

import typer

from trainyard.cli.acct import when
from trainyard.cli.client import Client
from trainyard.cli.render import table


def share(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Fair share per team and pool (sshare): quota, decayed usage, the engine's fair-share factor."""
    rep = Client().get("/api/v1/share")
    if as_json:
        typer.echo(json.dumps(rep, indent=2))
        return
    typer.echo(f"policy {rep['policy']}; usage decays with a half-life of {rep['half_life_s'] / 86400:g} days; "
               f"FAIRSHARE = 2^(-NORMUSAGE/NORMSHARES) as sshare's (higher: more priority); USAGEFACTOR = the "
               f"engine's (usage share / quota share) ^ {rep['fairshare_weight']:g} (higher: waits longer)")
    table(["TEAM", "POOL", "COHORT", "NOMINAL", "BORROW", "LEND", "ALLOC", "NORMSHARES", "RAWUSAGE(GPUh)",
           "NORMUSAGE", "LEVELFS", "FAIRSHARE", "USAGEFACTOR"],
          [[t["team"], t["pool"], t["cohort"] or "", t["nominal_gpus"],
            "" if t["borrowing_limit"] is None else t["borrowing_limit"],
            "" if t["lending_limit"] is None else t["lending_limit"], t["gpus_allocated"], f"{t['norm_shares']:.3f}",
            f"{t['raw_usage_gpu_hours']:.2f}", f"{t['norm_usage']:.3f}",
            "" if t["level_fs"] is None else f"{t['level_fs']:.3f}", f"{t['fairshare']:.6f}",
            f"{t['fairshare_factor']:.3f}"]
           for t in rep["teams"]])


def prio(jobs: Optional[list[str]] = typer.Argument(None, help="job ids (default: every waiting job)"),
         as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Why waiting jobs sit where they do in the engine's order (sprio): rank and each factor."""
    ids = ",".join(jobs or [])
    rep = Client().get("/api/v1/priority", params={"jobs": ids} if ids else {})
    if as_json:
        typer.echo(json.dumps(rep, indent=2))
        return
    typer.echo(f"policy {rep['policy']}; order: class priority, tier (in-quota before borrowing), urgent "
               f"(waited {rep['ordering']['reserve_at']:g} of max wait) oldest first, then score (lower first)")
    table(["RANK", "JOBID", "TEAM", "USER", "CLASS", "PRIO", "TIER", "URGENT", "WAITED", "REMAIN(GPUh)",
           "FAIRSHARE", "SCORE", "GPUS", "REASON", "EST.START"],
          [[j["rank"], j["id"], j["team"], j["user"], j["class"], j["class_priority"], j["tier"],
            "yes" if j["urgent"] else "", f"{100 * j['waited_fraction']:.1f}%", f"{j['remaining_gpu_s'] / 3600:.2f}",
            f"{j['fairshare_factor']:.3f}", "" if j["score"] is None else f"{j['score']:.3f}", j["gpus"], j["reason"],
            when(j["est_start"]) if j["est_start"] else ""] for j in rep["jobs"]])
