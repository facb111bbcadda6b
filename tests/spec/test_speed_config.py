"""The `speed` health check's configuration (spec/models.py SpeedSpec): a well-formed one reads as
written, and each malformed one is an error naming the file, the line and the field; a real
`yard up --config` with one exits 2 and writes nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.plane import TWO_TEAMS, YARD
from trainyard.spec.models import parse_config
from trainyard.spec.parsing import ConfigError

BASE = TWO_TEAMS.read_text()
GOOD = """
  - name: speed
    kind: speed
    when: before_work
    timeout: 2m
    speed:
      baselines:
        a100: {tflops: 250, busbw_gbps: 150}
        cpu: {tflops: 0.01}
      min_fraction: 0.9
      matmul_n: 512
"""


def config(checks: str):
    return parse_config(BASE + "health:\n  checks:\n" + checks, "cluster.yaml")


def test_a_speed_check_reads_as_written_with_defaults_for_the_rest() -> None:
    (c,) = config(GOOD).health.checks
    assert c.kind == "speed" and c.when == "before_work" and c.timeout == 120
    assert c.speed is not None
    assert c.speed.baselines["a100"].tflops == 250 and c.speed.baselines["a100"].busbw_gbps == 150
    assert c.speed.baselines["cpu"].busbw_gbps is None  # not judged
    assert c.speed.min_fraction == 0.9 and c.speed.matmul_n == 512
    assert c.speed.allreduce_mib is None and c.speed.device == "auto" and c.speed.cpu_ranks == 2
    (d,) = config("  - {name: s, kind: speed, speed: {baselines: {cpu: {tflops: 1}}}}\n").health.checks
    assert d.timeout == 120  # not the 30 s of a command: a node's ranks import torch and join NCCL first




@pytest.mark.parametrize("bad, field, words", [
    (GOOD.replace("tflops: 250", "tflops: -1"), "health.checks.0.speed.baselines.a100.tflops", ["greater than 0"]),
    (GOOD.replace("busbw_gbps: 150", "busbw_gbps: 0"), "health.checks.0.speed.baselines.a100.busbw_gbps",
     ["greater than 0"]),
    (GOOD.replace("tflops: 0.01", "tflops: 0.01, gbps: 1"), "health.checks.0.speed.baselines.cpu.gbps", ["Extra inputs"]),
    (GOOD.replace("tflops: 0.01", "tflop: 0.01"), "health.checks.0.speed.baselines.cpu.tflops", ["Field required"]),
    (GOOD.replace("min_fraction: 0.9", "min_fraction: 1.5"), "health.checks.0.speed.min_fraction",
     ["less than or equal to 1"]),
    (GOOD.replace("min_fraction: 0.9", "min_fraction: 0"), "health.checks.0.speed.min_fraction", ["greater than 0"]),
    (GOOD.replace("min_fraction: 0.9", "min_fraction: .nan"), "health.checks.0.speed.min_fraction", ["finite"]),
    (GOOD.replace("matmul_n: 512", "matmul_n: 1000000"), "health.checks.0.speed.matmul_n", ["less than or equal"]),
    (GOOD.replace("matmul_n: 512", "size: 512"), "health.checks.0.speed.size", ["Extra inputs"]),
    (GOOD.replace("matmul_n: 512", "device: tpu"), "health.checks.0.speed.device", ["'auto', 'cuda' or 'cpu'"]),
    (GOOD.replace("      baselines:\n        a100: {tflops: 250, busbw_gbps: 150}\n        cpu: {tflops: 0.01}\n",
                  "      baselines: {}\n"), "health.checks.0.speed.baselines", ["at least 1"]),
    (GOOD.replace("    speed:\n", "    fast:\n"), "health.checks.0.fast", ["Extra inputs"]),
])
def test_a_malformed_speed_check_is_an_error_naming_the_file_line_and_field(bad, field, words) -> None:
    with pytest.raises(ConfigError) as e:
        config(bad)
    assert e.value.field == field, str(e.value)
    assert e.value.file == "cluster.yaml" and e.value.line is not None and e.value.line > BASE.count("\n"), str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_the_line_is_the_bad_value_s() -> None:
    with pytest.raises(ConfigError) as e:
        config(GOOD.replace("min_fraction: 0.9", "min_fraction: 2"))
    text = BASE + "health:\n  checks:\n" + GOOD
    assert e.value.line == text.splitlines().index("      min_fraction: 0.9") + 1, str(e.value)


@pytest.mark.parametrize("check, words", [
    ("  - {name: s, kind: speed}\n", ["check 's': kind speed needs `speed`"]),
    ("  - {name: d, kind: disk, speed: {baselines: {cpu: {tflops: 1}}}}\n", ["check 'd': `speed` is for kind speed"]),
])
def test_speed_settings_go_with_kind_speed_and_only_with_it(check, words) -> None:
    with pytest.raises(ConfigError) as e:
        config(check)
    assert e.value.field == "health.checks.0", str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_yard_up_with_a_malformed_speed_check_exits_2_naming_it_and_writes_nothing(tmp_path: Path) -> None:
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(BASE + "health:\n  checks:\n    - {name: s, kind: speed, speed: {baselines: {cpu: {tflops: -1}}}}\n")
    data = tmp_path / "data"
    data.mkdir()
    p = subprocess.run([YARD, "up", "--data-dir", str(data), "--port", "0", "--login-socket", "none",
                        "--config", str(cfg)], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 2, p.stderr
    assert f"{cfg}:{BASE.count(chr(10)) + 3}, field 'health.checks.0.speed.baselines.cpu.tflops'" in p.stderr, p.stderr
    assert "greater than 0" in p.stderr
    assert list(data.iterdir()) == []  # no store, no log: nothing written
