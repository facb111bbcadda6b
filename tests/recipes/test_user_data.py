"""`recipes/user_data.py`: the user's JSON lines and text files, the token cache, the packing.

Real files and the real tokenizer (a BPE trained at test time): a line without the field is
named by file and line, a directory is read in a fixed order, the cache is built once and its key
follows the data and the tokenizer, and the packed windows are BOS + document + EOS concatenated
with the last `val_fraction` held out.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from trainyard.recipes import hf_checkpoint as H
from trainyard.recipes import user_data as U
from trainyard.recipes.spec import DataSpec, RecipeError
from tests.recipes.hf_fixtures import tiny_checkpoint, write_jsonl


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return H.load_tokenizer(tiny_checkpoint(tmp_path_factory.mktemp("hf") / "llama", "llama"))


def spec(path, **kw) -> DataSpec:
    return DataSpec(path=str(path), **kw)


def test_a_jsonl_line_without_the_field_is_named_by_file_and_line(tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_text('{"text": "one"}\n\n{"body": "two"}\n')
    with pytest.raises(RecipeError) as e:
        U.check(spec(f))
    assert e.value.field == "data.field" and str(e.value) == f"data.field: {f} line 3: no field 'text'"
    with pytest.raises(RecipeError, match="line 1: no field 'body'"):
        U.check(spec(f, field="body"))


def test_bad_json_a_non_string_field_and_unknown_formats_are_refused(tmp_path):
    f = tmp_path / "a.jsonl"
    f.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(RecipeError, match=r"a.jsonl line 2: not a JSON object"):
        U.check(spec(f))
    f.write_text('{"text": 3}\n')
    with pytest.raises(RecipeError, match="field 'text' is int, not a string"):
        U.check(spec(f))
    csv = tmp_path / "a.csv"
    csv.write_text("x")
    with pytest.raises(RecipeError, match="not a supported format"):
        U.check(spec(csv))
    with pytest.raises(RecipeError, match="no such file or directory"):
        U.check(spec(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RecipeError, match="no .jsonl, .txt, .parquet files or a datasets save_to_disk directory"):
        U.check(spec(empty))


def test_a_directory_is_read_in_the_order_of_relative_paths(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("zz")
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "aa"}) + "\n")
    (tmp_path / ".hidden.txt").write_text("no")
    (tmp_path / "notes.md").write_text("no")
    files = U.data_files(tmp_path)
    assert [f.relative_to(tmp_path).as_posix() for f in files] == ["a.jsonl", "b/z.txt"]
    assert list(U.documents(files, "text")) == ["aa", "zz"]


def test_the_cache_packs_bos_document_eos_and_is_built_once(tmp_path, tokenizer):
    data = write_jsonl(tmp_path / "data" / "train.jsonl", 60)
    (tmp_path / "data" / "notes.txt").write_text("the cluster trains the model")
    cache = tmp_path / "cache"
    meta_path = U.build_cache(spec(data.parent), tokenizer, cache)
    meta = json.loads(meta_path.read_text())
    assert meta["documents"] == 61 and meta["files"] == 2
    tokens = np.fromfile(meta_path.with_suffix(".bin"), dtype=np.int32)
    assert len(tokens) == meta["tokens"] and meta["max_id"] == tokens.max() < 400
    docs = list(U.documents(U.data_files(data.parent), "text"))
    want = []
    for ids in tokenizer.encode_batch(docs):
        want += [tokenizer.bos, *ids, tokenizer.eos]
    assert tokens.tolist() == want
    mtime = meta_path.stat().st_mtime_ns
    assert U.build_cache(spec(data.parent), tokenizer, cache) == meta_path  # reused, not rebuilt
    assert meta_path.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in cache.iterdir()) == sorted([meta_path.name, meta_path.with_suffix(".bin").name])

    # other bytes, another field name or another tokenizer: another key
    key = meta["key"]
    assert U.cache_key(spec(data.parent), U.ByteTokenizer())[0] != key
    assert U.cache_key(spec(data.parent, field="body"), tokenizer)[0] != key
    (tmp_path / "data" / "notes.txt").write_text("the cluster trains the model!")
    assert U.cache_key(spec(data.parent), tokenizer)[0] != key


def test_a_failed_build_leaves_nothing(tmp_path, tokenizer):
    f = tmp_path / "train.jsonl"
    f.write_text('{"text": "fine"}\n{"other": 1}\n')
    cache = tmp_path / "run" / "checkpoints" / "tokens"
    cache.parent.mkdir(parents=True)
    with pytest.raises(RecipeError, match="line 2"):
        U.build_cache(spec(f), tokenizer, cache)
    assert not cache.exists()


def test_packed_windows_hold_out_the_last_val_fraction(tmp_path, tokenizer):
    data = write_jsonl(tmp_path / "train.jsonl", 80)
    meta = U.build_cache(spec(data), tokenizer, tmp_path / "cache")
    packed = U.PackedTokens(meta, 16, 0.1)
    n_tokens = json.loads(meta.read_text())["tokens"]
    windows = (n_tokens - 1) // 16
    assert len(packed.eval_ids) == int(windows * 0.1) >= 1 and len(packed) + len(packed.eval_ids) == windows
    assert packed.eval_ids == list(range(len(packed), windows))
    b = packed.batch([0, 1, packed.eval_ids[-1]])
    all_tokens = np.fromfile(meta.with_suffix(".bin"), dtype=np.int32)
    assert b.shape == (3, 17) and b.dtype.is_floating_point is False
    assert b[1].tolist() == all_tokens[16:33].tolist() and b[0, -1] == b[1, 0]  # windows overlap by one token
    assert len(U.PackedTokens(meta, 16, 0.0).eval_ids) == 0
    with pytest.raises(RecipeError, match="no training window"):
        U.PackedTokens(meta, n_tokens, 0.0)


def test_the_byte_tokenizer_packs_the_user_s_text_too(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("héllo")
    meta = json.loads(U.build_cache(spec(f), U.ByteTokenizer(), tmp_path / "c").read_text())
    from trainyard.recipes.data import BOS, EOS

    tokens = np.fromfile(tmp_path / "c" / f"{meta['key']}.bin", dtype=np.int32).tolist()
    assert tokens == [BOS, *"héllo".encode(), EOS]
