"""Sane bounds on a cluster configuration, and on the YAML text it comes in.

A configuration is data an admin types, and one typo must not take the plane down: `count:
100000000` once made the plane build a hundred million nodes (8.3 GB in 2.5 minutes, every call
hung), and a deeply nested document made the YAML composer recurse past Python's stack (a 500).
Every number of `spec/models.py` a typo can blow up has a bound here, chosen well above any real cluster
and well below what the plane cannot hold, and the text is checked before it is parsed:

    MAX_YAML_BYTES    1 MiB of text (the API takes the same at most)
    MAX_YAML_DEPTH    32 levels of nesting (a configuration needs 6)
    MAX_YAML_NODES    200,000 values, aliases counted as what they stand for (an alias is a
                      copy to pydantic: ten levels of ten aliases are 10^10 values to validate)

`check_yaml` walks PyYAML's event stream, which is produced without recursion, so a document is
measured before anything recursive (composing, constructing, validating) sees it. An error names
the file and line, as every `ConfigError` does.
"""

from __future__ import annotations

import yaml

from trainyard.spec.parsing import ConfigError

MAX_YAML_BYTES = 1 << 20
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 200_000

# The cluster (`spec.models.ClusterSpec`): the largest GPU clusters in service have some tens of thousands
# of GPUs on a few thousand nodes; the scheduler's snapshot holds every node each pass.
MAX_NODES = 10_000  # after `count` is expanded, in the whole configuration
MAX_GPUS_PER_NODE = 64
MAX_GPU_MEM_GB = 4096.0  # per GPU (today's largest have under 300 GB)
MAX_QUOTA_GPUS = 1_000_000  # a quota's nominal, borrowing or lending limit
MAX_TEAMS = 10_000
MAX_CLASSES = 1_000
MAX_PRIORITY = 1_000_000_000  # |priority| of a class
MAX_CHECKS = 100  # health checks, and remediation actions
MAX_NAME = 100  # node, pool, team, class names: the store's columns are 100 characters
MAX_DURATION_S = 10 * 365 * 86400.0  # any duration: a wait, a run time, a grace period, a cooldown
MIN_HEALTH_INTERVAL_S = 0.1  # health rounds start processes: not a busy loop
MAX_REMEDIATION_ATTEMPTS = 100
MAX_STORAGE_GB = 1e9  # a team's disk quota or the reserve: an exabyte (GB of 2^30 bytes)
MIN_STORAGE_INTERVAL_S = 0.1  # a measurement walks every job dir: not a busy loop
# A job's pids limit per node (`classes[].pids_max`, `teams[].pids_max`): a job needs its command, a
# shell and a few helpers to start at all; 4,194,304 is the kernel's own ceiling (PID_MAX_LIMIT).
MIN_PIDS_MAX = 16
MAX_PIDS_MAX = 4_194_304


def check_yaml(text: str, file: str) -> None:
    """Refuse YAML text that is too big, too deeply nested or expands to too many values.

    Raises:
        ConfigError: naming the file, the line where the limit was passed, and the limit.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_YAML_BYTES:
        raise ConfigError(f"the configuration is {size} bytes; at most {MAX_YAML_BYTES} are read", file=file)
    depth, nodes = 0, 0
    open_anchors: list[tuple[str | None, int, int]] = []  # (anchor, values before it, depth at it)
    sizes: dict[str, tuple[int, int]] = {}  # anchor -> (values, depth below it)
    deepest: list[int] = []  # per open collection: the deepest level reached below it
    try:
        for ev in yaml.parse(text, Loader=yaml.SafeLoader):
            line = ev.start_mark.line + 1 if ev.start_mark else None
            if isinstance(ev, yaml.AliasEvent):
                if any(a == ev.anchor for a, _, _ in open_anchors):
                    raise ConfigError(f"the alias *{ev.anchor} refers to a node that contains it", file=file,
                                      line=line)
                n, below = sizes.get(ev.anchor, (1, 0))
                nodes += n
                _reach(deepest, depth + below, file, line)
            elif isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                nodes += 1
                depth += 1
                _reach(deepest, depth, file, line)
                open_anchors.append((ev.anchor, nodes - 1, depth))
                deepest.append(depth)
            elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                anchor, before, at = open_anchors.pop()
                below = deepest.pop() - at + 1
                if anchor is not None:
                    sizes[anchor] = (nodes - before, below)
                depth -= 1
            elif isinstance(ev, yaml.ScalarEvent):
                nodes += 1
                if ev.anchor is not None:
                    sizes[ev.anchor] = (1, 0)
            if nodes > MAX_YAML_NODES:
                raise ConfigError(f"the configuration holds more than {MAX_YAML_NODES} values (aliases counted as "
                                  "what they stand for)", file=file, line=line)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError(f"not valid YAML: {getattr(e, 'problem', e)}", file=file,
                          line=mark.line + 1 if mark else None) from None


def _reach(deepest: list[int], level: int, file: str, line: int | None) -> None:
    if level > MAX_YAML_DEPTH:
        raise ConfigError(f"the configuration is nested more than {MAX_YAML_DEPTH} levels deep", file=file, line=line)
    if deepest and level > deepest[-1]:
        for i in range(len(deepest)):
            deepest[i] = max(deepest[i], level)
