"""SFT and GRPO on Hugging Face checkpoints and the user's data (`kind: sft|rl` with `data.path`).

The trainers of `train.py` (`Trainer`: the runtime, checkpoints, the sampler, the strategies,
init_from) with the data of `chat_data.py` and the model's own tokenizer; the generated-tasks
trainers (`train.SFT`, `train.RL`, bytes) are untouched. `train.trainer_class` picks these when
`data.path` is set. The model is `model.from`, or the one the `init_from` run was trained from
(its recipe.yaml records it), so a chain `pretrain (model.from) → sft (init_from) → rl
(init_from)` keeps one architecture and one tokenizer throughout, and `yard export` of any of
them writes that tokenizer (chat template included) beside the weights.

`ChatSFT`: cross-entropy on the assistant tokens (their content and the end-of-turn tokens the
template writes), normalized by the global number of target tokens of the step (every rank
computes it from the global batch: no collective), so the update does not depend on the world
size. Each micro-batch is right-padded to its longest conversation. `eval_loss`: the mean over
every assistant token of the held-out conversations (every rank computes all of them: FSDP2's
gathers need every rank in every forward).

`PromptRL` (GRPO, as `train.RL`: one on-policy update per batch, so the importance ratio is 1 and
the clipped objective is the policy gradient `-A · log π`, averaged over every completion token
of the global batch up to and including EOS; the optional k3 KL term to the initial policy):
- prompts of a micro-batch are left-padded to the longest, with an attention mask and position
  ids that start at each prompt's first token, so a prompt is continued as it would be alone;
- `rl.max_new_tokens` (default 256, TRL's) tokens are generated for every completion, with a KV
  cache: a fixed count keeps FSDP2's collectives in step across ranks; a completion ends at its
  first end token (the tokenizer's EOS and generation_config.json's `eos_token_id`s) and what
  follows is padding, masked from the loss. Token ids beyond the tokenizer's vocabulary (the
  padding rows of an embedding matrix) are never sampled;
- sampling draws from torch's global generator, which the runtime checkpoints per rank: a
  resumed run samples the same completions;
- log-probabilities are those of the sampling distribution (logits / `rl.temperature`, as TRL);
- the reward (`rl.reward`, `recipes/rewards.py`) scores the decoded completion (special tokens
  dropped) against the record's answer; advantages are normalized within each prompt's group;
- `eval_reward`: the mean reward of greedy completions of the held-out prompts (at most
  `data.eval_samples` of them, every rank all of them).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainyard.recipes import chat_data, hf_checkpoint, rewards
from trainyard.recipes.spec import RecipeError
from trainyard.recipes.strategies import no_sync, unwrap
from trainyard.recipes.train import Trainer, k3_kl

DEFAULT_NEW_TOKENS = 256  # rl.max_new_tokens when not set (TRL's max_completion_length)
EVAL_CHUNK = 64  # held-out prompts generated at once


class _OnUserData(Trainer):
    """What SFT and RL on `data.path` share: the checkpoint's tokenizer and the token cache."""

    kind = "sft"

    def preflight(self) -> None:
        if self.hf is None:
            raise RecipeError(f"a {self.spec.kind} recipe on the user's data (data.path) tokenizes it with a Hugging "
                              "Face checkpoint's tokenizer: give model.from=DIR, or init_from a run trained from one",
                              "model.from")
        self.on_rank0(lambda: None if self._cache_ready() else chat_data.check(self.spec, self.hf))

    @property
    def source(self) -> hf_checkpoint.CheckpointInfo:
        """`model.from`'s checkpoint: these recipes have one (`preflight` refuses a run without)."""
        assert self.hf is not None
        return self.hf

    def tokenizer(self) -> hf_checkpoint.HFTokenizer:
        """The checkpoint's tokenizer: these recipes have no other."""
        tok = super().tokenizer()
        assert isinstance(tok, hf_checkpoint.HFTokenizer)
        return tok

    def _cache_ready(self) -> bool:
        key, _ = chat_data.cache_key(self.kind, self.spec.data, self.source.tokenizer_fingerprint())
        return (self.ckpt_dir / chat_data.CACHE_DIR / f"{key}.json").is_file()

    def cache(self) -> str:
        """Rank 0 tokenizes `data.path` into the run's token cache (once); every rank gets its path."""
        return self.on_rank0(lambda: str(chat_data.build_cache(self.kind, self.spec.data, self.tokenizer(),
                                                               self.ckpt_dir / chat_data.CACHE_DIR)))

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer().tok
        for candidate in (tok.pad_token_id, tok.eos_token_id):
            if candidate is not None:
                return int(candidate)
        return 0


