"""The training path's options (issue 19 part 5), each run the way a user runs it: `yard run` on this CPU.

- activation checkpointing: `none`, `selective`, `full` give the same losses bit for bit (the
  recomputed forward runs the same kernels), on one process and under FSDP2 on two;
- `log_every`: metrics lines at that cadence only (the GPU default is 10: one sync per line), and
  MFU in them once the device's peak is known (`gpu_peak_tflops`; a CPU has no table entry);
- AdamW's implementations (foreach, the CPU default; the for-loop of before; fused) train alike;
- `torch.compile` of each decoder layer runs and trains as the eager model does (slow: inductor
  compiles on the first step);
- a bad value is refused before anything starts (exit 2).
"""

from __future__ import annotations

import subprocess

import pytest

from tests.recipes.helpers import TINY_PRETRAIN, YARD, env, losses, metrics, yard_run

SHORT = [*TINY_PRETRAIN, "steps=6", "checkpoint_every=null", "print_every=3"]
# The tests of the module-scoped default run on one xdist worker (`make test`'s --dist loadgroup):
# unmarked, each worker they land on runs its own.
SAME_DEFAULT = pytest.mark.xdist_group("training-path-default-run")


def run(tmp_path, name: str, extra: list[str], nproc: int = 1) -> dict[int, float]:
    out = tmp_path / name
    rc, log = yard_run("llama-pretrain", out, nproc, [*SHORT, *extra])
    assert rc == 0, log[-3000:]
    return losses(out)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """One run with every default (no checkpointing, foreach AdamW, no peak): the baseline the
    tests below compare with."""
    out = tmp_path_factory.mktemp("default") / "run"
    rc, log = yard_run("llama-pretrain", out, 1, SHORT)
    assert rc == 0, log[-3000:]
    return out


@SAME_DEFAULT
def test_activation_checkpointing_changes_no_loss(tmp_path, default_run):
    base = losses(default_run)
    assert sorted(base) == list(range(1, 7))
    for mode in ("selective", "full"):
        got = run(tmp_path, mode, [f"activation_checkpoint={mode}"])
        assert {s: v.hex() for s, v in got.items()} == {s: v.hex() for s, v in base.items()}, mode


@pytest.mark.slow
def test_activation_checkpointing_under_fsdp2_on_two_processes(tmp_path):
    sets = ["strategy=fsdp2"]
    base = run(tmp_path, "none", sets, nproc=2)
    got = run(tmp_path, "full", [*sets, "activation_checkpoint=full"], nproc=2)
    assert {s: v.hex() for s, v in got.items()} == {s: v.hex() for s, v in base.items()}


@SAME_DEFAULT
def test_log_every_and_mfu(tmp_path, default_run):
    out = tmp_path / "run"
    rc, log = yard_run("llama-pretrain", out, 1, [*SHORT, "log_every=3", "gpu_peak_tflops=0.5"])
    assert rc == 0, log[-3000:]
    m = metrics(out)
    assert sorted(m) == [3, 6]
    for rec in m.values():
        assert rec["tokens_per_s"] > 0 and 0 < rec["mfu"] < 1, rec
    assert all("mfu" not in r for r in metrics(default_run).values())  # a CPU: no peak, no MFU


@SAME_DEFAULT
def test_adamw_implementations_train_alike(tmp_path, default_run):
    default = losses(default_run)
    for impl in ("for-loop", "fused"):
        got = run(tmp_path, impl, [f"optim.implementation={impl}"])
        assert all(got[s] == pytest.approx(default[s], rel=1e-5) for s in default), (impl, got, default)


@pytest.mark.slow
@SAME_DEFAULT
def test_compile_trains_as_the_eager_model(tmp_path, default_run):
    eager = losses(default_run)
    compiled = run(tmp_path, "compiled", ["compile=true"])
    assert all(compiled[s] == pytest.approx(eager[s], rel=1e-4) for s in eager), (compiled, eager)


@pytest.mark.parametrize("bad,field", [("activation_checkpoint=some", "activation_checkpoint"),
                                       ("optim.implementation=turbo", "optim.implementation"),
                                       ("log_every=0", "log_every"), ("precision=fp8", "precision")])
def test_bad_values_exit_2_naming_the_field(tmp_path, bad, field):
    out = tmp_path / "run"
    p = subprocess.run([YARD, "run", "llama-pretrain", "--out", str(out), "--set", bad], capture_output=True,
                       text=True, env=env(), timeout=60)
    assert p.returncode == 2 and f"{field}:" in p.stderr, p.stderr
    assert not out.exists()
