"""Bad input for `model.from`, `data.path` (pretrain, sft, rl), the reward and `yard export`,
through the real CLI.

Each is one line `error: <field>: <file> …` naming the file (and line, for data), exit code 2,
and nothing written: `yard run`'s --out is not even created, so a rerun with good input starts
clean. A rank started directly (`python -m trainyard.recipes`, as the control plane starts it)
also exits 2 before writing anything into its checkpoint dir.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.recipes.helpers import YARD, env
from tests.recipes.hf_fixtures import tiny_checkpoint, write_chat_jsonl, write_jsonl, write_prompt_jsonl


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {"model": tiny_checkpoint(root / "llama", "llama"), "data": write_jsonl(root / "train.jsonl", 20),
            "base": tiny_checkpoint(root / "base", "llama", chat_template=False),
            "chat": write_chat_jsonl(root / "chat.jsonl", 20), "prompts": write_prompt_jsonl(root / "prompts.jsonl", 20)}


def yard(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([YARD, *args], capture_output=True, text=True, timeout=120, env=env())


def run_with(tmp_path, model, data) -> tuple[subprocess.CompletedProcess, object]:
    out = tmp_path / "out"
    p = yard("run", "llama-pretrain", "--out", str(out), "--set", f"model.from={model}", "--set", f"data.path={data}",
             "--set", "data.seq_len=16", "--set", "batch.global_batch_size=2", "--set", "steps=1")
    return p, out


def one_line_error(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0]


def broken(good, tmp_path, edit) -> object:
    d = tmp_path / "ckpt"
    shutil.copytree(good["model"], d)
    edit(d)
    return d


def test_a_directory_without_config_json(good, tmp_path):
    d = broken(good, tmp_path, lambda d: (d / "config.json").unlink())
    p, out = run_with(tmp_path, d, good["data"])
    assert one_line_error(p) == f"error: model.from: {d}/config.json: no such file; a Hugging Face checkpoint " \
                                "directory has config.json"
    assert not out.exists()


def test_a_directory_without_weights(good, tmp_path):
    d = broken(good, tmp_path, lambda d: (d / "model.safetensors").unlink())
    p, out = run_with(tmp_path, d, good["data"])
    assert f"error: model.from: {d}: no weights" in one_line_error(p) and not out.exists()


def test_an_unsupported_model_type(good, tmp_path):
    def edit(d):
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, "model_type": "falcon"}))

    d = broken(good, tmp_path, edit)
    p, out = run_with(tmp_path, d, good["data"])
    line = one_line_error(p)
    assert line.startswith(f"error: model.from: {d}/config.json: model_type 'falcon' is not supported") and \
        not out.exists()


def test_a_jsonl_line_without_the_field(good, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "a fine line"}\n{"txt": "a typo"}\n')
    p, out = run_with(tmp_path, good["model"], data)
    assert one_line_error(p) == f"error: data.field: {data} line 2: no field 'text'" and not out.exists()


def test_a_rank_started_directly_exits_2_and_writes_nothing(good, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"body": "no text field"}\n')
    ckpt, metrics_dir = tmp_path / "job" / "checkpoints", tmp_path / "job" / "metrics"
    e = {**env(), "TRAINYARD_CHECKPOINT_DIR": str(ckpt), "TRAINYARD_METRICS_DIR": str(metrics_dir)}
    p = subprocess.run([sys.executable, "-m", "trainyard.recipes", "llama-pretrain", "--set",
                        f"model.from={good['model']}", "--set", f"data.path={data}", "--set", "data.seq_len=16",
                        "--set", "batch.global_batch_size=2", "--set", "steps=1"],
                       capture_output=True, text=True, timeout=120, env=e)
    assert p.returncode == 2, p.stderr[-3000:]
    assert f"error: data.field: {data} line 1: no field 'text'" in p.stderr
    assert not (tmp_path / "job").exists()


def test_export_without_a_checkpoint_or_into_a_non_empty_dir(good, tmp_path):
    p = yard("export", str(tmp_path / "nothing"), "--to", str(tmp_path / "x"))
    assert one_line_error(p).startswith("error: RUN: ") and not (tmp_path / "x").exists()
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("mine")
    p = yard("export", str(tmp_path / "nothing"), "--to", str(full))
    assert "error: --to: " in one_line_error(p) and [f.name for f in full.iterdir()] == ["keep"]


def run_kind(tmp_path, recipe, *sets) -> tuple[subprocess.CompletedProcess, object]:
    out = tmp_path / "out"
    args = ["run", recipe, "--out", str(out), "--set", "batch.global_batch_size=2", "--set", "steps=1"]
    for item in sets:
        args += ["--set", item]
    return yard(*args), out


def test_sft_with_a_tokenizer_without_a_chat_template(good, tmp_path):
    p, out = run_kind(tmp_path, "sft", f"model.from={good['base']}", f"data.path={good['chat']}")
    line = one_line_error(p)
    assert line.startswith(f"error: model.from: {good['base']}/tokenizer_config.json: no chat_template (nor "
                           "chat_template.jinja beside it); SFT renders the data's 'messages' with the tokenizer's "
                           "chat template"), line
    assert not out.exists()


def test_sft_records_without_the_messages_field(good, tmp_path):
    data = tmp_path / "chat.jsonl"
    data.write_text(good["chat"].read_text().splitlines()[0] + "\n" + '{"conversation": []}\n')
    p, out = run_kind(tmp_path, "sft", f"model.from={good['model']}", f"data.path={data}")
    assert one_line_error(p) == f"error: data.field: {data} line 2: no field 'messages'" and not out.exists()
    p, out = run_kind(tmp_path, "sft", f"model.from={good['model']}", f"data.path={data}", "data.field=conversation")
    assert one_line_error(p) == f"error: data.field: {data} line 1: no field 'conversation'" and not out.exists()


def test_sft_on_the_user_s_data_needs_a_hugging_face_model(good, tmp_path):
    p, out = run_kind(tmp_path, "sft", f"data.path={good['chat']}")
    assert one_line_error(p).startswith("error: model.from: a sft recipe on the user's data (data.path) tokenizes "
                                        "it with a Hugging Face checkpoint's tokenizer") and not out.exists()
    p, out = run_kind(tmp_path, "sft", f"model.from={good['model']}")
    assert one_line_error(p).startswith("error: data.path: the generated tasks are bytes; with model.from give the "
                                        "sft data") and not out.exists()


def test_rl_records_without_the_answer_field(good, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "last word: a b", "solution": "b"}\n')
    p, out = run_kind(tmp_path, "rl", f"model.from={good['model']}", f"data.path={data}")
    assert one_line_error(p) == f"error: data.answer_field: {data} line 1: no field 'answer'" and not out.exists()
    p, out = run_kind(tmp_path, "rl", f"model.from={good['model']}", f"data.path={data}", "data.field=question")
    assert one_line_error(p) == f"error: data.field: {data} line 1: no field 'question'" and not out.exists()


def test_rl_with_a_reward_function_that_is_not_there(good, tmp_path):
    f = tmp_path / "reward.py"
    f.write_text("def score(prompt, completion, answer):\n    return 1.0\n")
    base = [f"model.from={good['model']}", f"data.path={good['prompts']}", "rl.reward=python"]
    p, out = run_kind(tmp_path, "rl", *base, f"rl.reward_function={f}:scor")
    assert one_line_error(p) == f"error: rl.reward_function: {f}: no function 'scor' at its top level"
    p, out = run_kind(tmp_path, "rl", *base, f"rl.reward_function={tmp_path}/rewards.py:score")
    assert one_line_error(p).startswith(f"error: rl.reward_function: {tmp_path}/rewards.py: No such file")
    p, out = run_kind(tmp_path, "rl", *base, "rl.reward_function=my_rewardz:score")
    assert one_line_error(p).startswith("error: rl.reward_function: no module 'my_rewardz'") and not out.exists()


def test_an_sft_rank_started_directly_exits_2_and_writes_nothing(good, tmp_path):
    ckpt, metrics_dir = tmp_path / "job" / "checkpoints", tmp_path / "job" / "metrics"
    e = {**env(), "TRAINYARD_CHECKPOINT_DIR": str(ckpt), "TRAINYARD_METRICS_DIR": str(metrics_dir)}
    p = subprocess.run([sys.executable, "-m", "trainyard.recipes", "sft", "--set", f"model.from={good['base']}",
                        "--set", f"data.path={good['chat']}", "--set", "batch.global_batch_size=2", "--set",
                        "steps=1"], capture_output=True, text=True, timeout=120, env=e)
    assert p.returncode == 2, p.stderr[-3000:]
    assert f"error: model.from: {good['base']}/tokenizer_config.json: no chat_template" in p.stderr
    assert not (tmp_path / "job").exists()
