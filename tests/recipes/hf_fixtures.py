"""Tiny Hugging Face checkpoints and user data, built at test time (nothing is downloaded).

`tiny_checkpoint(dir, family)` writes what `save_pretrained` writes for a real model: config.json,
safetensors weights (sharded with `shards=True`: several files and model.safetensors.index.json),
generation_config.json and a tokenizer — a byte-level BPE of ~400 tokens trained here with
`tokenizers` on `CORPUS`, saved as a `PreTrainedTokenizerFast`, with a small chat template of
our own (`CHAT_TEMPLATE`; `chat_template=False` for a base-model tokenizer without one). Random
weights from a fixed seed.

`write_chat_jsonl` and `write_prompt_jsonl` write SFT conversations and RL prompt/answer records
over the same words.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ("the model reads text and learns which token comes next; a cluster trains it on many ranks "
         "while the scheduler shares the machines between teams. checkpoints save the weights, the "
         "optimizer and the position in the data so that a preempted run resumes exactly").split()


def sentences(n: int, seed: int = 0) -> list[str]:
    """`n` pseudo-sentences over `WORDS`, a fixed function of `seed`."""
    rnd = random.Random(seed)
    return [" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(8, 30))).capitalize() + "." for _ in range(n)]


# A chat template in the manner of Zephyr's: a role header line, the content, the assistant's turn
# closed by EOS; the generation prompt is the assistant header. (trim_blocks: the newlines are
# written as expressions.)
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>' + '\\n' + m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' + '\\n' }}{% endif %}"
)


# the chat template's role headers, one special token each (as chat models have them)
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")


def train_tokenizer(vocab_size: int = 400):  # noqa: ANN201 - a PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>", "<unk>", *ROLE_TOKENS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(sentences(400, seed=1), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", additional_special_tokens=list(ROLE_TOKENS))


def tiny_checkpoint(directory: Path, family: str = "llama", *, shards: bool = False, seed: int = 0,
                    chat_template: bool = True) -> Path:
    """A random-weight `family` model (llama, gemma, qwen2, mistral; hidden 32, 2 layers) and its
    tokenizer (with `CHAT_TEMPLATE` unless `chat_template=False`), saved to `directory`."""
    import torch
    from transformers import (GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                              MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

    tok = train_tokenizer()
    if chat_template:
        tok.chat_template = CHAT_TEMPLATE
    common = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=128, bos_token_id=tok.bos_token_id,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(num_key_value_heads=2, **common))
    elif family == "gemma":
        model = GemmaForCausalLM(GemmaConfig(num_key_value_heads=1, head_dim=8, **common))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(num_key_value_heads=2, **common))
    elif family == "mistral":
        model = MistralForCausalLM(MistralConfig(num_key_value_heads=2, sliding_window=None, **common))
    else:
        raise ValueError(family)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, max_shard_size="20KB" if shards else "1GB")
    tok.save_pretrained(directory)
    return directory


def write_jsonl(path: Path, n: int, *, field: str = "text", seed: int = 2) -> Path:
    """`n` JSON lines, each {field: a paragraph of a few sentences, "id": i}."""
    rnd = random.Random(seed)
    lines = [json.dumps({field: " ".join(sentences(rnd.randint(1, 4), seed=seed * 1000 + i)), "id": i})
             for i in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def conversation(i: int, seed: int = 5) -> list[dict]:
    """A conversation over `WORDS`: sometimes a system message, one or two user/assistant turns;
    the assistant repeats the user's words in reverse order (something a tiny model can learn)."""
    rnd = random.Random(seed * 100_003 + i)
    messages = [{"role": "system", "content": "Answer briefly."}] if rnd.random() < 0.3 else []
    for _ in range(rnd.choice((1, 1, 2))):
        words = [rnd.choice(WORDS) for _ in range(rnd.randint(2, 6))]
        messages += [{"role": "user", "content": "reverse: " + " ".join(words)},
                     {"role": "assistant", "content": " ".join(reversed(words))}]
    return messages


def write_chat_jsonl(path: Path, n: int, *, field: str = "messages", seed: int = 5) -> Path:
    """`n` JSON lines {field: a conversation, "id": i}."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({field: conversation(i, seed), "id": i}) + "\n" for i in range(n)))
    return path


def prompt_record(i: int, seed: int = 7) -> dict:
    """{"prompt": "last word: a b c", "answer": "c"}: the answer is the prompt's last word."""
    rnd = random.Random(seed * 100_003 + i)
    words = [rnd.choice(WORDS) for _ in range(rnd.randint(2, 5))]
    return {"prompt": "last word: " + " ".join(words), "answer": words[-1]}


def write_prompt_jsonl(path: Path, n: int, *, seed: int = 7, **rename: str) -> Path:
    """`n` JSON lines of `prompt_record`s (`rename={'answer': 'solution'}` renames a field)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        r = prompt_record(i, seed)
        lines.append(json.dumps({rename.get(k, k): v for k, v in r.items()}))
    path.write_text("\n".join(lines) + "\n")
    return path
