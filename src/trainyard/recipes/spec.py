"""`RecipeSpec`: a training recipe as data, loaded from YAML, changed with `--set key=value`.

A recipe says everything a run needs and nothing about where it runs: the model (a small
configuration of a real architecture), the data, the parallelism strategy, the batch, the
optimizer, the number of steps, the checkpoint interval and the seed. The same file runs on 1, 2
or 4 processes, on CPUs or GPUs; only `yard run --nproc` or the job's placement changes.

This module imports neither torch nor transformers: the CLI validates a recipe (and reports the
field at fault) in the time it takes to read a YAML file.

`--set key=value` overrides: the key is a dotted path into the spec (`steps`,
`model.hidden_size`, `optim.lr`, `data.tasks`); the value is read as a YAML scalar or flow
collection (`24`, `3e-4`, `true`, `null`, `[add, sub]`) and then typed by the field it lands in,
so `--set steps=abc` fails as `steps: Input should be a valid integer`. A key that names no field
fails before anything else, naming the key and the keys that exist at that level.

Errors are `RecipeError(message, field)`: one line, the field path first.
"""

from __future__ import annotations

import re
import types
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# The byte-level tokenizer's size: 256 bytes + PAD, BOS, EOS (`trainyard.recipes.tokenizer`).
TOKENIZER_SIZE = 259


class RecipeError(ValueError):
    """A recipe that cannot be used: `field` is the dotted path at fault (or 'recipe', '--set')."""

    def __init__(self, message: str, field: str | None = None) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSpec(_Section):
    """A small configuration of a real architecture (transformers' Llama or Gemma classes).

    Weights are initialized at random from the recipe's seed; nothing is downloaded.
    """

    arch: Literal["llama", "gemma"] = "llama"
    vocab_size: int = Field(264, ge=TOKENIZER_SIZE, le=1_000_000)  # >= the tokenizer's 259; 264 = 8 * 33
    hidden_size: int = Field(256, ge=8, le=65536)
    intermediate_size: int = Field(688, ge=8, le=262144)
    num_layers: int = Field(4, ge=1, le=512)
    num_heads: int = Field(8, ge=1, le=1024)
    num_kv_heads: int | None = Field(None, ge=1, le=1024)  # None: = num_heads (no grouped-query attention)
    head_dim: int | None = Field(None, ge=4, le=1024)  # None: hidden_size / num_heads
    max_seq_len: int = Field(512, ge=8, le=1_000_000)
    attention_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    tie_embeddings: bool | None = None  # None: the architecture's default (Llama no, Gemma yes)
    rope_theta: float = Field(10000.0, gt=0)
    init_std: float = Field(0.02, gt=0, le=1.0)

    @model_validator(mode="after")
    def _shape(self) -> ModelSpec:
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads: hidden_size {self.hidden_size} is not a multiple of {self.num_heads} "
                             "(or give head_dim)")
        kv = self.num_kv_heads or self.num_heads
        if self.num_heads % kv:
            raise ValueError(f"num_kv_heads: num_heads {self.num_heads} is not a multiple of {kv}")
        return self


class DataSpec(_Section):
    """Offline data. `python-stdlib`: the source text of this Python's standard library, as bytes,
    cut into windows of `seq_len` + 1 tokens (pretraining). `tasks`: generated prompt/response
    pairs with exact answers (instruction tuning, RL with a verifiable reward)."""

    source: Literal["python-stdlib", "tasks"] = "python-stdlib"
    # python-stdlib
    seq_len: int = Field(256, ge=2, le=1_000_000)
    max_bytes: int = Field(8_000_000, ge=1024)
    include_tests: bool = False  # the stdlib's test/ packages (mostly test code) too
    # tasks
    tasks: list[Literal["add", "sub", "reverse"]] = Field(default_factory=lambda: ["add"], min_length=1)
    max_operand: int = Field(99, ge=1, le=10**9)
    word_len: int = Field(6, ge=1, le=64)  # the longest word of `reverse`
    num_samples: int = Field(50_000, ge=1, le=100_000_000)
    eval_samples: int = Field(128, ge=0, le=100_000)  # held-out prompts for greedy accuracy


class BatchSpec(_Section):
    global_batch_size: int = Field(32, ge=1)  # samples (pretrain, sft) or prompts (rl) per step, all ranks
    micro_batch_size: int | None = Field(None, ge=1)  # per rank and forward pass; None: the rank's whole share


