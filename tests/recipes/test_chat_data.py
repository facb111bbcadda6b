"""`recipes/chat_data.py`, `recipes/rewards.py` and the sampler of `recipes/chat_train.py`, in
process: the chat template's assistant spans and the loss mask, the record checks (file, line,
field), the caches (built once, keyed by data, fields and tokenizer, nothing left on error), the
hashed split, truncation, prompts with and without a template, the rewards, left-padded sampling.

Real files and real tokenizers (the BPE of `hf_fixtures`, trained at test time, with and without
its chat template); the one model is the tiny Llama (for the sampler).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from trainyard.recipes import chat_data as C
from trainyard.recipes import hf_checkpoint as H
from trainyard.recipes import rewards as R
from trainyard.recipes import user_data
from trainyard.recipes.spec import RecipeError, load_recipe
from tests.recipes.hf_fixtures import conversation, tiny_checkpoint, write_chat_jsonl, write_prompt_jsonl


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    return {"chat": tiny_checkpoint(root / "llama", "llama"),
            "base": tiny_checkpoint(root / "base", "llama", chat_template=False)}


@pytest.fixture(scope="module")
def tok(ckpt):
    return H.load_tokenizer(ckpt["chat"])


@pytest.fixture(scope="module")
def base_tok(ckpt):
    return H.load_tokenizer(ckpt["base"])


def sft(model, data, *sets):
    return load_recipe("sft", [f"model.from={model}", f"data.path={data}", *sets])


def rl(model, data, *sets):
    return load_recipe("rl", [f"model.from={model}", f"data.path={data}", *sets])


# -- the chat template and the loss mask -----------------------------------------------------------------


def test_the_loss_mask_covers_each_assistant_turn_and_its_end_of_turn(tok):
    messages = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "reverse: the model"}, {"role": "assistant", "content": "model the"},
                {"role": "user", "content": "reverse: a run"}, {"role": "assistant", "content": "run a"}]
    text, spans = C.render_conversation(tok.tok, messages, "x")
    assert [text[a:b] for a, b in spans] == ["model the</s>\n", "run a</s>\n"]
    [(ids, mask)] = C.encode_conversations(tok.tok, [("x", messages)])
    # the very tokens apply_chat_template(tokenize=True) gives: inference sees what training saw
    assert ids == tok.tok.apply_chat_template(messages, tokenize=True)["input_ids"]
    trained = [tok.tok.decode([i]) for i, m in zip(ids, mask) if m]
    assert "".join(trained) == "model the</s>\nrun a</s>\n"
    assert not any(mask[: ids.index(tok.tok.convert_tokens_to_ids("<|assistant|>")) + 2])  # header and "\n"


def test_a_template_that_is_not_the_sum_of_its_prefixes_is_refused(ckpt, tmp_path):
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(ckpt["chat"])
    # a template that shows only the last assistant turn (as some drop earlier reasoning)
    t.chat_template = ("{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
                       "{{ m['role'] + ': ' + m['content'] + '\n' }}{% endif %}{% endfor %}"
                       "{% if add_generation_prompt %}assistant: {% endif %}")
    messages = conversation(0)[-2:] * 2
    with pytest.raises(RecipeError, match=r"^data.field: f.jsonl line 3: the chat template does not render"):
        C.render_conversation(t, messages, "f.jsonl line 3")


# -- records: every error names the file, the line and the field ----------------------------------------


def test_conversation_records_are_checked_by_file_line_and_field(tmp_path):
    f = tmp_path / "chat.jsonl"
    good = json.dumps({"messages": conversation(1)})
    cases = [
        ('{"text": "no messages"}', "data.field", "line 2: no field 'messages'"),
        ('{"messages": "hello"}', "data.field", "line 2: field 'messages' is str, not a list"),
        ('{"messages": [{"role": "user"}]}', "data.field", "line 2: messages[0] has no 'content'"),
        ('{"messages": [{"role": "user", "content": 3}]}', "data.field", "line 2: messages[0].content is int"),
        ('{"messages": [{"role": "user", "content": "hi"}]}', "data.field", "line 2: field 'messages' has no assistant"),
        ("not json", "data.path", "line 2: not a JSON object"),
    ]
    for line, field, words in cases:
        f.write_text(good + "\n" + line + "\n")
        with pytest.raises(RecipeError) as e:
            list(C.conversations([f], "messages"))
        assert e.value.field == field and str(e.value).startswith(f"{field}: {f} {words}"), str(e.value)
    f.write_text(json.dumps({"chat": conversation(1)}) + "\n")
    assert len(list(C.conversations([f], "chat"))) == 1  # data.field renames it
    txt = tmp_path / "notes.txt"
    txt.write_text("plain text")
    with pytest.raises(RecipeError, match="^data.path: .*notes.txt: a text file has no fields"):
        list(C.conversations([txt], "messages"))


def test_prompt_records_need_the_prompt_and_the_answer(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "2+2=", "answer": 4}\n{"prompt": [{"role": "user", "content": "hi"}], "answer": "x"}\n')
    assert [(p, a) for _, p, a in C.prompt_records([f], "prompt", "answer")] == \
        [("2+2=", "4"), ([{"role": "user", "content": "hi"}], "x")]  # a number answer is its text
    f.write_text('{"prompt": "2+2=", "answer": "4"}\n{"prompt": "3+3="}\n')
    with pytest.raises(RecipeError) as e:
        list(C.prompt_records([f], "prompt", "answer"))
    assert str(e.value) == f"data.answer_field: {f} line 2: no field 'answer'"
    f.write_text('{"question": "2+2=", "answer": "4"}\n')
    with pytest.raises(RecipeError, match=f"^data.field: {f} line 1: no field 'prompt'"):
        list(C.prompt_records([f], "prompt", "answer"))
    f.write_text('{"prompt": 5, "answer": "4"}\n')
    with pytest.raises(RecipeError, match="field 'prompt' is int, not a string or a list"):
        list(C.prompt_records([f], "prompt", "answer"))
    f.write_text('{"prompt": "x", "answer": null}\n')
    with pytest.raises(RecipeError, match="^data.answer_field: .* field 'answer' is NoneType"):
        list(C.prompt_records([f], "prompt", "answer"))


def test_check_needs_a_model_and_for_sft_a_chat_template(ckpt, tmp_path):
    chat = write_chat_jsonl(tmp_path / "chat.jsonl", 5)
    assert C.check(sft(ckpt["chat"], chat)) == 5
    with pytest.raises(RecipeError) as e:
        C.check(sft(ckpt["base"], chat))
    assert e.value.field == "model.from"
    assert str(e.value).startswith(f"model.from: {ckpt['base']}/tokenizer_config.json: no chat_template")
    with pytest.raises(RecipeError, match="^model.from: a sft recipe on the user's data .* give model.from"):
        C.check(load_recipe("sft", [f"data.path={chat}"]))
    # RL: plain-text prompts work without a template, chat prompts do not
    prompts = write_prompt_jsonl(tmp_path / "p.jsonl", 5)
    assert C.check(rl(ckpt["base"], prompts)) == 5
    chat_prompts = tmp_path / "cp.jsonl"
    chat_prompts.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}], "answer": "x"}) + "\n")
    with pytest.raises(RecipeError, match="^model.from: .*tokenizer_config.json: no chat_template"):
        C.check(rl(ckpt["base"], chat_prompts))
    # the call `yard run` makes, user_data.check_recipe(spec), checks what the recipe's kind reads
    with pytest.raises(RecipeError, match="no chat_template"):
        user_data.check_recipe(sft(ckpt["base"], chat))
    with pytest.raises(RecipeError, match="line 1: no field 'messages'"):
        user_data.check_recipe(sft(ckpt["chat"], prompts))


def test_the_kind_decides_the_default_field():
    assert load_recipe("llama-pretrain").data.field == "text"
    assert load_recipe("sft", ["data.path=/x.jsonl"]).data.field == "messages"
    r = load_recipe("rl", ["data.path=/x.jsonl"])
    assert (r.data.field, r.data.answer_field) == ("prompt", "answer")
    assert load_recipe("sft", ["data.path=/x.jsonl", "data.field=chat"]).data.field == "chat"
    assert "field: messages" in load_recipe("sft", ["data.path=/x.jsonl"]).to_yaml()  # recorded in recipe.yaml


# -- the caches ---------------------------------------------------------------------------------------------


def test_the_sft_cache_is_built_once_and_keyed_by_data_field_and_template(ckpt, tok, tmp_path):
    chat = write_chat_jsonl(tmp_path / "d" / "chat.jsonl", 40)
    spec = sft(ckpt["chat"], chat).data
    cache = tmp_path / "cache"
    meta_path = C.build_cache("sft", spec, tok, cache)
    meta = json.loads(meta_path.read_text())
    assert (meta["kind"], meta["documents"], meta["field"]) == ("sft", 40, "messages")
    key = meta["key"]
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [f"{key}.json"] + [f"{key}.{n}.bin" for n in ("tokens", "mask", "offsets", "first")])
    want = C.encode_conversations(tok.tok, list(C.conversations([chat], "messages")))
    tokens = np.fromfile(cache / f"{key}.tokens.bin", dtype=np.int32)
    mask = np.fromfile(cache / f"{key}.mask.bin", dtype=np.uint8)
    assert tokens.tolist() == [t for ids, _ in want for t in ids]
    assert mask.astype(bool).tolist() == [m for _, ms in want for m in ms]
    assert meta["targets"] == sum(sum(ms[1:]) for _, ms in want) and meta["tokens"] == len(tokens)
    mtime = meta_path.stat().st_mtime_ns
    assert C.build_cache("sft", spec, tok, cache) == meta_path and meta_path.stat().st_mtime_ns == mtime
    # another template is another tokenizer: another key (as are other bytes and another field)
    other = tmp_path / "other"
    shutil.copytree(ckpt["chat"], other)
    (other / "chat_template.jinja").write_text((other / "chat_template.jinja").read_text().replace("|>", "|> "))
    assert C.cache_key("sft", spec, H.inspect(other).tokenizer_fingerprint())[0] != key
    assert C.cache_key("sft", sft(ckpt["chat"], chat, "data.field=chat").data, tok.fingerprint)[0] != key
    assert C.cache_key("rl", spec, tok.fingerprint)[0] != key
    chat.write_text(chat.read_text() + json.dumps({"messages": conversation(99)}) + "\n")
    assert C.cache_key("sft", spec, tok.fingerprint)[0] != key


def test_a_failed_build_leaves_nothing(ckpt, tok, tmp_path):
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": conversation(1)}) + "\n" + '{"messages": []}\n')
    cache = tmp_path / "run" / "checkpoints" / "tokens"
    cache.parent.mkdir(parents=True)
    with pytest.raises(RecipeError, match="line 2: field 'messages' is an empty list"):
        C.build_cache("sft", sft(ckpt["chat"], chat).data, tok, cache)
    assert not cache.exists()


def test_conversations_are_cut_to_seq_len_and_those_left_without_targets_dropped(ckpt, tok, tmp_path):
    chat = write_chat_jsonl(tmp_path / "chat.jsonl", 200)
    meta = C.build_cache("sft", sft(ckpt["chat"], chat).data, tok, tmp_path / "cache")
    full = C.Conversations(meta, 10_000, 0.1, pad_id=0)
    assert full.dropped == 0 and len(full) + len(full.eval_ids) == 200 and len(full.eval_ids) == 20
    assert set(full.train).isdisjoint(full.eval_ids)
    short = C.Conversations(meta, 24, 0.1, pad_id=0)
    assert short.dropped > 0 and len(short) + len(short.eval_ids) + short.dropped == 200
    assert set(short.eval_ids) <= set(full.eval_ids)  # the split is of records, not of what is left
    tokens, targets = short.batch(list(range(8)))
    assert tokens.shape[0] == 8 and tokens.shape[1] <= 24 and targets.shape == (8, tokens.shape[1] - 1)
    assert short.target_tokens(list(range(8))) == int((targets != -100).sum()) > 0
    # a row is the record's tokens, right-padded; its targets are the next tokens where the mask says so
    r = short.train[0]
    ids = short.ids(r)[:24]
    n = len(ids)
    assert tokens[0, :n].tolist() == ids.tolist() and (tokens[0, n:] == 0).all()
    m = np.asarray(short.mask[short.offsets[r]: short.offsets[r] + n]).astype(bool)
    assert targets[0, : n - 1].tolist() == np.where(m[1:], ids[1:], -100).tolist()
    with pytest.raises(RecipeError, match="^data.seq_len: .*no conversation with an assistant token within"):
        C.Conversations(meta, 4, 0.1, pad_id=0)


def test_the_split_is_a_fixed_hash_of_the_record_index():
    a = C.held_out(1000, 0.05)
    assert len(a) == 50 and a.tolist() == sorted(a.tolist()) and C.held_out(1000, 0.05).tolist() == a.tolist()
    assert a.min() < 200 and a.max() > 800  # spread over the file, not its tail
    assert C.held_out(20, 0.1).tolist() == [10, 18]  # pinned (splitmix64): a change would move every split
    assert len(C.held_out(3, 0.01)) == 1 and len(C.held_out(1, 0.5)) == 0 and len(C.held_out(10, 0.0)) == 0


def test_prompts_with_the_template_or_as_plain_text(ckpt, tok, base_tok, tmp_path):
    f = write_prompt_jsonl(tmp_path / "p.jsonl", 30)
    with f.open("a") as fh:
        fh.write(json.dumps({"prompt": "dernier mot : café crème", "answer": "crème"}) + "\n")
        fh.write(json.dumps({"prompt": "last word: " + "model " * 40, "answer": "model"}) + "\n")
    spec = rl(ckpt["chat"], f).data
    p = C.Prompts(C.build_cache("rl", spec, tok, tmp_path / "c1"), 40, 0.1)
    assert p.dropped == 1 and len(p) + len(p.eval_ids) == 31  # the 40-word prompt is longer than seq_len
    assert p.record(30) == ("dernier mot : café crème", "crème")
    assert tok.tok.decode(p.prompt_ids(30)) == "<s><|user|>\ndernier mot : café crème\n<|assistant|>\n"
    base = C.Prompts(C.build_cache("rl", spec, base_tok, tmp_path / "c2"), 40, 0.1)
    assert base.prompt_ids(30) == [base_tok.bos, *base_tok.encode_batch(["dernier mot : café crème"])[0]]
    assert base.meta["chat_template"] is False and p.meta["chat_template"] is True


# -- rewards --------------------------------------------------------------------------------------------


def test_exact_and_regex_rewards():
    assert R.exact("p", " 42\n", "42") == 1.0 and R.exact("p", "42.", "42") == 0.0
    group = R.regex(r"#### (\S+)")
    assert group("p", "so 6*7 = 42\n#### 42", "42") == 1.0 and group("p", "#### 41", "42") == 0.0
    assert group("p", "no marker", "42") == 0.0
    templated = R.regex(r"answer is {answer}\b")
    assert templated("p", "the answer is 3.5 here", "3.5") == 1.0 and templated("p", "the answer is 3x5", "3.5") == 0.0
    assert R.regex(r"^\s*\w+\s*$")("p", " word ", "ignored") == 1.0  # no group, no {answer}: any match


def test_a_python_reward_from_a_file_or_a_module(tmp_path, monkeypatch):
    f = tmp_path / "my_reward.py"
    f.write_text("def score(prompt, completion, answer):\n    return float(answer in completion)\n\n"
                 "def half(prompt, completion, answer):\n    return 'half'\n\nNOT_A_FUNCTION = 3\n")
    spec = load_recipe("rl", ["data.path=/x.jsonl", "rl.reward=python", f"rl.reward_function={f}:score"]).rl
    R.check(spec)
    assert R.load(spec)("p", "it is 42", "42") == 1.0
    bad = load_recipe("rl", ["data.path=/x.jsonl", "rl.reward=python", f"rl.reward_function={f}:half"]).rl
    with pytest.raises(TypeError, match="returned 'half'; it must return a finite number"):
        R.load(bad)("p", "c", "a")
    for ref, words in ((f"{f}:nope", f"{f}: no function 'nope' at its top level"),
                       (f"{tmp_path}/missing.py:score", "missing.py: No such file or directory"),
                       ("no_such_module_here:score", "no module 'no_such_module_here'")):
        s = load_recipe("rl", ["data.path=/x.jsonl", "rl.reward=python", f"rl.reward_function={ref}"]).rl
        with pytest.raises(RecipeError) as e:
            R.load(s)
        assert e.value.field == "rl.reward_function" and words in str(e.value), str(e.value)
    s = load_recipe("rl", ["data.path=/x.jsonl", "rl.reward=python", f"rl.reward_function={f}:NOT_A_FUNCTION"]).rl
    R.check(s)  # bound at the top level: only the import tells
    with pytest.raises(RecipeError, match="'NOT_A_FUNCTION' is int, not a function"):
        R.load(s)
    f.write_text("def score(:\n")
    with pytest.raises(RecipeError, match="line 1: not valid Python"):
        R.check(spec)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "pkg_rewards.py").write_text("def exact_int(p, c, a):\n    return int(c.strip() == a)\n")
    mod = load_recipe("rl", ["data.path=/x.jsonl", "rl.reward=python", "rl.reward_function=pkg_rewards:exact_int"]).rl
    assert R.load(mod)("p", " 7 ", "7") == 1.0


def test_reward_settings_are_checked_in_the_recipe():
    for sets, words in ((["rl.reward=regex"], "rl.reward_pattern: rl.reward=regex needs a pattern"),
                        (["rl.reward=regex", "rl.reward_pattern=(["], "not a regular expression"),
                        (["rl.reward_pattern=x"], "rl.reward_pattern: only with rl.reward=regex"),
                        (["rl.reward=python", "rl.reward_function=score"], "is not FILE.py:NAME or MODULE:NAME")):
        with pytest.raises(RecipeError, match=words):
            load_recipe("rl", ["data.path=/x.jsonl", *sets])
    with pytest.raises(RecipeError, match="^rl.reward: the generated tasks are scored by their exact answer"):
        load_recipe("rl", ["rl.reward=regex", "rl.reward_pattern=x"])


# -- sampling -------------------------------------------------------------------------------------------


def test_left_padded_prompts_are_continued_as_they_would_be_alone(ckpt, tok):
    from trainyard.recipes.chat_train import completion_mask, sample

    model = H.build_model(ckpt["chat"]).eval()
    prompts = C.encode_prompts(tok, ["last word: the model", "last word: a cluster trains it on many ranks"],
                               templated=True)
    end = torch.tensor([tok.eos])
    ids, attn, both = sample(model, prompts, 8, pad_id=0, end_ids=end, vocab=400, greedy=True)
    assert ids.shape == (2, max(map(len, prompts))) and attn.sum(1).tolist() == [len(p) for p in prompts]
    for row, p in enumerate(prompts):
        _, _, alone = sample(model, [p], 8, pad_id=0, end_ids=end, vocab=400, greedy=True)
        assert alone[0].tolist() == both[row].tolist()
    resp = torch.tensor([[5, 6, tok.eos, 9, 9], [5, 6, 7, 8, 9]])
    assert completion_mask(resp, end).tolist() == [[True, True, True, False, False], [True] * 5]
    torch.manual_seed(0)
    _, _, a = sample(model, prompts * 4, 6, pad_id=0, end_ids=end, vocab=300)
    torch.manual_seed(0)
    _, _, b = sample(model, prompts * 4, 6, pad_id=0, end_ids=end, vocab=300)
    assert a.tolist() == b.tolist() and int(a.max()) < 300  # the global generator decides; no id >= vocab
