"""The user's own data (`data.path`) for pretraining: documents tokenized once, packed, split.

The files and their order come from `data_sources` (JSON lines, text files, parquet, a
`datasets` save_to_disk directory); a document is a `.txt` file's contents or a record's
`data.field` (default `text`).

Why a token cache: tokenizing is the slow part of reading text, it must give every rank the same
tokens, and a resumed attempt must see the very tokens the first one trained on. Rank 0
tokenizes once into `<checkpoint dir>/tokens/<key>.bin` (int32, read back as a NumPy memmap, so
a corpus larger than memory is fine) plus `<key>.json`, written last (its presence marks the
cache complete); the other ranks wait and map the same file. The key is a sha256 of the data's
bytes (each file's relative path and contents), the field, the tokenizer's fingerprint (its
files' bytes, or the byte tokenizer's name) and `FORMAT`: other data or another tokenizer is
another cache, never a stale one.

Packing: each document becomes BOS + ids + EOS (where the tokenizer has them) and the documents
are concatenated; window i of `seq_len` + 1 tokens starts at token i·seq_len, as for the stdlib
corpus (`data.TokenWindows`): every token is predicted once per epoch. The last `val_fraction`
of the windows (at least one when the fraction is above 0) is held out for the evaluation loss;
the training windows are what the runtime's `ResumableSampler` orders, so exact resume and a
change of world size hold as for the shipped data.

Errors are `RecipeError`s naming the field and the file (and line): `check` runs them all without
a tokenizer, which is what `yard run` does before anything is started or written.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from trainyard.recipes.data_sources import data_digest, data_files, records
from trainyard.recipes.spec import DataSpec, RecipeError

FORMAT = "trainyard-packed-v1"
CACHE_DIR = "tokens"
BATCH_DOCS = 512  # documents per call of the tokenizer (its batch encoding is much faster than one by one)


class Tokenizer(Protocol):
    """What packing needs of a tokenizer (`ByteTokenizer`, `hf_checkpoint.HFTokenizer`)."""

    @property
    def bos(self) -> int | None: ...  # (read only: a tokenizer whose ids are ints fits)

    @property
    def eos(self) -> int | None: ...

    vocab_size: int
    fingerprint: str
    description: str

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...


class ByteTokenizer:
    """The recipes' byte tokenizer (`data.encode`) for the user's data when no checkpoint is given."""

    def __init__(self) -> None:
        from trainyard.recipes.data import BOS, EOS, VOCAB

        self.bos, self.eos, self.vocab_size = BOS, EOS, VOCAB
        self.fingerprint = "trainyard-bytes-v1"
        self.description = "bytes"

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]


# -- reading --------------------------------------------------------------------------------------------


def documents(files: list[Path], field: str) -> Iterator[str]:
    """Every document's text, in order: a `.txt` file's contents, else each record's `field`.

    Raises RecipeError naming the file and line (or row)."""
    for rec in records(files):
        if rec.text is not None:
            yield rec.text
            continue
        assert rec.row is not None
        if field not in rec.row:
            raise RecipeError(f"{rec.where}: no field {field!r}", "data.field")
        value = rec.row[field]
        if not isinstance(value, str):
            raise RecipeError(f"{rec.where}: field {field!r} is {type(value).__name__}, not a string", "data.field")
        yield value


def check(spec: DataSpec) -> int:
    """Read all of `data.path` as the pretraining trainer will (no tokenizer); the number of documents.

    Raises:
        RecipeError: a missing path, an unsupported file, bad JSON, a line without the field.
    """
    assert spec.path is not None
    n = sum(1 for _ in documents(data_files(spec.path), spec.field))
    if n == 0:
        raise RecipeError(f"{spec.path}: no documents", "data.path")
    return n


def check_recipe(spec: Any) -> int:
    """`data.path` checked as the recipe's kind reads it — documents (pretrain), or conversations
    or prompt/answer records with the chat template and the reward (`chat_data.check`) — before
    anything is started or written (`yard run`). The number of records."""
    if spec.kind != "pretrain":
        from trainyard.recipes import chat_data

        return chat_data.check(spec)
    return check(spec.data)


# -- the cache --------------------------------------------------------------------------------------------


def cache_key(spec: DataSpec, tokenizer: Tokenizer) -> tuple[str, str]:
    """(cache key, data fingerprint) for `data.path` tokenized by `tokenizer`."""
    assert spec.path is not None
    digest = data_digest(data_files(spec.path), spec.path)
    key = hashlib.sha256(f"{FORMAT}\0{digest}\0{spec.field}\0{tokenizer.fingerprint}".encode()).hexdigest()
    return key[:24], digest


def build_cache(spec: DataSpec, tokenizer: Tokenizer, directory: str | Path) -> Path:
    """Tokenize `data.path` into `directory`/<key>.bin + .json, unless done; the .json's path.

    Nothing is left behind on error (the .bin is written under a temporary name and the
    directory removed again if this call created it and it stays empty).
    """
    key, digest = cache_key(spec, tokenizer)
    d = Path(directory)
    meta_path = d / f"{key}.json"
    if meta_path.is_file():
        return meta_path
    created = not d.exists()
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{key}.bin.{os.getpid()}.tmp"
    assert spec.path is not None  # callers: the recipes on the user's data (data.path)
    files = data_files(spec.path)
    n_docs = n_tokens = 0
    max_id = -1
    try:
        with open(tmp, "wb") as out:
            batch: list[str] = []

            def flush() -> None:
                nonlocal n_docs, n_tokens, max_id
                for ids in tokenizer.encode_batch(batch):
                    row = ([tokenizer.bos] if tokenizer.bos is not None else []) + list(ids) + \
                          ([tokenizer.eos] if tokenizer.eos is not None else [])
                    arr = np.asarray(row, dtype=np.int32)
                    out.write(arr.tobytes())
                    n_docs += 1
                    n_tokens += len(arr)
                    if len(arr):
                        max_id = max(max_id, int(arr.max()))
                batch.clear()

            for text in documents(files, spec.field):
                batch.append(text)
                if len(batch) >= BATCH_DOCS:
                    flush()
            flush()
        if n_docs == 0:
            raise RecipeError(f"{spec.path}: no documents", "data.path")
        os.replace(tmp, d / f"{key}.bin")
        meta = {"format": FORMAT, "key": key, "data": str(spec.path), "data_fingerprint": digest,
                "field": spec.field, "files": len(files), "documents": n_docs, "tokens": n_tokens,
                "max_id": max_id,
                "tokenizer": tokenizer.description, "tokenizer_fingerprint": tokenizer.fingerprint}
        tmp_meta = d / f".{key}.json.tmp"
        tmp_meta.write_text(json.dumps(meta, indent=1))
        os.replace(tmp_meta, meta_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        if created and not any(d.iterdir()):
            d.rmdir()
        raise
    return meta_path


# -- packed windows --------------------------------------------------------------------------------------


class PackedTokens:
    """The cached tokens as training windows (ids 0 … len-1) and held-out validation windows.

    Same interface as `data.TokenWindows` (`len`, `batch(ids)`, `fingerprint`, `seq_len`), plus
    `eval_ids` and `meta` (the cache's record: data fingerprint, documents, tokens).
    """

    def __init__(self, meta_path: str | Path, seq_len: int, val_fraction: float) -> None:
        from trainyard.recipes.data import Fingerprint

        meta_path = Path(meta_path)
        self.meta: dict[str, Any] = json.loads(meta_path.read_text())
        n = int(self.meta["tokens"])
        self.tokens = np.memmap(meta_path.with_suffix(".bin"), dtype=np.int32, mode="r", shape=(n,))
        self.seq_len = seq_len
        windows = (n - 1) // seq_len
        n_val = 0
        if val_fraction > 0 and windows >= 2:
            n_val = max(1, int(windows * val_fraction))
        self.n = windows - n_val
        if self.n < 1:
            raise RecipeError(f"{self.meta['data']}: {n} tokens make no training window of {seq_len} + 1 tokens "
                              f"(with val_fraction {val_fraction})", "data.seq_len")
        self.eval_ids = list(range(self.n, windows))
        desc = (f"{self.meta['data']}: {self.meta['files']} file(s), {self.meta['documents']} documents, "
                f"{n} tokens ({self.meta['tokenizer']}); {len(self.eval_ids)} windows held out")
        self.fingerprint = Fingerprint(desc, self.meta["key"])

    def __len__(self) -> int:
        return self.n

    def batch(self, ids: list[int]) -> Any:
        """[len(ids), seq_len + 1] int64 (a torch tensor); `ids` may name training or held-out windows."""
        import torch

        s = self.seq_len
        return torch.from_numpy(np.stack([np.asarray(self.tokens[i * s: i * s + s + 1]) for i in ids])).long()


__all__ = ["BATCH_DOCS", "CACHE_DIR", "FORMAT", "ByteTokenizer", "PackedTokens", "Tokenizer", "build_cache",
           "cache_key", "check", "check_recipe", "data_digest", "data_files", "documents"]
