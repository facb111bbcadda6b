"""The memory planner: published figures (ZeRO paper, Korthikanti et al.), config files, the GPU search, the CLI."""

import json
import math
from decimal import ROUND_HALF_UP, Decimal

import pytest
from typer.testing import CliRunner

from trainyard.cli.main import app
from trainyard.plan.memory import (GB, GIB, KNOWN, ArchError, ModelArch, ParamCount, PlanError, TrainSetup,
                                   activation_bytes_per_layer, arch_to_hf_config, get_model, load_hf_config,
                                   memory_per_gpu, min_gpus, model_state_bytes, parse_param_count, suggest,
                                   unsharded_bytes, usable_bytes)


def gb1(x: float) -> Decimal:
    """GB to one decimal, halves up: the ZeRO paper's 1.875 GB → 1.9."""
    return (Decimal(x) / Decimal(GB)).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP)


def yard(*args):
    return CliRunner().invoke(app, ["plan", "memory", *map(str, args)])


# --- parameter counts -----------------------------------------------------------------------------


def test_llama2_7b_parameter_count_is_exact():
    m = get_model("llama-2-7b")
    assert (m.vocab, m.hidden, m.layers, m.ffn, m.tied_embeddings, m.norm) == (32000, 4096, 32, 11008, False, "rms")
    assert m.params == 6_738_415_616
    assert get_model("llama-7b") is m and get_model(" Llama-2-7B ") is m


@pytest.mark.parametrize("name,params", [
    ("gpt2", 124_439_808),  # the GPT-2 small checkpoint
    ("tinyllama-1.1b", 1_100_048_384),
    ("llama-2-13b", 13_015_864_320),
    ("llama-2-70b", 68_976_648_192),  # GQA: 8 KV heads
    ("llama-3-8b", 8_030_261_248),
    ("llama-3-70b", 70_553_706_496),
    ("mistral-7b", 7_241_732_096),
    ("gemma-2b", 2_506_172_416),  # head_dim 256, one KV head, tied
    ("gemma-7b", 8_537_680_896),
])
def test_known_parameter_counts(name, params):
    assert get_model(name).params == params


def test_gpt3_is_175b():
    assert round(get_model("gpt3-175b").params / 1e9) == 175


# --- model state: the ZeRO paper ------------------------------------------------------------------


def test_mixed_precision_adam_is_16_bytes_per_parameter():
    p = get_model("llama-2-7b").params
    st = model_state_bytes(p, "ddp", "bf16")
    assert (st.parameters, st.gradients, st.optimizer) == (2 * p, 2 * p, 12 * p)
    assert st.total == 16 * p == 107_814_649_856
    assert gb1(st.total) == Decimal("107.8")
    fp32 = model_state_bytes(p, "ddp", "fp32")  # same 16 bytes, split 4 + 4 + 8
    assert (fp32.parameters, fp32.gradients, fp32.optimizer) == (4 * p, 4 * p, 8 * p)
    assert memory_per_gpu(get_model("llama-2-7b"), TrainSetup("ddp")).model_state == 16 * p


def test_zero_paper_figure_1():
    """Ψ = 7.5B, N_d = 64, K = 12: 120 / 31.4 / 16.6 / 1.9 GB (Rajbhandari et al. 2020, figure 1)."""
    psi, nd = 7.5e9, 64
    got = {s: model_state_bytes(psi, s, "fp16", nd).total for s in ("ddp", "zero1", "zero2", "zero3", "fsdp")}
    assert got["ddp"] == (2 + 2 + 12) * psi == 120e9
    assert got["zero1"] == 2 * psi + 2 * psi + 12 * psi / nd == 31.40625e9
    assert got["zero2"] == 2 * psi + (2 + 12) * psi / nd == 16.640625e9
    assert got["zero3"] == got["fsdp"] == 16 * psi / nd == 1.875e9
    assert [str(gb1(got[s])) for s in ("ddp", "zero1", "zero2", "zero3")] == ["120.0", "31.4", "16.6", "1.9"]
    # the same through the per-GPU planner with a bare parameter count
    for s, want in (("ddp", "120.0"), ("zero1", "31.4"), ("zero2", "16.6"), ("zero3", "1.9")):
        bd = memory_per_gpu(ParamCount(7_500_000_000), TrainSetup(s), dp=64)
        assert str(gb1(bd.total)) == want and bd.activations is None and bd.gpus == 64


