"""The training entry points: `pretrain`, `sft`, `rl`, on top of `trainyard.runtime.Run`.

`trainer_class(spec)` picks the trainer: by kind, and for `sft`/`rl` on the user's data
(`data.path`) the Hugging Face trainers of `chat_train.py`, which share everything below.

One process is one rank; `main(spec)` runs it to the end (exit 0), to a preemption checkpoint
(exit 75, raised by the runtime as SystemExit), or to an error. What the runtime provides and the
trainers use as is: the process group and seeding (`init`), checkpoints of model, optimizer,
LR schedule, data position and every RNG (`Run` → `CheckpointManager`), preemption agreement,
the resumable global-batch sampler, metrics.jsonl and the watchdog. What the trainers add: the
recipe's data, model, strategy and the step itself.

The shape shared by all three (`Trainer`):
1. `init(seed, deterministic)`; read the run's saved recipe (`<checkpoint dir>/recipe.yaml`) and
   refuse a recipe whose model, data, seed or global batch differ from the checkpoint's (a DCP
   load of other shapes would fail and mark good checkpoints damaged); `preflight()`: every
   check of the user's input (files, fields, chat template, reward) before anything is written,
   then recipe.yaml and init_from.json;
2. build the dataset (every sample has an id), the model (seeded: identical on every rank), load
   `init_from` weights (sft, rl), keep a frozen reference copy (rl with a KL term), wrap it in the
   strategy, AdamW and the LR schedule, the `ResumableSampler`;
3. `Run(...)`; `for step in run.steps(total)`: the rank's sample ids from the sampler and their
   batch (`load`, fetched through `run.data`, so its time is the step's data wait in the phase
   timings), the step, metrics (global means, all-reduced) with `run.log`.

Losses are normalized by the *global* number of target tokens and gradients averaged over the
ranks by DDP/FSDP2, so the update is the same whatever the world size (up to float order).
Logged losses are global means, so metrics.jsonl reads the same on 1, 2 or 4 processes.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

import torch
import torch.distributed as dist
import torch.nn.functional as F

import trainyard.runtime as yr
from trainyard.contracts import committed_steps
from trainyard.recipes import data as D
from trainyard.recipes import checkpointing, hf_checkpoint, sharded_start, throughput, user_data
from trainyard.recipes.checkpoints import RECIPE_FILE, check_compatible, resolve_init, saved_recipe
from trainyard.recipes.models import build_model, count_parameters, decoder_layers
from trainyard.recipes.spec import ModelSpec, RecipeError, RecipeSpec
from trainyard.recipes.strategies import no_sync, shard_fsdp2, unwrap, wrap

INIT_FILE = "init_from.json"


def lr_lambda(spec: RecipeSpec):  # noqa: ANN201
    o, total = spec.optim, spec.steps

    def f(step: int) -> float:  # `step` optimizer steps done so far
        if o.warmup_steps and step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "constant":
            return 1.0
        span = max(1, total - o.warmup_steps)
        t = min(1.0, (step - o.warmup_steps) / span)
        decay = 0.5 * (1 + math.cos(math.pi * t)) if o.schedule == "cosine" else 1 - t
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * decay

    return f


def build_optimizer(model: torch.nn.Module, spec: RecipeSpec) -> torch.optim.Optimizer:
    """AdamW; no weight decay on vectors (norms, biases), as is usual for transformers."""
    decay: list[torch.nn.Parameter] = []
    rest: list[torch.nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else rest).append(p)
    o = spec.optim
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    impl = o.implementation
    if impl == "auto":  # fused kernels on CUDA; on CPUs foreach (a few ops per step, not per parameter)
        impl = "fused" if any(p.is_cuda for p in decay + rest) else "foreach"
    return torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, eps=o.eps, foreach=impl == "foreach",
                             fused=True if impl == "fused" else None)


class Trainer:
    """What the three recipe kinds share; subclasses give `build_data` and `train_step`."""

    split = "train"

    def __init__(self, spec: RecipeSpec, ctx: yr.Context) -> None:
        self.spec, self.ctx = spec, ctx
        self.device = ctx.device
        self.world, self.rank = ctx.world_size, ctx.rank
        self.main = ctx.rank == 0
        self.ckpt_dir = Path(ctx.env.checkpoint_dir)
        self.metrics_dir = Path(ctx.env.metrics_dir)
        spec.check_world_size(self.world)
        self.bf16 = spec.precision in ("bf16", "auto") and self.device.type == "cuda"
        self.deterministic = torch.are_deterministic_algorithms_enabled()

        # 1. the run's identity: a rerun with an incompatible recipe is refused before anything loads
        saved = saved_recipe(self.ckpt_dir)
        self.init_info = self._resolve_init(saved)
        self.model_spec = spec.model
        if self.init_info is not None and self.init_info.get("model") is not None:
            self.model_spec = ModelSpec.model_validate(self.init_info["model"])
            if self.main and self.model_spec != spec.model:
                print(f"trainyard.recipes: the model is {self.init_info['source']}'s ({self.model_spec.arch}, "
                      f"hidden {self.model_spec.hidden_size}, {self.model_spec.num_layers} layers); the recipe's "
                      "model section is not used", file=sys.stderr, flush=True)
        if self.init_info is not None and spec.model.from_ is not None and self.model_spec.from_ is not None and \
                Path(spec.model.from_).resolve() != Path(self.model_spec.from_).resolve():
            raise RecipeError(f"{spec.model.from_}, but the init_from run {self.init_info['source']} was trained from "
                              f"{self.model_spec.from_}; with init_from the model is that run's: leave model.from out",
                              "model.from")
        effective = spec.model_copy(update={"model": self.model_spec})
        resuming = bool(committed_steps(self.ckpt_dir))
        if saved is not None and resuming:
            check_compatible(saved, effective)
        # the user's model and data are checked before anything is written (bad input: exit 2, no trace)
        self._tokenizer: user_data.Tokenizer | None = None
        self.hf = hf_checkpoint.inspect(self.model_spec.from_) if self.model_spec.from_ is not None else None
        if self.hf is not None and self.main:
            print(f"trainyard.recipes: the model is {self.hf.describe()} from {self.hf.directory}; the recipe's "
                  "model sizes are not used", file=sys.stderr, flush=True)
        self.preflight()
        if self.main:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.ckpt_dir / f".{RECIPE_FILE}.tmp"
            tmp.write_text(effective.to_yaml())
            os.replace(tmp, self.ckpt_dir / RECIPE_FILE)
            record = self.ckpt_dir / INIT_FILE
            if self.init_info is not None and not record.exists():
                record.write_text(json.dumps(self.init_info, indent=1))

        # 2. data, model, strategy, optimizer, sampler
        self.data = self.build_data()
        if spec.batch.global_batch_size > len(self.data):
            raise RecipeError(f"{spec.batch.global_batch_size} exceeds the data's {len(self.data)} samples "
                              f"({self.data.fingerprint.description})", "batch.global_batch_size")
        # resuming, the weights come from this run's own checkpoint, and with init_from from that run's:
        # model.from's are not read first. Under FSDP2 with weights to read (a checkpoint, a resume),
        # no rank holds the whole model: built on the meta device, sharded, each rank reads its rows.
        # A random start (values a single process would draw) and a KL reference (a whole copy) build
        # it whole.
        needs_whole = spec.kind == "rl" and spec.rl.kl_coef > 0
        self.sharded_start = (spec.strategy == "fsdp2" and self.world > 1 and not needs_whole
                              and (resuming or self.init_info is not None or self.hf is not None))
        if self.sharded_start:
            model = sharded_start.build_sharded(
                self.model_spec, self.device, load_checkpoint=not resuming and self.init_info is None,
                shard=lambda m: shard_fsdp2(self.prepare(m), self.device, bf16=self.bf16))
            if self.main:
                weights_from = ("this run's checkpoint" if resuming else
                                f"{self.init_info['checkpoint']}" if self.init_info is not None else
                                str(self.hf.directory) if self.hf is not None else "?")  # (sharded_start: one of them)
                print(f"trainyard.recipes: FSDP2 start on the meta device: each rank holds and reads only its shard "
                      f"(weights from {weights_from})", file=sys.stderr, flush=True)
        else:
            model = build_model(self.model_spec, load_weights=not resuming and self.init_info is None)
        if self.hf is not None and isinstance(getattr(self.data, "meta", None), dict):
            top, vocab = self.data.meta.get("max_id", -1), model.config.vocab_size
            if top >= vocab:
                raise RecipeError(f"the tokenized data has token id {top}, the model's vocabulary is {vocab} "
                                  f"({self.hf.directory / hf_checkpoint.CONFIG}: vocab_size)", "model.from")
        if self.init_info is not None:
            source = Path(self.init_info["checkpoint"])
            if source.is_dir() and self.sharded_start:
                if not resuming:
                    sharded_start.load_dcp_shards(model, source)
            elif source.is_dir():
                load_weights(model, source)
            elif not resuming or (spec.kind == "rl" and spec.rl.kl_coef > 0):
                # resuming, the weights come from this run's own checkpoint; only a KL reference needs them
                raise RecipeError(f"the checkpoint this run starts from, {source}, is gone", "init_from")
        self.reference = self.build_reference(model)
        self.n_params = count_parameters(model)
        if self.sharded_start:
            self.model: torch.nn.Module = model  # sharded and on its device already
        else:
            # (transformers' `@wraps(Module.to)` types the bound method as the unbound one)
            model.to(self.device)  # type: ignore[arg-type]
            find_unused = spec.ddp_find_unused
            if find_unused is None:  # see strategies.wrap: only an exact resume on > 2 ranks needs it
                find_unused = self.deterministic and self.world > 2
            self.model = wrap(self.prepare(model), spec.strategy, self.device, bf16=self.bf16,
                              find_unused=find_unused)
        self.optimizer = build_optimizer(self.model, spec)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(spec))
        self.sampler = yr.ResumableSampler(len(self.data), spec.batch.global_batch_size, seed=spec.seed,
                                           world_size=self.world, rank=self.rank)
        self.local_batch = spec.batch.global_batch_size // self.world
        self.micro = spec.batch.micro_batch_size or self.local_batch

        # 3. the runtime
        self.run = yr.Run(ctx, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                          sampler=self.sampler, extra={"data": self.data.fingerprint},
                          checkpoint_every=spec.checkpoint_every, keep_last=spec.keep_last,
                          async_checkpoint=spec.async_checkpoint,
                          watchdog_s=spec.watchdog_s,
                          log_every=spec.log_every or (10 if self.device.type == "cuda" else 1))
        seq = getattr(self.data, "seq_len", None) or spec.data.seq_len
        precision = "bf16" if self.bf16 else "tf32"
        self.run.metrics.set_flops(throughput.flops_per_token(unwrap(self.model), seq),
                                   throughput.peak_flops(self.device, precision, self.world, spec.gpu_peak_tflops))
        self._samples_fh: TextIO | None = None

    # -- pieces ---------------------------------------------------------------------------------------

    def build_data(self) -> Any:
        raise NotImplementedError

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """Activation checkpointing, then `torch.compile` per decoder layer, before any sharding."""
        checkpointing.apply(model, self.spec.activation_checkpoint)
        if self.spec.compile:
            for layer in decoder_layers(model):
                layer.compile()
        return model

    def preflight(self) -> None:
        """Every check of the user's input that can fail, before anything is written (exit 2, no
        trace): here the documents of `data.path` (unless their token cache is already there)."""
        if self.spec.data.path is not None:
            self.on_rank0(lambda: None if self._token_cache_ready() else user_data.check(self.spec.data))

    def build_reference(self, model: torch.nn.Module) -> torch.nn.Module | None:
        return None

    def load(self, ids: list[int]) -> Any:
        """The step's batch of samples `ids`, on the device; None: `train_step` fetches its own (the
        chat trainers, micro-batch by micro-batch)."""
        return None

    def batches(self) -> Iterator[tuple[list[int], Any]]:
        """(ids, batch) of each step, the ids from the sampler as it stands when asked."""
        while True:
            ids = self.sampler.indices()
            yield ids, self.load(ids)

    def train_step(self, ids: list[int], batch: Any = None) -> dict[str, Any]:
        """One optimizer step on samples `ids` (`batch`: their `load`); the step's metrics."""
        raise NotImplementedError

    def evaluate(self) -> dict[str, Any]:
        return {}

    def on_rank0(self, fn: Callable[[], Any]) -> Any:
        """`fn()` on rank 0 only, its result (or its RecipeError) handed to every rank.

        For what must happen once (write a file, decide which checkpoint) while every rank
        learns the outcome, and fails the same way on bad input.
        """
        result, error = None, None
        if self.main:
            try:
                result = fn()
            except RecipeError as e:
                error = (e.message, e.field)
        if self.ctx.distributed:
            box = [(result, error)]
            dist.broadcast_object_list(box, src=0, group=self.ctx.control_group)
            result, error = box[0]
        if error is not None:
            raise RecipeError(*error)
        return result

    # -- the user's data (data.path) ---------------------------------------------------------------------

    def tokenizer(self) -> user_data.Tokenizer:
        """The checkpoint's tokenizer with `model.from`, else the recipes' bytes."""
        if self._tokenizer is None:
            self._tokenizer = hf_checkpoint.HFTokenizer(self.hf) if self.hf is not None else user_data.ByteTokenizer()
        return self._tokenizer

    def _token_cache_ready(self) -> bool:
        key, _ = user_data.cache_key(self.spec.data, self.tokenizer())
        return (self.ckpt_dir / user_data.CACHE_DIR / f"{key}.json").is_file()

    def user_data(self) -> user_data.PackedTokens:
        """Rank 0 tokenizes `data.path` into the run's token cache (once); every rank maps it."""
        d = self.spec.data
        meta = self.on_rank0(lambda: str(user_data.build_cache(d, self.tokenizer(),
                                                               self.ckpt_dir / user_data.CACHE_DIR)))
        return user_data.PackedTokens(meta, d.seq_len, d.val_fraction)

    def _resolve_init(self, saved: dict[str, Any] | None) -> dict[str, Any] | None:
        """The init checkpoint: the one recorded by the run's first attempt, else the newest now.

        Rank 0 decides and tells the others, so all load the same one even while the source run
        is still writing checkpoints. Recorded in `<checkpoint dir>/init_from.json` once the
        run's input has passed its checks (with recipe.yaml).
        """
        init_from = self.spec.init_from
        if self.spec.kind == "pretrain" or not init_from:
            if self.spec.kind != "pretrain" and self.spec.model.from_ is None and self.main:
                warnings.warn(f"{self.spec.kind} without init_from starts from a random model", RuntimeWarning,
                              stacklevel=2)
            return None
        def decide() -> dict[str, Any]:
            record = self.ckpt_dir / INIT_FILE
            if record.exists():
                return json.loads(record.read_text())
            return resolve_init(init_from)

        return self.on_rank0(decide)

    def global_sum(self, *values: float | torch.Tensor) -> torch.Tensor:
        """Element-wise sum over ranks (float64, on this rank's device). Timed as the step's comm:
        a rank ahead of the others waits here, and the straggler detector tells a slow rank from
        the ones that wait for it by their time outside collectives."""
        t = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=self.device).detach().reshape(())
                         for v in values])
        if self.ctx.distributed:
            run = getattr(self, "run", None)
            with run.phase("comm") if run is not None else nullcontext():
                dist.all_reduce(t)
        return t

    def autocast(self) -> Any:
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.bf16 else nullcontext()

    @contextmanager
    def evaluating(self) -> Iterator[torch.nn.Module]:
        """The unwrapped model in eval mode for a held-out pass, put back in its mode after: the one
        toggle every recipe's `evaluate` shares."""
        model = unwrap(self.model)
        was_training = model.training
        model.eval()
        try:
            yield model
        finally:
            model.train(was_training)

    def optimizer_step(self) -> torch.Tensor | None:
        norm = None
        if self.spec.optim.grad_clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.optim.grad_clip)
            if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2
                norm = norm.full_tensor()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def finish_step(self, loss_sum: torch.Tensor, n_global: int) -> dict[str, Any]:
        """Optimizer step after the micro-batches; the metrics of a token-level loss over the global batch."""
        norm = self.optimizer_step()
        total = self.global_sum(loss_sum)
        out: dict[str, Any] = {"loss": total[0] / n_global, "tokens": n_global}
        if norm is not None:
            out["grad_norm"] = norm
        return out

    def finish_grpo_step(self, pg_sum: torch.Tensor, kl_sum: torch.Tensor, counts: torch.Tensor, n_global: float,
                         group: int) -> dict[str, Any]:
        """Optimizer step after a GRPO batch's micro-batches (tasks and the user's prompts alike);
        its metrics: loss and KL per response token, mean reward and response length, samples.
        `counts` = the global (response tokens, reward sum, completions)."""
        norm = self.optimizer_step()
        tot = self.global_sum(pg_sum, kl_sum)
        out: dict[str, Any] = {
            "loss": tot[0] / n_global,
            "reward": counts[1] / counts[2],
            "response_tokens": counts[0] / counts[2],
            "samples": self.spec.batch.global_batch_size * group,
        }
        if self.reference is not None:
            out["kl"] = tot[1] / n_global
        if norm is not None:
            out["grad_norm"] = norm
        return out

    def micro_batches(self, n: int) -> list[slice]:
        return [slice(i, min(n, i + self.micro)) for i in range(0, n, self.micro)]

    def _log_samples(self, step: int, ids: list[int]) -> None:
        if self._samples_fh is None:
            self.metrics_dir.mkdir(parents=True, exist_ok=True)
            self._samples_fh = open(self.metrics_dir / f"samples-rank{self.rank}.jsonl", "a")
        self._samples_fh.write(json.dumps({"step": step, "ids": ids, "world": self.world,
                                           "attempt": self.ctx.env.attempt}) + "\n")
        self._samples_fh.flush()

    # -- the loop -------------------------------------------------------------------------------------

    def fit(self) -> None:
        spec, run = self.spec, self.run
        if self.main:
            arch = self.hf.model_type if self.hf is not None else self.model_spec.arch
            print(f"trainyard.recipes: {spec.name} ({spec.kind}): {arch} with {self.n_params:,} "
                  f"parameters, {spec.strategy} on {self.world} process(es) ({self.device.type}), "
                  f"{len(self.data):,} samples; {self.data.fingerprint.description}", file=sys.stderr, flush=True)
        t_print = time.monotonic()
        for step, (ids, batch) in zip(run.steps(spec.steps), run.data(self.batches())):
            metrics = self.train_step(ids, batch)
            if spec.log_samples:
                self._log_samples(step, ids)
            if spec.eval_every and (step % spec.eval_every == 0 or step == 1 or step == spec.steps):
                metrics.update(self.evaluate())
            run.log(**metrics)
            if self.main and (step % spec.print_every == 0 or step == spec.steps):
                now = time.monotonic()
                shown = " ".join(f"{k} {float(v):.4g}" for k, v in metrics.items() if k not in ("tokens", "samples"))
                print(f"step {step}/{spec.steps} {shown} lr {self.scheduler.get_last_lr()[0]:.3g} "
                      f"({now - t_print:.2f} s)", file=sys.stderr, flush=True)
                t_print = now
        if self._samples_fh is not None:
            self._samples_fh.close()


