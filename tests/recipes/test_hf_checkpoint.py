"""`recipes/hf_checkpoint.py` on real checkpoint directories written by `save_pretrained`.

The checks that run before anything starts (a directory without config.json, without weights,
with a shard missing, without a tokenizer, a model_type not supported) name the file and the
field; the loader gives the very model that was saved (same logits), sharded or not, for Llama
and Gemma; the tokenizer wrapper encodes without special tokens and knows BOS/EOS.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from trainyard.recipes import hf_checkpoint as H
from trainyard.recipes.models import build_model, decoder_layers
from trainyard.recipes.spec import ModelSpec, RecipeError
from tests.recipes.hf_fixtures import tiny_checkpoint


@pytest.fixture(scope="module")
def llama_sharded(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("hf") / "llama", "llama", shards=True)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("hf") / "gemma", "gemma")


def copy(src, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def test_inspect_reads_the_sharded_index_and_the_tokenizer_files(llama_sharded):
    info = H.inspect(llama_sharded)
    assert info.model_type == "llama" and info.config["hidden_size"] == 32
    assert len(info.weight_files) > 1 and all(p.suffix == ".safetensors" for p in info.weight_files)
    assert {p.name for p in info.tokenizer_files} >= {"tokenizer.json", "tokenizer_config.json"}
    assert len(info.tokenizer_fingerprint()) == 64


def test_a_directory_without_config_json_is_refused_naming_the_file(llama_sharded, tmp_path):
    d = copy(llama_sharded, tmp_path)
    (d / "config.json").unlink()
    with pytest.raises(RecipeError) as e:
        H.inspect(d)
    assert e.value.field == "model.from" and f"{d}/config.json: no such file" in str(e.value)


def test_an_unsupported_model_type_is_refused_naming_the_file_and_the_field(gemma, tmp_path):
    d = copy(gemma, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(RecipeError) as e:
        H.inspect(d)
    msg = str(e.value)
    assert msg.startswith("model.from: ") and "config.json: model_type 'gpt2' is not supported" in msg
    assert "gemma, llama, mistral, qwen2" in msg and "\n" not in msg


def test_no_weights_or_a_missing_shard_is_refused(gemma, llama_sharded, tmp_path):
    d = copy(gemma, tmp_path)
    (d / "model.safetensors").unlink()
    with pytest.raises(RecipeError, match=r"no weights \(model.safetensors, or shards listed by "):
        H.inspect(d)
    s = tmp_path / "sharded"
    shutil.copytree(llama_sharded, s)
    shard = sorted(s.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(RecipeError, match=f"model.safetensors.index.json: names {shard.name}, which is not in"):
        H.inspect(s)


def test_no_tokenizer_is_refused(gemma, tmp_path):
    d = copy(gemma, tmp_path)
    (d / "tokenizer.json").unlink()
    with pytest.raises(RecipeError, match="no tokenizer"):
        H.inspect(d)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("hf") / "qwen2", "qwen2")


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("hf") / "mistral", "mistral")


@pytest.mark.parametrize("which", ["llama_sharded", "gemma", "qwen2", "mistral"])
def test_the_loaded_model_is_the_saved_one(which, request):
    d = request.getfixturevalue(which)
    assert H.inspect(d).model_type == which.split("_")[0]
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(d, local_files_only=True).eval()
    model = build_model(ModelSpec.model_validate({"from": str(d)})).eval()
    assert type(model).__name__ == type(ref).__name__ and not model.config.use_cache
    assert len(decoder_layers(model)) == 2  # what FSDP2 shards
    x = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, ref(input_ids=x).logits)
    arch_only = build_model(ModelSpec.model_validate({"from": str(d)}), load_weights=False)
    assert arch_only.config.hidden_size == 32
    assert not torch.equal(arch_only.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_the_tokenizer_encodes_without_special_tokens_and_knows_bos_and_eos(gemma):
    tok = H.load_tokenizer(gemma)
    ids = tok.encode_batch(["the model reads text", ""])
    assert ids[1] == [] and ids[0] and tok.bos not in ids[0] and tok.eos not in ids[0]
    assert (tok.bos, tok.eos) == (1, 2) and tok.vocab_size <= 400


def test_model_from_resets_the_recipe_s_model_sizes():
    m = ModelSpec.model_validate({"from": "/x", "hidden_size": 7, "num_heads": 3})
    assert m.from_ == "/x" and m.hidden_size == ModelSpec().hidden_size
    assert m.model_dump(mode="json")["from"] == "/x"
