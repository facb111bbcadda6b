"""Memory planning for transformer training: how many bytes one GPU needs, and how many GPUs it takes.

    ModelArch / ParamCount            what is trained (an architecture, or just a parameter count)
    get_model(name), load_hf_config(path)
    TrainSetup(strategy, precision, tp, pp, seq, micro_batch, recompute, sequence_parallel)
    memory_per_gpu(model, setup, dp) -> Breakdown      bytes on the most loaded GPU
    min_gpus(model, setup, capacity_bytes) -> Fit | None
    suggest(model, setup, capacity_bytes) -> (TrainSetup, Fit) | None

Everything here is a pure function of its arguments; the CLI (`yard plan memory`) formats it.

Model state (parameters, gradients, optimizer states) follows the ZeRO paper: Rajbhandari et al.,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020, section 3.1 and
figure 1. With mixed precision (bf16/fp16) and Adam a parameter costs 2 bytes (16-bit weight) +
2 bytes (16-bit gradient) + K = 12 bytes of optimizer state (fp32 master weight, momentum and
variance, 4 bytes each): 16 bytes. In plain fp32 it also costs 16 bytes, split differently: 4
(weight) + 4 (gradient) + 8 (momentum and variance; the weight is its own master copy). Each GPU
holds the parameters of its model-parallel shard (tensor parallel degree t, pipeline stage), and
ZeRO divides parts of that by the data-parallel degree N_d:

    DDP          (2 + 2 + K) Ψ                  P_os      2Ψ + 2Ψ + KΨ/N_d
    P_os+g       2Ψ + (2 + K)Ψ/N_d              P_os+g+p  (2 + 2 + K)Ψ/N_d   (ZeRO-3 = FSDP full shard)

Activations follow Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models", MLSys 2023 (arXiv:2205.05198), section 4 and table 2. Per transformer layer, with s the
sequence length, b the micro-batch, h the hidden size, a the attention heads, t the tensor
parallel degree, 16-bit activations and 1-byte dropout masks:

    no parallelism                         sbh (34 + 5as/h)          (eq. 1)
    tensor parallel                        sbh (10 + 24/t + 5as/ht)  (eq. 2)
    tensor + sequence parallel             sbh/t (34 + 5as/h)        (eq. 3)
    tensor parallel + selective recompute  sbh (10 + 24/t)
    tensor + sequence + selective          sbh 34/t                  (table 2)
    full recompute                         2 sbh                     (table 2: the layer input only)

The first pipeline stage of a 1F1B schedule keeps p micro-batches in flight over its L/p layers:
L layers' worth, whatever p (section 4.2.3, eq. 5). Outside the layers the paper adds the input
embedding's dropout mask, sbhp/t, and, when p = 1, the last layer norm and output projection
inputs, 4sbh/t, and the fp32 logits of the cross entropy, 4sbv/t (section 4.3, eq. 6). Those
are included here. The formulas are the paper's GPT architecture (GeLU MLP of 4h, dropout,
multi-head attention); for gated MLPs (SwiGLU/GeGLU), other MLP widths, grouped-query attention
and dropout-free models (Llama, Gemma, ...) they are an approximation of the same order.

Not included: temporary buffers (ZeRO-3 gathered layers, communication buckets), the working set
of the layer being recomputed, the CUDA context and allocator fragmentation. The caller's
capacity margin stands for those.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterable

from trainyard.plan import inventory

GB = 10**9  # the ZeRO paper's GB
GIB = 2**30

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")  # fsdp = ZeRO-3 (full shard)
PRECISIONS = ("bf16", "fp16", "fp32")
RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("sdpa", "eager")  # sdpa: PyTorch's fused attention (no stored scores), what the recipes run
ACTIVATION_MODELS = ("inventory", "paper")  # inventory: plan/inventory.py; paper: Korthikanti et al.'s formulas
STRATEGY_LABELS = {"ddp": "DDP", "zero1": "ZeRO-1 (P_os)", "zero2": "ZeRO-2 (P_os+g)",
                   "zero3": "ZeRO-3 (P_os+g+p)", "fsdp": "FSDP full shard (ZeRO-3)"}


class PlanError(ValueError):
    """A setting the planner cannot use; `field` names it (strategy, tp, pp, ...)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


class ArchError(ValueError):
    """A model description (config file) the planner cannot use; the message names file and field."""