def test_model_parallel_divides_the_shard():
    m = get_model("llama-2-7b")
    one = memory_per_gpu(m, TrainSetup("ddp", tp=1))
    two = memory_per_gpu(m, TrainSetup("ddp", tp=2))
    assert two.shard_params == m.params / 2 and two.model_state == one.model_state / 2
    # pipeline: the first stage holds the embedding and L/p layers, the last the LM head and L/p layers
    bd = memory_per_gpu(m, TrainSetup("ddp", tp=2, pp=4, recompute="selective", activation_model="paper"))
    assert bd.stage == "first"
    assert bd.shard_params == (m.embedding_params + 8 * m.layer_params) / 2
    assert memory_per_gpu(ParamCount(800), TrainSetup("ddp", tp=2, pp=4)).shard_params == 100


def test_precision_and_strategy_checked():
    with pytest.raises(PlanError, match="strategy"):
        model_state_bytes(1e9, "zero4")
    with pytest.raises(PlanError, match="precision"):
        model_state_bytes(1e9, "ddp", "fp8")


# --- activations: Korthikanti et al. 2022 ---------------------------------------------------------

S, B, H, A, T = 2048, 1, 12288, 96, 8  # GPT-3 175B as in the paper: s = 2048, h = 12288, a = 96, t = 8


def test_per_layer_formulas_table_2():
    sbh = S * B * H
    assert activation_bytes_per_layer(S, B, H, A, 1) == sbh * (34 + 5 * A * S / H)  # eq. 1
    assert activation_bytes_per_layer(S, B, H, A, T, sequence_parallel=False) == \
        pytest.approx(sbh * (10 + 24 / T + 5 * A * S / (H * T)))  # eq. 2
    assert activation_bytes_per_layer(S, B, H, A, T) == pytest.approx(sbh / T * (34 + 5 * A * S / H))  # eq. 3
    assert activation_bytes_per_layer(S, B, H, A, T, recompute="selective", sequence_parallel=False) == \
        pytest.approx(sbh * (10 + 24 / T))
    assert activation_bytes_per_layer(S, B, H, A, 1, recompute="full") == 2 * sbh


def test_gpt3_175b_selective_recompute_row():
    """With tensor + sequence parallelism and selective recompute a layer stores 34·sbh/t bytes: for
    GPT-3 (s 2048, b 1, h 12288, t 8) 106,954,752 bytes. 5as/h = 80 for GPT-3 and 64 for MT-NLG
    530B (a 128, h 20480), so selective recompute saves 80/114 = 70% and 64/98 = 65%, the paper's
    figures (section 4.2.2)."""
    sel = activation_bytes_per_layer(S, B, H, A, T, recompute="selective")
    assert sel == 34 * S * B * H / T == 106_954_752
    assert 5 * A * S / H == 80
    full_sp = activation_bytes_per_layer(S, B, H, A, T)
    assert round(100 * (1 - sel / full_sp)) == 70
    mt = activation_bytes_per_layer(S, B, 20480, 128, T)
    mt_sel = activation_bytes_per_layer(S, B, 20480, 128, T, recompute="selective")
    assert 5 * 128 * S / 20480 == 64 and round(100 * (1 - mt_sel / mt)) == 65


def test_first_stage_holds_l_layers_of_activations():
    """1F1B: p micro-batches over L/p layers on the first stage = L layers' worth, whatever p (eq. 5),
    plus the embedding dropout mask sbhp/t (eq. 6)."""
    m = get_model("gpt3-175b")
    per = activation_bytes_per_layer(S, B, H, A, T, recompute="selective")
    for p in (2, 4, 8, 16):
        bd = memory_per_gpu(m, TrainSetup("zero1", tp=T, pp=p, seq=S, recompute="selective", activation_model="paper"),
                            dp=1)
        assert bd.stage == "first" and bd.layers_in_flight == 96
        assert bd.activations == pytest.approx(96 * per + S * B * H * p / T)
    # no pipeline: L layers, the embedding mask, and the output layer (4sbh/t + fp32 logits 4sbv/t)
    bd = memory_per_gpu(m, TrainSetup("zero1", tp=T, seq=S, recompute="selective", activation_model="paper"))
    assert bd.activations == pytest.approx(96 * per + S * B * H / T + 4 * S * B * H / T + 4 * S * B * m.vocab / T)


