"""Offline data for the recipes: a byte tokenizer, the stdlib corpus, generated tasks.

Nothing is fetched: pretraining reads the source text of this interpreter's standard library
(`sysconfig.get_paths()["stdlib"]`); instruction pairs and RL prompts are generated from the
recipe's seed. Every dataset is a function of (recipe, machine's Python) only, and every sample
has an id (its index), which is what `ResumableSampler` orders and what `log_samples` records.

Tokenizer: bytes. Token t < 256 is byte t; 256 = PAD, 257 = BOS, 258 = EOS. A byte tokenizer
needs no training and no files, and a small model learns it fast; the price is longer sequences
than a subword vocabulary, which does not matter at these sizes.

Why the file order is by hash of the relative path, not alphabetical: the first `max_bytes` of an
alphabetical list would be mostly `asyncio/` and `collections/`; hashing mixes the packages while
staying a fixed order on every machine with the same Python.
"""

from __future__ import annotations

import hashlib
import os
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainyard.recipes.spec import DataSpec

PAD, BOS, EOS = 256, 257, 258
VOCAB = 259


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(tokens: list[int] | torch.Tensor) -> str:
    """Bytes back to text; stops at the first EOS; PAD/BOS are dropped."""
    out = bytearray()
    for t in (tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens):
        if t == EOS:
            break
        if t < 256:
            out.append(t)
    return out.decode("utf-8", errors="replace")


class Fingerprint:
    """The dataset's identity in the checkpoint: resuming on other data is reported, not hidden."""

    def __init__(self, description: str, digest: str) -> None:
        self.description, self.digest = description, digest

    def state_dict(self) -> dict[str, Any]:
        return {"description": self.description, "digest": self.digest}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("digest") != self.digest:
            import warnings

            warnings.warn(f"this run's data ({self.description}, {self.digest}) differs from the checkpoint's "
                          f"({state.get('description')}, {state.get('digest')}): the same sample ids now mean other "
                          "text (another Python's standard library?)", RuntimeWarning, stacklevel=2)


# -- pretraining: the standard library's source ---------------------------------------------------------


def stdlib_files(include_tests: bool = False) -> list[tuple[str, Path]]:
    """(relative path, path) of the stdlib's .py files in a fixed order (sha256 of the relative path)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "__pycache__"}
    if not include_tests:
        skip |= {"test", "tests", "idle_test"}
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip]  # prune: site-packages can be huge
        for name in filenames:
            if name.endswith(".py"):
                p = Path(dirpath, name)
                rel = p.relative_to(root).as_posix()
                found.append((hashlib.sha256(rel.encode()).hexdigest(), rel, p))
    found.sort()
    return [(rel, p) for _, rel, p in found]


class TokenWindows:
    """A token stream cut into samples of `seq_len` + 1 tokens (inputs and shifted targets).

    Sample i covers tokens [i * seq_len, i * seq_len + seq_len]; consecutive samples overlap by one
    token, so every token is predicted exactly once per epoch.
    """

    def __init__(self, tokens: torch.Tensor, seq_len: int, description: str) -> None:
        self.tokens = tokens
        self.seq_len = seq_len
        self.n = (len(tokens) - 1) // seq_len
        if self.n < 1:
            raise ValueError(f"{description}: {len(tokens)} tokens make no sample of {seq_len + 1}")
        digest = hashlib.sha256(tokens.to(torch.int16).numpy().tobytes()).hexdigest()[:16]
        self.fingerprint = Fingerprint(description, digest)

    def __len__(self) -> int:
        return self.n

    def batch(self, ids: list[int]) -> torch.Tensor:
        """[len(ids), seq_len + 1] int64."""
        s = self.seq_len
        return torch.stack([self.tokens[i * s: i * s + s + 1] for i in ids]).long()


def stdlib_corpus(spec: DataSpec) -> TokenWindows:
    """The stdlib's source as bytes, each file as BOS + bytes + EOS, up to `max_bytes` bytes in all."""
    chunks: list[np.ndarray] = []
    total, nfiles = 0, 0
    for _, p in stdlib_files(spec.include_tests):
        if total >= spec.max_bytes:
            break
        try:
            raw = p.read_bytes()[: spec.max_bytes - total]
        except OSError:
            continue
        chunks += [np.array([BOS], np.int16), np.frombuffer(raw, np.uint8).astype(np.int16), np.array([EOS], np.int16)]
        total += len(raw)
        nfiles += 1
    tokens = torch.from_numpy(np.concatenate(chunks)) if chunks else torch.empty(0, dtype=torch.int16)
    desc = f"python-stdlib {sysconfig.get_python_version()}: {nfiles} files, {total} bytes"
    return TokenWindows(tokens, spec.seq_len, desc)


