"""trainyard.recipes: declarative training recipes, their data, models and entry points.

A recipe is a YAML file (`configs/*.yaml` ships four: `llama-pretrain`, `gemma-pretrain`, `sft`,
`rl`) validated into a `RecipeSpec`: model, data, parallelism strategy, batch, optimizer, steps,
checkpoint interval, seed. `yard run RECIPE --nproc N --out DIR [--set key=value …]` trains it on
this machine; `yard submit --recipe RECIPE` hands it to the control plane; both start ranks of
`python -m trainyard.recipes RECIPE [--set …]`, which read the job environment (docs/design.md).

Parts, one job each:
- `spec`: RecipeSpec, loading, `--set` overrides (no torch: the CLI validates in milliseconds);
- `data`: byte tokenizer, the stdlib source corpus, generated tasks with exact answers;
- `models`: transformers' Llama / Gemma from small configs, random init (or `model.from`);
- `hf_checkpoint`: a Hugging Face checkpoint dir on disk (`model.from`): checked, loaded, its tokenizer;
- `data_sources`: the user's files (`data.path`: JSON lines, text, parquet, `datasets` dirs) and their records;
- `user_data`: the user's documents for pretraining: tokenized once into a cache, packed, split;
- `chat_data`: the user's chat conversations (SFT) and prompt/answer records (RL): the chat template,
  the assistant-token mask, token caches, the held-out split;
- `rewards`: GRPO's verifiable rewards on the user's data (exact, regex, a Python function);
- `export`: a run's final checkpoint as a Hugging Face model dir with lineage (`yard export`);
- `strategies`: DDP and FSDP2 (`fully_shard`), gradient accumulation without sync;
- `checkpoints`: the run's saved recipe (resume compatibility), `init_from` resolution;
- `train`: the `pretrain`, `sft` and `rl` (GRPO) trainers on `trainyard.runtime.Run`;
- `chat_train`: `sft` and `rl` on Hugging Face checkpoints and the user's data (`data.path`);
- `launch`: the local launcher behind `yard run` (ranks, signal forwarding, exit code).

Everything that makes a run resumable and preemptible (checkpoints, the data order, RNG states,
preemption → exit 75, metrics.jsonl, the watchdog) comes from `trainyard.runtime`.
"""

from trainyard.recipes.spec import RecipeError, RecipeSpec, load_recipe, shipped

__all__ = ["RecipeError", "RecipeSpec", "load_recipe", "shipped"]