# -- pretrain ---------------------------------------------------------------------------------------------


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimate of KL(pi || pi_ref), summed over the masked tokens."""
    d = ref_logp - logp
    return ((torch.exp(d) - d - 1) * mask).sum()


def next_token_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of predicting tokens[:, 1:] from tokens[:, :-1], in fp32.

    The logits are dropped before the caller's backward (only the log-softmax that autograd saved
    stays): with a large vocabulary they are the biggest tensor of the step, and keeping them
    through backward would add their size to its peak (what `yard plan memory` counts:
    docs/memory-planner.md).
    """
    logits = model(input_ids=tokens[:, :-1]).logits
    return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten(), reduction="sum")


class Pretrain(Trainer):
    """Next-token prediction over windows of the stdlib's source text."""

    def build_data(self) -> D.TokenWindows | user_data.PackedTokens:
        if self.spec.data.path is not None:
            return self.user_data()
        if self.hf is not None:
            raise RecipeError("the stdlib corpus is bytes; with model.from give the text to tokenize with the "
                              "checkpoint's tokenizer (a .jsonl or .txt file or a directory of them)", "data.path")
        return D.stdlib_corpus(self.spec.data)

    def evaluate(self) -> dict[str, Any]:
        """Mean next-token loss on the held-out windows of the user's data (`data.val_fraction`).

        Every rank computes all of them (FSDP2 gathers need every rank in every forward; a
        held-out split is small), in micro-batches, without gradients.
        """
        ids = getattr(self.data, "eval_ids", None)
        if not ids:
            return {}
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        with self.evaluating() as model, torch.no_grad():
            for start in range(0, len(ids), self.micro):
                chunk = self.data.batch(ids[start: start + self.micro]).to(self.device)
                with self.autocast():
                    total += next_token_loss(model, chunk)
        return {"eval_loss": total / (len(ids) * self.data.seq_len)}

    def load(self, ids: list[int]) -> torch.Tensor:
        return self.data.batch(ids).to(self.device)

    def train_step(self, ids: list[int], batch: Any = None) -> dict[str, Any]:
        tokens = batch if batch is not None else self.load(ids)
        seq = tokens.shape[1] - 1
        n_global = self.spec.batch.global_batch_size * seq
        parts = self.micro_batches(len(ids))
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for i, part in enumerate(parts):
            with no_sync(self.model, i == len(parts) - 1), self.autocast():
                loss = next_token_loss(self.model, tokens[part])
                (loss * (self.world / n_global)).backward()
            loss_sum += loss.detach()
        return self.finish_step(loss_sum, n_global)


