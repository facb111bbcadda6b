"""A Hugging Face checkpoint directory on disk (`model.from`): checked, loaded, its tokenizer.

A team brings a model it already has: `config.json`, its weights as safetensors (one
`model.safetensors`, or shards listed by `model.safetensors.index.json`) and its tokenizer
(`tokenizer.json`, or a SentencePiece `tokenizer.model`), as `save_pretrained` writes them. The
families supported are those whose decoder the recipes train as they are (`SUPPORTED`: Llama,
Gemma, Qwen2, Mistral — `model_type` in config.json); anything else is refused up front, because
a model that loads but does not fit the trainers' assumptions (one stack of decoder layers under
`model.model.layers` for FSDP2, a plain causal-LM forward) would fail later and less clearly.

`inspect(dir)` reads only JSON and file names (no torch, no transformers), so `yard run` checks
the directory and reports the file and field at fault before any rank starts and before anything
is written to the run dir. `load_model` and `load_tokenizer` are for the ranks and the exporter;
they read local files only (`local_files_only=True`; the launcher also sets HF_HUB_OFFLINE=1).

The weights are loaded in float32 whatever their stored dtype: the recipes train in fp32 (with
bf16 autocast on GPUs), and an exact resume needs the same dtype on every attempt.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard.recipes.spec import RecipeError

if TYPE_CHECKING:  # transformers loads only where a model is built
    from transformers import PreTrainedModel

FIELD = "model.from"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
# model_type (config.json) → its transformers causal-LM class
SUPPORTED = {"llama": "LlamaForCausalLM", "gemma": "GemmaForCausalLM", "qwen2": "Qwen2ForCausalLM",
             "mistral": "MistralForCausalLM"}
# the files that make a tokenizer, as `save_pretrained` writes them (what the fingerprint and export cover)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja")


@dataclass(frozen=True)
class CheckpointInfo:
    """What `inspect` found: the parsed config and the files that hold weights and tokenizer."""

    directory: Path
    config: dict[str, Any]
    model_type: str
    weight_files: tuple[Path, ...]
    tokenizer_files: tuple[Path, ...]

    @property
    def max_positions(self) -> int | None:
        value = self.config.get("max_position_embeddings")
        return value if isinstance(value, int) else None

    def describe(self) -> str:
        c = self.config
        return (f"{self.directory.name} ({self.model_type}, hidden {c.get('hidden_size')}, "
                f"{c.get('num_hidden_layers')} layers, vocabulary {c.get('vocab_size')})")

    def tokenizer_fingerprint(self) -> str:
        """sha256 of the tokenizer's files (names and bytes): part of the token cache's key."""
        h = hashlib.sha256()
        for p in self.tokenizer_files:
            h.update(p.name.encode() + b"\0")
            h.update(p.read_bytes())
            h.update(b"\0")
        return h.hexdigest()


def _fail(message: str) -> RecipeError:
    return RecipeError(message, FIELD)


def inspect(directory: str | Path) -> CheckpointInfo:
    """Check a checkpoint directory without loading it (JSON and file names only).

    Raises:
        RecipeError (field `model.from`): no such directory, no or unreadable config.json, a
            `model_type` not in `SUPPORTED`, no weights (or a shard the index names missing),
            no tokenizer. The message names the file and, for config.json, the field.
    """
    d = Path(directory).expanduser()
    if not d.is_dir():
        raise _fail(f"{d}: no such directory (a Hugging Face checkpoint: config.json, *.safetensors, tokenizer)")
    cfg_path = d / CONFIG
    if not cfg_path.is_file():
        raise _fail(f"{cfg_path}: no such file; a Hugging Face checkpoint directory has config.json")
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise _fail(f"{cfg_path}: not readable JSON ({e})") from None
    if not isinstance(config, dict):
        raise _fail(f"{cfg_path}: expected a JSON object")
    model_type = config.get("model_type")
    if model_type not in SUPPORTED:
        shown = "missing" if model_type is None else repr(model_type)
        raise _fail(f"{cfg_path}: model_type {shown} is not supported; supported: {', '.join(sorted(SUPPORTED))}")
    index = d / WEIGHTS_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise _fail(f"{index}: not a safetensors index (no weight_map: {e})") from None
        missing = [n for n in names if not (d / n).is_file()]
        if missing or not names:
            raise _fail(f"{index}: names {missing[0] if missing else 'no shard'}, which is not in {d}")
        weights = tuple(d / n for n in names)
    elif (d / WEIGHTS).is_file():
        weights = (d / WEIGHTS,)
    else:
        raise _fail(f"{d}: no weights ({WEIGHTS}, or shards listed by {WEIGHTS_INDEX}); other formats "
                    "(pytorch_model.bin) are not read")
    tok = tuple(d / n for n in TOKENIZER_FILES if (d / n).is_file())
    if not any(p.name in ("tokenizer.json", "tokenizer.model") for p in tok):
        raise _fail(f"{d}: no tokenizer (tokenizer.json or tokenizer.model); the data is tokenized with the "
                    "checkpoint's own tokenizer")
    return CheckpointInfo(d.resolve(), config, model_type, weights, tok)


def _quiet_transformers() -> None:
    """No progress bars in the ranks' logs (one per load, per rank)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def model_class(model_type: str) -> type[PreTrainedModel]:
    import transformers

    return getattr(transformers, SUPPORTED[model_type])


def build_model(directory: str | Path, *, load_weights: bool = True) -> Any:
    """The checkpoint's causal LM in float32 on the CPU, SDPA attention, no KV cache.

    `load_weights=False` builds the architecture with random weights (the caller then loads a
    trainyard checkpoint over them: a resumed run, the exporter), skipping the read of the
    safetensors.
    """
    import torch
    from transformers import AutoConfig

    info = inspect(directory)
    _quiet_transformers()
    cls = model_class(info.model_type)
    if load_weights:
        model = cls.from_pretrained(str(info.directory), local_files_only=True, dtype=torch.float32,
                                    attn_implementation="sdpa")
    else:
        cfg = AutoConfig.from_pretrained(str(info.directory), local_files_only=True)
        cfg._attn_implementation = "sdpa"
        # (transformers' `@wraps(Module.to)` types the bound method as the unbound one)
        model = cls(cfg).to(torch.float32)  # type: ignore[arg-type]
    model.config.use_cache = False
    return model


class HFTokenizer:
    """The checkpoint's tokenizer for packing documents: ids without special tokens, and the
    BOS/EOS ids that frame each document (added here, not by the tokenizer's post-processor,
    which some tokenizers have and some do not)."""

    def __init__(self, info: CheckpointInfo) -> None:
        from transformers import AutoTokenizer

        _quiet_transformers()
        self.info = info
        self.tok = AutoTokenizer.from_pretrained(str(info.directory), local_files_only=True)
        self.bos: int | None = self.tok.bos_token_id
        self.eos: int | None = self.tok.eos_token_id
        self.vocab_size = len(self.tok)
        self.fingerprint = info.tokenizer_fingerprint()
        self.description = f"the tokenizer of {info.directory.name} ({self.vocab_size} tokens)"

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.tok(texts, add_special_tokens=False)["input_ids"]


def load_tokenizer(directory: str | Path) -> HFTokenizer:
    return HFTokenizer(inspect(directory))


__all__ = ["CONFIG", "CheckpointInfo", "HFTokenizer", "SUPPORTED", "TOKENIZER_FILES", "WEIGHTS", "WEIGHTS_INDEX",
           "build_model", "inspect", "load_tokenizer", "model_class"]