def test_fp32_activations_double_except_masks():
    sbh = S * B * H
    assert activation_bytes_per_layer(S, B, H, A, 1, precision="fp32") == sbh * (66 + 9 * A * S / H)
    assert activation_bytes_per_layer(S, B, H, A, 1, precision="fp32", recompute="full") == 4 * sbh


# --- HF config.json -------------------------------------------------------------------------------


def test_config_round_trip(tmp_path):
    for name in ("llama-2-7b", "llama-2-70b", "llama-3-8b", "gemma-2b", "mistral-7b", "gpt2", "gpt3-175b"):
        m = get_model(name)
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(arch_to_hf_config(m)))
        got = load_hf_config(d / "config.json")
        assert got.params == m.params and got.name == name
        assert (got.layers, got.hidden, got.heads, got.kv_heads, got.ffn, got.vocab, got.tied_embeddings) == \
            (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab, m.tied_embeddings)
        assert load_hf_config(d).params == m.params  # a model directory stands for its config.json


def test_gpt2_style_config(tmp_path):
    f = tmp_path / "gpt2.json"
    f.write_text(json.dumps({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
                             "vocab_size": 50257, "n_positions": 1024, "layer_norm_epsilon": 1e-5}))
    m = load_hf_config(f)
    assert m.params == 124_439_808 and not m.gated_mlp and m.tied_embeddings and m.norm == "layer"


@pytest.mark.parametrize("content,needle", [
    ({"hidden_size": 4096}, "missing field 'num_hidden_layers'"),
    ({"hidden_size": "big", "num_hidden_layers": 2}, "field 'hidden_size' must be an integer"),
    ({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10}, "'intermediate_size'"),
    ({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 3,
      "intermediate_size": 128, "vocab_size": 10}, "'num_key_value_heads' must divide"),
    ({"hidden_size": 64, "num_hidden_layers": True, "num_attention_heads": 4, "intermediate_size": 1,
      "vocab_size": 10}, "'num_hidden_layers'"),
    ({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
      "vocab_size": 10, "tie_word_embeddings": "yes"}, "'tie_word_embeddings' must be true or false"),
    ({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
      "vocab_size": 10, "num_local_experts": 8}, "mixture-of-experts"),
    ([1, 2], "expected a JSON object"),
])
def test_bad_config_names_file_and_field(tmp_path, content, needle):
    f = tmp_path / "config.json"
    f.write_text(json.dumps(content))
    with pytest.raises(ArchError) as e:
        load_hf_config(f)
    assert needle in str(e.value) and str(f) in str(e.value)


def test_unreadable_config(tmp_path):
    with pytest.raises(ArchError, match="cannot read"):
        load_hf_config(tmp_path / "nope.json")
    (tmp_path / "broken.json").write_text('{"hidden_size": 4096,')
    with pytest.raises(ArchError, match="not valid JSON"):
        load_hf_config(tmp_path / "broken.json")


# --- minimum GPUs ---------------------------------------------------------------------------------


def brute_force(model, setup, capacity, limit=4096):
    for dp in range(1, limit):
        if memory_per_gpu(model, setup, dp).total <= capacity:
            return dp
    return None


@pytest.mark.parametrize("name,strategy,tp,pp,recompute", [
    ("llama-2-7b", "zero1", 1, 1, "selective"), ("llama-2-7b", "zero2", 1, 1, "full"),
    ("llama-2-7b", "zero3", 2, 4, "selective"), ("llama-2-13b", "zero3", 1, 1, "full"),
    ("llama-2-70b", "zero3", 8, 1, "selective"), ("llama-3-70b", "zero1", 8, 4, "selective"),
    ("gpt3-175b", "zero1", 8, 8, "selective"), ("gemma-7b", "fsdp", 1, 2, "full"),
])
def test_min_gpus_matches_brute_force(name, strategy, tp, pp, recompute):
    m = get_model(name)
    setup = TrainSetup(strategy, tp=tp, pp=pp, seq=4096, recompute=recompute)
    cap = usable_bytes(80, 0.10)
    fit = min_gpus(m, setup, cap, gpus_per_node=8)
    want = brute_force(m, setup, cap)
    assert (fit.dp if fit else None) == want
    if fit:
        assert fit.gpus == fit.dp * tp * pp and fit.nodes == math.ceil(fit.gpus / 8)
        assert fit.breakdown.total <= cap


