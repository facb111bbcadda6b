"""sbatch options refused with a reason (`cli/refused.py`: --nice, --time-min, --no-requeue), and
--requeue honoured as every job's default (issue 17, item 3). Real `yard` processes against a real
`yard up`: a refused option is exit 2, one line naming it, nothing stored, on the command line and
in `#SBATCH`; a `--requeue` job asked to requeue is requeued and runs again."""

from __future__ import annotations

import json
import time

import pytest

from tests.cli.yard_process import job_id_of, stored, yard_process


# One worker for this module's tests under `make test`'s --dist loadgroup: its module-scoped
# yard up starts once, not once per worker (about 4 s of CPU each).
pytestmark = pytest.mark.xdist_group("cli-refused-options")


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    yield from yard_process(tmp_path_factory, "refused")


@pytest.mark.parametrize("option, says", [
    ("--nice", "no place in that order yet"),
    ("--nice=10", "no place in that order yet"),
    ("--time-min=30", "does not start a job with a time limit shorter"),
    ("--no-requeue", "every job may be requeued"),
])
def test_a_refused_option_names_itself_with_the_reason(yard, tmp_path, option, says):
    name = option.partition("=")[0].split()[0]
    before = stored(yard)
    p = yard("submit", "-A", "nlp", *option.split(), "--", "true", ok=False)
    assert p.returncode == 2 and p.stderr.startswith(f"error: {name}: not supported"), p.stderr
    assert says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    script = tmp_path / "job.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH -A nlp\n#SBATCH {option}\ntrue\n")
    p = yard("submit", str(script), ok=False, cwd=tmp_path)
    assert p.returncode == 2 and f"{script}:3: {name}: not supported" in p.stderr and says in p.stderr, p.stderr
    assert stored(yard) == before


def wait(yard, jid: int, pred, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        j = json.loads(yard("show", str(jid), "--json").stdout)
        if pred(j):
            return j
        assert time.monotonic() < deadline, j
        time.sleep(0.2)


@pytest.mark.parametrize("where", ["sbatch", "command line"])
def test_requeue_is_honoured_a_requeued_job_runs_again(yard, tmp_path, where):
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -A nlp\n" + ("#SBATCH --requeue\n" if where == "sbatch" else "") +
                      "trap 'exit 75' USR1\necho \"attempt $TRAINYARD_ATTEMPT\"\n"
                      "if [ \"$TRAINYARD_ATTEMPT\" = 1 ]; then sleep 60 & wait; fi\n")
    args = (["--requeue"] if where == "command line" else []) + [str(script)]
    p = yard("submit", *args, cwd=tmp_path)
    assert "warning" not in p.stderr, p.stderr
    jid = job_id_of(p)
    wait(yard, jid, lambda j: j["state"] == "RUNNING")
    time.sleep(1)  # the trap is set
    yard("requeue", str(jid))
    j = wait(yard, jid, lambda j: j["state"] in ("COMPLETED", "FAILED", "CANCELLED"))
    assert j["state"] == "COMPLETED" and j["attempt"] == 2, j
    assert "attempt 2" in yard("logs", str(jid)).stdout