class ChatSFT(_OnUserData):
    """Supervised fine-tuning on chat conversations: the loss on the assistant's tokens."""

    kind = "sft"

    def build_data(self) -> chat_data.Conversations:
        d = self.spec.data
        return chat_data.Conversations(self.cache(), d.seq_len, d.val_fraction, self.pad_id)

    def _loss_sum(self, model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            logits = model(input_ids=tokens[:, :-1]).logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")

    def train_step(self, ids: list[int], batch: Any = None) -> dict[str, Any]:
        # the global number of target tokens, from the global batch every rank knows: no collective
        n_global = self.data.target_tokens(self.sampler.global_batch())
        parts = self.micro_batches(len(ids))
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for i, part in enumerate(parts):
            tokens, targets = self.data.batch(ids[part])
            with no_sync(self.model, i == len(parts) - 1):
                loss = self._loss_sum(self.model, tokens.to(self.device), targets.to(self.device))
                (loss * (self.world / n_global)).backward()
            loss_sum += loss.detach()
        return self.finish_step(loss_sum, n_global)

    def evaluate(self) -> dict[str, Any]:
        """Mean loss per assistant token over the held-out conversations."""
        recs = self.data.eval_ids
        if not recs:
            return {}
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        with self.evaluating() as model, torch.no_grad():
            for start in range(0, len(recs), self.micro):
                tokens, targets = self.data.batch_records(recs[start: start + self.micro])
                total += self._loss_sum(model, tokens.to(self.device), targets.to(self.device))
        return {"eval_loss": total / self.data.record_targets(recs)}


def _end_ids(info: Any, tokenizer: Any) -> list[int]:
    """The ids that end a completion: the tokenizer's EOS and the checkpoint's `eos_token_id`s
    (generation_config.json, config.json; an int or a list, as instruct models have several)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for name in ("generation_config.json", "config.json"):
        try:
            value = json.loads((Path(info.directory) / name).read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        ids |= set(value) if isinstance(value, list) else ({value} if isinstance(value, int) else set())
    if not ids:
        raise RecipeError(f"{info.directory}: the tokenizer has no eos_token and config.json no eos_token_id; a "
                          "completion needs an end", "model.from")
    return sorted(ids)


@torch.no_grad()
def sample(model: torch.nn.Module, prompts: list[list[int]], new_tokens: int, *, pad_id: int,
           end_ids: torch.Tensor, vocab: int, temperature: float = 1.0,
           greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prompts [B, P] left-padded, their attention mask [B, P], completions [B, new_tokens]).

    Exactly `new_tokens` forwards after the prompt's (a KV cache: each feeds one token), whatever
    the completions: the same number of FSDP2 collectives on every rank. A completion's tokens
    after its first end token are `pad_id`. Ids >= `vocab` are never drawn.
    """
    device = end_ids.device
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    attn = torch.zeros((len(prompts), P), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, P - len(p):] = torch.tensor(p, dtype=torch.long)
        attn[b, P - len(p):] = 1
    ids, attn = ids.to(device), attn.to(device)
    prompt_ids, prompt_attn = ids, attn
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    last = pos[:, -1:]
    picked = []
    for t in range(new_tokens):
        logits = out.logits[:, -1].float()
        if vocab < logits.shape[-1]:
            logits[:, vocab:] = float("-inf")
        if greedy:
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        picked.append(nxt)
        done |= torch.isin(nxt, end_ids)
        if t == new_tokens - 1:
            break
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
        last = last + 1
        out = model(input_ids=nxt[:, None], attention_mask=attn, position_ids=last, cache=out.cache,
                    use_cache=True)
    return prompt_ids, prompt_attn, torch.stack(picked, dim=1)


def completion_mask(resp: torch.Tensor, end_ids: torch.Tensor) -> torch.Tensor:
    """True for a completion's tokens up to and including its first end token."""
    is_end = torch.isin(resp, end_ids).long()
    return (is_end.cumsum(1) - is_end) == 0


class PromptRL(_OnUserData):
    """GRPO on prompt/answer records with the reward the recipe names (see the module docstring)."""

    kind = "rl"

    def preflight(self) -> None:
        super().preflight()
        self.reward = rewards.load(self.spec.rl)  # every rank imports it: a bad name fails before anything is written

    def build_data(self) -> chat_data.Prompts:
        d, rl = self.spec.data, self.spec.rl
        data = chat_data.Prompts(self.cache(), d.seq_len, d.val_fraction)
        self.eval_recs = data.eval_ids[: d.eval_samples]
        self.new_tokens = rl.max_new_tokens or DEFAULT_NEW_TOKENS
        longest, limit = data.longest(), self.source.max_positions
        if limit is not None and longest + self.new_tokens > limit:
            raise RecipeError(f"{self.new_tokens} new tokens after the longest prompt's {longest} exceed the model's "
                              f"{limit} positions ({self.source.directory / 'config.json'}: max_position_embeddings)",
                              "rl.max_new_tokens")
        tok = self.tokenizer().tok
        self.end_ids = torch.tensor(_end_ids(self.source, tok), dtype=torch.long, device=self.device)
        self.vocab = min(len(tok), int(self.source.config.get("vocab_size") or len(tok)))
        return data

    def build_reference(self, model: torch.nn.Module) -> torch.nn.Module | None:
        if self.spec.rl.kl_coef <= 0:
            return None
        ref = copy.deepcopy(model).to(self.device).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def _generate(self, model: torch.nn.Module, recs: list[int], *, greedy: bool
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rl = self.spec.rl
        with self.autocast():
            return sample(model, [self.data.prompt_ids(r) for r in recs], self.new_tokens, pad_id=self.pad_id,
                          end_ids=self.end_ids, vocab=self.vocab, temperature=rl.temperature, greedy=greedy)

    def _rewards(self, recs: list[int], resp: torch.Tensor) -> torch.Tensor:
        tok = self.tokenizer().tok
        mask = completion_mask(resp, self.end_ids)
        ends = torch.isin(resp, self.end_ids)
        out = []
        for row, r in enumerate(recs):
            text = tok.decode(resp[row][mask[row] & ~ends[row]].tolist(), skip_special_tokens=True)
            assert isinstance(text, str)  # (one sequence of ids decodes to one string)
            prompt, answer = self.data.record(r)
            out.append(self.reward(prompt, text, answer))
        return torch.tensor(out, dtype=torch.float32)

    def _logp(self, model: torch.nn.Module, full: torch.Tensor, attn: torch.Tensor, P: int,
              resp: torch.Tensor) -> torch.Tensor:
        """log π(token) of each completion token under the sampling distribution (logits / T)."""
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=full[:, :-1], attention_mask=attn[:, :-1], position_ids=pos[:, :-1]).logits
        logits = logits[:, P - 1:].float() / self.spec.rl.temperature
        if self.vocab < logits.shape[-1]:
            logits[..., self.vocab:] = float("-inf")
        return torch.log_softmax(logits, -1).gather(-1, resp[:, :, None]).squeeze(-1)

    def train_step(self, ids: list[int], batch: Any = None) -> dict[str, Any]:
        rl = self.spec.rl
        G = rl.group_size
        recs = [self.data.train[i] for i in ids for _ in range(G)]
        parts = self.micro_batches(len(ids))  # micro-batches of prompts, each with its whole group
        gen_model = unwrap(self.model)
        was_training = gen_model.training
        gen_model.eval()
        batches = []
        for part in parts:  # sample every micro-batch first: the policy that samples is the step's
            sl = slice(part.start * G, part.stop * G)
            batches.append((sl, *self._generate(gen_model, recs[sl], greedy=False)))
        gen_model.train(was_training)
        rewards_all = torch.cat([self._rewards(recs[sl], resp) for sl, _, _, resp in batches])
        masks = [completion_mask(resp, self.end_ids) for _, _, _, resp in batches]
        r = rewards_all.view(-1, G)
        adv = r - r.mean(1, keepdim=True)
        if rl.normalize_std:
            adv = adv / (r.std(1, keepdim=True) + 1e-4)
        adv = adv.flatten().to(self.device)
        n_local = sum(m.sum() for m in masks)
        counts = self.global_sum(n_local, rewards_all.sum(), len(rewards_all))
        n_global = max(1.0, counts[0].item())
        pg_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        kl_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for i, ((sl, prompt, prompt_attn, resp), m) in enumerate(zip(batches, masks)):
            full = torch.cat([prompt, resp], dim=1)
            attn = torch.cat([prompt_attn, torch.ones_like(resp)], dim=1)
            P = prompt.shape[1]
            m = m.float()
            with no_sync(self.model, i == len(batches) - 1), self.autocast():
                logp = self._logp(self.model, full, attn, P, resp)
                pg = -(adv[sl, None] * logp * m).sum()
                loss = pg
                if self.reference is not None:
                    with torch.no_grad():
                        ref_logp = self._logp(self.reference, full, attn, P, resp)
                    kl = k3_kl(logp, ref_logp, m)
                    loss = loss + rl.kl_coef * kl
                    kl_sum += kl.detach()
                (loss * (self.world / n_global)).backward()
            pg_sum += pg.detach()
        return self.finish_grpo_step(pg_sum, kl_sum, counts, n_global, G)

    def evaluate(self) -> dict[str, Any]:
        """Mean reward of greedy completions of the held-out prompts."""
        if not self.eval_recs:
            return {}
        total = 0.0
        with self.evaluating() as model:
            for start in range(0, len(self.eval_recs), EVAL_CHUNK):
                chunk = self.eval_recs[start: start + EVAL_CHUNK]
                _, _, resp = self._generate(model, chunk, greedy=True)
                total += float(self._rewards(chunk, resp).sum())
        return {"eval_reward": total / len(self.eval_recs)}


__all__ = ["ChatSFT", "DEFAULT_NEW_TOKENS", "PromptRL", "completion_mask", "sample"]