def test_zero_paper_model_min_gpus():
    cap = usable_bytes(80, 0.10)  # 72 GiB
    model = ParamCount(7_500_000_000)
    assert min_gpus(model, TrainSetup("ddp"), cap) is None  # 120 GB never fits
    assert min_gpus(model, TrainSetup("zero3"), cap).gpus == 2  # 60 GB
    fit = min_gpus(model, TrainSetup("zero1"), cap)  # 30 GB + 90 GB / dp <= 77.3 GB → dp 2
    assert fit.gpus == 2 and fit.nodes == 1
    fit = min_gpus(model, TrainSetup("zero3"), usable_bytes(16, 0.10), gpus_per_node=4)  # 15.46 GB → 8 GPUs
    assert fit.gpus == 8 and fit.nodes == 2


def test_margin_and_gpu_mem():
    assert usable_bytes(80, 0.10) == 72 * GIB
    assert usable_bytes(80, 0) == 80 * GIB
    with pytest.raises(PlanError, match="margin"):
        usable_bytes(80, 1.0)
    with pytest.raises(PlanError, match="gpu_mem"):
        usable_bytes(0)


def test_ddp_70b_never_fits_and_a_strategy_is_suggested():
    m, cap = get_model("llama-2-70b"), usable_bytes(80)
    setup = TrainSetup("ddp", seq=4096, recompute="selective")
    assert min_gpus(m, setup, cap) is None
    assert unsharded_bytes(m, setup) > cap
    s, fit = suggest(m, setup, cap)
    assert s.strategy != "ddp" and fit.breakdown.total <= cap
    assert min_gpus(m, s, cap).gpus == fit.gpus


def test_setup_checks_name_the_setting():
    m = get_model("llama-2-7b")
    with pytest.raises(PlanError) as e:
        TrainSetup(tp=3).check(m)
    assert e.value.field == "tp"
    with pytest.raises(PlanError) as e:
        TrainSetup(pp=5).check(m)
    assert e.value.field == "pp"
    with pytest.raises(PlanError) as e:
        get_model("gpt-5")
    assert e.value.field == "model" and "llama-2-7b" in e.value.message


def test_parse_param_count():
    assert parse_param_count("7.5e9").params == parse_param_count("7.5B").params == 7_500_000_000
    assert parse_param_count("6,738,415,616").params == 6_738_415_616
    assert parse_param_count("350M").params == 350_000_000
    for bad in ("abc", "0", "-1", "inf", ""):
        with pytest.raises(PlanError):
            parse_param_count(bad)


def test_registry_has_the_named_families():
    for n in ("llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "gemma-2b", "gemma-7b",
              "gpt3-175b", "gpt2"):
        assert isinstance(KNOWN[n], ModelArch)
    assert KNOWN["llama-2-70b"].is_gqa and not KNOWN["llama-2-7b"].is_gqa


# --- CLI ------------------------------------------------------------------------------------------


def test_cli_table():
    r = yard("--model", "llama-7b", "--gpu-mem", 80, "--gpus-per-node", 8, "--strategy", "zero3", "--seq", 4096,
             "--micro-batch", 1, "--recompute", "selective", "--tp", 2, "--pp", 4, "--activations", "paper")
    assert r.exit_code == 0, r.output
    out = r.stdout
    for needle in ("llama-2-7b", "6,738,415,616", "parameters", "gradients", "optimizer states", "activations",
                   "total", "minimum: 8 GPUs = 1 node", "GB = 10^9 bytes", "first pipeline stage", "34sbh/t"):
        assert needle in out, needle


