"""`--signal=[B:]SIG[@secs]` (issue 17, item 3): the job gets SIG `secs` before its time limit, so
it can checkpoint before it is stopped. Real `yard` processes against a real `yard up` on the local
backend: a job with a one-minute limit asks for its notice 50-55 s before it, traps it and exits 0
long before the limit. Malformed specs are exit 2 naming the option or the #SBATCH line."""

from __future__ import annotations

import json
import time

import pytest

from tests.cli.yard_process import job_id_of, stored, yard_process


# One worker for this module's tests under `make test`'s --dist loadgroup: its module-scoped
# yard up starts once, not once per worker (about 4 s of CPU each).
pytestmark = pytest.mark.xdist_group("cli-signal")


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    yield from yard_process(tmp_path_factory, "signal")


def ended(yard, jid: int, timeout: float = 50) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        j = json.loads(yard("show", str(jid), "--json").stdout)
        if j["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return j
        assert time.monotonic() < deadline, j  # well before the one-minute limit
        time.sleep(0.2)


TRAP = "trap 'echo \"got {sig}\"; exit 0' {sig}\nsleep 120 & wait\necho no-notice; exit 1\n"


def test_a_batch_script_gets_its_notice_before_the_time_limit(yard, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -A nlp\n#SBATCH --time=1\n#SBATCH --signal=B:USR1@55\n"
                      + TRAP.format(sig="USR1"))
    start = time.monotonic()
    jid = job_id_of(yard("submit", str(script), cwd=tmp_path))
    j = ended(yard, jid)
    log = yard("logs", str(jid)).stdout
    assert j["state"] == "COMPLETED" and "got USR1" in log, (j, log)
    assert time.monotonic() - start < 50
    events = yard("events", str(jid)).stdout
    assert "sent SIGUSR1 (--signal=B:USR1@55" in events, events


def test_a_command_gets_its_notice_given_on_the_command_line(yard):
    jid = job_id_of(yard("submit", "-A", "nlp", "--time=1", "--signal=USR2@50", "--",
                         "bash", "-c", TRAP.format(sig="USR2")))
    j = ended(yard, jid)
    log = yard("logs", str(jid)).stdout
    assert j["state"] == "COMPLETED" and "got USR2" in log, (j, log)


@pytest.mark.parametrize("value, says", [
    ("KILL@10", "SIGKILL cannot be handled"),
    ("R:USR1@10", "reservations send no notice at their end"),
    ("USR1@soon", "expected [B:]SIG[@secs]"),
    ("NOPE", "unknown signal 'NOPE'"),
    ("USR1@70000", "at most 65535"),
])
def test_a_malformed_signal_is_exit_2_naming_it_and_nothing_stored(yard, tmp_path, value, says):
    before = stored(yard)
    p = yard("submit", "-A", "nlp", f"--signal={value}", "--", "true", ok=False)
    assert p.returncode == 2 and p.stderr.startswith("error: --signal: ") and says in p.stderr, p.stderr
    script = tmp_path / "bad.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH -A nlp\n#SBATCH --signal={value}\ntrue\n")
    p = yard("submit", str(script), ok=False, cwd=tmp_path)
    assert p.returncode == 2 and f"{script}:3: --signal: " in p.stderr and says in p.stderr, p.stderr
    assert stored(yard) == before
