"""`yard models`: the exported models of the data dir with their lineage, through the real CLI.

One tiny byte-tokenizer `yard run` (module fixture), then real `yard export` processes into a
data dir of the test's own: `--to DIR` and the default `<data dir>/models/<run id>`, both listed
by `yard models` (table and JSON) with the lineage of their trainyard.json; a model whose
directory was deleted is `missing` (its row from the record), a record that does not parse is
`damaged`, and neither makes the listing fail. Bad input is one line `error: …`, exit 2, nothing
written: an unknown NAME, a --data-dir that is a file, a bad or taken --name. A registry that
belongs to another user is not written into: an export elsewhere succeeds and says it was not
recorded, one without --to (which would go into that registry) is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.recipes.helpers import TINY_PRETRAIN, YARD, env, yard_run


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("models") / "tiny-run"
    rc, log = yard_run("llama-pretrain", out, 1, [*TINY_PRETRAIN, "steps=3", "checkpoint_every=3"])
    assert rc == 0, log[-3000:]
    return out


def yard(data: Path, *args: str, code: int = 0) -> subprocess.CompletedProcess:
    p = subprocess.run([YARD, *args], capture_output=True, text=True, timeout=180,
                       env={**env(), "YARD_DATA_DIR": str(data), "COLUMNS": "200"})
    assert p.returncode == code, (p.returncode, p.stdout[-2000:], p.stderr[-3000:])
    return p


def test_exports_are_listed_with_their_lineage_and_a_missing_one_does_not_break_the_list(run, tmp_path):
    data = tmp_path / "data"
    to = tmp_path / "somewhere" / "my-model"
    p = yard(data, "export", str(run), "--to", str(to), "--json")
    assert json.loads(p.stdout) == json.loads((to / "trainyard.json").read_text())
    assert f"registered as 'my-model' in {data / 'models'}" in p.stderr
    assert "no Hugging Face tokenizer" in p.stderr
    p = yard(data, "export", str(run))  # no --to: <data dir>/models/<run id>
    default = data / "models" / "tiny-run"
    assert f"to {default}" in p.stdout and (default / "config.json").is_file()
    assert oct((data / "models").stat().st_mode & 0o777) == "0o700"

    listed = json.loads(yard(data, "models", "--json").stdout)
    assert [(e["name"], e["state"], e["path"]) for e in listed] == [
        ("my-model", "ok", str(to)), ("tiny-run", "ok", str(default))]
    for e in listed:
        lin = e["lineage"]
        assert lin["recipe"] == "llama-pretrain" and lin["kind"] == "pretrain" and lin["step"] == 3
        assert lin["run"] == str(run) and lin["run_id"] == "tiny-run" and lin["parent_model"] is None
        assert lin["data"]["fingerprint"] and lin["exported_by"] == "yard export"
    table = yard(data, "models").stdout
    head, *rows = table.splitlines()
    assert head.split() == ["NAME", "STATE", "KIND", "RECIPE", "STEP", "EVAL", "LOSS", "PARENT", "RUN", "EXPORTED",
                            "PATH"]
    assert rows[0].split()[:5] == ["my-model", "ok", "pretrain", "llama-pretrain", "3"] and str(to) in rows[0]

    one = yard(data, "models", "my-model").stdout
    assert one.startswith(f"my-model: ok, {to}") and "  recipe: llama-pretrain" in one and "  step: 3" in one

    shutil.rmtree(to)
    (data / "models" / "junk.json").write_text("{not json")
    listed = {e["name"]: e for e in json.loads(yard(data, "models", "--json").stdout)}
    assert listed["my-model"]["state"] == "missing" and listed["my-model"]["lineage"]["step"] == 3  # the record's copy
    assert listed["junk"]["state"] == "damaged" and listed["tiny-run"]["state"] == "ok"
    rows = {r.split()[0]: r.split() for r in yard(data, "models").stdout.splitlines()[1:]}
    assert rows["my-model"][1] == "missing" and rows["junk"][1] == "damaged" and rows["tiny-run"][1] == "ok"

    # exporting again to the same place updates its record, under the same name
    yard(data, "export", str(run), "--to", str(to))
    assert [e["state"] for e in json.loads(yard(data, "models", "--json").stdout) if e["name"] == "my-model"] == ["ok"]


def test_bad_input_is_one_line_and_exit_2(run, tmp_path):
    data = tmp_path / "data"
    p = yard(data, "models", "nope", code=2)
    assert p.stderr.startswith("error: NAME: no model 'nope' in ") and len(p.stderr.splitlines()) == 1
    afile = tmp_path / "afile"
    afile.write_text("x")
    p = yard(data, "models", "--data-dir", str(afile), code=2)
    assert p.stderr == f"error: --data-dir: {afile} is not a directory\n"
    p = yard(data, "export", str(run), "--name", "../escape", code=2)
    assert p.stderr.startswith("error: --name: '../escape' is not a model name")
    assert not (data / "models").exists() and not (tmp_path / "escape").exists()

    yard(data, "export", str(run), "--to", str(tmp_path / "first"), "--name", "taken")
    p = yard(data, "export", str(run), "--to", str(tmp_path / "second"), "--name", "taken", code=2)
    assert p.stderr.startswith("error: --name: 'taken' already names ") and not (tmp_path / "second").exists()
    assert "no exported models" in yard(tmp_path / "empty", "models").stdout


def test_a_registry_of_someone_else_is_not_written_into_and_cells_are_escaped(run, tmp_path):
    data = tmp_path / "data"
    reg = data / "models"
    reg.mkdir(parents=True)
    record = {"name": "evil", "path": str(tmp_path / "gone"),
              "lineage": {"recipe": "\x1b[2Jred", "kind": "pretrain", "step": 1, "exported_at": "2026-01-01T00:00"}}
    (reg / "evil.json").write_text(json.dumps(record))
    out = yard(data, "models").stdout
    assert "\x1b" not in out and "\\x1b[2Jred" in out

    if os.geteuid() == 0:
        os.chown(reg, 65534, 65534)  # nobody's
    else:
        reg.chmod(0o500)
    try:
        p = yard(data, "export", str(run), "--to", str(tmp_path / "mine"))
        refused = yard(data, "export", str(run), code=2)  # no --to: the model would go into that registry
    finally:
        reg.chmod(0o700)
    assert refused.stderr.startswith("error: --to: not given, and the model registry cannot take the model: ")
    assert "note: not recorded in the model registry: " in p.stderr, p.stderr
    assert (tmp_path / "mine" / "model.safetensors").is_file() and sorted(f.name for f in reg.iterdir()) == ["evil.json"]
