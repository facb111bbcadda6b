"""Loader for the Philly job trace (Microsoft, 2017) as a `Workload`.

The CSV has the columns `timestamp,duration,num_gpus,gpu_time,cluster` (rows not sorted; see the
README next to the file). What the trace does not say is decided here, the same for every policy:

- **Window.** Jobs submitted in `[date_from, date_to)` are loaded (`date_to` exclusive, both at
  00:00); only those submitted in `[date_from + warmup_days, date_to)` are measured. Time 0 is
  `date_from` at 00:00. Example: `--from 2017-10-20 --to 2017-10-29 --warmup-days 2` measures the
  jobs submitted 2017-10-22..10-28 with the cluster warmed up by the jobs of 10-20 and 10-21.
- **Teams** are the virtual clusters (column `cluster`), all in one cohort `philly` with no
  borrowing or lending limits; every job is of class `training`; the classes are those of the
  example config (`interactive`, `training`, `batch`); one pool, `default`.
- **Nominal quotas** come from the VC node table (`philly_vc_nodes_heliosartifact.csv`, next to
  the trace unless `vc_table` is given): each VC gets a share of the cluster's GPUs proportional to
  its node count, rounded by largest remainder (ties by VC name) so the shares sum exactly to the
  cluster's GPUs. A VC of the trace missing from the table gets nominal 0 (it only borrows).
- **Cluster** `NxG`: N nodes `n0..n{N-1}` of G GPUs with 24 GB (24,576 MiB) each (Philly had 12 GB
  P100 and 24 GB P40 GPUs); topology: racks of 8 consecutive nodes, blocks of 4 racks (32 nodes).
- **Jobs**: `gpus=num_gpus` as a GPU count (no fixed shape; beyond one node, placement spreads the
  job over the fewest nodes); run time = `duration` (the sum of its attempts in the raw log);
  checkpoint every 30 minutes (the trace does not say; 1800 s is a common setting); ids are the
  1-based data row (line − 1), an int, so that sorting by (submit time, id) is the file order for
  equal timestamps; each job keeps the label `p<row>` (zero-padded to 5 digits), the string id it
  had before ids were ints, from which its run-time estimate is seeded. A job asking for more GPUs
  than the whole cluster could never run; it is left out and counted in the notes.
- **Estimates** are not set here: see `trainyard.sim.estimates`.

Raises `ConfigError` naming the file, the 1-based physical line and the column for a malformed
row (wrong number of values, a timestamp that does not parse, a duration or GPU count that is not
a positive number, an empty VC) or a header without the needed columns (line 1).
"""

from __future__ import annotations

import math
import re
from datetime import date, datetime, timedelta
from pathlib import Path

from trainyard.sched.cluster import Node, gb_to_mib
from trainyard.sched.types import JobRequest, Quota, Team
from trainyard.sim.workload import SimJob, Workload
from trainyard.spec.models import EXAMPLE_CONFIG, ConfigError, load_config

VC_TABLE_NAME = "philly_vc_nodes_heliosartifact.csv"
REQUIRED = ("timestamp", "duration", "num_gpus", "cluster")
GPU_MEM_GB = 24.0
GPU_MEM_MIB = gb_to_mib(GPU_MEM_GB)
RACK_NODES = 8
BLOCK_RACKS = 4
CHECKPOINT_INTERVAL_S = 1800.0
POOL = "default"
COHORT = "philly"
JOB_CLASS = "training"


def parse_cluster_shape(value: str) -> tuple[int, int]:
    """`"80x8"` → (80 nodes, 8 GPUs per node).

    Raises:
        ConfigError (field `cluster`): not of the form NxG with N, G positive integers.
    """
    m = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*(\d+)\s*", str(value))
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ConfigError(f"cannot read {value!r} as a cluster shape; expected NODESxGPUS, e.g. 80x8", field="cluster")
    return int(m.group(1)), int(m.group(2))


def make_nodes(n_nodes: int, gpus_per_node: int, gpu_mem_mib: int = GPU_MEM_MIB, *,
               rack_nodes: int = RACK_NODES, block_racks: int = BLOCK_RACKS, gpu_model: str = "gpu") -> list[Node]:
    """N identical nodes `n0..` with `gpu_mem_mib` MiB per GPU, racks of `rack_nodes` consecutive
    nodes, blocks of `block_racks` racks."""
    out = []
    for i in range(n_nodes):
        rack = i // rack_nodes
        out.append(Node(f"n{i}", gpus_per_node, gpu_mem_mib, POOL, gpu_model, f"b{rack // block_racks}", f"r{rack}"))
    return out