# --- what is trained ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelArch:
    """A decoder-only transformer, enough of it to count parameters and activations.

    `gated_mlp`: SwiGLU/GeGLU (gate, up and down projections: 3 matrices) rather than two.
    `attn_bias`: "none", "qkv" (Qwen2) or "all" (q, k, v and output projection: GPT-2/3).
    `learned_positions`: rows of a learned position embedding (GPT-2/3); 0 for rotary.
    `head_dim`: None means hidden / heads (Gemma sets it apart).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied_embeddings: bool = False
    gated_mlp: bool = True
    norm: str = "rms"  # "rms" (weight only) or "layer" (weight and bias)
    attn_bias: str = "none"
    mlp_bias: bool = False
    learned_positions: int = 0
    head_dim: int | None = None
    max_positions: int | None = None
    notes: tuple[str, ...] = ()

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def norm_params(self) -> int:
        return self.hidden if self.norm == "rms" else 2 * self.hidden

    @property
    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_size, self.kv_heads * self.head_size
        attn = h * q + 2 * h * kv + q * h  # q, k, v, output projection
        if self.attn_bias in ("qkv", "all"):
            attn += q + 2 * kv
        if self.attn_bias == "all":
            attn += h
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn
        if self.mlp_bias:
            mlp += (2 if self.gated_mlp else 1) * self.ffn + h
        return attn + mlp + 2 * self.norm_params  # pre-attention and pre-MLP norms

    @property
    def embedding_params(self) -> int:
        return (self.vocab + self.learned_positions) * self.hidden

    @property
    def output_params(self) -> int:
        """The output projection (LM head); 0 when tied to the input embedding."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Exact parameter count: embeddings, layers, final norm, output projection."""
        return self.embedding_params + self.layers * self.layer_params + self.norm_params + self.output_params

    @property
    def is_gqa(self) -> bool:
        return self.kv_heads != self.heads


@dataclass(frozen=True, slots=True)
class ParamCount:
    """A model known only by its parameter count (as in the ZeRO paper's Ψ): model state only."""

    params: int
    name: str = ""

    def __post_init__(self):
        if not self.name:
            object.__setattr__(self, "name", f"{self.params:,} parameters")


Model = ModelArch | ParamCount


def _llama(name, layers, hidden, heads, kv_heads, ffn, vocab, ctx, **kw) -> ModelArch:
    return ModelArch(name, layers, hidden, heads, kv_heads, ffn, vocab, max_positions=ctx, **kw)


def _gpt(name, layers, hidden, heads, vocab, ctx) -> ModelArch:
    return ModelArch(name, layers, hidden, heads, heads, 4 * hidden, vocab, tied_embeddings=True, gated_mlp=False,
                     norm="layer", attn_bias="all", mlp_bias=True, learned_positions=ctx, max_positions=ctx)


KNOWN: dict[str, ModelArch] = {m.name: m for m in (
    _gpt("gpt2", 12, 768, 12, 50257, 1024),  # 124,439,808
    _gpt("gpt2-xl", 48, 1600, 25, 50257, 1024),  # 1,557,611,200
    _gpt("gpt3-175b", 96, 12288, 96, 50257, 2048),  # Brown et al. 2020, table 2.1
    _llama("tinyllama-1.1b", 22, 2048, 32, 4, 5632, 32000, 2048),  # 1,100,048,384
    _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),  # 6,738,415,616
    _llama("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),  # 13,015,864,320
    _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),  # 68,976,648,192 (GQA)
    _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),  # 8,030,261,248 (GQA)
    _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),  # 70,553,706,496 (GQA)
    _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768),  # 7,241,732,096 (GQA)
    _llama("gemma-2b", 18, 2048, 8, 1, 16384, 256000, 8192, tied_embeddings=True, head_dim=256),  # 2,506,172,416
    _llama("gemma-7b", 28, 3072, 16, 16, 24576, 256000, 8192, tied_embeddings=True, head_dim=256),  # 8,537,680,896
)}
ALIASES = {"llama-7b": "llama-2-7b", "llama-13b": "llama-2-13b", "llama-70b": "llama-2-70b",
           "llama2-7b": "llama-2-7b", "llama2-13b": "llama-2-13b", "llama2-70b": "llama-2-70b",
           "llama3-8b": "llama-3-8b", "llama3-70b": "llama-3-70b", "gpt3": "gpt3-175b", "gpt-3": "gpt3-175b"}


def model_names() -> list[str]:
    return sorted(KNOWN)


def get_model(name: str) -> ModelArch:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in KNOWN:
        raise PlanError("model", f"unknown model {name!r}; known: {', '.join(model_names())} "
                                 f"(or give --config PATH to an HF config.json)")
    return KNOWN[key]


