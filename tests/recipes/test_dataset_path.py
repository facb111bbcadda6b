"""A recipe on a catalogue dataset (issue 41): `data.path: $TRAINYARD_DATASET_CORPUS`.

Real files laid out as a node's cache lays them out (`<hex>/data`, a suffixless file): the variable is
expanded only where the files are read, so the recipe keeps it (`absolute_paths` leaves it alone);
an unset variable is a RecipeError naming data.path; the token cache's key is the same for two
nodes' copies of the same bytes (an attempt on other nodes resumes with the same tokens); and
`yard submit --recipe` refuses such a recipe (exit 2 naming data.path) unless the job asks for the
dataset with `--dataset`.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainyard.cli.main import app
from trainyard.recipes import data_sources as S
from trainyard.recipes import user_data as U
from trainyard.recipes.spec import DataSpec, RecipeError, absolute_paths, load_recipe

LINES = "".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(20))


def _node_copy(root, node: str) -> str:
    """A one-object dataset as node `node`'s cache holds it: `<root>/<node>/<hex>/data`."""
    entry = root / node / ("ab" * 32)
    entry.mkdir(parents=True)
    (entry / "data").write_text(LINES)
    return str(entry / "data")


def test_the_variable_is_expanded_where_the_files_are_read(tmp_path, monkeypatch):
    copy = _node_copy(tmp_path, "node-0")
    monkeypatch.setenv("TRAINYARD_DATASET_CORPUS", copy)
    assert S.local_path("$TRAINYARD_DATASET_CORPUS") == tmp_path / "node-0" / ("ab" * 32) / "data"
    monkeypatch.setenv("TRAINYARD_DATASET_SHARDS", str(tmp_path))
    assert S.local_path("${TRAINYARD_DATASET_SHARDS}/node-0") == tmp_path / "node-0"
    assert S.dataset_variable("$TRAINYARD_DATASET_CORPUSX/a") == "TRAINYARD_DATASET_CORPUSX"
    assert S.dataset_variable("$HOME/corpus") is None and S.dataset_variable("/data/$TRAINYARD_DATASET_X") is None
    assert U.check(DataSpec(path="$TRAINYARD_DATASET_CORPUS")) == 20  # the suffixless copy read as JSON lines


def test_an_unset_variable_names_data_path_and_the_dataset_to_ask_for(monkeypatch):
    monkeypatch.delenv("TRAINYARD_DATASET_MY_CORPUS", raising=False)
    with pytest.raises(RecipeError) as e:
        U.check(DataSpec(path="$TRAINYARD_DATASET_MY_CORPUS"))
    assert e.value.field == "data.path" and "--dataset my-corpus[:VERSION]" in str(e.value)


def test_the_recipe_keeps_the_variable():
    spec = load_recipe("llama-pretrain", ["data.path=$TRAINYARD_DATASET_CORPUS"])
    assert spec.data.path == "$TRAINYARD_DATASET_CORPUS" and absolute_paths(spec) == []
    assert "TRAINYARD_DATASET_CORPUS" in spec.to_yaml()


def test_two_nodes_copies_give_one_token_cache_key(tmp_path, monkeypatch):
    keys = []
    for node in ("node-0", "node-1"):
        monkeypatch.setenv("TRAINYARD_DATASET_CORPUS", _node_copy(tmp_path, node))
        keys.append(U.cache_key(DataSpec(path="$TRAINYARD_DATASET_CORPUS"), U.ByteTokenizer()))
    assert keys[0] == keys[1]
    (tmp_path / "node-1" / ("ab" * 32) / "data").write_text(LINES + '{"text": "one more"}\n')
    assert U.cache_key(DataSpec(path="$TRAINYARD_DATASET_CORPUS"), U.ByteTokenizer()) != keys[0]  # the bytes


def test_a_suffixless_file_is_read_by_its_first_bytes(tmp_path, monkeypatch):
    entry = tmp_path / "e"
    entry.mkdir()
    (entry / "data").write_text("plain text, one document\n")
    monkeypatch.setenv("TRAINYARD_DATASET_NOTES", str(entry / "data"))
    assert S.file_format(entry / "data") == ".txt"
    assert [r.text for r in S.records(S.data_files("$TRAINYARD_DATASET_NOTES"))] == ["plain text, one document\n"]
    with pytest.raises(RecipeError, match="not a supported format"):  # outside a dataset a suffix is needed
        S.data_files(entry / "data")


@pytest.mark.parametrize("asked, ok", [([], False), (["--dataset", "other:v1"], False),
                                       (["--dataset", "other,corpus:v1"], True)])
def test_submit_refuses_a_dataset_path_the_job_does_not_ask_for(asked, ok, monkeypatch):
    monkeypatch.setenv("YARD_URL", "http://127.0.0.1:9")  # no plane: the discard port refuses
    r = CliRunner().invoke(app, ["submit", "--recipe", "llama-pretrain", "-G", "1", *asked,
                                 "--set", "data.path=$TRAINYARD_DATASET_CORPUS", "--json"])
    if ok:  # past the check: the CLI then talks to a plane (none here)
        assert "data.path" not in r.output and "is `yard up` running?" in r.output
        return
    assert r.exit_code == 2, r.output
    assert "data.path: $TRAINYARD_DATASET_CORPUS" in r.output and "--dataset corpus[:VERSION]" in r.output


def test_yard_run_without_the_variable_names_data_path_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINYARD_DATASET_CORPUS", raising=False)
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", "llama-pretrain", "--out", str(out),
                                 "--set", "data.path=$TRAINYARD_DATASET_CORPUS"])
    assert r.exit_code == 2, r.output
    assert "data.path: $TRAINYARD_DATASET_CORPUS: $TRAINYARD_DATASET_CORPUS is not set here" in r.output
    assert not out.exists()


@pytest.mark.parametrize("path", ["$TRAINYARD_DATASET_corpus", "${TRAINYARD_DATASET_CORPUS", "$TRAINYARD_DATASET_X.jsonl"])
def test_submit_refuses_a_malformed_dataset_variable(path, monkeypatch):
    monkeypatch.setenv("YARD_URL", "http://127.0.0.1:9")
    r = CliRunner().invoke(app, ["submit", "--recipe", "llama-pretrain", "-G", "1", "--dataset", "corpus:v1",
                                 "--set", f"data.path={path}", "--json"])
    assert r.exit_code == 2 and f"data.path: {path} does not name a dataset's variable" in r.output, r.output
