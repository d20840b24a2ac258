"""Megatron checkpoints (legacy torch and torch_dist formats) convert to folders whose logits match
megatron-core's own forward pass, and bad layouts get one clear error."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import SHIPPED
from generate import CASES
from safetensors.torch import load_file
from test_cli_and_errors import leftovers, run_cli
from unshard_forks import run_unshard

import unshard
from unshard import OutputOptions

transformers = pytest.importorskip("transformers")

MEGATRON_CASES = [name for name in CASES if name.startswith("megatron-") and "critic" not in name]
# Regenerated with the installed megatron-core too, one representative case (the others are shipped only, for CI's
# time): DeepSeek-V3's MoE over TP x PP x EP (multi-latent attention, dense first layers, a shared expert, an MTP
# layer: the stand-ins megatron-core needs on CPU).
FRESH = ["megatron-deepseekv3-tp2-pp2-ep2"]
FORMATS = ["torch", "torch_dist"]
LLAMA = SHIPPED / "megatron-llama-tp2-pp2-vpp2"


def megatron_logits_match(fixture, out):
    oracle = torch.load(fixture / "oracle.pt")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True, dtype=torch.float32)
    # (what transformers leaves unloaded is only the MTP layers the config counts, as of the Hub's DeepSeek-V3)
    counted = getattr(model.config, "num_nextn_predict_layers", 0)
    mtp = f"model.layers.{model.config.num_hidden_layers}." if counted else "-"
    unexpected = [name for name in info["unexpected_keys"] if not name.startswith(mtp)]
    assert not info["missing_keys"] and not unexpected and not info["mismatched_keys"]
    with torch.no_grad():
        logits = model.eval()(oracle["tokens"]).logits
    assert logits.shape == oracle["logits"].shape  # the padded vocabulary rows are cut
    torch.testing.assert_close(logits, oracle["logits"], atol=1e-4, rtol=0)


def same_tensors_from_each(fixture, formats, tmp_path, verify=False):
    """Each of the fixture's formats converted (into tmp_path/FORMAT): every one gives the first's tensors, returned."""
    written = {}
    for fmt in formats:
        unshard.convert(fixture / fmt, tmp_path / fmt, progress=False, verify=verify)
        written[fmt] = load_file(tmp_path / fmt / "model.safetensors")
    first = written[formats[0]]
    for fmt in formats[1:]:
        assert sorted(written[fmt]) == sorted(first)
        assert all(torch.equal(written[fmt][name], tensor) for name, tensor in first.items()), fmt
    return first


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", MEGATRON_CASES)
def test_logits_match_megatron(case, fmt, tmp_path):
    fixture = SHIPPED / case
    out = tmp_path / "out"
    unshard.convert(fixture / fmt, out, progress=False, verify=True)
    megatron_logits_match(fixture, out)
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == json.loads((fixture / "fixture.json").read_text())["true_vocab"]


@pytest.mark.parametrize("case", FRESH)
def test_freshly_generated_logits_match_megatron(case, fresh_fixtures, tmp_path):
    fixture = fresh_fixtures(case)
    for fmt in FORMATS:
        unshard.convert(fixture / fmt, tmp_path / fmt, progress=False)
        megatron_logits_match(fixture, tmp_path / fmt)


@pytest.mark.parametrize("case", MEGATRON_CASES)
def test_both_formats_give_the_same_tensors(case, tmp_path):
    same_tensors_from_each(SHIPPED / case, FORMATS, tmp_path)


def test_inspect_shows_the_parallel_layout():
    code, out, _ = run_cli("inspect", SHIPPED / "megatron-qwen2moe-tp2-pp2-ep2" / "torch")
    assert code == 0
    assert "layout       megatron" in out
    assert "tensor 2, pipeline 2, virtual pipeline 1, expert 2" in out
    assert "architecture    qwen2_moe" in out
    assert "100 (padded to 128 in the checkpoint)" in out
    assert "hf files     none; made from the checkpoint's args (qwen2_moe)" in out
    code, out, _ = run_cli("inspect", LLAMA / "torch_dist", "--json")
    info = json.loads(out)
    assert info["layout"] == "megatron-torch-dist"
    assert info["parallel"]["virtual_pipeline"] == 2 and info["iteration"] == 10
    assert info["output"]["tensors"] == 39


def test_config_made_from_args_is_removed_when_the_command_ends(tmp_path):
    """The config made from Megatron's args lives in a temporary folder; the command exits without
    Python's teardown, so the folder must go before, whether the run succeeds or fails."""
    import os
    import subprocess
    import sys

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    src = SHIPPED / "megatron-qwen2moe-tp2-pp2-ep2" / "torch"
    env = dict(os.environ, TMPDIR=str(scratch))
    # The second conversion fails: OUT exists.
    for args, code in (
        (["convert", src, tmp_path / "out"], 0),
        (["convert", src, tmp_path / "out"], 1),
        (["inspect", src], 0),
    ):
        done = run_unshard(*args, env=env)
        assert done.returncode == code, done.stderr
        assert list(scratch.glob("unshard-*")) == [], args
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "qwen2_moe"


