"""`recipes/data_sources.py`: the user's files in every format, read the same way.

Real files written by the real libraries: a parquet file by pyarrow, a Dataset and a DatasetDict by
`datasets`' `save_to_disk`. The same documents in JSON lines, parquet and a saved dataset give the
same records, the same packed tokens (through `user_data.build_cache`) and a fingerprint that
follows the bytes; a saved dataset inside a data directory is one source; unreadable files and
missing fields are named.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from trainyard.recipes import data_sources as S
from trainyard.recipes import user_data as U
from trainyard.recipes.spec import DataSpec, RecipeError
from tests.recipes.hf_fixtures import sentences

ROWS = [{"text": s, "id": i} for i, s in enumerate(sentences(40, seed=5))]


def write_parquet(path, rows, row_group_size=16):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def save_dataset(path, rows, *, splits=None):
    import datasets

    datasets.disable_progress_bars()
    if splits is None:
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    else:
        datasets.DatasetDict({name: datasets.Dataset.from_list(r) for name, r in splits.items()}).save_to_disk(str(path))
    return path


def texts(path, field="text"):
    return list(U.documents(S.data_files(path), field))


def test_parquet_and_saved_datasets_give_the_records_of_the_jsonl(tmp_path):
    jl = tmp_path / "a.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    pq = write_parquet(tmp_path / "b.parquet", ROWS)  # three row groups: read batch by batch
    ds = save_dataset(tmp_path / "saved", ROWS)
    dd = save_dataset(tmp_path / "dict", [], splits={"train": ROWS, "test": ROWS[:3]})
    want = [r["text"] for r in ROWS]
    assert texts(jl) == texts(pq) == texts(ds) == texts(dd) == want
    recs = list(S.records(S.data_files(pq)))
    assert recs[0].row == ROWS[0] and recs[39].where == f"{pq} row 40"
    assert list(S.records(S.data_files(dd)))[0].where == f"{dd.resolve()} split train row 1"


def test_the_packed_tokens_are_the_same_whatever_the_format(tmp_path):
    from trainyard.recipes.user_data import ByteTokenizer

    tok = ByteTokenizer()
    jl = tmp_path / "jl" / "a.jsonl"
    jl.parent.mkdir()
    jl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    caches = {}
    for name, path in (("jsonl", jl), ("parquet", write_parquet(tmp_path / "pq" / "a.parquet", ROWS)),
                       ("saved", save_dataset(tmp_path / "saved", ROWS))):
        meta = json.loads(U.build_cache(DataSpec(path=str(path)), tok, tmp_path / f"cache-{name}").read_text())
        assert meta["documents"] == 40
        caches[name] = (np.fromfile(tmp_path / f"cache-{name}" / f"{meta['key']}.bin", dtype=np.int32), meta)
    assert (caches["jsonl"][0] == caches["parquet"][0]).all() and (caches["jsonl"][0] == caches["saved"][0]).all()
    # the key follows the bytes: other formats are other caches, never a stale one
    assert len({m["key"] for _, m in caches.values()}) == 3


def test_a_saved_dataset_in_a_data_directory_is_one_source(tmp_path):
    save_dataset(tmp_path / "b-saved", ROWS[:5])
    (tmp_path / "a.txt").write_text("first")
    write_parquet(tmp_path / "c" / "part.parquet", ROWS[5:7])
    sources = S.data_files(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in sources] == ["a.txt", "b-saved", "c/part.parquet"]
    assert texts(tmp_path) == ["first"] + [r["text"] for r in ROWS[:7]]
    digest = S.data_digest(sources, tmp_path)
    save_dataset(tmp_path / "b-saved", ROWS[:6])  # rewritten with one row more: another fingerprint
    assert S.data_digest(S.data_files(tmp_path), tmp_path) != digest


def test_bad_files_and_missing_fields_are_named(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 but not really")
    with pytest.raises(RecipeError, match=r"bad.parquet: not a readable parquet file") as e:
        texts(bad)
    assert e.value.field == "data.path"
    pq = write_parquet(tmp_path / "ok.parquet", [{"body": "x"}])
    with pytest.raises(RecipeError, match=r"ok.parquet row 1: no field 'text'") as e:
        texts(pq)
    assert e.value.field == "data.field"
    ds = save_dataset(tmp_path / "saved", [{"text": 3}])
    with pytest.raises(RecipeError, match=r"saved row 1: field 'text' is int, not a string"):
        texts(ds)
    dd = save_dataset(tmp_path / "dict", [], splits={"a": ROWS[:1], "b": ROWS[:1]})
    with pytest.raises(RecipeError, match=r"a DatasetDict without a 'train' split \(splits: a, b\)"):
        texts(dd)


def test_yard_run_trains_a_checkpoint_on_a_saved_dataset_and_parquet(tmp_path):
    """A user's `yard run` on a directory holding a save_to_disk dataset and a parquet file."""
    from tests.recipes.hf_fixtures import tiny_checkpoint
    from tests.recipes.helpers import metrics, yard_run

    data = tmp_path / "data"
    save_dataset(data / "wiki", ROWS[:30])
    write_parquet(data / "more.parquet", ROWS[30:])
    ckpt = tiny_checkpoint(tmp_path / "llama", "llama")
    out = tmp_path / "run"
    rc, log = yard_run("llama-pretrain", out, 1, [f"model.from={ckpt}", f"data.path={data}", "data.seq_len=16",
                                                  "batch.global_batch_size=4", "steps=3", "checkpoint_every=3",
                                                  "eval_every=3"])
    assert rc == 0, log[-3000:]
    assert "2 file(s), 40 documents" in log
    assert sorted(metrics(out)) == [1, 2, 3] and "eval_loss" in metrics(out)[3]