# -- tasks: instruction pairs and prompts with verifiable answers -----------------------------------------

LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Task:
    prompt: str
    answer: str


def make_task(kind: str, rnd: random.Random, spec: DataSpec) -> Task:
    m = spec.max_operand
    if kind == "add":
        a, b = rnd.randint(0, m), rnd.randint(0, m)
        return Task(f"{a}+{b}=", str(a + b))
    if kind == "sub":
        a, b = rnd.randint(0, m), rnd.randint(0, m)
        a, b = max(a, b), min(a, b)
        return Task(f"{a}-{b}=", str(a - b))
    if kind == "reverse":
        w = "".join(rnd.choice(LETTERS) for _ in range(rnd.randint(1, spec.word_len)))
        return Task(f"reverse {w}=", w[::-1])
    raise ValueError(f"unknown task {kind!r}")


def task_limits(spec: DataSpec) -> tuple[int, int]:
    """(longest prompt, longest answer) in characters over the task set."""
    d = len(str(spec.max_operand))
    prompt = {"add": 2 * d + 2, "sub": 2 * d + 2, "reverse": len("reverse =") + spec.word_len}
    answer = {"add": len(str(2 * spec.max_operand)), "sub": d, "reverse": spec.word_len}
    return max(prompt[t] for t in spec.tasks), max(answer[t] for t in spec.tasks)


class TaskSet:
    """Generated prompt/response pairs; sample i is a function of (seed, split, i) only.

    Layout of one sample (`prompt_len` + `answer_len` tokens): the prompt right-aligned after
    PADs, `PAD… BOS p r o m p t`, then `a n s w e r EOS PAD…`. Right-aligning the prompts makes
    every prompt end at the same position, so a batch of them is sampled from without padding
    logic; the model sees the same layout in SFT and in RL.
    """

    def __init__(self, spec: DataSpec, seed: int, split: str, size: int) -> None:
        self.spec = spec
        self.split = split
        max_p, max_a = task_limits(spec)
        self.prompt_len = max_p + 1  # + BOS
        self.answer_len = max_a + 1  # + EOS
        self.tasks: list[Task] = []
        for i in range(size):
            rnd = random.Random(f"{seed}:{split}:{i}")
            self.tasks.append(make_task(spec.tasks[i % len(spec.tasks)], rnd, spec))
        h = hashlib.sha256("\n".join(f"{t.prompt}{t.answer}" for t in self.tasks).encode()).hexdigest()[:16]
        self.fingerprint = Fingerprint(f"tasks {','.join(spec.tasks)} split {split}: {size}", h)

    def __len__(self) -> int:
        return len(self.tasks)

    def prompts(self, ids: list[int]) -> torch.Tensor:
        """[len(ids), prompt_len]: right-aligned BOS + prompt."""
        out = torch.full((len(ids), self.prompt_len), PAD, dtype=torch.long)
        for row, i in enumerate(ids):
            t = [BOS] + encode(self.tasks[i].prompt)
            out[row, self.prompt_len - len(t):] = torch.tensor(t)
        return out

    def pairs(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, loss mask) [len(ids), prompt_len + answer_len]; the mask covers answer + EOS."""
        p = self.prompts(ids)
        ans = torch.full((len(ids), self.answer_len), PAD, dtype=torch.long)
        mask = torch.zeros((len(ids), self.prompt_len + self.answer_len), dtype=torch.bool)
        for row, i in enumerate(ids):
            a = encode(self.tasks[i].answer) + [EOS]
            ans[row, : len(a)] = torch.tensor(a)
            mask[row, self.prompt_len: self.prompt_len + len(a)] = True
        return torch.cat([p, ans], dim=1), mask

    def target_tokens(self, ids: list[int]) -> int:
        """Tokens an SFT loss counts for these samples: each answer and its EOS."""
        return sum(len(encode(self.tasks[i].answer)) + 1 for i in ids)

    def reward(self, i: int, response: list[int]) -> float:
        """1.0 when the response is exactly the answer followed by EOS, else 0.0 (verifiable)."""
        want = encode(self.tasks[i].answer) + [EOS]
        return 1.0 if response[: len(want)] == want else 0.0


__all__ = ["BOS", "EOS", "PAD", "VOCAB", "Fingerprint", "Task", "TaskSet", "TokenWindows", "decode", "encode",
           "make_task", "stdlib_corpus", "stdlib_files", "task_limits"]