def test_cli_acceptance_figures():
    r = yard("--model", "llama-2-7b", "--strategy", "ddp")
    assert "107,814,649,856" in r.stdout and "107.8" in r.stdout
    r = yard("--params", "7.5e9", "--gpus", 64, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["per_gpu"]["model_state_gb"] == 120.0
    by = {row["strategy"]: str(gb1(row["model_state_bytes"])) for row in d["strategies"]}
    assert by == {"ddp": "120.0", "zero1": "31.4", "zero2": "16.6", "zero3": "1.9"}
    r = yard("--params", "7.5e9", "--gpus", 64)
    assert r.exit_code == 1  # DDP never fits an 80 GiB GPU: said, with a suggestion
    for figure in ("120.0", "31.4", "16.6", "1.9", "does not fit", "suggestion: --strategy zero1"):
        assert figure in r.stdout, figure


def test_cli_json():
    r = yard("--model", "llama-2-7b", "--strategy", "zero3", "--recompute", "selective", "--seq", 4096, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["model"]["params"] == 6_738_415_616
    pg = d["per_gpu"]
    assert pg["total"] == max(pg["moments"].values()) and pg["peak_moment"] in pg["moments"]
    assert pg["moments"]["optimizer step"] >= pg["model_state"]  # every gradient is live then
    paper = json.loads(yard("--model", "llama-2-7b", "--strategy", "zero3", "--recompute", "selective", "--seq", 4096,
                            "--activations", "paper", "--json").stdout)["per_gpu"]
    assert paper["total"] == paper["model_state"] + paper["activations"] and paper["moments"] == {}
    assert pg["model_state"] == pg["parameters"] + pg["gradients"] + pg["optimizer_states"]
    assert d["minimum"]["gpus"] == pg["gpus"] and pg["fits"]
    assert d["usable_bytes_per_gpu"] == 72 * GIB and d["setup"]["margin"] == 0.1
    assert [row["strategy"] for row in d["strategies"]] == ["ddp", "zero1", "zero2", "zero3"]


def test_cli_never_fits_says_so():
    r = yard("--model", "llama-2-70b", "--strategy", "ddp", "--gpu-mem", 80)
    assert r.exit_code == 1
    assert "does not fit" in r.stdout and "suggestion: --strategy" in r.stdout
    d = json.loads(yard("--model", "llama-2-70b", "--strategy", "ddp", "--json").stdout)
    assert d["minimum"] is None and d["suggestion"]["strategy"] in ("zero1", "zero2", "zero3")


def test_cli_config(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps(arch_to_hf_config(get_model("llama-2-7b"))))
    d = json.loads(yard("--config", f, "--json").stdout)
    assert d["model"]["params"] == 6_738_415_616


@pytest.mark.parametrize("args,option", [
    (["--model", "gpt-5"], "--model"),
    (["--model", "llama-2-7b", "--strategy", "zero4"], "--strategy"),
    (["--model", "llama-2-7b", "--tp", 3], "--tp"),
    (["--model", "llama-2-7b", "--pp", 5], "--pp"),
    (["--model", "llama-2-7b", "--recompute", "some"], "--recompute"),
    (["--model", "llama-2-7b", "--precision", "fp8"], "--precision"),
    (["--model", "llama-2-7b", "--margin", 1.5], "--margin"),
    (["--model", "llama-2-7b", "--seq", 0], "--seq"),
    (["--model", "llama-2-7b", "--gpus", 6, "--tp", 4], "--gpus"),
    (["--model", "llama-2-7b", "--params", "7B"], "--model/--params"),
    ([], "--model"),
    (["--config", "/nonexistent/config.json"], "--config"),
])
def test_cli_bad_input(args, option):
    r = yard(*args)
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {option}:"), r.stderr
    assert r.stdout == ""


def test_cli_unknown_model_lists_known():
    r = yard("--model", "gpt-5")
    assert "llama-2-7b" in r.stderr and "gemma-7b" in r.stderr


def test_cli_bad_config_names_field(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                             "vocab_size": 32000}))
    r = yard("--config", f)
    assert r.exit_code == 2 and "intermediate_size" in r.stderr and str(f) in r.stderr