class OptimSpec(_Section):
    """AdamW with linear warm-up, then cosine (or linear, or constant) decay to `min_lr_ratio` * lr."""

    lr: float = Field(3e-4, gt=0, le=10)
    weight_decay: float = Field(0.1, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    grad_clip: float | None = Field(1.0, gt=0)  # None: no clipping


class RLSpec(_Section):
    """GRPO: `group_size` completions per prompt, rewards normalized within each group."""

    group_size: int = Field(8, ge=2, le=4096)
    temperature: float = Field(1.0, gt=0, le=100)
    max_new_tokens: int | None = Field(None, ge=1, le=100_000)  # None: the task's longest answer + EOS
    kl_coef: float = Field(0.0, ge=0)  # KL to the initial policy (k3 estimator); 0: no reference model
    normalize_std: bool = True  # divide advantages by the group's standard deviation


class RecipeSpec(_Section):
    """One training recipe. See docs/recipes.md for each field's role."""

    name: str = Field("recipe", min_length=1, max_length=200)
    kind: Literal["pretrain", "sft", "rl"]
    seed: int = Field(0, ge=0, le=2**63 - 1)
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    strategy: Literal["ddp", "fsdp2"] = "ddp"
    batch: BatchSpec = Field(default_factory=BatchSpec)
    optim: OptimSpec = Field(default_factory=OptimSpec)
    rl: RLSpec = Field(default_factory=RLSpec)
    steps: int = Field(1000, ge=1, le=10**9)
    checkpoint_every: int | None = Field(100, ge=1)  # steps; None: only on preemption and at the end
    keep_last: int = Field(3, ge=1)
    precision: Literal["fp32", "bf16"] = "fp32"  # bf16: autocast on GPUs (CPUs stay fp32)
    deterministic: bool = True  # deterministic kernels: exact resume, bit for bit
    init_from: str | None = None  # sft / rl: a previous run's out dir (or checkpoint dir) to start from
    eval_every: int | None = Field(None, ge=1)  # sft / rl: greedy accuracy on held-out prompts every N steps
    log_samples: bool = False  # each rank appends the sample ids of every step to metrics/samples-rank<R>.jsonl
    print_every: int = Field(10, ge=1)
    watchdog_s: float | None = Field(None, gt=0)  # None: TRAINYARD_WATCHDOG_S or no watchdog
    gpus: int = Field(1, ge=1, le=100_000)  # what `yard submit --recipe` asks for when given no -G/-N

    @model_validator(mode="after")
    def _consistent(self) -> RecipeSpec:
        want = "python-stdlib" if self.kind == "pretrain" else "tasks"
        if self.data.source != want:
            raise ValueError(f"data.source: a {self.kind} recipe needs data.source={want}, not {self.data.source}")
        if self.kind == "pretrain" and self.data.seq_len > self.model.max_seq_len:
            raise ValueError(f"data.seq_len: {self.data.seq_len} exceeds model.max_seq_len {self.model.max_seq_len}")
        if self.batch.global_batch_size > self.data.num_samples and self.kind != "pretrain":
            raise ValueError(f"batch.global_batch_size: {self.batch.global_batch_size} exceeds "
                             f"data.num_samples {self.data.num_samples}")
        return self

    def check_world_size(self, world_size: int) -> None:
        """Raises RecipeError unless each of `world_size` ranks gets an equal, whole share."""
        gbs, mbs = self.batch.global_batch_size, self.batch.micro_batch_size
        if gbs % world_size:
            raise RecipeError(f"{gbs} is not a multiple of the {world_size} processes; every rank takes an "
                              "equal share of each global batch", "batch.global_batch_size")
        if mbs is not None and (gbs // world_size) % mbs:
            raise RecipeError(f"{mbs} does not divide a rank's share {gbs // world_size} "
                              f"(global_batch_size {gbs} / {world_size} processes)", "batch.micro_batch_size")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# -- loading -----------------------------------------------------------------------------------------


def configs_dir() -> Path:
    return Path(str(resources.files("trainyard.recipes") / "configs"))


def shipped() -> list[str]:
    """Names of the recipes that ship with trainyard."""
    return sorted(p.stem for p in configs_dir().glob("*.yaml"))


def recipe_path(ref: str) -> Path:
    """The YAML file of a shipped recipe name or of a path.

    Raises:
        RecipeError: neither a shipped name nor an existing file.
    """
    if ref in shipped():
        return configs_dir() / f"{ref}.yaml"
    p = Path(ref).expanduser()
    if p.is_file():
        return p.resolve()
    if p.suffix in (".yaml", ".yml") or "/" in ref:
        raise RecipeError(f"no such file: {ref}", "recipe")
    raise RecipeError(f"unknown recipe {ref!r}; shipped: {', '.join(shipped())} (or give a path to a YAML file)",
                      "recipe")


def _section_type(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel class a field holds (also through Optional), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        for arg in get_args(annotation):
            t = _section_type(arg)
            if t is not None:
                return t
    return None


def parse_set(item: str) -> tuple[list[str], Any]:
    """`a.b=value` → (['a', 'b'], typed-by-YAML value); checks the key against RecipeSpec.

    Raises:
        RecipeError: no `=`, an empty key part, or a key that names no field.
    """
    key, eq, raw = item.partition("=")
    key = key.strip()
    if not eq or not key:
        raise RecipeError(f"expected KEY=VALUE, got {item!r}", "--set")
    parts = key.split(".")
    cls: type[BaseModel] = RecipeSpec
    for i, part in enumerate(parts):
        here = ".".join(parts[: i + 1])
        if not part:
            raise RecipeError(f"empty part in key {key!r}", "--set")
        if part not in cls.model_fields:
            known = ", ".join(cls.model_fields)
            raise RecipeError(f"unknown key {here!r}; known here: {known}", "--set")
        sub = _section_type(cls.model_fields[part].annotation)
        if i < len(parts) - 1:
            if sub is None:
                raise RecipeError(f"{here!r} is a value, not a section (no key {key!r})", "--set")
            cls = sub
        elif sub is not None:
            raise RecipeError(f"{here!r} is a section; set one of its keys ({', '.join(sub.model_fields)})", "--set")
    raw = raw.strip()
    annotation = cls.model_fields[parts[-1]].annotation
    if annotation is str or (get_origin(annotation) in (Union, types.UnionType) and str in get_args(annotation)):
        # a string field takes the text as it is (a path may hold ': ' or '#'); null/~ clear an optional one
        nullable = type(None) in get_args(annotation)
        return parts, None if nullable and raw in ("null", "~", "") else raw
    try:
        value = yaml.safe_load(raw) if raw else None
    except yaml.YAMLError:
        value = raw  # not YAML: the field's type decides whether the plain string will do
    return parts, value


def _apply(data: dict[str, Any], parts: list[str], value: Any) -> None:
    node = data
    for p in parts[:-1]:
        nxt = node.get(p)
        if not isinstance(nxt, dict):
            nxt = {}
            node[p] = nxt
        node = nxt
    node[parts[-1]] = value


_FIELD_PREFIX = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*): (.*)", re.S)


def _describe(e: ValidationError, origin: dict[str, str]) -> str:
    """One line: `field.path: message (from --set …)` for each error."""
    msgs = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        m = _FIELD_PREFIX.fullmatch(msg)
        if m and err["type"] == "value_error":  # a cross-field check names its field: model.num_heads
            loc, msg = ".".join(x for x in (loc, m.group(1)) if x), m.group(2)
        src = next((origin[k] for k in sorted(origin, key=len, reverse=True)
                    if loc == k or loc.startswith(k + ".") or k.startswith(loc + ".")), None) if loc else None
        msgs.append(f"{loc or 'recipe'}: {msg}" + (f" (from {src})" if src else ""))
    return "; ".join(msgs)


def build(data: dict[str, Any], sets: list[str] | tuple[str, ...] = (), *, source: str = "recipe") -> RecipeSpec:
    """Validate recipe data with `--set` overrides applied. Raises RecipeError."""
    data = yaml.safe_load(yaml.safe_dump(data))  # a deep copy of plain data
    origin: dict[str, str] = {}
    for item in sets:
        parts, value = parse_set(item)
        _apply(data, parts, value)
        origin[".".join(parts)] = f"--set {item}"
    try:
        return RecipeSpec.model_validate(data)
    except ValidationError as e:
        raise RecipeError(_describe(e, origin)) from None


def load_recipe(ref: str, sets: list[str] | tuple[str, ...] = ()) -> RecipeSpec:
    """A shipped recipe (by name) or a YAML file (by path), with `--set key=value` overrides.

    Raises:
        RecipeError: unknown recipe, unreadable or malformed YAML, a bad `--set`, or a value that
            does not validate (the message names the field and, for overrides, the `--set`).
    """
    path = recipe_path(ref)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise RecipeError(f"{path}: {e.strerror or e}", "recipe") from None
    except yaml.YAMLError as e:
        raise RecipeError(f"{path}: not valid YAML ({str(e).splitlines()[0]})", "recipe") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: expected a mapping of recipe fields", "recipe")
    return build(data, sets, source=str(path))


__all__ = ["RecipeError", "RecipeSpec", "ModelSpec", "DataSpec", "BatchSpec", "OptimSpec", "RLSpec",
           "TOKENIZER_SIZE", "build", "configs_dir", "load_recipe", "parse_set", "recipe_path", "shipped"]
