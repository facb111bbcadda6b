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
    """A small configuration of a real architecture (transformers' Llama or Gemma classes), or a
    Hugging Face checkpoint directory on disk (`from`).

    Without `from`, weights are initialized at random from the recipe's seed. With `from`, the
    architecture, sizes, weights and tokenizer all come from that directory (`recipes/hf_checkpoint.py`),
    so the other fields would only contradict it: they are reset to their defaults (a resumed run
    is then not refused over sizes nobody uses). Nothing is downloaded either way.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True,
                              serialize_by_alias=True)

    # `from` is a Python keyword: the attribute is `from_`, the recipe key and `--set` key `from`
    from_: str | None = Field(None, alias="from", min_length=1)
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

    @model_validator(mode="before")
    @classmethod
    def _checkpoint_decides(cls, data: Any) -> Any:
        if isinstance(data, dict):
            source = data.get("from", data.get("from_"))
            if source is not None:
                return {"from": source}
        return data

    @model_validator(mode="after")
    def _shape(self) -> ModelSpec:
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads: hidden_size {self.hidden_size} is not a multiple of {self.num_heads} "
                             "(or give head_dim)")
        kv = self.num_kv_heads or self.num_heads
        if self.num_heads % kv:
            raise ValueError(f"num_kv_heads: num_heads {self.num_heads} is not a multiple of {kv}")
        return self


Task = Literal["add", "sub", "reverse"]  # the generated tasks (`data.tasks`)


def _first_task() -> list[Task]:
    return ["add"]


# a data.path that names a catalogue dataset (staging/types.dataset_var; recipes/data_sources.local_path)
DATASET_PATH_PREFIXES = ("$TRAINYARD_DATASET_", "${TRAINYARD_DATASET_")


class DataSpec(_Section):
    """Offline data. `python-stdlib`: the source text of this Python's standard library, as bytes,
    cut into windows of `seq_len` + 1 tokens (pretraining). `tasks`: generated prompt/response
    pairs with exact answers (instruction tuning, RL with a verifiable reward). `path`: the
    user's own files (`recipes/data_sources.py`), which replace `source`: documents for
    pretraining (`recipes/user_data.py`), chat `messages` for SFT and `prompt`/`answer` records
    for RL (`recipes/chat_data.py`). `path` may start with a catalogue dataset's variable
    (`$TRAINYARD_DATASET_CORPUS`, `${TRAINYARD_DATASET_CORPUS}/train`): the copy staged on each
    rank's node for a job submitted with `--dataset corpus[:VERSION]`, expanded only where the files
    are read (`data_sources.local_path`), so the recipe (and the run's recipe.yaml) keeps the variable.

    `field` defaults per kind: a recipe that does not set it reads `text` (pretrain), `messages`
    (sft) or `prompt` (rl) (`RecipeSpec` fills it in, so the run's recipe.yaml records it).

    `user_data.check_recipe(spec)`, what `yard run` calls before it starts anything, checks the
    records the recipe's kind reads (and, for SFT and RL, its tokenizer's chat template and its
    reward).
    """

    source: Literal["python-stdlib", "tasks"] = "python-stdlib"
    # the user's data: a .jsonl/.txt/.parquet file, a save_to_disk dataset or a directory of them; None: `source`
    path: str | None = Field(None, min_length=1)
    field: str = Field("text", min_length=1, max_length=200)  # pretrain: text; sft: messages; rl: prompt
    answer_field: str = Field("answer", min_length=1, max_length=200)  # rl on `path`: the reference answer
    val_fraction: float = Field(0.05, ge=0.0, lt=0.5)  # `path`: held out for eval_loss (rl: eval_reward)
    # python-stdlib; pretrain on `path`: window length; sft on `path`: the longest conversation
    # (longer ones are cut); rl on `path`: the longest prompt (longer ones are left out)
    seq_len: int = Field(256, ge=2, le=1_000_000)
    max_bytes: int = Field(8_000_000, ge=1024)
    include_tests: bool = False  # the stdlib's test/ packages (mostly test code) too
    # tasks
    tasks: list[Task] = Field(default_factory=_first_task, min_length=1)
    max_operand: int = Field(99, ge=1, le=10**9)
    word_len: int = Field(6, ge=1, le=64)  # the longest word of `reverse`
    num_samples: int = Field(50_000, ge=1, le=100_000_000)
    eval_samples: int = Field(128, ge=0, le=100_000)  # held-out prompts for greedy accuracy (rl on path: at most)


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
    # auto: fused on CUDA, foreach on CPUs (both deterministic); for-loop: one parameter at a time
    implementation: Literal["auto", "fused", "foreach", "for-loop"] = "auto"


class RLSpec(_Section):
    """GRPO: `group_size` completions per prompt, rewards normalized within each group.

    The reward (on the user's data, `data.path`; the generated tasks have their own exact
    match): `exact`, 1 when the completion, stripped, equals the record's answer; `regex` with
    `reward_pattern`, 1 when the pattern matches the completion (a pattern with a group: when
    the group's text, stripped, equals the answer; `{answer}` in the pattern stands for the
    answer, escaped); `python` with `reward_function` (`file.py:name` or `module:name`), the
    float `name(prompt, completion, answer)` returns (`recipes/rewards.py`).
    """

    group_size: int = Field(8, ge=2, le=4096)
    temperature: float = Field(1.0, gt=0, le=100)
    # None: the task's longest answer + EOS (tasks); 256 on data.path (TRL's max_completion_length)
    max_new_tokens: int | None = Field(None, ge=1, le=100_000)
    kl_coef: float = Field(0.0, ge=0)  # KL to the initial policy (k3 estimator); 0: no reference model
    normalize_std: bool = True  # divide advantages by the group's standard deviation
    reward: Literal["exact", "regex", "python"] = "exact"
    reward_pattern: str | None = Field(None, min_length=1)  # reward=regex
    reward_function: str | None = Field(None, min_length=3)  # reward=python: file.py:name or module:name

    @model_validator(mode="after")
    def _reward(self) -> RLSpec:
        if self.reward == "regex":
            if self.reward_pattern is None:
                raise ValueError("reward_pattern: rl.reward=regex needs a pattern (a match, or its group equal "
                                 "to the answer, scores 1)")
            try:
                re.compile(self.reward_pattern.replace("{answer}", "answer"))
            except re.error as e:
                raise ValueError(f"reward_pattern: not a regular expression ({e})") from None
        elif self.reward_pattern is not None:
            raise ValueError(f"reward_pattern: only with rl.reward=regex (rl.reward is {self.reward})")
        if self.reward == "python":
            if self.reward_function is None:
                raise ValueError("reward_function: rl.reward=python needs FILE.py:NAME or MODULE:NAME")
            where, colon, name = self.reward_function.rpartition(":")
            if not colon or not where or not name.isidentifier():
                raise ValueError(f"reward_function: {self.reward_function!r} is not FILE.py:NAME or MODULE:NAME")
        elif self.reward_function is not None:
            raise ValueError(f"reward_function: only with rl.reward=python (rl.reward is {self.reward})")
        return self


# data.field when a recipe does not set it
DEFAULT_FIELD = {"pretrain": "text", "sft": "messages", "rl": "prompt"}


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
    # False: periodic saves block, at exact multiples of checkpoint_every (no early asynchronous start)
    async_checkpoint: bool = True
    # the final checkpoint as a Hugging Face model dir (recipes/export.py); relative: to the run's dir
    export: str | None = Field(None, min_length=1, max_length=4096)
    # The training path (recipes/train.py, docs/recipes.md "On GPUs"): auto = what suits the device
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPUs
    # deterministic kernels, exact resume bit for bit; None: on CPUs (where it costs nothing), not on CUDA
    deterministic: bool | None = None
    tf32: bool = True  # CUDA: TF32 matmuls and convolutions for what runs in fp32
    activation_checkpoint: Literal["none", "selective", "full"] = "none"  # recipes/checkpointing.py
    compile: bool = False  # torch.compile each decoder layer (after checkpointing, before sharding)
    # DDP's find_unused_parameters; None: only where an exact resume needs it (deterministic, > 2 ranks)
    ddp_find_unused: bool | None = None
    log_every: int | None = Field(None, ge=1)  # metrics lines (a GPU sync each); None: 1 on CPUs, 10 on CUDA
    gpu_peak_tflops: float | None = Field(None, gt=0)  # the device's peak for MFU; None: known GPUs' table
    init_from: str | None = None  # sft / rl: a previous run's out dir (or checkpoint dir) to start from
    # sft / rl on tasks: greedy held-out accuracy; on data.path: eval_loss (pretrain, sft), eval_reward (rl)
    eval_every: int | None = Field(None, ge=1)
    log_samples: bool = False  # each rank appends the sample ids of every step to metrics/samples-rank<R>.jsonl
    print_every: int = Field(10, ge=1)
    watchdog_s: float | None = Field(None, gt=0)  # None: TRAINYARD_WATCHDOG_S or no watchdog
    gpus: int = Field(1, ge=1, le=100_000)  # what `yard submit --recipe` asks for when given no -G/-N

    @model_validator(mode="before")
    @classmethod
    def _field_by_kind(cls, data: Any) -> Any:
        """`data.field` not given: the kind's default (text, messages, prompt)."""
        if isinstance(data, dict) and data.get("kind") in DEFAULT_FIELD:
            section = data.get("data")
            if section is None or isinstance(section, dict):
                section = dict(section or {})
                section.setdefault("field", DEFAULT_FIELD[data["kind"]])
                data = {**data, "data": section}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> RecipeSpec:
        d = self.data
        want = "python-stdlib" if self.kind == "pretrain" else "tasks"
        if d.path is None and d.source != want:
            raise ValueError(f"data.source: a {self.kind} recipe needs data.source={want}, not {d.source}")
        if self.kind != "pretrain" and d.path is None and self.model.from_ is not None:
            what = "chat messages" if self.kind == "sft" else "prompt/answer records"
            raise ValueError(f"data.path: the generated tasks are bytes; with model.from give the {self.kind} data "
                             f"({what}: a .jsonl, .parquet or datasets directory) to tokenize with its tokenizer")
        if self.kind == "pretrain" and self.model.from_ is None and d.seq_len > self.model.max_seq_len:
            raise ValueError(f"data.seq_len: {d.seq_len} exceeds model.max_seq_len {self.model.max_seq_len}")
        if self.batch.global_batch_size > d.num_samples and self.kind != "pretrain" and d.path is None:
            raise ValueError(f"batch.global_batch_size: {self.batch.global_batch_size} exceeds "
                             f"data.num_samples {d.num_samples}")
        if self.kind == "rl" and d.path is None and self.rl.reward != "exact":
            raise ValueError(f"rl.reward: the generated tasks are scored by their exact answer; rl.reward="
                             f"{self.rl.reward} is for the user's data (data.path)")
        return self

    @model_validator(mode="after")
    def _export_dir(self) -> RecipeSpec:
        """`export` names a directory of its own (the checks that need the run dir: recipes/export.py)."""
        import os.path

        v = self.export
        if v is not None and "\x00" in v:
            raise ValueError("export: a path cannot hold a NUL character")
        norm = os.path.normpath(v) if v is not None else None
        if norm is not None and not os.path.isabs(norm) and not norm.startswith("~") and (
                norm == "." or norm.split(os.sep)[0] in ("checkpoints", "metrics", "logs")):
            raise ValueError(f"export: {v!r} is the run's own directory or in its checkpoints/, metrics/ or logs/; "
                             "name a directory of its own (a relative path is taken relative to the run's directory)")
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
        return yaml.safe_dump(self.model_dump(mode="json", by_alias=True), sort_keys=False)


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


def _keys(cls: type[BaseModel]) -> dict[str, str]:
    """The recipe keys of a section (a field's alias where it has one: `from`) → attribute names."""
    return {(info.alias or name): name for name, info in cls.model_fields.items()}


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
        keys = _keys(cls)
        if part not in keys:
            known = ", ".join(keys)
            raise RecipeError(f"unknown key {here!r}; known here: {known}", "--set")
        sub = _section_type(cls.model_fields[keys[part]].annotation)
        if i < len(parts) - 1:
            if sub is None:
                raise RecipeError(f"{here!r} is a value, not a section (no key {key!r})", "--set")
            cls = sub
        elif sub is not None:
            raise RecipeError(f"{here!r} is a section; set one of its keys ({', '.join(_keys(sub))})", "--set")
    raw = raw.strip()
    annotation = cls.model_fields[_keys(cls)[parts[-1]]].annotation
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


def absolute_paths(spec: RecipeSpec) -> list[str]:
    """`--set` items that make the recipe's local paths absolute — `init_from`, `model.from`,
    `data.path`, a `FILE.py:NAME` reward function — so that ranks started in another directory
    (the job's workdir, another node) read the same files. Empty when they already are. `export`
    stays as given: relative to the run's directory by design, as does a `data.path` that starts with
    a dataset's variable (`$TRAINYARD_DATASET_<NAME>`)."""
    out = []
    for key, value in (("init_from", spec.init_from), ("model.from", spec.model.from_), ("data.path", spec.data.path)):
        if key == "data.path" and value is not None and value.startswith(DATASET_PATH_PREFIXES):
            continue  # a catalogue dataset: each rank's node has its own copy (recipes/data_sources.local_path)
        if value is not None and str(Path(value).expanduser().resolve()) != value:
            out.append(f"{key}={Path(value).expanduser().resolve()}")
    fn = spec.rl.reward_function
    if fn and ".py:" in fn:  # a MODULE:NAME stays as it is
        file, _, name = fn.rpartition(":")
        if str(Path(file).expanduser().resolve()) != file:
            out.append(f"rl.reward_function={Path(file).expanduser().resolve()}:{name}")
    return out


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


__all__ = ["absolute_paths", "DATASET_PATH_PREFIXES", "DEFAULT_FIELD", "RecipeError", "RecipeSpec", "ModelSpec", "DataSpec", "BatchSpec", "OptimSpec",
           "RLSpec", "TOKENIZER_SIZE", "build", "configs_dir", "load_recipe", "parse_set", "recipe_path", "shipped"]