def parse_day(value: str | date | datetime, field: str = "date") -> datetime:
    """A day (`YYYY-MM-DD`, or a date/datetime) → datetime at 00:00 of that day.

    Raises:
        ConfigError (field `field`): not a date.
    """
    if isinstance(value, datetime):
        return datetime(value.year, value.month, value.day)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    try:
        d = date.fromisoformat(str(value).strip())
    except ValueError:
        raise ConfigError(f"cannot read {value!r} as a date; expected YYYY-MM-DD", field=field) from None
    return datetime(d.year, d.month, d.day)


def largest_remainder(weights: dict[str, float], total: int) -> dict[str, int]:
    """Integer shares of `total` proportional to `weights`, summing exactly to `total`.

    Each gets the floor of its exact share; the units left over go to the largest fractional parts
    (ties broken by name), so the result is deterministic.
    """
    wsum = sum(weights.values())
    if wsum <= 0:
        return {k: 0 for k in weights}
    exact = {k: total * w / wsum for k, w in weights.items()}
    out = {k: math.floor(v) for k, v in exact.items()}
    left = total - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), k))[:left]:
        out[k] += 1
    return out


def read_vc_table(path: str | Path) -> dict[str, int]:
    """The VC node table: `vc,node num` → {vc: nodes}.

    Raises:
        ConfigError: unreadable file, missing columns or a bad node count (naming line and field).
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except OSError as e:
        raise ConfigError(f"cannot read the VC node table: {e.strerror or e}", file=str(path)) from None
    if not lines:
        raise ConfigError("empty file; expected a header 'vc,node num'", file=str(path), line=1)
    header = [h.strip() for h in lines[0].split(",")]
    for col in ("vc", "node num"):
        if col not in header:
            raise ConfigError(f"missing column {col!r} in the header {header}", file=str(path), line=1, field=col)
    i_vc, i_n = header.index("vc"), header.index("node num")
    out: dict[str, int] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        row = [x.strip() for x in line.split(",")]
        if len(row) != len(header):
            raise ConfigError(f"{len(row)} values, expected {len(header)}", file=str(path), line=lineno)
        if not row[i_vc]:
            raise ConfigError("empty VC name", file=str(path), line=lineno, field="vc")
        try:
            n = int(row[i_n])
        except ValueError:
            n = -1
        if n < 0:
            raise ConfigError(f"node count {row[i_n]!r} is not a non-negative integer", file=str(path), line=lineno, field="node num")
        out[row[i_vc]] = out.get(row[i_vc], 0) + n
    return out


def _positive(text: str, file: str, line: int, field: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ConfigError(f"{text!r} is not a number", file=file, line=line, field=field) from None
    if not math.isfinite(v) or v <= 0:
        raise ConfigError(f"{text!r} must be a positive number", file=file, line=line, field=field)
    return v


def read_rows(path: str | Path) -> list[tuple[datetime, int, float, int, str]]:
    """Every data row, validated: (submitted, line number, duration_s, num_gpus, vc), in file order.

    Raises:
        ConfigError: unreadable file, missing header columns (line 1), or a malformed row.
    """
    path = Path(path)
    file = str(path)
    try:
        f = path.open(encoding="utf-8-sig", newline="")
    except OSError as e:
        raise ConfigError(f"cannot read the trace: {e.strerror or e}", file=file) from None
    rows: list[tuple[datetime, int, float, int, str]] = []
    with f:
        header_line = f.readline()
        header = [h.strip() for h in header_line.rstrip("\r\n").split(",")]
        for col in REQUIRED:
            if col not in header:
                raise ConfigError(f"missing column {col!r}; the header must name {', '.join(REQUIRED)}",
                                  file=file, line=1, field=col)
        ncols = len(header)
        i_ts, i_dur, i_gpu, i_vc = (header.index(c) for c in REQUIRED)
        fromiso = datetime.fromisoformat
        for lineno, line in enumerate(f, start=2):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            row = line.split(",")
            if len(row) != ncols:
                missing = header[len(row)] if len(row) < ncols else None
                raise ConfigError(f"{len(row)} values, expected {ncols} ({','.join(header)})",
                                  file=file, line=lineno, field=missing)
            ts = row[i_ts].strip()
            try:
                if len(ts) < 10:
                    raise ValueError
                submitted = fromiso(ts)
            except ValueError:
                raise ConfigError(f"cannot read {ts!r} as a time; expected YYYY-MM-DD HH:MM:SS",
                                  file=file, line=lineno, field="timestamp") from None
            if submitted.tzinfo is not None:
                submitted = submitted.replace(tzinfo=None)
            dur = _positive(row[i_dur], file, lineno, "duration")
            g = _positive(row[i_gpu], file, lineno, "num_gpus")
            if g != int(g):
                raise ConfigError(f"{row[i_gpu]!r} is not a whole number of GPUs", file=file, line=lineno, field="num_gpus")
            vc = row[i_vc].strip()
            if not vc:
                raise ConfigError("empty virtual cluster name", file=file, line=lineno, field="cluster")
            rows.append((submitted, lineno, dur, int(g), vc))
    return rows


def load_philly(path: str | Path, *, date_from: str | date | datetime | None, date_to: str | date | datetime | None,
                warmup_days: float = 0.0, cluster: str = "80x8", seed: int = 0,
                vc_table: str | Path | None = None) -> Workload:
    """The Philly trace as a `Workload` (see the module notes for every choice made).

    `date_from` None: the day of the first submission; `date_to` None: the day after the last.
    `seed` is accepted for symmetry with the other loaders; loading draws nothing at random.

    Raises:
        ConfigError: malformed trace or VC table (file, line, field), a bad cluster shape, a bad
            date, or a window that is empty or shorter than the warm-up.
    """
    del seed
    n_nodes, gpn = parse_cluster_shape(cluster)
    rows = read_rows(path)
    if date_from is None:
        if not rows:
            raise ConfigError("the trace has no rows", file=str(path))
        start = parse_day(min(r[0] for r in rows))
    else:
        start = parse_day(date_from, "from")
    if date_to is None:
        end = parse_day(max(r[0] for r in rows)) + timedelta(days=1) if rows else start + timedelta(days=1)
    else:
        end = parse_day(date_to, "to")
    if end <= start:
        raise ConfigError(f"--to ({end.date()}) must be after --from ({start.date()})", field="to")
    if warmup_days < 0:
        raise ConfigError("the warm-up cannot be negative", field="warmup_days")
    measure_from = warmup_days * 86400.0
    measure_to = (end - start).total_seconds()
    if measure_from >= measure_to:
        raise ConfigError(f"a warm-up of {warmup_days:g} days leaves nothing to measure in "
                          f"{start.date()}..{end.date()} (to is exclusive)", field="warmup_days")

    total_gpus = n_nodes * gpn
    chosen = sorted((r for r in rows if start <= r[0] < end), key=lambda r: (r[0], r[1]))
    jobs: list[SimJob] = []
    too_big = 0
    for submitted, lineno, dur, g, vc in chosen:
        if g > total_gpus:
            too_big += 1
            continue
        req = JobRequest(id=lineno - 1, team=vc, job_class=JOB_CLASS,
                         submit_time=(submitted - start).total_seconds(), gpus=g,
                         checkpoint_interval_s=CHECKPOINT_INTERVAL_S, pool=POOL)
        jobs.append(SimJob(req, dur, label=f"p{lineno - 1:05d}"))

    table_path = Path(vc_table) if vc_table is not None else Path(path).with_name(VC_TABLE_NAME)
    vc_nodes = read_vc_table(table_path)
    nominal = largest_remainder({vc: float(n) for vc, n in vc_nodes.items()}, total_gpus)
    trace_vcs = sorted({j.req.team for j in jobs})
    unlisted = [vc for vc in trace_vcs if vc not in nominal]
    names = sorted(set(nominal) | set(trace_vcs))
    teams = {vc: Team(vc, COHORT, {POOL: Quota(nominal.get(vc, 0), None, None)}) for vc in names}
    _, _, classes = load_config(EXAMPLE_CONFIG).to_sched()

    notes = [
        f"Philly trace {Path(path).name}: jobs submitted {start.date()} .. {(end - timedelta(days=1)).date()} "
        f"loaded ({len(jobs)} jobs); measured from {(start + timedelta(days=warmup_days))} "
        f"(warm-up {warmup_days:g} days) to {end} (exclusive); time 0 = {start}.",
        f"Cluster {n_nodes}x{gpn}: {n_nodes} nodes of {gpn} GPUs with {GPU_MEM_GB:g} GB each "
        f"({total_gpus} GPUs), racks of {RACK_NODES} nodes, blocks of {BLOCK_RACKS} racks; one pool.",
        f"Teams = virtual clusters, one cohort '{COHORT}', no borrowing or lending limits; every job "
        f"of class '{JOB_CLASS}', checkpoint every {CHECKPOINT_INTERVAL_S:g} s (assumed).",
        f"Nominal quotas: the cluster's {total_gpus} GPUs split in proportion to each VC's node count "
        f"in {table_path.name} ({sum(vc_nodes.values())} nodes), largest-remainder rounding: "
        + ", ".join(f"{vc}={nominal[vc]}" for vc in sorted(nominal, key=lambda v: (-nominal[v], v))) + ".",
    ]
    if unlisted:
        notes.append(f"VCs in the trace but not in the node table get nominal 0 (they only borrow): {', '.join(unlisted)}.")
    if too_big:
        notes.append(f"{too_big} jobs asking for more than the cluster's {total_gpus} GPUs were left out.")
    return Workload(
        nodes=make_nodes(n_nodes, gpn), teams=teams, classes=dict(classes), jobs=jobs,
        measure_from=measure_from, measure_to=measure_to, origin=start,
        name=f"philly {start.date()}..{(end - timedelta(days=1)).date()} on {n_nodes}x{gpn}", notes=notes,
    )