def parse_param_count(text: str) -> ParamCount:
    """'7.5e9', '7.5B', '175b', '350M', '6738415616' → ParamCount."""
    t = text.strip().replace(",", "").replace("_", "")
    mult = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}.get(t[-1:].lower(), 1) if t else 1
    if mult != 1:
        t = t[:-1]
    try:
        n = round(float(t) * mult)
    except (ValueError, OverflowError):
        raise PlanError("params", f"not a parameter count: {text!r} (e.g. 7.5e9 or 7.5B)") from None
    if n < 1:
        raise PlanError("params", f"must be at least 1, got {text!r}")
    return ParamCount(n)


# --- HF-style config.json -------------------------------------------------------------------------

_ALIASES = {  # our field: the names HF configs use for it, first one preferred in messages
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head"),
    "vocab": ("vocab_size",),
    "ffn": ("intermediate_size", "n_inner", "ffn_dim"),
}
_CLASSIC_MLP = {"gpt2", "gpt_neo", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "falcon", "phi", "starcoder2"}
_ALL_BIASES = {"gpt2", "gpt_neo", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "phi", "starcoder2"}
_LEARNED_POSITIONS = {"gpt2", "gpt_neo", "gpt_bigcode", "opt"}
_TIED_BY_DEFAULT = {"gemma", "gemma2", "gpt2", "gpt_neo", "gpt_bigcode", "opt", "bloom", "phi"}
_MOE_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def load_hf_config(path: str | Path) -> ModelArch:
    """An architecture from a Hugging Face style `config.json`.

    Reads hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads (default: the
    attention heads), intermediate_size, vocab_size, tie_word_embeddings, head_dim, attention_bias,
    mlp_bias, max_position_embeddings; GPT-2 names (n_embd, n_layer, n_head, n_inner, n_positions)
    too. A directory stands for its config.json; a multimodal config's `text_config` is used when
    the top level has no hidden size. The MLP, norm and bias layout follow `model_type` (gated MLP
    and RMSNorm unless it is a GPT-2 style family). Raises ArchError naming the file and the
    missing or bad field.
    """
    p = Path(path)
    if p.is_dir():  # a model directory: its config.json
        p = p / "config.json"
    try:
        raw = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ArchError(f"{p}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ArchError(f"{p}: not UTF-8 text") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ArchError(f"{p}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(data, dict):
        raise ArchError(f"{p}: expected a JSON object, got {type(data).__name__}")
    if not any(k in data for k in _ALIASES["hidden"]) and isinstance(data.get("text_config"), dict):
        data = {"model_type": data.get("model_type"), **data["text_config"]}
    mtype = str(data.get("model_type") or "").lower()

    def bad(key: str, what: str, value) -> ArchError:
        return ArchError(f"{p}: field {key!r} {what}, got {json.dumps(value)}")

    def integer(key: str, value, minimum: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise bad(key, f"must be an integer >= {minimum}", value)
        return value

    def found(ours: str) -> int | None:
        for key in _ALIASES[ours]:
            if data.get(key) is not None:
                return integer(key, data[key])
        return None

    def get(ours: str) -> int:
        value = found(ours)
        if value is None:
            raise ArchError(f"{p}: missing field {_ALIASES[ours][0]!r}")
        return value

    for key in _MOE_FIELDS:
        if isinstance(data.get(key), int) and not isinstance(data[key], bool) and data[key] > 1:
            raise ArchError(f"{p}: field {key!r}: mixture-of-experts models are not supported")
    hidden, layers, heads, vocab = get("hidden"), get("layers"), get("heads"), get("vocab")
    ffn = found("ffn") if mtype in ("gpt2", "gpt_bigcode") else get("ffn")
    if ffn is None:  # GPT-2: n_inner null means 4 * n_embd
        ffn = 4 * hidden
    kv = data.get("num_key_value_heads")
    kv_heads = heads if kv is None else integer("num_key_value_heads", kv)
    if heads % kv_heads:
        raise bad("num_key_value_heads", f"must divide num_attention_heads ({heads})", kv)
    head_dim = None
    if data.get("head_dim") is not None:
        head_dim = integer("head_dim", data["head_dim"])
        if head_dim * heads == hidden:
            head_dim = None
    elif hidden % heads:
        raise bad(_ALIASES["heads"][0] if "num_attention_heads" in data else "n_head",
                  f"must divide the hidden size ({hidden})", heads)
    tied = data.get("tie_word_embeddings")
    notes: list[str] = []
    if "tie_word_embeddings" not in data:
        tied = mtype in _TIED_BY_DEFAULT
        notes.append(f"tie_word_embeddings absent: assumed {str(tied).lower()} for model_type {mtype or '(none)'}")
    elif not isinstance(tied, bool):
        raise bad("tie_word_embeddings", "must be true or false", tied)
    for key in ("attention_bias", "mlp_bias"):
        if key in data and not isinstance(data[key], bool):
            raise bad(key, "must be true or false", data[key])
    if "rms_norm_eps" in data:
        norm = "rms"
    elif any(k in data for k in ("layer_norm_eps", "layer_norm_epsilon", "layernorm_epsilon")):
        norm = "layer"
    else:
        norm = "layer" if mtype in _CLASSIC_MLP else "rms"
    gated = mtype not in _CLASSIC_MLP
    if mtype in _ALL_BIASES or data.get("attention_bias"):
        attn_bias = "all"
    elif mtype in ("qwen2", "qwen2_moe"):
        attn_bias = "qkv"
    else:
        attn_bias = "none"
    mlp_bias = mtype in _ALL_BIASES or bool(data.get("mlp_bias"))
    ctx = data.get("max_position_embeddings", data.get("n_positions"))
    ctx = integer("max_position_embeddings" if "max_position_embeddings" in data else "n_positions", ctx) \
        if ctx is not None else None
    learned = ctx if (mtype in _LEARNED_POSITIONS and ctx) else 0
    if mtype not in _CLASSIC_MLP and mtype not in ("llama", "mistral", "gemma", "gemma2", "qwen2", "qwen3"):
        notes.append(f"model_type {mtype or '(none)'}: assumed a Llama-style layout "
                     f"(gated MLP, {norm} norm, no biases unless attention_bias/mlp_bias)")
    name = str(data.get("_name_or_path") or (p.parent.name if p.name == "config.json" and p.parent.name else p.stem))
    return ModelArch(name, layers, hidden, heads, kv_heads, ffn, vocab, tied_embeddings=tied, gated_mlp=gated,
                     norm=norm, attn_bias=attn_bias, mlp_bias=mlp_bias, learned_positions=learned,
                     head_dim=head_dim, max_positions=ctx, notes=tuple(notes))


def arch_to_hf_config(m: ModelArch) -> dict:
    """An HF-style config dict for `m` (Llama or GPT-2 layout; what load_hf_config reads back)."""
    d = {"model_type": "llama" if m.gated_mlp else "gpt2", "hidden_size": m.hidden, "num_hidden_layers": m.layers,
         "num_attention_heads": m.heads, "num_key_value_heads": m.kv_heads, "intermediate_size": m.ffn,
         "vocab_size": m.vocab, "tie_word_embeddings": m.tied_embeddings}
    if m.head_dim:
        d["head_dim"] = m.head_dim
    if m.max_positions:
        d["max_position_embeddings"] = m.max_positions
    return d


# --- how it is trained ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TrainSetup:
    strategy: str = "ddp"
    precision: str = "bf16"
    tp: int = 1
    pp: int = 1
    seq: int = 2048
    micro_batch: int = 1
    recompute: str = "none"
    sequence_parallel: bool = True  # with tp > 1 (Megatron's sequence parallelism); no effect at tp 1
    attention: str = "sdpa"
    activation_model: str = "inventory"
    grad_accumulation: int = 1  # micro-batches per step: above 1 the gradients are live during backward

    @property
    def zero_stage(self) -> int:
        return {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}[self.strategy]

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp

    def check(self, model: Model) -> None:
        """Raise PlanError naming the setting that cannot work with this model."""
        for name, value, choices in (("strategy", self.strategy, STRATEGIES), ("precision", self.precision, PRECISIONS),
                                     ("recompute", self.recompute, RECOMPUTE), ("attention", self.attention, ATTENTION),
                                     ("activation_model", self.activation_model, ACTIVATION_MODELS)):
            if value not in choices:
                raise PlanError(name, f"{value!r} is not one of {', '.join(choices)}")
        for name in ("tp", "pp", "seq", "micro_batch", "grad_accumulation"):
            if getattr(self, name) < 1:
                raise PlanError(name, f"must be at least 1, got {getattr(self, name)}")
        if isinstance(model, ModelArch):
            if model.heads % self.tp:
                raise PlanError("tp", f"{self.tp} does not divide the {model.heads} attention heads of {model.name}")
            if model.kv_heads % self.tp and self.tp % model.kv_heads:
                raise PlanError("tp", f"{self.tp} and the {model.kv_heads} key/value heads of {model.name} "
                                      f"do not divide one another")
            if model.layers % self.pp:
                raise PlanError("pp", f"{self.pp} does not divide the {model.layers} layers of {model.name}")


# --- model state ----------------------------------------------------------------------------------


def state_bytes_per_param(precision: str) -> tuple[int, int, int]:
    """(weights, gradients, optimizer states) bytes per parameter for Adam.

    Mixed precision (bf16/fp16): 2 + 2 + 12 (fp32 master weights, momentum, variance; K = 12 in the
    ZeRO paper). fp32: 4 + 4 + 8 (momentum and variance). Both 16 bytes per parameter.
    """
    if precision not in PRECISIONS:
        raise PlanError("precision", f"{precision!r} is not one of {', '.join(PRECISIONS)}")
    return (4, 4, 8) if precision == "fp32" else (2, 2, 12)


@dataclass(frozen=True, slots=True)
class ModelState:
    parameters: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer


def model_state_bytes(params: float, strategy: str, precision: str = "bf16", dp: int = 1) -> ModelState:
    """Bytes of weights, gradients and optimizer states on one GPU holding `params` parameters
    (its model-parallel shard), with data-parallel degree `dp` (ZeRO paper, section 5.1, figure 1)."""
    if strategy not in STRATEGIES:
        raise PlanError("strategy", f"{strategy!r} is not one of {', '.join(STRATEGIES)}")
    if dp < 1:
        raise PlanError("dp", f"must be at least 1, got {dp}")
    w, g, o = state_bytes_per_param(precision)
    stage = TrainSetup(strategy=strategy).zero_stage
    return ModelState(parameters=w * params / (dp if stage >= 3 else 1),
                      gradients=g * params / (dp if stage >= 2 else 1),
                      optimizer=o * params / (dp if stage >= 1 else 1))


# --- activations ----------------------------------------------------------------------------------


def _element_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1, *, recompute: str = "none",
                               sequence_parallel: bool = True, precision: str = "bf16") -> float:
    """Activation bytes one transformer layer stores for the backward pass (Korthikanti et al. 2022).

    16-bit activations (bf16/fp16), the paper's table 2:
      none, t = 1:                 sbh (34 + 5as/h)             eq. 1
      none, tensor parallel:       sbh (10 + 24/t + 5as/ht)     eq. 2
      none, tensor + sequence:     sbh/t (34 + 5as/h)           eq. 3
      selective, tensor parallel:  sbh (10 + 24/t)
      selective, tensor + seq.:    34 sbh/t
      full:                        2 sbh                        (the layer's input)
    The 34 splits into 10 sbh replicated without sequence parallelism (two layer-norm inputs 4,
    attention and MLP inputs 2 + 2, two dropout masks 1 + 1) and 24 sbh split by tensor
    parallelism (Q, K 4, V 2, attention projection input 2, GeLU input 8, second linear input 8);
    5as²b is softmax output 2, its dropout mask 1 and dropout output 2. For fp32 the 16-bit terms
    double and the 1-byte masks stay: 18 + 48/t and 9as/h (an extension; the paper is 16-bit).
    """
    if recompute not in RECOMPUTE:
        raise PlanError("recompute", f"{recompute!r} is not one of {', '.join(RECOMPUTE)}")
    e = _element_bytes(precision)
    sbh = s * b * h
    if recompute == "full":
        return e * sbh
    replicated = (4 * e + 2) * sbh / (t if sequence_parallel else 1)  # 10 sbh (or 10 sbh / t)
    split = 12 * e * sbh / t  # 24 sbh / t
    scores = (2 * e + 1) * a * s * s * b / t  # 5 a s² b / t
    return replicated + split + (0 if recompute == "selective" else scores)


def activation_formula(setup: TrainSetup) -> str:
    """The per-layer expression evaluated for this setup (the paper's, or the inventory's in words)."""
    if setup.activation_model == "inventory":
        e = inventory.element_bytes(setup.precision)
        what = {"none": "norms, Q/K/V, attention output, MLP intermediates",
                "selective": "layer input, Q, V, attention output, MLP up and down outputs",
                "full": "layer input"}[setup.recompute]
        scores = ", softmax probabilities" if setup.attention == "eager" and setup.recompute == "none" else ""
        return f"{e} B x tokens x ({what}{scores}) [inventory]"
    tp, sp = setup.tp > 1, setup.tp > 1 and setup.sequence_parallel
    if setup.precision == "fp32":
        base = {("none", False): "sbh(66 + 9as/h)", ("none", True): "sbh(18 + 48/t + 9as/ht)",
                ("none", "sp"): "sbh/t(66 + 9as/h)", ("selective", False): "66sbh",
                ("selective", True): "sbh(18 + 48/t)", ("selective", "sp"): "66sbh/t"}
        tag = " (fp32 activations)"
    else:
        base = {("none", False): "sbh(34 + 5as/h) [eq. 1]", ("none", True): "sbh(10 + 24/t + 5as/ht) [eq. 2]",
                ("none", "sp"): "sbh/t(34 + 5as/h) [eq. 3]", ("selective", False): "34sbh [table 2]",
                ("selective", True): "sbh(10 + 24/t) [table 2]", ("selective", "sp"): "34sbh/t [table 2]"}
        tag = ""
    if setup.recompute == "full":
        return ("4sbh" if setup.precision == "fp32" else "2sbh [table 2]") + tag
    return base[(setup.recompute, "sp" if sp else tp)] + tag


def _outside_layers_bytes(m: ModelArch, setup: TrainSetup, first: bool, last: bool, in_flight: int) -> float:
    """Embedding dropout mask (first stage, sbh per micro-batch in flight) and, on the last stage,
    the final norm and output projection inputs (4 sbh) and the fp32 logits (4 sbv): eq. 6."""
    s, b, h, t = setup.seq, setup.micro_batch, m.hidden, setup.tp
    ts = t if setup.sequence_parallel else 1
    total = 0.0
    if first:
        total += s * b * h * in_flight / ts
    if last:
        total += 2 * _element_bytes(setup.precision) * s * b * h / ts + 4 * s * b * m.vocab / t
    return total


# --- per GPU --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Bytes on the most loaded GPU of a setup at data-parallel degree dp.

    `parameters`, `gradients`, `optimizer` are the model state (the ZeRO paper's terms);
    `activations` what backward keeps (None: no architecture). With the inventory model the
    total is the largest of the step's moments (`moments`, `moment`): `loss` (the loss's
    temporaries at the start of backward), `working_set` (one layer's backward) and `buffers`
    (FSDP's gathered units, DDP's buckets) are counted at the moments they exist, and the
    gradients only where they are live. With the paper's model (or a bare parameter count) the
    total is model state + activations, as before.
    """

    model: str
    setup: TrainSetup
    dp: int
    stage: str  # "all" (no pipeline), "first" or "last" pipeline stage, "each" (bare count, even split)
    shard_params: float  # parameters of this GPU's model-parallel shard (before any ZeRO sharding)
    parameters: float
    gradients: float
    optimizer: float
    activations: float | None  # None: no architecture (a bare parameter count)
    layers_in_flight: float = 0.0  # layers' worth of activations stored (L on the first stage)
    loss: float = 0.0
    working_set: float = 0.0
    buffers: float = 0.0
    moments: tuple[tuple[str, float], ...] = ()  # (moment, bytes live then); empty: model state + activations

    @property
    def gpus(self) -> int:
        return self.dp * self.setup.model_parallel

    @property
    def model_state(self) -> float:
        return self.parameters + self.gradients + self.optimizer

    @property
    def moment(self) -> str:
        """When the step peaks: 'start of backward', 'layer backward', 'optimizer step' ('' : a sum)."""
        return max(self.moments, key=lambda m: m[1])[0] if self.moments else ""

    @property
    def total(self) -> float:
        if self.moments:
            return max(v for _, v in self.moments)
        return self.model_state + (self.activations or 0.0)


def _layer_shape(m: ModelArch) -> inventory.LayerShape:
    return inventory.LayerShape(hidden=m.hidden, q_width=m.heads * m.head_size, kv_width=m.kv_heads * m.head_size,
                                heads=m.heads, ffn=m.ffn, gated_mlp=m.gated_mlp, rms_norm=m.norm == "rms")


def _per_layer(m: ModelArch, setup: TrainSetup) -> float:
    """Activation bytes one layer stores for one micro-batch, in the setup's activation model."""
    if setup.activation_model == "paper":
        return activation_bytes_per_layer(setup.seq, setup.micro_batch, m.hidden, m.heads, setup.tp,
                                          recompute=setup.recompute, sequence_parallel=setup.sequence_parallel,
                                          precision=setup.precision)
    return setup.seq * setup.micro_batch * inventory.saved_per_token(
        _layer_shape(m), setup.recompute, e=inventory.element_bytes(setup.precision), t=setup.tp,
        sp=setup.sequence_parallel, attention=setup.attention, seq=setup.seq)


def layer_activation_bytes(m: ModelArch, setup: TrainSetup) -> float:
    """Activation bytes one layer stores for one micro-batch (inventory or paper model)."""
    setup.check(m)
    return _per_layer(m, setup)


def _stage_params(m: ModelArch, setup: TrainSetup) -> list[tuple[str, float, float, bool, bool]]:
    """(stage, parameters on one GPU before ZeRO, layers' worth of activations, first, last) per stage."""
    t, p, L = setup.tp, setup.pp, m.layers
    if p == 1:
        return [("all", m.params / t, float(L), True, True)]
    lp = L // p
    # 1F1B: the first stage has p micro-batches in flight over L/p layers (= L layers' worth), the
    # last stage one. Megatron keeps a copy of a tied word embedding on the last stage for the output.
    first = (m.embedding_params + lp * m.layer_params) / t
    last = (lp * m.layer_params + m.norm_params + m.vocab * m.hidden) / t
    return [("first", first, float(L), True, False), ("last", last, float(lp), False, True)]


def _stages(model: Model, setup: TrainSetup) -> list[tuple[str, float, float | None, float]]:
    """(stage, parameters on one GPU of it before ZeRO, activation bytes, layers' worth) per candidate stage."""
    if isinstance(model, ParamCount):
        return [("all" if setup.pp == 1 else "each", model.params / (setup.tp * setup.pp), None, 0.0)]
    per_layer = _per_layer(model, setup)
    out: list[tuple[str, float, float | None, float]] = []
    for stage, shard, layers, first, last in _stage_params(model, setup):
        in_flight = setup.pp if first else 1
        if setup.activation_model == "paper":
            acts = layers * per_layer + _outside_layers_bytes(model, setup, first, last, in_flight)
        else:
            e = inventory.element_bytes(setup.precision)
            norm = inventory.final_norm_per_token(_layer_shape(model), e=e, t=setup.tp, sp=setup.sequence_parallel)
            acts = layers * per_layer + (setup.seq * setup.micro_batch * norm if last else 0.0)
        out.append((stage, shard, acts, layers))
    return out


def _moments(model: ModelArch, setup: TrainSetup, dp: int, stage: str, shard: float, st: ModelState,
             acts: float) -> tuple[float, float, float, tuple[tuple[str, float], ...]]:
    """(loss temporaries, layer working set, buffers at the start of backward, moments) of a stage."""
    t, tokens = setup.tp, setup.seq * setup.micro_batch
    e = inventory.element_bytes(setup.precision)
    last = stage in ("all", "last")
    first = stage in ("all", "first")
    shape = _layer_shape(model)
    loss = tokens * inventory.loss_per_token(model.vocab, t=t) if last else 0.0
    ws = tokens * inventory.working_set_per_token(shape, setup.recompute, e=e, t=t, sp=setup.sequence_parallel,
                                                 attention=setup.attention, seq=setup.seq)
    w, g, _ = state_bytes_per_param(setup.precision)
    layer = model.layer_params / t
    root = ((model.embedding_params if first else 0)
            + ((model.norm_params + (model.vocab * model.hidden if setup.pp > 1 else model.output_params))
               if last else 0)) / t
    buf_start = buf_layer = buf_step = 0.0
    if dp > 1 and setup.zero_stage == 3:  # FSDP: full-size gathered units in the parameter dtype
        buf_start = w * (root + layer)
        buf_layer = w * (root + 2 * layer) + (w + (inventory.FP32 if w < inventory.FP32 else 0)) * layer
    elif dp > 1 and setup.strategy == "ddp":  # DDP's buckets: a second copy of the gradients
        buf_start = buf_layer = buf_step = g * shard
    grads_acc = st.gradients if setup.grad_accumulation > 1 else 0.0
    head = (model.norm_params + model.output_params) / t if last else 0.0
    grads_head = g * head / (dp if setup.zero_stage >= 2 else 1)
    # foreach/fused AdamW (the recipes' defaults) make about one fp32 temporary of what it updates
    opt_tmp = inventory.FP32 * shard / (dp if setup.zero_stage >= 1 else 1)
    base = st.parameters + st.optimizer
    moments = (("start of backward", base + grads_acc + acts + loss + buf_start),
               ("layer backward", base + max(grads_acc, grads_head) + acts + ws + buf_layer),
               ("optimizer step", base + st.gradients + opt_tmp + buf_step))
    return loss, ws, buf_start, moments


def _per_stage(model: Model, setup: TrainSetup, dp: int) -> list[Breakdown]:
    setup.check(model)
    if dp < 1:
        raise PlanError("dp", f"must be at least 1, got {dp}")
    out = []
    for stage, shard, acts, inflight in _stages(model, setup):
        st = model_state_bytes(shard, setup.strategy, setup.precision, dp)
        extra: dict = {}
        if isinstance(model, ModelArch) and setup.activation_model == "inventory":
            loss, ws, buffers, moments = _moments(model, setup, dp, stage, shard, st, acts or 0.0)
            extra = {"loss": loss, "working_set": ws, "buffers": buffers, "moments": moments}
        out.append(Breakdown(model.name, setup, dp, stage, shard, st.parameters, st.gradients, st.optimizer, acts,
                             inflight, **extra))
    return out


def memory_per_gpu(model: Model, setup: TrainSetup, dp: int = 1) -> Breakdown:
    """Bytes on the most loaded GPU (the pipeline stage with the largest total) at data-parallel degree dp."""
    return max(_per_stage(model, setup, dp), key=lambda b: b.total)


# --- how many GPUs --------------------------------------------------------------------------------


def usable_bytes(gpu_mem_gib: float, margin: float = 0.10) -> float:
    """What the planner lets a GPU of `gpu_mem_gib` GiB hold: the rest is the margin (CUDA context,
    allocator fragmentation, communication buffers)."""
    if not gpu_mem_gib > 0:
        raise PlanError("gpu_mem", f"must be positive, got {gpu_mem_gib}")
    if not 0 <= margin < 1:
        raise PlanError("margin", f"must be in [0, 1), got {margin}")
    return gpu_mem_gib * GIB * (1 - margin)


@dataclass(frozen=True, slots=True)
class Fit:
    dp: int
    gpus: int
    nodes: int
    breakdown: Breakdown


_UNBOUNDED_DP = 10**15  # a data-parallel degree at which whatever ZeRO shards is as good as gone


def unsharded_bytes(model: Model, setup: TrainSetup) -> float:
    """The per-GPU bytes no data-parallel degree removes (the limit as dp grows), on the worst stage."""
    setup.check(model)
    return memory_per_gpu(model, setup, _UNBOUNDED_DP).total


def min_gpus(model: Model, setup: TrainSetup, capacity: float, gpus_per_node: int = 8) -> Fit | None:
    """The smallest data-parallel degree (GPUs = dp × tp × pp) whose per-GPU total fits in
    `capacity` bytes, or None if none does (what ZeRO does not shard is already too big).

    One process needs no data-parallel wrapper (no gathered units, no buckets), so dp = 1 is tried
    first; from dp = 2 on every moment of the step is A + B/dp (A what the strategy keeps whole, B
    what it shards), which never grows with dp: the smallest dp is found by doubling, then
    bisection.
    """
    if gpus_per_node < 1:
        raise PlanError("gpus_per_node", f"must be at least 1, got {gpus_per_node}")
    setup.check(model)

    def fits(dp: int) -> bool:
        return memory_per_gpu(model, setup, dp).total <= capacity

    if fits(1):
        dp = 1
    else:
        floor = unsharded_bytes(model, setup)
        if floor >= capacity:
            return None
        lo, hi = 1, 2  # fits(lo) is False, fits(hi) is what the doubling looks for
        while not fits(hi):
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(mid) else (mid, hi)
        dp = hi
    gpus = dp * setup.model_parallel
    return Fit(dp, gpus, math.ceil(gpus / gpus_per_node), memory_per_gpu(model, setup, dp))


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def candidate_setups(model: Model, setup: TrainSetup, gpus_per_node: int = 8, *,
                     strategies_only: bool = False) -> Iterable[TrainSetup]:
    """Variations of `setup` to try when it does not fit: other strategies; then also other
    recompute modes, tensor parallel degrees up to a node (powers of two) and pipeline degrees."""
    strategies = ("ddp", "zero1", "zero2", "zero3")
    if strategies_only:
        for s in strategies:
            yield replace(setup, strategy=s)
        return
    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= max(1, gpus_per_node)]
    if isinstance(model, ModelArch):
        pps = _divisors(model.layers, 32)
    else:
        pps = [1, 2, 4, 8, 16, 32]
    for s in strategies:
        for r in RECOMPUTE:
            for t in tps:
                for p in pps:
                    cand = replace(setup, strategy=s, recompute=r, tp=t, pp=p)
                    try:
                        cand.check(model)
                    except PlanError:
                        continue
                    yield cand


def suggest(model: Model, setup: TrainSetup, capacity: float,
            gpus_per_node: int = 8) -> tuple[TrainSetup, Fit] | None:
    """A setup that fits: the strategy alone changed if that is enough (fewest GPUs), otherwise the
    fewest GPUs over strategies, recompute and tensor/pipeline degrees (ties: less recompute, less
    model parallelism, lower ZeRO stage)."""
    rank = {r: i for i, r in enumerate(RECOMPUTE)}
    for strategies_only in (True, False):
        best = None
        for cand in candidate_setups(model, setup, gpus_per_node, strategies_only=strategies_only):
            if cand == setup:
                continue
            fit = min_gpus(model, cand, capacity, gpus_per_node)
            if fit is None:
                continue
            key = (fit.gpus, rank[cand.recompute], cand.model_parallel, cand.zero_stage)
            if best is None or key < best[0]:
                best = (key, cand, fit)
        if best is not None:
            return best[1], best[2]
    return None


def setup_dict(setup: TrainSetup) -> dict:
    return asdict(setup)


def arch_dict(model: Model) -> dict:
    if isinstance(model, ParamCount):
        return {"name": model.name, "params": model.params}
    d = {k: v for k, v in asdict(model).items() if k != "notes"}
    d["params"] = model.params
    return d