# -- sft --------------------------------------------------------------------------------------------------


def _allowed_mask(vocab: int, device: torch.device) -> torch.Tensor:
    """Additive logit mask: a completion is bytes and EOS (never PAD, BOS or the unused ids)."""
    m = torch.full((vocab,), float("-inf"), device=device)
    m[:256] = 0.0
    m[D.EOS] = 0.0
    return m


@torch.no_grad()
def generate(model: torch.nn.Module, prompts: torch.Tensor, new_tokens: int, mask: torch.Tensor, *,
             temperature: float = 1.0, greedy: bool = False) -> torch.Tensor:
    """Append `new_tokens` sampled tokens to every row (fixed length: collectives stay in step).

    Sampling draws from torch's global generator, which the runtime checkpoints per rank: a
    resumed run samples the very same completions.
    """
    seq = prompts
    for _ in range(new_tokens):
        logits = model(input_ids=seq).logits[:, -1].float() + mask
        if greedy:
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1).squeeze(-1)
        seq = torch.cat([seq, nxt[:, None]], dim=1)
    return seq


class TaskTrainer(Trainer):
    split = "train"

    def preflight(self) -> None:
        if self.hf is not None:  # init_from a run trained from model.from, on the generated tasks
            what = "chat messages" if self.spec.kind == "sft" else "prompt/answer records"
            raise RecipeError(f"the model is {self.hf.describe()} from {self.hf.directory}, the generated tasks are "
                              f"bytes: give the {self.spec.kind} data ({what}) to tokenize with its tokenizer",
                              "data.path")

    def build_data(self) -> D.TaskSet:
        d = self.spec.data
        self.eval_set = D.TaskSet(d, self.spec.seed, "eval", d.eval_samples) if d.eval_samples else None
        return D.TaskSet(d, self.spec.seed, self.split, d.num_samples)

    def evaluate(self) -> dict[str, Any]:
        """Greedy accuracy on the held-out prompts (every rank computes all of them: FSDP2's
        gathers need every rank in every forward; the sets are small)."""
        if self.eval_set is None:
            return {}
        es = self.eval_set
        mask = _allowed_mask(self.model_spec.vocab_size, self.device)
        gen_model = unwrap(self.model)
        was_training = gen_model.training
        gen_model.eval()
        right = 0.0
        ids = list(range(len(es)))
        for start in range(0, len(ids), 256):
            chunk = ids[start: start + 256]
            with self.autocast():
                seq = generate(gen_model, es.prompts(chunk).to(self.device), es.answer_len, mask, greedy=True)
            for row, i in enumerate(chunk):
                right += es.reward(i, seq[row, es.prompt_len:].tolist())
        gen_model.train(was_training)
        return {"eval_accuracy": right / len(ids)}


