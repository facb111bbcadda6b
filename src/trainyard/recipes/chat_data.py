"""The user's data for SFT and RL (`data.path` with `kind: sft` or `kind: rl`): chat
conversations and prompt/answer records, tokenized once with the model's tokenizer.

The files and their order come from `data_sources` (JSON lines, parquet, a `datasets`
save_to_disk directory; a `.txt` file has no fields and is refused here). What a record holds:

- **SFT**: `data.field` (default `messages`) is a conversation, a list of `{"role", "content"}`
  messages (other keys are passed to the template as they are), with at least one `assistant`
  message. It is rendered with the tokenizer's chat template (`apply_chat_template`); the loss is
  on the assistant turns only. Which tokens those are is found by rendering prefixes: assistant
  message k spans the text between `messages[:k]` rendered with `add_generation_prompt=True` (the
  context up to and including the assistant header) and `messages[:k+1]` rendered as is (its
  content and whatever the template closes a turn with: EOS, `<|im_end|>`, …, which the model
  must learn to emit). The whole conversation is tokenized once, as `apply_chat_template(...,
  tokenize=True)` would, and a token is a target when its first character lies in an assistant
  span (offsets from the fast tokenizer). A template that does not render a conversation as
  the sum of its prefixes (one that drops earlier turns' reasoning, say) is refused, naming the
  record. A tokenizer without a chat template is refused before anything runs.
  Conversations longer than `data.seq_len` tokens are cut to it (TRL's `max_length`); one left
  without a target token is left out (counted in the log).
- **RL**: `data.field` (default `prompt`) is a string or a list of chat messages; `data.answer_field`
  (default `answer`) the reference answer handed to the reward (a string; a number is taken as
  its text). A prompt is rendered with the chat template and its generation prompt when the
  tokenizer has one (a string as one `user` message), else as plain text after BOS. Prompts
  longer than `data.seq_len` tokens are left out (counted in the log); completions are
  `rl.max_new_tokens` long.

The caches, like `user_data`'s: rank 0 writes `<checkpoint dir>/tokens/<key>.*.bin` (NumPy
memmaps: tokens int32, per-record offsets int64, SFT's loss mask uint8 and first target
position int32, RL's prompt/answer text as JSON lines with offsets) and `<key>.json` last (the
mark of a complete cache; `yard export` reads its `field`, `documents`, `tokens`,
`data_fingerprint`). The key hashes the format, the data's bytes (`data_digest`), the field
names and the tokenizer's files — the chat template among them. `data.seq_len` is applied when
the cache is read, so another `seq_len` reuses the tokens.

The split: `data.val_fraction` of the records (at least one when above 0 and there are two or
more) are held out, chosen by a fixed hash of the record's index (splitmix64), not the file's
tail: a function of the number of records only, the same for every seed, not biased by how the
file is sorted. The held-out records give `eval_loss` (SFT) and `eval_reward` (RL); the
training records are what the runtime's `ResumableSampler` orders (sample id i = the i-th
training record), so exact resume and a change of world size hold as for the other data.

Errors are `RecipeError`s naming the field and the file and line; `check` runs every one of them
(no tokenizer needed), which is what `yard run` does before it starts a rank.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from trainyard.recipes import hf_checkpoint
from trainyard.recipes.data_sources import data_digest, data_files, records
from trainyard.recipes.spec import DataSpec, RecipeError, RecipeSpec

FORMAT = {"sft": "trainyard-chat-v1", "rl": "trainyard-prompts-v1"}
CACHE_DIR = "tokens"
TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
BATCH = 512  # records per call of the tokenizer
ROLES_TRAINED = ("assistant",)


# -- the model and its chat template -----------------------------------------------------------------------


def has_chat_template(info: hf_checkpoint.CheckpointInfo) -> bool:
    """The tokenizer has a chat template (`chat_template.jinja`, or `chat_template` in
    tokenizer_config.json, as transformers saves them); read as JSON, no transformers."""
    if (info.directory / TEMPLATE_FILE).is_file():
        return True
    try:
        cfg = json.loads((info.directory / TOKENIZER_CONFIG).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and bool(cfg.get("chat_template"))


def require_chat_template(info: hf_checkpoint.CheckpointInfo, why: str) -> None:
    if not has_chat_template(info):
        raise RecipeError(f"{info.directory / TOKENIZER_CONFIG}: no chat_template (nor {TEMPLATE_FILE} beside "
                          f"it); {why} (set tokenizer.chat_template and save_pretrained, or pick an instruct "
                          "model's tokenizer)", "model.from")


def model_of(recipe: RecipeSpec) -> hf_checkpoint.CheckpointInfo:
    """The Hugging Face checkpoint a sft/rl recipe on `data.path` trains: `model.from`, or the one
    its `init_from` run was trained from. Raises RecipeError when there is none, or both disagree."""
    from trainyard.recipes.checkpoints import resolve_init

    mine = recipe.model.from_
    if recipe.init_from:
        theirs = (resolve_init(recipe.init_from).get("model") or {}).get("from")
        if mine is not None and theirs is not None and Path(mine).resolve() != Path(theirs).resolve():
            raise RecipeError(f"{mine}, but the init_from run {recipe.init_from} was trained from {theirs}; with "
                              "init_from the model is that run's: leave model.from out", "model.from")
        if theirs is None:
            raise RecipeError(f"{recipe.init_from} was not trained from a Hugging Face checkpoint (model.from); "
                              f"a {recipe.kind} run on the user's data needs that checkpoint's tokenizer", "init_from")
        return hf_checkpoint.inspect(theirs)
    if mine is None:
        raise RecipeError(f"a {recipe.kind} recipe on the user's data (data.path) tokenizes it with a Hugging Face "
                          "checkpoint's tokenizer: give model.from=DIR, or init_from a run trained from one",
                          "model.from")
    return hf_checkpoint.inspect(mine)


# -- records -------------------------------------------------------------------------------------------------


def _no_fields(where: str, kind: str) -> RecipeError:
    return RecipeError(f"{where}: a text file has no fields; {kind} reads records (JSON lines, parquet, a datasets "
                       "directory)", "data.path")


def _messages(value: Any, where: str, field: str, *, assistant: bool) -> list[dict[str, Any]]:
    """`value` checked as a chat: a list of {role, content} with string role and content."""
    if not isinstance(value, list):
        raise RecipeError(f"{where}: field {field!r} is {type(value).__name__}, not a list of "
                          "{role, content} messages", "data.field")
    if not value:
        raise RecipeError(f"{where}: field {field!r} is an empty list of messages", "data.field")
    for j, m in enumerate(value):
        if not isinstance(m, dict):
            raise RecipeError(f"{where}: {field}[{j}] is {type(m).__name__}, not a {{role, content}} message",
                              "data.field")
        for key in ("role", "content"):
            if key not in m:
                raise RecipeError(f"{where}: {field}[{j}] has no {key!r}", "data.field")
            if not isinstance(m[key], str):
                raise RecipeError(f"{where}: {field}[{j}].{key} is {type(m[key]).__name__}, not a string",
                                  "data.field")
    if assistant and not any(m["role"] in ROLES_TRAINED for m in value):
        raise RecipeError(f"{where}: field {field!r} has no assistant message (the loss is on the assistant's "
                          "turns)", "data.field")
    return value


def conversations(files: list[Path], field: str) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(where, messages) of every record, checked. Raises RecipeError naming the file and line."""
    for rec in records(files):
        if rec.row is None:
            raise _no_fields(rec.where, "sft")
        if field not in rec.row:
            raise RecipeError(f"{rec.where}: no field {field!r}", "data.field")
        yield rec.where, _messages(rec.row[field], rec.where, field, assistant=True)


