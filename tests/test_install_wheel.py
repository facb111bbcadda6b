"""A wheel of this checkout, installed without extras into a fresh venv, is a working CLI and plane
(issue 17, acceptance line 6).

tests/test_install_extras.py checks the metadata and runs the base with torch and the rest made
unimportable in the dev venv; only a real install shows that the wheel's package data and entry
point are right and that pip, resolving the base dependencies itself, pulls no torch. So: `pip
wheel --no-deps` of the repo, `python -m venv` under tmp_path, `pip install` of the wheel (no
extras, dependencies from pip's configured index), then `yard --help`, and `yard queue` against a
real `yard up`, both from that venv. Slow (a wheel build and about 40 packages to install: 65–80 s
here); skipped with pip's reason when no package index can be reached.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tests.plane as plane
from tests.plane import TWO_TEAMS, YardServer

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "tensorboard", "matplotlib")
# pip's words when it could not reach an index or find a distribution there
OFFLINE = ("No matching distribution found", "Could not find a version", "NewConnectionError",
           "Failed to establish a new connection", "Network is unreachable", "Temporary failure in name resolution")

# Every child runs without PYTHONPATH (`PYTHONPATH=src pytest` is how this suite may be run): with
# it, the fresh venv would import the source tree, and pip, seeing src/trainyard.egg-info (left by
# the wheel build), would take trainyard for installed already and skip the wheel.
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("YARD_", "TRAINYARD_")) and k != "PYTHONPATH"}

pytestmark = pytest.mark.slow


def _pip(py: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(py), "-m", "pip", *args], capture_output=True, text=True, timeout=timeout, env=ENV)


def _skip_if_offline(p: subprocess.CompletedProcess, what: str) -> None:
    """Skip, with pip's own last line, when pip failed because no index had what it needed."""
    reason = next((w for w in OFFLINE if w in p.stderr), None) if p.returncode != 0 else None
    if reason:
        pytest.skip(f"pip could not get {what} from a package index ({reason}): {p.stderr.strip().splitlines()[-1]}")


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory) -> Path:
    """The wheel built from the repo and installed without extras into a fresh venv."""
    tmp = tmp_path_factory.mktemp("wheel")
    built = _pip(Path(sys.executable), "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"), str(ROOT))
    _skip_if_offline(built, "the wheel's build dependencies (setuptools, wheel)")
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("trainyard-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=ENV)
    py = venv / "bin" / "python"
    inst = _pip(py, "install", "-q", str(wheel))
    _skip_if_offline(inst, "the base dependencies")
    if inst.returncode != 0:
        pytest.fail(f"pip install {wheel.name}: exit {inst.returncode}\n{inst.stderr[-3000:]}")
    return venv


def test_the_base_wheel_pulls_no_pytorch(base_venv):
    rows = json.loads(_pip(base_venv / "bin" / "python", "list", "--format", "json").stdout)
    names = {r["name"].lower() for r in rows}
    assert "trainyard" in names and {"fastapi", "typer", "sqlalchemy"} <= names
    show = _pip(base_venv / "bin" / "python", "show", "-f", "trainyard").stdout
    assert f"Location: {base_venv}" in show and "../../../bin/yard" in show, show  # the wheel's, not src/
    assert not names & set(HEAVY), names & set(HEAVY)


def test_yard_help_up_and_queue_run_from_the_base_wheel(base_venv, tmp_path, monkeypatch):
    yard = base_venv / "bin" / "yard"
    env = ENV
    helped = subprocess.run([str(yard), "--help"], capture_output=True, text=True, timeout=120, env=env)
    assert helped.returncode == 0 and "queue" in helped.stdout, helped.stderr
    data = tmp_path / "yard"
    data.mkdir()
    config = tmp_path / "two_teams.yaml"
    config.write_text(TWO_TEAMS.read_text())
    monkeypatch.setattr(plane, "YARD", str(yard))  # YardServer starts the wheel's `yard up`, not the dev venv's
    server = YardServer(data, config_file=config, env=env)
    server.start()
    try:
        assert Path(server.proc.args[0]) == yard
        q = subprocess.run([str(yard), "queue", "-t", "all", "--json"], capture_output=True, text=True, timeout=120,
                           env={**env, "YARD_URL": server.url, "YARD_TOKEN": server.token})
        assert q.returncode == 0, q.stderr
        assert json.loads(q.stdout) == []
        assert "Traceback" not in (data / "up.log").read_text()
    finally:
        server.terminate()