def test_config_from_is_used_and_checked(tmp_path):
    hf = tmp_path / "hf"
    unshard.convert(LLAMA / "torch", hf, progress=False)
    (hf / "tokenizer_config.json").write_text("{}")
    out = tmp_path / "out"
    unshard.convert(LLAMA / "torch_dist", out, config_from=hf, progress=False)
    assert (out / "tokenizer_config.json").exists()
    megatron_logits_match(LLAMA, out)

    config = json.loads((hf / "config.json").read_text())
    config["intermediate_size"] = 64
    (hf / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli("convert", LLAMA / "torch", tmp_path / "bad", "--config-from", hf)
    assert code == 1 and "does not fit this config" in err and "with other shapes" in err
    assert not (tmp_path / "bad").exists()


def copy_fixture(tmp_path, fmt="torch", case="megatron-llama-tp2-pp2-vpp2"):
    dest = tmp_path / "ckpt"
    shutil.copytree(SHIPPED / case / fmt, dest)
    return dest


def test_missing_rank_folder(tmp_path):
    ckpt = copy_fixture(tmp_path)
    shutil.rmtree(ckpt / "iter_0000010" / "mp_rank_01_001")
    code, _, err = run_cli("convert", ckpt, tmp_path / "out")
    assert code == 1 and err.count("\n") == 1
    assert "no mp_rank_* file for tensor rank 1, stage 1" in err and "TP=2, PP=2" in err
    assert not (tmp_path / "out").exists() and not leftovers(tmp_path)


def resave_rank_file(path, change):
    state = torch.load(path, weights_only=False)  # our own fixture, to make a broken one from it
    change(state)
    torch.save(state, path)


def test_rank_files_from_different_iterations(tmp_path):
    ckpt = copy_fixture(tmp_path)
    resave_rank_file(
        ckpt / "iter_0000010" / "mp_rank_00_001" / "model_optim_rng.pt", lambda state: state.update(iteration=20)
    )
    code, _, err = run_cli("convert", ckpt, tmp_path / "out")
    assert code == 1 and "different iterations [10, 20]" in err


def test_unknown_architecture(tmp_path):
    ckpt = copy_fixture(tmp_path)
    for path in (ckpt / "iter_0000010").glob("mp_rank_*/model_optim_rng.pt"):
        resave_rank_file(path, lambda state: setattr(state["args"], "normalization", "LayerNorm"))
    code, _, err = run_cli("inspect", ckpt)
    assert code == 1 and "a normalization other than RMSNorm" in err


def test_iteration_choice(tmp_path):
    ckpt = copy_fixture(tmp_path)
    code, _, err = run_cli("inspect", ckpt, "--iteration", "7")
    assert code == 1 and "iter_0000007: missing" in err and "saved here: iter_0000010" in err
    (ckpt / "iter_0000010").rename(ckpt / "release")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("release")
    code, out, _ = run_cli("inspect", ckpt)
    assert code == 0 and "release" in out
    (ckpt / "latest_checkpointed_iteration.txt").write_text("10")
    code, _, err = run_cli("inspect", ckpt)
    assert code == 1 and "names 10" in err and "saved here: release" in err


def test_torch_dist_missing_distcp_file(tmp_path):
    ckpt = copy_fixture(tmp_path, "torch_dist")
    (ckpt / "iter_0000010" / "__1_0.distcp").unlink()
    code, _, err = run_cli("convert", ckpt, tmp_path / "out")
    assert code == 1 and "__1_0.distcp: missing" in err


def test_conversion_never_imports_megatron(tmp_path):
    import subprocess
    import sys

    script = (
        "import sys, unshard\n"
        f"unshard.convert({str(LLAMA / 'torch')!r}, {str(tmp_path / 'a')!r}, progress=False)\n"
        f"unshard.convert({str(LLAMA / 'torch_dist')!r}, {str(tmp_path / 'b')!r}, progress=False)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'megatron'))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_verl_layouts_without_megatron_args(tmp_path):
    """verl saves no Megatron-LM args (model/dist_ckpt now, mp_rank_*/model.pt before); sizes come from
    the Hugging Face config it saves beside."""
    fixture = SHIPPED / "megatron-qwen2-tp2-pp2"
    unshard.convert(fixture / "torch", tmp_path / "megatron-lm", progress=False)
    expected = load_file(tmp_path / "megatron-lm" / "model.safetensors")
    for i, src in enumerate(
        [
            "verl",
            "verl/global_step_10",
            "verl/global_step_10/actor",
            "verl-legacy/global_step_10",
            "verl-legacy/global_step_10/actor/model",
        ]
    ):
        out = tmp_path / f"out{i}"
        unshard.convert(fixture / src, out, progress=False)
        written = load_file(out / "model.safetensors")
        assert sorted(written) == sorted(expected)
        assert all(torch.equal(written[name], expected[name]) for name in expected)
    megatron_logits_match(fixture, tmp_path / "out0")
    megatron_logits_match(fixture, tmp_path / "out3")
    info = unshard.inspect(fixture / "verl")
    assert info["parallel"] == {"tensor": 2, "pipeline": 2, "virtual_pipeline": 1, "expert": 1}
    assert info["naming"].startswith("verl")


def test_deepseek_v3_from_every_layout(tmp_path):
    """DeepSeek-V3 (multi-latent attention, a dense first layer, sigmoid routing with an expert bias, a shared
    expert, an MTP layer on the last stage): Megatron-LM's two formats and verl's layout give the same tensors, the
    MTP layer as the layer after the model's, as the Hub's DeepSeek-V3 holds it (with copies of the embedding and the
    head, which megatron-core's shares), and the config made from Megatron-LM's args builds the model verl's config
    does and counts the MTP layer. A config.json beside that counts none: the MTP layer is left out with a note."""
    fixture = SHIPPED / "megatron-deepseekv3-tp2-pp2-ep2"
    tensors = same_tensors_from_each(fixture, ("torch", "torch_dist", "verl"), tmp_path)
    megatron_logits_match(fixture, tmp_path / "verl")
    names = set(tensors)
    assert "model.layers.0.mlp.gate_proj.weight" in names and "model.layers.0.mlp.gate.weight" not in names
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in names
    assert "model.layers.3.mlp.shared_experts.down_proj.weight" in names
    mtp = {name.removeprefix("model.layers.4.") for name in names if name.startswith("model.layers.4.")}
    assert {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight"} <= mtp
    assert {"self_attn.kv_b_proj.weight", "mlp.experts.7.down_proj.weight", "mlp.gate.e_score_correction_bias"} <= mtp
    assert torch.equal(tensors["model.layers.4.embed_tokens.weight"], tensors["model.embed_tokens.weight"])
    assert torch.equal(tensors["model.layers.4.shared_head.head.weight"], tensors["lm_head.weight"])
    made = json.loads((tmp_path / "torch" / "config.json").read_text())
    assert made["num_nextn_predict_layers"] == 1
    verl = json.loads((fixture / "verl/global_step_10/actor/model/huggingface/config.json").read_text())
    for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_group"):
        assert made[key] == verl[key], key
    assert (made["first_k_dense_replace"], made["n_routed_experts"], made["n_shared_experts"]) == (1, 8, 1)
    assert made["rope_scaling"]["factor"] == 4.0 and made["routed_scaling_factor"] == 2.5
    code, out, _ = run_cli("inspect", fixture / "torch")
    assert code == 0 and "44 tensors of the multi-token prediction layer(s) config.json counts" in out
    config = tmp_path / "config"
    shutil.copytree(fixture / "verl/global_step_10/actor/model/huggingface", config)
    (config / "config.json").write_text(json.dumps({**verl, "num_nextn_predict_layers": 0}))
    code, out, _ = run_cli("inspect", fixture / "torch", "--config-from", config)
    assert code == 0 and "33 multi-token prediction layer tensors (mtp.*): " in out and "counts 0" in out


def test_moe_layers_after_dense_ones_only(tmp_path):
    """transformers' DeepSeek-V3 and GLM-4.5 hold dense layers first only: another --moe-layer-freq is refused."""
    ckpt = copy_fixture(tmp_path, "torch", "megatron-deepseekv3-tp2-pp2-ep2")
    for path in (ckpt / "iter_0000010").glob("mp_rank_*/model_optim_rng.pt"):
        resave_rank_file(path, lambda state: setattr(state["args"], "moe_layer_freq", [1, 0, 1, 1]))
    code, _, err = run_cli("convert", ckpt, tmp_path / "out")
    assert code == 1 and err.count("\n") == 1
    assert "moe_layer_freq [1, 0, 1, 1] puts dense layers after MoE ones" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, said",
    [
        ({"moe_router_pre_softmax": False}, "take the top-k experts before the softmax"),
        (
            {"moe_router_num_groups": 2, "moe_router_group_topk": 1},
            "rank 2 groups of experts by the sum of each one's best 2",
        ),
    ],
)
def test_deepseek_v2_routers_transformers_cannot_compute_are_refused(args, said, tmp_path):
    """DeepSeek-V2 (latent attention, shared experts, a softmax router) whose Megatron router transformers' DeepSeek-V2
    would not compute: the top-k before the softmax (Megatron's default, which renormalises the chosen weights), or
    groups ranked by more than their best expert. One line, nothing written."""
    ckpt = copy_fixture(tmp_path, "torch", "megatron-deepseekv2-tp2-pp2-ep2")
    for path in (ckpt / "iter_0000010").glob("mp_rank_*/model_optim_rng.pt"):
        resave_rank_file(path, lambda state: [setattr(state["args"], k, v) for k, v in args.items()])
    code, _, err = run_cli("convert", ckpt, tmp_path / "out")
    assert code == 1 and err.count("\n") == 1 and said in err, err
    assert not (tmp_path / "out").exists()


def test_deepseek_v2_groups_megatron_cannot_rank_are_refused_on_the_way_back(tmp_path):
    """The other way: a DeepSeek-V2 config whose groups transformers ranks by their best expert where Megatron would
    rank them by the sum of more (DeepSeek-V2's own 6 experts from 3 of 8 groups) is refused by --to megatron in one
    line; one group per expert taken is written as Megatron's groups, and read back as they were."""
    src = tmp_path / "hf"
    unshard.convert(SHIPPED / "megatron-deepseekv2-tp2-pp2-ep2" / "torch", src, progress=False)
    config = json.loads((src / "config.json").read_text())
    grouped = {**config, "topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1}
    (src / "config.json").write_text(json.dumps(grouped))
    code, _, err = run_cli("convert", src, tmp_path / "out", "--to", "megatron")
    assert code == 1 and err.count("\n") == 1 and "by the sum of its best 2" in err, err
    assert not (tmp_path / "out").exists()
    (src / "config.json").write_text(json.dumps({**grouped, "num_experts_per_tok": 1}))
    unshard.convert(src, tmp_path / "megatron", output=OutputOptions(to="megatron"), progress=False)
    unshard.convert(tmp_path / "megatron", tmp_path / "back", progress=False)
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert [back[k] for k in ("topk_method", "n_group", "topk_group", "num_experts_per_tok")] == [
        "group_limited_greedy",
        2,
        1,
        1,
    ]


@pytest.mark.parametrize(
    "case, family, read_as",
    [
        ("megatron-deepseekv3-tp2-pp2-ep2", "glm4_moe_lite", "DeepSeek-V3"),
        ("megatron-qwen2-tp2-pp2", "seed_oss", "Qwen2"),
    ],
)
def test_a_family_the_args_describe_as_another_is_read_with_its_config(case, family, read_as, tmp_path):
    """GLM-4.7-Flash is DeepSeek-V3's latent attention and MoE block under DeepSeek-V3's names, Seed-OSS is Qwen2's
    layers with q, k and v biases, and Megatron-LM's args describe the other. Read with --config-from the family's
    config (transformers' own, of the same sizes), the folder holds the other reading's tensors and transformers' model
    of the family computes megatron-core's logits from it. Written back into Megatron: one line, as the args cannot
    say it."""
    fixture = SHIPPED / case
    unshard.convert(fixture / "torch", tmp_path / "read", progress=False)
    read = json.loads((tmp_path / "read" / "config.json").read_text())
    sizes = {k: v for k, v in read.items() if k not in ("model_type", "architectures", "first_k_dense_replace")}
    if family == "glm4_moe_lite":  # (its dense first layers as a type per layer)
        dense = read["first_k_dense_replace"]
        sizes["mlp_layer_types"] = ["dense"] * dense + ["sparse"] * (read["num_hidden_layers"] - dense)
    else:  # (Seed-OSS's released biases: on q, k and v, not on o)
        sizes.update(attention_bias=True, attention_out_bias=False)
    config = transformers.AutoConfig.for_model(family, **sizes)
    config.architectures = [type(config).__name__.replace("Config", "ForCausalLM")]
    config.save_pretrained(tmp_path / "config")
    code, _, err = run_cli("convert", fixture / "torch_dist", tmp_path / "out", "--config-from", tmp_path / "config")
    assert code == 0, err
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == family
    same = load_file(tmp_path / "read" / "model.safetensors")
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(written) == sorted(same) and all(torch.equal(written[n], t) for n, t in same.items())
    megatron_logits_match(fixture, tmp_path / "out")
    code, _, err = run_cli("convert", tmp_path / "out", tmp_path / "back", "--to", "megatron")
    assert code == 1 and f"they would describe a {read_as}" in err and err.count("\n") == 1


def test_gpt_oss_from_every_layout(tmp_path, monkeypatch):
    """gpt-oss trained with megatron-core (attention sinks, biases on every linear layer, a sliding window on every
    other layer, the clamped SwiGLU, YaRN; experts over two expert-parallel ranks): Megatron-LM's two formats and
    verl's layout give the same tensors, each layer's experts stacked into transformers' fused tensors (fc1's gate and
    up rows as interleaved columns, each expert turned) a band of experts at a time, and the config made from the args
    is the one verl's Hugging Face config says."""
    fixture = SHIPPED / "megatron-gptoss-tp2-pp2-ep2"
    tensors = same_tensors_from_each(fixture, ("torch", "torch_dist", "verl"), tmp_path, verify=True)
    megatron_logits_match(fixture, tmp_path / "verl")
    # Layer 0's expert 3 is expert rank 1's second: its own tensors, as megatron-core saved them
    rank = torch.load(fixture / "torch/iter_0000010/mp_rank_01_000_001/model_optim_rng.pt", weights_only=False)
    prefix = "decoder.layers.0.mlp.experts.local_experts.1."
    expert = {k.removeprefix(prefix): v for k, v in rank["model"].items() if k.startswith(prefix)}
    gate, up = expert["linear_fc1.weight"].chunk(2)
    fused = tensors["model.layers.0.mlp.experts.gate_up_proj"]
    assert fused.shape == (4, 64, 96)
    assert torch.equal(fused[3, :, 0::2], gate.T) and torch.equal(fused[3, :, 1::2], up.T)
    gate_bias, up_bias = expert["linear_fc1.bias"].chunk(2)
    fused_bias = tensors["model.layers.0.mlp.experts.gate_up_proj_bias"][3]
    assert torch.equal(fused_bias[0::2], gate_bias) and torch.equal(fused_bias[1::2], up_bias)
    assert torch.equal(tensors["model.layers.0.mlp.experts.down_proj"][3], expert["linear_fc2.weight"].T)
    assert torch.equal(tensors["model.layers.0.mlp.experts.down_proj_bias"][3], expert["linear_fc2.bias"])
    assert tensors["model.layers.0.self_attn.sinks"].shape == (4,)
    # One expert per band (an expert's fc1 is 24 KB): the same bytes
    monkeypatch.setattr(unshard.Checkpoint, "BAND_BYTES", 30_000)
    unshard.convert(fixture / "torch_dist", tmp_path / "bands", progress=False)
    banded = (tmp_path / "bands/model.safetensors").read_bytes()
    assert banded == (tmp_path / "torch_dist/model.safetensors").read_bytes()
    made = json.loads((tmp_path / "torch" / "config.json").read_text())
    verl = json.loads((fixture / "verl/global_step_10/actor/model/huggingface/config.json").read_text())
    for key in ("num_local_experts", "intermediate_size", "sliding_window", "layer_types", "swiglu_limit"):
        assert made[key] == verl[key], key
    assert {k: made["rope_scaling"][k] for k in ("rope_type", "factor", "truncate")} == {
        "rope_type": "yarn",
        "factor": 4.0,
        "truncate": False,
    }


def test_gpt_oss_args_transformers_cannot_compute_are_refused(tmp_path):
    """A gpt-oss whose args say a computation transformers' gpt-oss has not (another GLU offset) is refused in one
    line, nothing written; and so is writing back into Megatron a gpt-oss whose YaRN Megatron-LM's args cannot say
    (an attention factor of its own)."""
    ckpt = copy_fixture(tmp_path, "torch", "megatron-gptoss-tp2-pp2-ep2")
    for path in (ckpt / "iter_0000010").glob("mp_rank_*/model_optim_rng.pt"):
        resave_rank_file(path, lambda state: setattr(state["args"], "glu_linear_offset", 0.5))
    code, _, err = run_cli("convert", ckpt, tmp_path / "out")
    assert code == 1 and err.count("\n") == 1
    assert "a GLU offset other than 1 (--glu-linear-offset)" in err and str(ckpt) in err
    assert not (tmp_path / "out").exists()
    unshard.convert(SHIPPED / "megatron-gptoss-tp2-pp2-ep2" / "torch_dist", tmp_path / "hf", progress=False)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["rope_scaling"]["attention_factor"] = 1.2
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli("convert", tmp_path / "hf", tmp_path / "back", "--to", "megatron")
    assert code == 1 and err.count("\n") == 1
    assert "--to megatron: YaRN's attention_factor has no place in Megatron-LM's args" in err
    assert not (tmp_path / "back").exists()


def test_grouped_gemm_experts_in_every_format(tmp_path):
    """GroupedMLP's experts (weight1/weight2: each expert's matrix transposed inside one matrix per rank), over two
    expert-tensor-parallel ranks: the legacy format, torch_dist (a rank's experts in one chunk) and torch_dist with
    singleton_local_shards (each expert its own key, fc1 as gate `_w` and up `_v`) give the same tensors, and the
    logits of megatron-core's forward."""
    fixture = SHIPPED / "megatron-qwen3moe-gmm-tp2-ep2-etp2"
    assert json.loads((fixture / "fixture.json").read_text())["etp"] == 2
    tensors = same_tensors_from_each(fixture, ("torch", "torch_dist", "torch_dist_singleton"), tmp_path, verify=True)
    megatron_logits_match(fixture, tmp_path / "torch_dist_singleton")
    assert tensors["model.layers.3.mlp.experts.3.gate_proj.weight"].shape == (48, 64)


def test_transformer_engine_grouped_experts_in_the_legacy_format_are_refused(tmp_path):
    """TEGroupedMLP saves `linear_fc1.weight0..N` per rank; no fixture can be written without Transformer Engine, so
    the legacy format of it is refused in one line pointing at torch_dist (whose keys are SequentialMLP's)."""
    ckpt = copy_fixture(tmp_path, "torch", "megatron-qwen3moe-gmm-tp2-ep2-etp2")

    def as_te_names(state):
        model = state["model"]
        model["decoder.layers.0.mlp.experts.linear_fc1.weight0"] = model.pop("decoder.layers.0.mlp.experts.weight1")

    for path in (ckpt / "iter_0000010").glob("mp_rank_*/model_optim_rng.pt"):
        resave_rank_file(path, as_te_names)
    code, _, err = run_cli("convert", ckpt, tmp_path / "out")
    assert code == 1 and err.count("\n") == 1
    assert "Transformer Engine's grouped experts (decoder.layers.0.mlp.experts.linear_fc1.weight0)" in err
    assert "--ckpt-format torch_dist" in err and not (tmp_path / "out").exists()


def test_verl_megatron_critic_becomes_a_token_classification_folder(tmp_path):
    """verl's Megatron critic (its value head, one output, in place of the output layer) is written as the
    ...ForTokenClassification folder verl's FSDP critics give, from verl's layouts (critic/, no Megatron-LM args)
    and Megatron-LM's; its values are megatron-core's."""
    fixture = SHIPPED / "megatron-qwen2-critic-tp2-pp2"
    oracle = torch.load(fixture / "oracle.pt")
    written = {}
    for src in ("verl", "verl-legacy/global_step_10", "torch_dist"):
        out = tmp_path / src.replace("/", "-")
        unshard.convert(fixture / src, out, progress=False, verify=True)
        config = json.loads((out / "config.json").read_text())
        assert config["architectures"] == ["Qwen2ForTokenClassification"] and config["id2label"] == {"0": "LABEL_0"}
        model, info = transformers.AutoModelForTokenClassification.from_pretrained(
            out, output_loading_info=True, dtype=torch.float32
        )
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
        with torch.no_grad():
            values = model.eval()(oracle["tokens"]).logits
        torch.testing.assert_close(values, oracle["logits"], atol=1e-4, rtol=0)
        written[src] = load_file(out / "model.safetensors")
    assert {"score.weight", "score.bias"} <= set(written["verl"]) and "lm_head.weight" not in written["verl"]
    for src in ("verl-legacy/global_step_10", "torch_dist"):
        assert all(torch.equal(written[src][name], tensor) for name, tensor in written["verl"].items()), src
