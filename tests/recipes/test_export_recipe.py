"""`export:` in a recipe: a real `yard run` exports its final checkpoint as a Hugging Face model.

- A tiny HF Llama (model.from) on JSON lines, 1 process, `export: hf`: when the run completes,
  `<out>/hf` holds config, safetensors, generation config, the tokenizer and trainyard.json;
  `from_pretrained` loads model and tokenizer and gives the logits of the final checkpoint; the
  lineage names the recipe, the parent model, the data fingerprint, the steps, the last eval_loss
  and the run; the registry (`yard models`) lists it under the run's id. A rerun of the completed
  run leaves the export as it is.
- A byte-tokenizer run (no model.from) stopped by SIGUSR1 before its last step: exit 75, no
  export and no registry record; the rerun completes and exports (weights, config, generation
  config; trainyard.json says there is no Hugging Face tokenizer).
- A bad export target (a non-empty directory that is not an export of this run; the run's own
  checkpoints/) is refused by `yard run` before anything starts: exit 2, no --out.
"""

from __future__ import annotations

import json
import signal
import subprocess

import torch

from trainyard.contracts import REQUEUE_EXIT, newest_checkpoint
from tests.recipes.helpers import TINY_PRETRAIN, YARD, YardRun, env, metrics, yard_run
from tests.recipes.hf_fixtures import tiny_checkpoint, write_jsonl

HF = ["data.seq_len=32", "batch.global_batch_size=8", "optim.lr=3e-3", "optim.warmup_steps=2", "checkpoint_every=5",
      "print_every=5", "steps=12", "eval_every=6", "export=hf"]


def registry() -> list[dict]:
    p = subprocess.run([YARD, "models", "--json"], capture_output=True, text=True, timeout=60, env=env())
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_a_completed_run_exports_its_final_checkpoint_and_records_it(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainyard.recipes.checkpoints import saved_recipe
    from trainyard.recipes.models import build_model
    from trainyard.recipes.spec import ModelSpec
    from trainyard.recipes.train import load_weights

    parent = tiny_checkpoint(tmp_path / "llama", "llama")
    data = write_jsonl(tmp_path / "train.jsonl", 200, seed=5)
    out = tmp_path / "cpt-run"
    rc, log = yard_run("llama-pretrain", out, 1, [f"model.from={parent}", f"data.path={data}", *HF])
    assert rc == 0, log[-4000:]
    to = out / "hf"
    assert "exported step 12 (llama" in log and f"to {to}" in log, log[-2000:]
    assert {p.name for p in to.iterdir()} >= {"config.json", "model.safetensors", "generation_config.json",
                                              "tokenizer.json", "tokenizer_config.json", "trainyard.json"}
    assert not list(out.glob(".hf.*"))  # nothing left of the temporary directory

    step, step_dir, _ = newest_checkpoint(out / "checkpoints")
    assert step == 12
    mine = build_model(ModelSpec.model_validate(saved_recipe(out / "checkpoints")["model"]), load_weights=False)
    load_weights(mine.eval(), step_dir)
    theirs = AutoModelForCausalLM.from_pretrained(to, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(to, local_files_only=True)
    ids = tok(["the scheduler shares the machines"], return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.allclose(mine(input_ids=ids).logits, theirs(input_ids=ids).logits, rtol=0, atol=1e-6)

    lineage = json.loads((to / "trainyard.json").read_text())
    evals = {s: r["eval_loss"] for s, r in metrics(out).items() if "eval_loss" in r}
    assert lineage["recipe"] == "llama-pretrain" and lineage["kind"] == "pretrain"
    assert lineage["step"] == lineage["steps"] == 12 and lineage["checkpoint"] == str(step_dir)
    assert lineage["parent_model"] == str(parent) and lineage["hf_tokenizer"] is True
    assert lineage["run"] == str(out) and lineage["run_id"] == "cpt-run" and lineage["exported_by"] == "recipe"
    assert lineage["final_eval_loss"] == evals[12]
    key = json.loads(next((out / "checkpoints" / "tokens").glob("*.json")).read_text())["key"]
    assert lineage["data"]["fingerprint"] == key and lineage["data"]["path"] == str(data)

    [entry] = [e for e in registry() if e["path"] == str(to)]
    assert entry["name"] == "cpt-run" and entry["state"] == "ok" and entry["lineage"] == lineage

    before = (to / "model.safetensors").stat().st_mtime_ns
    rc, log = yard_run("llama-pretrain", out, 1, [f"model.from={parent}", f"data.path={data}", *HF])
    assert rc == 0 and "already holds step 12 of this run; left as it is" in log, log[-3000:]
    assert (to / "model.safetensors").stat().st_mtime_ns == before


def test_a_preempted_run_exports_nothing_until_it_completes(tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "bytes-run"
    # A name no other test exports under: the registry is one per test process, shared by the tests
    # that run in it, and a taken name gets a suffix ("exported-4").
    sets = [*TINY_PRETRAIN, "steps=60", "checkpoint_every=10", "export=../preempted-then-exported"]
    to = tmp_path / "preempted-then-exported"
    first = YardRun("llama-pretrain", out, 1, sets)
    first.wait_for_step(3)
    first.proc.send_signal(signal.SIGUSR1)
    assert first.wait() == REQUEUE_EXIT, first.log[-3000:]
    stopped = newest_checkpoint(out / "checkpoints")[0]
    assert stopped < 60
    assert not to.exists() and not list(tmp_path.glob(".exported*")), "exported before the last step"
    assert not [e for e in registry() if e["path"] == str(to)]

    rc, log = yard_run("llama-pretrain", out, 1, sets)
    assert rc == 0, log[-3000:]
    assert f"resumed from step {stopped}" in log and "no Hugging Face tokenizer" in log
    lineage = json.loads((to / "trainyard.json").read_text())
    assert lineage["step"] == 60 and lineage["parent_model"] is None and lineage["hf_tokenizer"] is False
    assert lineage["tokenizer"].startswith("bytes")
    assert {p.name for p in to.iterdir()} == {"config.json", "model.safetensors", "generation_config.json",
                                              "trainyard.json"}
    model = AutoModelForCausalLM.from_pretrained(to, local_files_only=True)
    assert model.config.vocab_size == 264 and model.config.eos_token_id == 258
    assert [e["name"] for e in registry() if e["path"] == str(to)] == ["preempted-then-exported"]


def test_a_bad_export_target_is_refused_before_anything_starts(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("mine")
    for target, why in ((str(full), f"error: export: {full} exists and is not empty"),
                        ("checkpoints/hf", "error: export: 'checkpoints/hf' is the run's own directory")):
        out = tmp_path / "out"
        p = subprocess.run([YARD, "run", "llama-pretrain", "--out", str(out), "--set", "steps=2",
                            "--set", f"export={target}"], capture_output=True, text=True, timeout=60, env=env())
        assert p.returncode == 2 and why in p.stderr, p.stderr
        assert not out.exists() and [f.name for f in full.iterdir()] == ["keep"]