def prompt_records(files: list[Path], field: str, answer_field: str) -> Iterator[tuple[str, Any, str]]:
    """(where, prompt, answer) of every record, checked: the prompt a string or a list of
    messages, the answer a string or a number (as its text)."""
    for rec in records(files):
        if rec.row is None:
            raise _no_fields(rec.where, "rl")
        if field not in rec.row:
            raise RecipeError(f"{rec.where}: no field {field!r}", "data.field")
        prompt = rec.row[field]
        if not isinstance(prompt, str):
            if not isinstance(prompt, list):
                raise RecipeError(f"{rec.where}: field {field!r} is {type(prompt).__name__}, not a string or a list "
                                  "of {role, content} messages", "data.field")
            _messages(prompt, rec.where, field, assistant=False)
        if answer_field not in rec.row:
            raise RecipeError(f"{rec.where}: no field {answer_field!r}", "data.answer_field")
        answer = rec.row[answer_field]
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise RecipeError(f"{rec.where}: field {answer_field!r} is {type(answer).__name__}, not a string",
                              "data.answer_field")
        yield rec.where, prompt, answer if isinstance(answer, str) else str(answer)


def check(recipe: RecipeSpec, info: hf_checkpoint.CheckpointInfo | None = None) -> int:
    """Everything about a sft/rl recipe's data that can fail, before anything is written: its
    model has a tokenizer (and, for SFT, a chat template), every record has the named fields in
    the right shape, the reward names a function that exists. The number of records.

    Raises:
        RecipeError: naming the field (model.from, data.path, data.field, data.answer_field,
            rl.reward_function) and the file (and line).
    """
    d = recipe.data
    assert d.path is not None and recipe.kind in FORMAT
    info = info or model_of(recipe)
    files = data_files(d.path)
    n = 0
    if recipe.kind == "sft":
        require_chat_template(info, f"SFT renders the data's {d.field!r} with the tokenizer's chat template")
        for _ in conversations(files, d.field):
            n += 1
    else:
        templated = has_chat_template(info)
        for where, prompt, _ in prompt_records(files, d.field, d.answer_field):
            if isinstance(prompt, list) and not templated:
                require_chat_template(info, f"{where}: a prompt of chat messages is rendered with the tokenizer's "
                                            "chat template")
            n += 1
        from trainyard.recipes import rewards

        rewards.check(recipe.rl)
    if n == 0:
        raise RecipeError(f"{d.path}: no records", "data.path")
    return n


