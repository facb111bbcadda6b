"""Recipes as data: the shipped files, `--set` typing and errors, resume compatibility, the data.

Fast: no training here (the CLI is called in-process, or as `python -m trainyard.recipes`, which
fails before importing torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from trainyard.cli.main import app
from trainyard.recipes import RecipeError, load_recipe, shipped
from trainyard.recipes.checkpoints import check_resume, resolve_init
from trainyard.recipes.data import EOS, PAD, TaskSet, decode, stdlib_files
from trainyard.recipes.spec import DataSpec, configs_dir, parse_set


def yard(*args: str):
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_the_four_recipes_ship_and_take_steps_and_checkpoint_every():
    assert shipped() == ["gemma-pretrain", "llama-pretrain", "rl", "sft"]
    for name in shipped():
        spec = load_recipe(name, ["steps=24", "checkpoint_every=4"])
        assert (spec.name, spec.steps, spec.checkpoint_every) == (name, 24, 4)
        for n in (1, 2, 4):
            spec.check_world_size(n)  # the same recipe on 1, 2 or 4 processes
    assert load_recipe("gemma-pretrain").strategy == "fsdp2" and load_recipe("llama-pretrain").strategy == "ddp"
    assert load_recipe("rl").kind == "rl" and load_recipe("sft").data.source == "tasks"


def test_set_values_are_typed_by_the_field():
    spec = load_recipe("llama-pretrain", ["model.hidden_size=64", "optim.lr=3e-4", "log_samples=true",
                                          "checkpoint_every=null", "optim.betas=[0.8, 0.9]", "strategy=fsdp2",
                                          "model.tie_embeddings=true", "seed=7"])
    assert spec.model.hidden_size == 64 and spec.optim.lr == 3e-4 and spec.log_samples is True
    assert spec.checkpoint_every is None and spec.optim.betas == (0.8, 0.9) and spec.strategy == "fsdp2"
    assert spec.model.tie_embeddings is True and spec.seed == 7
    sft = load_recipe("sft", ["data.tasks=[add, sub, reverse]", "init_from=/runs/a: b#c"])
    assert sft.data.tasks == ["add", "sub", "reverse"]
    assert sft.init_from == "/runs/a: b#c"  # a string field takes the text as it is
    assert load_recipe("sft", ["init_from=null"]).init_from is None
    assert parse_set("model.num_layers= 3 ") == (["model", "num_layers"], 3)


@pytest.mark.parametrize("item, field, words", [
    ("model.hiden_size=3", "--set", ["unknown key 'model.hiden_size'", "hidden_size"]),
    ("stepz=3", "--set", ["unknown key 'stepz'", "steps"]),
    ("model=3", "--set", ["'model' is a section"]),
    ("steps.x=1", "--set", ["'steps' is a value"]),
    ("steps", "--set", ["expected KEY=VALUE"]),
    ("steps=abc", "steps", ["valid integer", "--set steps=abc"]),
    ("steps=0", "steps", ["greater than or equal to 1"]),
    ("optim.lr=fast", "optim.lr", ["valid number"]),
    ("strategy=zero3", "strategy", ["'ddp' or 'fsdp2'"]),
    ("model.num_heads=7", "model.num_heads", ["not a multiple of 7"]),
    ("data.seq_len=4096", "data.seq_len", ["exceeds model.max_seq_len"]),
    ("data.source=tasks", "data.source", ["needs data.source=python-stdlib"]),
    ("model.vocab_size=100", "model.vocab_size", ["greater than or equal to 259"]),
])
def test_a_bad_set_names_the_field(item, field, words):
    with pytest.raises(RecipeError) as e:
        load_recipe("llama-pretrain", [item])
    msg = str(e.value)
    assert msg.startswith(f"{field}: "), msg
    for w in words:
        assert w in msg, msg


def test_recipe_files_and_their_errors(tmp_path):
    mine = tmp_path / "mine.yaml"
    data = yaml.safe_load((configs_dir() / "llama-pretrain.yaml").read_text())
    mine.write_text(yaml.safe_dump({**data, "name": "mine", "steps": 12}))
    assert load_recipe(str(mine)).steps == 12
    with pytest.raises(RecipeError, match="^recipe: unknown recipe 'nope'; shipped: gemma-pretrain"):
        load_recipe("nope")
    with pytest.raises(RecipeError, match="^recipe: no such file"):
        load_recipe(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**data, "modle": {}}))
    with pytest.raises(RecipeError, match="^modle: Extra inputs are not permitted"):
        load_recipe(str(bad))
    bad.write_text("kind: [unclosed")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(str(bad))


def test_world_size_and_micro_batch_must_divide():
    spec = load_recipe("llama-pretrain", ["batch.global_batch_size=12", "batch.micro_batch_size=4"])
    spec.check_world_size(3)  # 4 per rank, one micro-batch
    with pytest.raises(RecipeError, match="^batch.global_batch_size: 12 is not a multiple of the 5 processes"):
        spec.check_world_size(5)
    with pytest.raises(RecipeError, match="^batch.micro_batch_size: 4 does not divide a rank's share 6"):
        spec.check_world_size(2)


def test_a_rerun_must_keep_model_data_seed_and_global_batch(tmp_path):
    ckpt = tmp_path / "checkpoints"
    (ckpt / "step-4").mkdir(parents=True)
    (ckpt / "step-4" / "COMMITTED").write_text("{}")
    spec = load_recipe("llama-pretrain", ["steps=8"])
    (ckpt / "recipe.yaml").write_text(spec.to_yaml())
    check_resume(ckpt, load_recipe("llama-pretrain", ["steps=16", "optim.lr=1e-4", "strategy=fsdp2"]))  # fine
    for item, field in (("model.hidden_size=128", "model.hidden_size"), ("seed=1", "seed"),
                        ("data.seq_len=128", "data.seq_len"), ("batch.global_batch_size=64", "batch.global_batch_size")):
        with pytest.raises(RecipeError) as e:
            check_resume(ckpt, load_recipe("llama-pretrain", [item]))
        assert str(e.value).startswith(f"{field}: ") and "another --out" in str(e.value)
    # init_from: an out dir, its checkpoints/ or one step; the newest complete checkpoint and its model
    info = resolve_init(tmp_path)
    assert info["step"] == 4 and info["checkpoint"] == str(ckpt / "step-4") and info["model"]["hidden_size"] == 256
    assert resolve_init(ckpt / "step-4")["step"] == 4
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecipeError, match="^init_from: .*no complete checkpoint"):
        resolve_init(tmp_path / "empty")
    with pytest.raises(RecipeError, match="^init_from: .*no such directory"):
        resolve_init(tmp_path / "nothing")


def test_yard_run_bad_input_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "out"
    cases = [
        (["nope"], "recipe: unknown recipe 'nope'"),
        (["llama-pretrain", "--set", "model.hiden_size=3"], "unknown key 'model.hiden_size'"),
        (["llama-pretrain", "--set", "steps=abc"], "steps: Input should be a valid integer"),
        (["llama-pretrain", "--nproc", "0"], "--nproc: must be at least 1"),
        (["llama-pretrain", "--nproc", "3"], "batch.global_batch_size: 32 is not a multiple of the 3 processes"),
        (["sft", "--set", f"init_from={tmp_path / 'none'}"], "init_from: "),
    ]
    for args, words in cases:
        code, _, err = yard("run", *args, "--out", str(out))
        assert code == 2, (args, err)
        assert err.startswith("error: ") and words in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_yard_submit_recipe_bad_input_is_refused_before_the_server():
    for args, words in ((["--recipe", "nope"], "unknown recipe"),
                        (["--recipe", "llama-pretrain", "--set", "nope=1"], "unknown key 'nope'"),
                        (["--recipe", "llama-pretrain", "-G", "3"], "not a multiple of the 3 processes"),
                        (["--set", "steps=3", "--", "true"], "--set: only with --recipe"),
                        (["--recipe", "llama-pretrain", "--", "true"], "not both")):
        code, _, err = yard("submit", *args)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, (args, err)


def test_the_rank_entry_point_reports_a_bad_recipe_with_exit_2():
    p = subprocess.run([sys.executable, "-m", "trainyard.recipes", "llama-pretrain", "--set", "model.layers=2"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("error: --set: unknown key 'model.layers'"), p.stderr


def test_tasks_are_generated_deterministically_and_checked_exactly():
    spec = DataSpec(source="tasks", tasks=["add", "sub", "reverse"], max_operand=99, word_len=5)
    a, b = TaskSet(spec, 0, "sft", 50), TaskSet(spec, 0, "sft", 50)
    assert a.tasks == b.tasks and a.fingerprint.digest == b.fingerprint.digest
    assert TaskSet(spec, 0, "rl", 50).tasks != a.tasks  # splits differ
    tokens, mask = a.pairs([0, 1, 2])
    assert a.target_tokens([0, 1, 2]) == int(mask.sum())  # what the SFT loss is normalized by
    assert tokens.shape == (3, a.prompt_len + a.answer_len)
    for row, i in enumerate([0, 1, 2]):
        t = a.tasks[i]
        assert decode(tokens[row, : a.prompt_len]) == t.prompt  # right-aligned after PADs
        assert decode(tokens[row][mask[row]]) == t.answer and tokens[row][mask[row]][-1] == EOS
        assert tokens[row, 0] == PAD or len(t.prompt) + 1 == a.prompt_len
        right = list(t.answer.encode()) + [EOS]
        assert a.reward(i, right + [PAD]) == 1.0
        assert a.reward(i, list(t.answer.encode())) == 0.0  # no EOS: not an answer
        assert a.reward(i, list((t.answer + "0").encode()) + [EOS]) == 0.0
    add = next(t for t in a.tasks if "+" in t.prompt)
    x, y = map(int, add.prompt[:-1].split("+"))
    assert int(add.answer) == x + y


def test_the_stdlib_corpus_is_a_fixed_list_of_files():
    files = stdlib_files()
    assert files == stdlib_files() and len(files) > 100
    names = [rel for rel, _ in files]
    assert "os.py" in names and not any(n.startswith(("site-packages/", "test/")) for n in names)