class SFT(TaskTrainer):
    """Instruction tuning: cross-entropy on the response tokens (and EOS) of prompt/response pairs."""

    split = "sft"

    def load(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, mask = self.data.pairs(ids)
        targets = torch.where(mask[:, 1:], tokens[:, 1:], torch.full_like(tokens[:, 1:], -100))
        return tokens.to(self.device), targets.to(self.device)

    def train_step(self, ids: list[int], batch: Any = None) -> dict[str, Any]:
        tokens, targets = batch if batch is not None else self.load(ids)
        # the global number of target tokens, from the global batch every rank knows: no collective
        n_global = self.data.target_tokens(self.sampler.global_batch())
        parts = self.micro_batches(len(ids))
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for i, part in enumerate(parts):
            with no_sync(self.model, i == len(parts) - 1), self.autocast():
                logits = self.model(input_ids=tokens[part, :-1]).logits
                loss = F.cross_entropy(logits.float().flatten(0, 1), targets[part].flatten(), ignore_index=-100,
                                       reduction="sum")
                (loss * (self.world / n_global)).backward()
            loss_sum += loss.detach()
        return self.finish_step(loss_sum, n_global)


# -- rl ---------------------------------------------------------------------------------------------------


class RL(TaskTrainer):
    """GRPO (Shao et al. 2024, DeepSeekMath) with one on-policy update per batch.

    For each prompt, `group_size` completions are sampled from the current policy; each gets the
    task's exact-match reward; its advantage is the reward minus the group's mean (divided by
    the group's standard deviation unless `normalize_std` is off). With a single update per batch
    the importance ratio is 1, so GRPO's clipped objective is the plain policy gradient
    -A * log pi(token), averaged over all response tokens of the global batch (up to and
    including EOS). `kl_coef` > 0 adds the k3 estimate of KL(pi || pi_ref) to the initial policy.
    """

    split = "rl"

    def build_reference(self, model: torch.nn.Module) -> torch.nn.Module | None:
        if self.spec.rl.kl_coef <= 0:
            return None
        ref = copy.deepcopy(model).to(self.device).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def load(self, ids: list[int]) -> torch.Tensor:
        """The prompts, each repeated for its group."""
        return self.data.prompts(ids).repeat_interleave(self.spec.rl.group_size, dim=0).to(self.device)

    def train_step(self, ids: list[int], batch: Any = None) -> dict[str, Any]:
        rl, ds = self.spec.rl, self.data
        G = rl.group_size
        new = rl.max_new_tokens or ds.answer_len
        mask_v = _allowed_mask(self.model_spec.vocab_size, self.device)
        prompts = batch if batch is not None else self.load(ids)
        with self.autocast():
            seq = generate(unwrap(self.model), prompts, new, mask_v, temperature=rl.temperature)
        P = ds.prompt_len
        resp = seq[:, P:]
        rewards = torch.tensor([ds.reward(i, resp[row].tolist()) for row, i in
                                enumerate(x for x in ids for _ in range(G))], dtype=torch.float32)
        # tokens that count: up to and including the first EOS
        is_eos = (resp == D.EOS).cpu()
        after = (is_eos.cumsum(1) - is_eos.long()) > 0
        tmask = (~after).to(self.device)
        r = rewards.view(-1, G)
        adv = r - r.mean(1, keepdim=True)
        if rl.normalize_std:
            adv = adv / (r.std(1, keepdim=True) + 1e-4)
        adv = adv.flatten().to(self.device)
        n_local = tmask.sum()
        counts = self.global_sum(n_local, rewards.sum(), len(rewards))
        n_global = counts[0].item()
        pg_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        kl_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        rows = self.micro_batches(len(ids))  # micro-batches of prompts, each with its whole group
        for i, part in enumerate(rows):
            sl = slice(part.start * G, part.stop * G)
            with no_sync(self.model, i == len(rows) - 1), self.autocast():
                logits = self.model(input_ids=seq[sl, :-1]).logits[:, P - 1:].float() + mask_v
                logp = torch.log_softmax(logits, -1).gather(-1, resp[sl, :, None]).squeeze(-1)
                m = tmask[sl].float()
                pg = -(adv[sl, None] * logp * m).sum()
                loss = pg
                if self.reference is not None:
                    with torch.no_grad():
                        ref_logits = self.reference(input_ids=seq[sl, :-1]).logits[:, P - 1:].float() + mask_v
                        ref_logp = torch.log_softmax(ref_logits, -1).gather(-1, resp[sl, :, None]).squeeze(-1)
                    kl = k3_kl(logp, ref_logp, m)
                    loss = loss + rl.kl_coef * kl
                    kl_sum += kl.detach()
                (loss * (self.world / n_global)).backward()
            pg_sum += pg.detach()
        return self.finish_grpo_step(pg_sum, kl_sum, counts, n_global, G)


TRAINERS = {"pretrain": Pretrain, "sft": SFT, "rl": RL}


def trainer_class(spec: RecipeSpec) -> type[Trainer]:
    """The trainer of a recipe: by kind; sft and rl on the user's data (`data.path`) are the
    chat/prompt trainers of `recipes/chat_train.py` (Hugging Face models, their tokenizers)."""
    if spec.kind != "pretrain" and spec.data.path is not None:
        from trainyard.recipes.chat_train import ChatSFT, PromptRL

        return ChatSFT if spec.kind == "sft" else PromptRL
    return TRAINERS[spec.kind]


def load_weights(model: torch.nn.Module, step_dir: Path) -> None:
    """Model weights (only) of a committed checkpoint into a plain module, on every rank.

    Each rank reads the whole model (`no_dist`: no collective): the modules here are small, and
    the strategy shards them afterwards. Optimizer state, schedule and data position are not
    taken: a fine-tuning run starts its own.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    state = {"model": get_model_state_dict(model)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP warns about no_dist
        dcp.load(state, checkpoint_id=str(step_dir), no_dist=True)
    set_model_state_dict(model, state["model"])


def main(spec: RecipeSpec, early_notice: Any = None) -> int:
    """Run one rank of `spec` under the job environment. Returns 0; preemption exits 75."""
    if "OMP_NUM_THREADS" not in os.environ and not torch.cuda.is_available():
        # N ranks on one CPU machine: share the cores instead of each rank taking all of them
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
    cuda = torch.cuda.is_available()
    if cuda and spec.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    deterministic = spec.deterministic if spec.deterministic is not None else not cuda
    ctx = yr.init(seed=spec.seed, deterministic=deterministic)
    from trainyard.recipes import export  # `export:`: checked before anything is written, done after the end

    export_to = export.before_training(spec, ctx)
    trainer = trainer_class(spec)(spec, ctx)
    if early_notice is not None and early_notice():
        trainer.run.preemption.request()  # a notice that came while the rank was starting
    trainer.fit()
    del trainer  # its model and optimizer: the export reads the committed checkpoint
    export.after_training(spec, ctx, export_to)
    return 0


__all__ = ["RL", "SFT", "Pretrain", "TRAINERS", "Trainer", "generate", "load_weights", "lr_lambda", "main",
           "k3_kl", "next_token_loss", "trainer_class"]