# -- rendering -------------------------------------------------------------------------------------------------


def _render(tok: Any, messages: list[dict[str, Any]], *, generation: bool) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)


def render_conversation(tok: Any, messages: list[dict[str, Any]], where: str) -> tuple[str, list[tuple[int, int]]]:
    """The conversation's text and the character spans of its assistant turns (see the module
    docstring). Raises RecipeError when the template does not render it as the sum of its prefixes."""
    text = _render(tok, messages, generation=False)
    spans = []
    for k, m in enumerate(messages):
        if m["role"] not in ROLES_TRAINED:
            continue
        before = _render(tok, messages[:k], generation=True)
        upto = text if k == len(messages) - 1 else _render(tok, messages[: k + 1], generation=False)
        if not (upto.startswith(before) and text.startswith(upto)):
            raise RecipeError(f"{where}: the chat template does not render this conversation as the sum of its "
                              f"prefixes (message {k}, {m['role']}); the assistant's tokens cannot be told apart",
                              "data.field")
        if len(upto) > len(before):
            spans.append((len(before), len(upto)))
    return text, spans


def encode_conversations(tok: Any, batch: list[tuple[str, list[dict[str, Any]]]]) -> list[tuple[list[int], list[bool]]]:
    """(token ids, loss mask) of each conversation: the whole text tokenized without adding
    special tokens (the template writes them), a token a target when it starts in an assistant span."""
    rendered = [render_conversation(tok, messages, where) for where, messages in batch]
    enc = tok([text for text, _ in rendered], add_special_tokens=False, return_offsets_mapping=True)
    out = []
    for (_, spans), ids, offsets in zip(rendered, enc["input_ids"], enc["offset_mapping"]):
        mask, j = [], 0
        for start, _ in offsets:
            while j < len(spans) and start >= spans[j][1]:
                j += 1
            mask.append(j < len(spans) and spans[j][0] <= start < spans[j][1])
        out.append((list(ids), mask))
    return out


def render_prompt(tok: Any, prompt: Any, *, templated: bool) -> str | None:
    """A prompt's text with the chat template's generation prompt, or None without a template
    (then the prompt string is encoded after BOS)."""
    if not templated:
        return None
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return _render(tok, messages, generation=True)


def encode_prompts(tokenizer: hf_checkpoint.HFTokenizer, prompts: list[Any], *, templated: bool) -> list[list[int]]:
    tok = tokenizer.tok
    if templated:
        texts = [render_prompt(tok, p, templated=True) for p in prompts]
        return [list(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]
    bos = [tokenizer.bos] if tokenizer.bos is not None else []
    return [bos + list(ids) for ids in tok(list(prompts), add_special_tokens=False)["input_ids"]]


# -- the caches ----------------------------------------------------------------------------------------------


def cache_key(kind: str, spec: DataSpec, tokenizer_fingerprint: str) -> tuple[str, str]:
    """(cache key, data fingerprint) of `data.path` for `kind`, tokenized by that tokenizer."""
    assert spec.path is not None
    digest = data_digest(data_files(spec.path), spec.path)
    fields = spec.field if kind == "sft" else f"{spec.field}\0{spec.answer_field}"
    key = hashlib.sha256(f"{FORMAT[kind]}\0{digest}\0{fields}\0{tokenizer_fingerprint}".encode()).hexdigest()
    return key[:24], digest


class _Streams:
    """Binary arrays appended under temporary names in `directory`, renamed when complete."""

    def __init__(self, directory: Path, key: str, dtypes: dict[str, Any]) -> None:
        self.directory, self.key, self.dtypes = directory, key, dtypes
        self.tmp = {name: directory / f".{key}.{name}.bin.{os.getpid()}.tmp" for name in dtypes}
        self.fh = {name: open(p, "wb") for name, p in self.tmp.items()}

    def write(self, name: str, values: Any) -> None:
        self.fh[name].write(np.asarray(values, dtype=self.dtypes[name]).tobytes())

    def close(self) -> None:
        for fh in self.fh.values():
            fh.close()

    def commit(self) -> None:
        self.close()
        for name, p in self.tmp.items():
            os.replace(p, self.directory / f"{self.key}.{name}.bin")

    def discard(self) -> None:
        self.close()
        for p in self.tmp.values():
            p.unlink(missing_ok=True)


def build_cache(kind: str, spec: DataSpec, tokenizer: hf_checkpoint.HFTokenizer, directory: str | Path) -> Path:
    """Tokenize `data.path` for `kind` (sft, rl) into `directory`, unless done; the .json's path.

    Nothing is left behind on error (temporary files removed, the directory too if this call
    created it and it stays empty)."""
    key, digest = cache_key(kind, spec, tokenizer.fingerprint)
    d = Path(directory)
    meta_path = d / f"{key}.json"
    if meta_path.is_file():
        return meta_path
    created = not d.exists()
    d.mkdir(parents=True, exist_ok=True)
    assert spec.path is not None  # callers: the recipes on the user's data (data.path)
    files = data_files(spec.path)
    templated = has_chat_template(tokenizer.info)
    if kind == "sft":
        require_chat_template(tokenizer.info, "SFT renders the data with the tokenizer's chat template")
        streams = _Streams(d, key, {"tokens": np.int32, "mask": np.uint8, "offsets": np.int64, "first": np.int32})
    else:
        streams = _Streams(d, key, {"tokens": np.int32, "offsets": np.int64, "text": np.uint8,
                                    "text_offsets": np.int64})
    n = n_tokens = n_targets = text_bytes = longest = 0
    max_id = -1
    try:
        streams.write("offsets", [0])
        if kind == "rl":
            streams.write("text_offsets", [0])

        def add(ids: list[int]) -> None:
            nonlocal n, n_tokens, max_id, longest
            streams.write("tokens", ids)
            n += 1
            n_tokens += len(ids)
            longest = max(longest, len(ids))
            streams.write("offsets", [n_tokens])
            if ids:
                max_id = max(max_id, max(ids))

        batch: list[Any] = []

        def flush() -> None:
            nonlocal n_targets, text_bytes
            if not batch:
                return
            if kind == "sft":
                for ids, mask in encode_conversations(tokenizer.tok, batch):
                    add(ids)
                    streams.write("mask", mask)
                    first = next((j for j in range(1, len(mask)) if mask[j]), -1)
                    streams.write("first", [first])
                    n_targets += sum(mask[1:])
            else:
                for (_, prompt, answer), ids in zip(batch, encode_prompts(tokenizer, [p for _, p, _ in batch],
                                                                          templated=templated)):
                    add(ids)
                    line = (json.dumps([prompt, answer], ensure_ascii=False) + "\n").encode()
                    streams.write("text", np.frombuffer(line, dtype=np.uint8))
                    text_bytes += len(line)
                    streams.write("text_offsets", [text_bytes])
            batch.clear()

        source = conversations(files, spec.field) if kind == "sft" else \
            prompt_records(files, spec.field, spec.answer_field)
        for item in source:
            if kind == "rl" and isinstance(item[1], list) and not templated:
                require_chat_template(tokenizer.info, f"{item[0]}: a prompt of chat messages needs the chat template")
            batch.append(item)
            if len(batch) >= BATCH:
                flush()
        flush()
        if n == 0:
            raise RecipeError(f"{spec.path}: no records", "data.path")
        streams.commit()
        meta = {"format": FORMAT[kind], "key": key, "kind": kind, "data": str(spec.path), "data_fingerprint": digest,
                "field": spec.field, "files": len(files), "documents": n, "tokens": n_tokens, "max_id": max_id,
                "longest": longest, "tokenizer": tokenizer.description,
                "tokenizer_fingerprint": tokenizer.fingerprint, "chat_template": templated}
        if kind == "sft":
            meta["targets"] = n_targets
        else:
            meta["answer_field"] = spec.answer_field
        tmp_meta = d / f".{key}.json.tmp"
        tmp_meta.write_text(json.dumps(meta, indent=1))
        os.replace(tmp_meta, meta_path)
    except BaseException:
        streams.discard()
        for name in streams.dtypes:
            (d / f"{key}.{name}.bin").unlink(missing_ok=True)
        if created and not any(d.iterdir()):
            d.rmdir()
        raise
    return meta_path


# -- reading the caches ----------------------------------------------------------------------------------------


def _mix(i: np.ndarray) -> np.ndarray:
    """splitmix64 of each index: a fixed pseudo-random order, the same on every machine and version."""
    with np.errstate(over="ignore"):
        z = i.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def held_out(n: int, val_fraction: float) -> np.ndarray:
    """The records held out of `n` (sorted indices): `val_fraction` of them, at least one when
    the fraction is above 0 and there are two or more, chosen by the hash of their index."""
    n_val = max(1, int(n * val_fraction)) if val_fraction > 0 and n >= 2 else 0
    return np.sort(np.argsort(_mix(np.arange(n)), kind="stable")[:n_val])


class _Cache:
    def __init__(self, meta_path: str | Path) -> None:
        from trainyard.recipes.data import Fingerprint

        self.meta_path = Path(meta_path)
        self.meta: dict[str, Any] = json.loads(self.meta_path.read_text())
        self.n_records = int(self.meta["documents"])
        key = self.meta["key"]
        self.Fingerprint = Fingerprint

        def mapped(name: str, dtype: Any, count: int) -> np.ndarray:
            if count == 0:
                return np.zeros(0, dtype=dtype)
            return np.memmap(self.meta_path.with_name(f"{key}.{name}.bin"), dtype=dtype, mode="r", shape=(count,))

        self.mapped = mapped
        self.tokens = mapped("tokens", np.int32, int(self.meta["tokens"]))
        self.offsets = np.asarray(mapped("offsets", np.int64, self.n_records + 1))
        self.lengths = np.diff(self.offsets)

    def split(self, usable: np.ndarray, val_fraction: float) -> tuple[list[int], list[int]]:
        """(training records, held-out records), each usable."""
        held = np.zeros(self.n_records, dtype=bool)
        held[held_out(self.n_records, val_fraction)] = True
        train = np.flatnonzero(~held & usable).tolist()
        evals = np.flatnonzero(held & usable).tolist()
        return train, evals

    def ids(self, r: int) -> np.ndarray:
        return np.asarray(self.tokens[self.offsets[r]: self.offsets[r + 1]])


class Conversations(_Cache):
    """The SFT cache as samples: sample i is the i-th training conversation, cut to `seq_len`.

    `batch(ids)` → (tokens [B, L] right-padded with `pad_id`, targets [B, L - 1] with -100 where
    nothing is learned); `target_tokens(ids)` counts the targets (what the loss is normalized
    by). Right padding needs no attention mask: a causal model's real tokens never see the pads
    after them. `eval_ids` are held-out record indices for `batch_records`.
    """

    def __init__(self, meta_path: str | Path, seq_len: int, val_fraction: float, pad_id: int) -> None:
        super().__init__(meta_path)
        self.seq_len, self.pad_id = seq_len, pad_id
        self.mask = self.mapped("mask", np.uint8, int(self.meta["tokens"]))
        first = np.asarray(self.mapped("first", np.int32, self.n_records))
        usable = (first >= 1) & (first < seq_len)
        self.dropped = int((~usable).sum())
        self.train, self.eval_ids = self.split(usable, val_fraction)
        if not self.train:
            raise RecipeError(f"{self.meta['data']}: no conversation with an assistant token within data.seq_len "
                              f"{seq_len} is left for training ({self.n_records} records, "
                              f"{len(self.eval_ids)} held out)", "data.seq_len")
        desc = (f"{self.meta['data']}: {self.meta['files']} file(s), {self.n_records} conversations, "
                f"{self.meta['tokens']} tokens ({self.meta['tokenizer']}, chat template); {len(self.eval_ids)} held "
                f"out" + (f"; {self.dropped} without an assistant token in {seq_len} left out" if self.dropped else ""))
        self.fingerprint = self.Fingerprint(desc, self.meta["key"])

    def __len__(self) -> int:
        return len(self.train)

    def _row(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        a = self.offsets[r]
        b = min(self.offsets[r + 1], a + self.seq_len)
        return np.asarray(self.tokens[a:b]), np.asarray(self.mask[a:b]).astype(bool)

    def batch_records(self, recs: list[int]) -> tuple[Any, Any]:
        import torch

        rows = [self._row(r) for r in recs]
        width = max(len(t) for t, _ in rows)
        tokens = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        targets = np.full((len(rows), width - 1), -100, dtype=np.int64)
        for k, (t, m) in enumerate(rows):
            tokens[k, : len(t)] = t
            targets[k, : len(t) - 1] = np.where(m[1:], t[1:], -100)
        return torch.from_numpy(tokens), torch.from_numpy(targets)

    def batch(self, ids: list[int]) -> tuple[Any, Any]:
        return self.batch_records([self.train[i] for i in ids])

    def record_targets(self, recs: list[int]) -> int:
        return int(sum(self._row(r)[1][1:].sum() for r in recs))

    def target_tokens(self, ids: list[int]) -> int:
        return self.record_targets([self.train[i] for i in ids])


class Prompts(_Cache):
    """The RL cache as samples: sample i is the i-th training prompt (at most `seq_len` tokens).

    `prompt_ids(r)`, `record(r)` → (the prompt as the data had it, the answer) of record r;
    `eval_ids` are held-out record indices.
    """

    def __init__(self, meta_path: str | Path, seq_len: int, val_fraction: float) -> None:
        super().__init__(meta_path)
        self.seq_len = seq_len
        self.text_offsets = np.asarray(self.mapped("text_offsets", np.int64, self.n_records + 1))
        self.text = self.mapped("text", np.uint8, int(self.text_offsets[-1]))
        usable = (self.lengths >= 1) & (self.lengths <= seq_len)
        self.dropped = int((~usable).sum())
        self.train, self.eval_ids = self.split(usable, val_fraction)
        if not self.train:
            raise RecipeError(f"{self.meta['data']}: no prompt of at most data.seq_len {seq_len} tokens is left for "
                              f"training (the longest is {self.meta['longest']})", "data.seq_len")
        how = "chat template" if self.meta["chat_template"] else "plain text"
        desc = (f"{self.meta['data']}: {self.meta['files']} file(s), {self.n_records} prompts, {self.meta['tokens']} "
                f"tokens ({self.meta['tokenizer']}, {how}); {len(self.eval_ids)} held out"
                + (f"; {self.dropped} longer than {seq_len} tokens left out" if self.dropped else ""))
        self.fingerprint = self.Fingerprint(desc, self.meta["key"])

    def __len__(self) -> int:
        return len(self.train)

    def prompt_ids(self, r: int) -> list[int]:
        return self.ids(r).tolist()

    def record(self, r: int) -> tuple[Any, str]:
        raw = bytes(self.text[self.text_offsets[r]: self.text_offsets[r + 1]])
        prompt, answer = json.loads(raw.decode())
        return prompt, answer

    def longest(self) -> int:
        return int(max(self.lengths[self.train + self.eval_ids]))


__all__ = ["CACHE_DIR", "FORMAT", "Conversations", "Prompts", "build_cache", "cache_key", "check", "conversations",
           "encode_conversations", "encode_prompts", "has_chat_template", "held_out", "model_of", "prompt_records",
           "render_conversation", "render_prompt", "require_chat_template"]
