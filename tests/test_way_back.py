"""The way back into training: `--to dcp` writes a torch.distributed.checkpoint folder that FSDP2 (on a transformers
model, at world size 3) and torchtitan (its own model, torchtitan's names) load, with the source model's logits;
converted back, it gives the source's safetensors bytes."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import FIXTURES, ROOT, SHIPPED, tied_qwen2
from generate import free_port, peer_python
from test_cli_and_errors import run_cli
from test_scale_out import torchrun

import unshard
from unshard.names import megatron_rules, meta_rules
from unshard.sinks import dcp as dcp_sink
from unshard.sources.megatron_hf import yarn_config
from unshard.types import OutputOptions

transformers = pytest.importorskip("transformers")
EXAMPLE = ROOT / "examples" / "tiny-llama-verl-fsdp2" / "global_step_1"
TOKENS = torch.randint(0, 103, (2, 12), generator=torch.Generator().manual_seed(3))
# torchtitan's gpt-oss computes its experts in bf16 (and its fixture trained in bf16 throughout): its logits agree
# with transformers' and its own to that rounding (test_meta_llama measures 0.064; a wrong tensor is off by 1 and more)
GPT_OSS_ATOL = 0.1


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    """The shipped example as a Hugging Face folder: the source of the way back."""
    out = tmp_path_factory.mktemp("hf") / "tiny-llama"
    unshard.convert(EXAMPLE, out, progress=False)
    return out


def titan_source(tmp_path, model: str):
    """A Hugging Face folder of torchtitan's fixture model: torchtitan's own to_hf of it, with its config."""
    fixture = SHIPPED / f"torchtitan-{model}-fsdp2"
    src = tmp_path / f"{model}-hf"
    shutil.copytree(fixture / "hf", src)
    shutil.copy(fixture / "reference" / "model.safetensors", src)
    return src, fixture


def to_dcp(src, out, names="hf", max_shard_size="5GB", **options):
    output = OutputOptions(max_shard_size=max_shard_size, to="dcp", names=names)
    return unshard.convert(src, out, output=output, progress=False, **options)


def loader_files(tmp_path) -> list[str]:
    """dcp_loaders.py's --dcp, --tokens and --out, in a test's folder."""
    return [
        "--dcp",
        str(tmp_path / "dcp"),
        "--tokens",
        str(tmp_path / "tokens.pt"),
        "--out",
        str(tmp_path / "logits.pt"),
    ]


def trainer_logits(trainer: str, model: str, tmp_path, compared: list[str]):
    """The trainer's own model (in its venv) loaded from the DCP folder in tmp_path (fixtures/dcp_loaders.py), its
    tensors `compared` with what the loader is given; its logits on tmp_path's tokens."""
    trainer_loads(trainer, model, [*loader_files(tmp_path), *compared])
    return torch.load(tmp_path / "logits.pt")


def trainer_loads(trainer: str, model: str, args: list[str]) -> None:
    """The trainer's own model (in its venv) loaded by fixtures/dcp_loaders.py with these arguments."""
    done = subprocess.run(
        [str(peer_python(trainer)), str(FIXTURES / "dcp_loaders.py"), trainer, "--model", model, *args],
        capture_output=True,
        text=True,
        cwd=FIXTURES,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def hf_logits(folder, tokens):
    vision = "vision_config" in json.loads((Path(folder) / "config.json").read_text())
    loader = transformers.AutoModelForImageTextToText if vision else transformers.AutoModelForCausalLM
    model = loader.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model.eval()(tokens).logits


@pytest.mark.parametrize("names", ["hf", "torchtitan"])
def test_round_trip_gives_the_source_bytes(names, hf_model, tmp_path, monkeypatch):
    monkeypatch.setattr(dcp_sink, "CHUNK_BYTES", 1024)  # (many chunks per tensor, q and k reordered head by head)
    result = to_dcp(hf_model, tmp_path / "dcp", names, verify=True, threads=2)
    assert result.files == ["__0_0.distcp"]
    metadata = pickle.load(open(tmp_path / "dcp" / ".metadata", "rb"))
    q = "layers.0.attention.qkv_linear.wq.weight" if names == "torchtitan" else "model.layers.0.self_attn.q_proj.weight"
    assert len(metadata.state_dict_metadata[q].chunks) > 1
    unshard.convert(tmp_path / "dcp", tmp_path / "back", progress=False)
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == (hf_model / "model.safetensors").read_bytes()


@pytest.mark.parametrize("model", ["qwen3moe", "deepseekv3"])
def test_grouped_experts_round_trip_gives_the_source_bytes(model, tmp_path, monkeypatch):
    """Each expert goes into its index of torchtitan's grouped tensor (Qwen3 MoE's expert bias written as zeros)
    and comes back out of it, in save_pretrained's order."""
    src, _ = titan_source(tmp_path, model)
    monkeypatch.setattr(dcp_sink, "CHUNK_BYTES", 1024)
    to_dcp(src, tmp_path / "dcp", "torchtitan", verify=True)
    metadata = pickle.load(open(tmp_path / "dcp" / ".metadata", "rb")).state_dict_metadata
    assert tuple(metadata["layers.1.moe.routed_experts.inner_experts.w2_EDF"].size)[0] == 4
    unshard.convert(tmp_path / "dcp", tmp_path / "back", progress=False)
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


def test_fsdp2_at_world_size_3_loads_it(hf_model, tmp_path, monkeypatch):
    monkeypatch.setattr(dcp_sink, "CHUNK_BYTES", 2048)  # (chunks that do not fall on the three ranks' shards)
    to_dcp(hf_model, tmp_path / "dcp", max_shard_size="100KB")
    assert len(list((tmp_path / "dcp").glob("*.distcp"))) > 1
    torch.save(TOKENS, tmp_path / "tokens.pt")
    done = torchrun(3, str(FIXTURES / "dcp_loaders.py"), "fsdp2", *loader_files(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), hf_logits(hf_model, TOKENS), atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "model",
    ["llama3", "qwen3", "qwen3-moe", "deepseek-v3", "deepseek-v3-mtp", "gpt-oss", "muse-glimmer", "kimi-k2.5"],
)
def test_torchtitan_loads_its_names(model, tmp_path, monkeypatch):
    """Each expert's chunks land at its index of torchtitan's grouped experts, Qwen3 MoE's expert bias as zeros.
    gpt-oss's experts, which transformers keeps in one tensor per layer (and torchtitan 0.3's own adapter leaves
    out), are each turned back as torchtitan holds them; DeepSeek-V3's MTP layer, the layer after the model's in the
    Hugging Face folder (with the Hub's copies of the embedding and head, which torchtitan's shares), goes to its
    `mtp_layers.0`; Muse Glimmer's vision tower's q and k rows and biases are reordered as its text model's; Kimi
    K2.5's tower's fused qkv is cut in three, its Conv2d patch embedding flat. For these four, from unshard's conversion
    of torchtitan's own checkpoint, every tensor torchtitan loads equals what it loads from that checkpoint (and Kimi
    K2.5's what its own adapter's from_hf makes of the Hub's names), and converted back, the folder's bytes."""
    src, fixture = titan_source(tmp_path, model.replace("-", "").replace(".", ""))
    compared = ["--hf", str(src)]
    own_checkpoint = ("gpt-oss", "deepseek-v3-mtp", "muse-glimmer", "kimi-k2.5")
    if model in own_checkpoint:
        own = fixture / "checkpoint" / "step-1"
        shutil.rmtree(src)
        unshard.convert(own, src, config_from=fixture / "hf", progress=False)
        compared = ["--own", str(own), *(["--hf", str(src)] if model == "kimi-k2.5" else [])]
    monkeypatch.setattr(dcp_sink, "CHUNK_BYTES", 1024)
    to_dcp(src, tmp_path / "dcp", "torchtitan")
    oracle = torch.load(fixture / "reference" / "logits.pt")
    torch.save(oracle["tokens"], tmp_path / "tokens.pt")
    logits = trainer_logits("torchtitan", model, tmp_path, compared)
    # torchtitan's own, before saving (gpt-oss's trained in bf16 throughout, by FSDP's mixed precision: here only its
    # experts are, which torchtitan casts to bf16)
    expected = oracle["logits"].float()
    torch.testing.assert_close(logits.float(), expected, atol=GPT_OSS_ATOL if model == "gpt-oss" else 1e-5, rtol=0)
    # (torchtitan runs grouped experts in bf16: the MoE models agree with transformers to its rounding)
    atol = {"qwen3-moe": 1e-3, "deepseek-v3": 2e-4, "deepseek-v3-mtp": 2e-4, "kimi-k2.5": 2e-4, "gpt-oss": GPT_OSS_ATOL}
    atol = atol.get(model, 1e-4)
    torch.testing.assert_close(logits.float(), hf_logits(src, oracle["tokens"]), atol=atol, rtol=0)
    if model in own_checkpoint[1:]:
        unshard.convert(tmp_path / "dcp", tmp_path / "back", config_from=src, progress=False)
        assert (tmp_path / "back" / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


@pytest.mark.parametrize("model", ["qwen3.5", "qwen3.5-moe"])
def test_torchtitan_loads_qwen35_in_its_names(model, tmp_path, monkeypatch):
    """torchtitan's Qwen3.5 with its vision tower, from unshard's conversion of torchtitan's own checkpoint, written
    back in torchtitan's names: the linear attention's fused projection and convolution cut into q, k and v by the
    config's heads, the tower's qkv into three, its Conv3d patch embedding flat as torchtitan's Linear holds it (and
    Qwen3.5-MoE's experts grouped again, each turned, its expert bias zeros). torchtitan loads every tensor its own
    checkpoint gives, and (the dense model) what its own adapter's from_hf makes of the folder; converted back, the
    folder's bytes. (No logits: its linear attention runs in Triton kernels only.)"""
    fixture = SHIPPED / f"torchtitan-{model.replace('.', '').replace('-', '')}-fsdp2"
    own, src = fixture / "checkpoint" / "step-1", tmp_path / "hf"
    unshard.convert(own, src, config_from=fixture / "hf", progress=False)
    monkeypatch.setattr(dcp_sink, "CHUNK_BYTES", 1024)
    to_dcp(src, tmp_path / "dcp", "torchtitan", verify=True)
    metadata = pickle.load(open(tmp_path / "dcp" / ".metadata", "rb")).state_dict_metadata
    assert tuple(metadata["vision_encoder.patch_embed.weight"].size) == (32, 1536)
    assert tuple(metadata["layers.0.attn.conv_v.weight"].size) == (64, 1, 4)
    # (torchtitan's adapter reads Qwen3.5-MoE's experts only in its own fused layout, not as transformers saves them)
    adapter = ["--hf", str(src)] if model == "qwen3.5" else []
    trainer_loads("torchtitan", model, ["--dcp", str(tmp_path / "dcp"), "--own", str(own), *adapter])
    unshard.convert(tmp_path / "dcp", tmp_path / "back", config_from=src, progress=False)
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


@pytest.mark.parametrize("model", ["llama3", "qwen2", "gemma", "gemma2", "phi3", "mistral", "llama3_2_vision"])
def test_torchtune_loads_its_names(model, tmp_path, monkeypatch):
    """torchtune's checkpoint (its DistributedCheckpointer's, FSDP2 at two ranks) as a Hugging Face folder, written
    back with torchtune's names: torchtune's DistributedCheckpointer loads it into its own model, every tensor equal
    to torchtune's own single-file save of the model (Gemma's tied head no tensor of its own, Gemma 2's MLP norms by
    what torchtune computes), and its logits are torchtune's before saving; converted back, the source's bytes.
    Llama 3.2 Vision's cross-attention layers go back into the layers torchtune fuses them into, the special tokens'
    rows of the embedding into its fusion embedding, its tile embeddings from the rows of the ratios of all tiles:
    every tensor equals what torchtune's checkpointer makes of the folder (its own save holds the tiles of ratios of
    more tiles than the model takes, which no Hugging Face folder has)."""
    fixture = SHIPPED / f"torchtune-{model.replace('_', '')}-fsdp2"
    src, out = tmp_path / "hf", tmp_path / "dcp"
    unshard.convert(fixture / "dist_epoch_0", src, config_from=fixture / "hf", progress=False)
    monkeypatch.setattr(dcp_sink, "CHUNK_BYTES", 1024)
    to_dcp(src, out, "torchtune")
    oracle = torch.load(fixture / "reference" / "logits.pt")
    torch.save(oracle["tokens"], tmp_path / "tokens.pt")
    tune = fixture / "epoch_0" / "model-00001-of-00001.bin"
    compared = ["--hf", str(src)] if model == "llama3_2_vision" else ["--tune", str(tune)]
    logits = trainer_logits("torchtune", model, tmp_path, compared)
    # (the fixture's logits were computed on another CPU, whose kernels sum in another order: Gemma 2's reach 66, where
    # float32's step is 8e-6, and two steps apart were seen; the tensors loaded are compared bit for bit above)
    torch.testing.assert_close(logits, oracle["logits"], atol=1e-5, rtol=1e-6)
    unshard.convert(out, tmp_path / "back", progress=False)
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


def test_a_fused_tensor_whose_rows_the_config_does_not_give_is_refused():
    """Phi-3's qkv_proj is cut into q, k and v by the config's head counts: rows that are not theirs are one line."""
    from unshard.errors import UnshardError
    from unshard.families.phi3 import TORCHTUNE_PHI3

    config = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64}
    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    renamed, _ = meta_rules.to_meta(TORCHTUNE_PHI3, "Phi-3", {qkv: (128, 64)}, config, "src")
    assert renamed[qkv].parts == tuple((f"layers.0.attn.{p}_proj.weight", n) for p, n in zip("qkv", (64, 32, 32)))
    with pytest.raises(UnshardError, match=r"^src: model.layers.0.self_attn.qkv_proj.weight: 96 rows are not its 3 "):
        meta_rules.to_meta(TORCHTUNE_PHI3, "Phi-3", {qkv: (96, 64)}, config, "src")


@pytest.mark.parametrize(
    "to, folder, how", [("dcp", "", "workers"), ("megatron", "release", "workers"), ("megatron", "release", "torchrun")]
)
def test_workers_write_the_same_files(to, folder, how, hf_model, tmp_path):
    """--workers deals the .distcp files out to processes, and so does --distributed under torchrun (each rank its
    share, rank 0 the metadata): the same files, the same places in `.metadata`."""
    output = OutputOptions(to=to, max_shard_size="100KB")
    unshard.convert(hf_model, tmp_path / "one", output=output, progress=False)
    if how == "workers":
        result = unshard.convert(hf_model, tmp_path / "two", output=output, progress=False, workers=2, verify=True)
        assert result.writers == 2
    else:
        sizes = ("--to", to, "--max-shard-size", "100KB")
        done = torchrun(2, "-m", "unshard", "convert", str(hf_model), str(tmp_path / "two"), *sizes, "--distributed")
        assert done.returncode == 0 and "by 2 processes" in done.stdout, done.stderr[-2000:]
        assert (tmp_path / "two" / "release" / "common.pt").is_file()
    one, two = tmp_path / "one" / folder, tmp_path / "two" / folder
    files = sorted(p.name for p in one.glob("*.distcp"))
    assert len(files) > 2 and files == sorted(p.name for p in two.glob("*.distcp"))
    assert all((one / name).read_bytes() == (two / name).read_bytes() for name in files)
    places = [pickle.load(open(where / ".metadata", "rb")).storage_data for where in (one, two)]
    assert places[0] == places[1]


def test_refusals_are_one_line_and_write_nothing(hf_model, tmp_path):
    qwen2 = SHIPPED / "qwen2-fsdp2" / "global_step_1" / "actor"
    cases = [
        ((qwen2, "--to", "dcp", "--names", "torchtitan"), "--names torchtitan: Qwen2: "),
        (
            (SHIPPED / "qwen3-fsdp2-spm" / "global_step_1" / "actor", "--to", "dcp", "--names", "torchtune"),
            "--names torchtune: Qwen3: torchtune (0.6.1, its last release) has no model of this family",
        ),
        ((hf_model, "--to", "dcp", "--quantize", "W4A16"), "leave out --quantize"),
    ]
    for args, expected in cases:
        code, _, err = run_cli("convert", *args, tmp_path / "out")
        assert code == 1 and expected in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "out").exists()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    code, _, err = run_cli("convert", hf_model, tmp_path / "taken", "--to", "dcp")
    assert code == 1 and "already exists" in err and (tmp_path / "taken" / "x").read_text() == "x"


def test_dry_run_says_the_files_and_the_peak(hf_model):
    code, out, _ = run_cli("convert", hf_model, "/nonexistent/out", "--to", "dcp", "--names", "torchtitan", "--dry-run")
    assert code == 0 and "__0_0.distcp" in out and "torchtitan names" in out and "peak memory" in out


# Megatron-LM's args that say the model (and its experts): what the run that saved a fixture had, and --to
# megatron writes
MODEL_ARGS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "add_qkv_bias",
    "qk_layernorm",
    "rotary_percent",
    "num_experts",
    "mtp_num_layers",
)
MOE_ARGS = (
    "moe_router_topk",
    "moe_router_pre_softmax",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "moe_shared_expert_gate",
    "moe_layer_freq",
    "moe_router_score_function",
    "moe_router_enable_expert_bias",
    "moe_router_topk_scaling_factor",
    "moe_router_num_groups",
    "moe_router_group_topk",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
)
LATENT_ARGS = (
    "multi_latent_attention",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "rope_type",
    "rotary_scaling_factor",
    "original_max_position_embeddings",
    "mscale",
    "mscale_all_dim",
)
GPT_OSS_ARGS = (
    "quick_geglu",
    "glu_linear_offset",
    "activation_func_clamp_value",
    "add_bias_linear",
    "softmax_type",
    "window_size",
    "window_attn_skip_freq",
    "position_embedding_type",
    "yarn_rotary_scaling_factor",
    "yarn_original_max_position_embeddings",
    "yarn_beta_fast",
    "yarn_beta_slow",
    "yarn_mscale",
    "yarn_mscale_all_dim",
    "yarn_correction_range_round_to_int",
)
# (what Megatron-LM's arguments default to, where a fixture's older args do not name them)
MEGATRON_LM_DEFAULTS = {
    "moe_layer_freq": 1,
    "moe_router_score_function": "softmax",
    "moe_router_enable_expert_bias": False,
}
MEGATRON = [
    "megatron-qwen2-tp2-pp2",
    "megatron-llama-tp2-pp2-vpp2",
    "megatron-qwen3-tp2-dp2",
    # (experts: loaded at EP 1, which DCP reshards to as to any other; each expert's tensors in their stacks' places)
    "megatron-mixtral-tp2-pp2-ep2",
    "megatron-qwen2moe-tp2-pp2-ep2",
    "megatron-qwen3moe-pp2-ep2-dp2",
    # (GLM-4.5: partial rotary, a sigmoid router with an expert bias and expert groups, a dense first layer: each
    # layer keyed on its own)
    "megatron-glm45-tp2-ep2-dp2",
    # (Solar Open: GLM-4.5's MoE block in every layer, Llama's attention; no dense width in its config)
    "megatron-solaropen-tp2-pp2-ep2",
    # (DeepSeek-V3: latent attention with YaRN, a dense first layer, shared experts; its MTP layer, which the Hugging
    # Face folder holds as the Hub's DeepSeek-V3 does, back in megatron-core's MultiTokenPredictionBlock)
    "megatron-deepseekv3-tp2-pp2-ep2",
    # (DeepSeek-V2-Lite: latent attention without the query's down projection; a softmax router before the top-k, its
    # weights scaled)
    "megatron-deepseekv2-tp2-pp2-ep2",
    # (gpt-oss: each expert a row of transformers' fused tensors, turned back into SequentialMLP's, with its biases;
    # the sinks, the window on every other layer, YaRN)
    "megatron-gptoss-tp2-pp2-ep2",
    # (GroupedMLP's experts, each split over ETP 2: megatron-core's dist format for them is SequentialMLP's, which
    # unshard writes; loaded into GroupedMLP at the fixture's TP 2 and ETP 2)
    "megatron-qwen3moe-gmm-tp2-ep2-etp2",
]
# (every case's tensors equal megatron-core's own checkpoint's, whose logits are the fixture's: the forward pass is
# run again on four, the dense family with the most parts, both latent attentions and routers, and gpt-oss, to show it)
FORWARD = (
    "megatron-qwen2-tp2-pp2",
    "megatron-deepseekv3-tp2-pp2-ep2",
    "megatron-deepseekv2-tp2-pp2-ep2",
    "megatron-gptoss-tp2-pp2-ep2",
)


def norms_under_each_spec_name(dist) -> set[str]:
    """The norms written under two layer specs' names (names.megatron_rules.SPEC_NAMES: Transformer Engine's, and
    the local spec's), each pair checked to hold the same values; the names without their layer."""
    found = pickle.load(open(dist / ".metadata", "rb")).state_dict_metadata
    shapes = {key: m.size for key, m in found.items() if hasattr(m, "size")}  # (tensors, not objects)
    pairs = [
        (key, key[: -len(fused)] + apart)
        for key in shapes
        for fused, (apart, _) in megatron_rules.SPEC_NAMES.items()
        if key.endswith(fused) and key[: -len(fused)] + apart in shapes
    ]
    state = {key: torch.empty(shapes[key]) for pair in pairs for key in pair}
    dcp.load(state, checkpoint_id=str(dist), no_dist=True)
    for fused, apart in pairs:
        assert torch.equal(state[fused], state[apart]), apart
    return {re.sub(r"layers\.\d+\.", "layers.", name) for pair in pairs for name in pair}


@pytest.mark.parametrize(
    "case, layout", [*((case, "megatron") for case in MEGATRON), ("megatron-qwen2-tp2-pp2", "verl-megatron")]
)
def test_megatron_core_loads_it_at_its_parallelism(case, layout, tmp_path, monkeypatch):
    """The source: megatron-core's own checkpoint (a fixture) as a Hugging Face folder. Written back into Megatron
    at the fixture's TP, PP and VPP, megatron-core built at that parallelism loads every tensor its own checkpoint
    holds, and its forward pass gives the fixture's logits. In verl's layout: the same .distcp files, byte for byte,
    other files around them, as verl's own."""
    pytest.importorskip("megatron.core")
    fixture = SHIPPED / case
    info = json.loads((fixture / "fixture.json").read_text())
    src, out = tmp_path / "hf", tmp_path / "global_step_10"
    unshard.convert(fixture / "torch_dist", src, progress=False)
    monkeypatch.setattr(dcp_sink, "CHUNK_BYTES", 2048)  # (chunks smaller than a rank's shard)
    sizes = {
        "tp": info["tp"],
        "pp": info["pp"],
        "vpp": info["vpp"],
        "ep": info.get("ep", 1),
        "etp": info.get("etp") or 1,
    }
    options = OutputOptions(to=layout, vocab_divisible=64, **sizes)
    unshard.convert(src, out, output=options, progress=False, verify=True)
    if layout == "megatron":
        dist = out / "release"
        assert (out / "latest_checkpointed_iteration.txt").read_text() == "release"
        # (the args say the model as megatron-core's own run's args said it)
        ours = vars(torch.load(dist / "common.pt", weights_only=False)["args"])
        trained = vars(torch.load(fixture / "torch_dist" / "iter_0000010" / "common.pt", weights_only=False)["args"])
        compared = MODEL_ARGS + (MOE_ARGS if trained.get("num_experts") else ())
        compared += LATENT_ARGS if trained.get("multi_latent_attention") else ()
        for key in compared + (GPT_OSS_ARGS if trained.get("quick_geglu") else ()):
            assert ours.get(key) == trained.get(key, MEGATRON_LM_DEFAULTS.get(key)), key
    else:  # (as verl's own fixture beside it: the same files but the tensors' chunks)
        dist = out / "actor" / "model" / "dist_ckpt"
        verl = fixture / "verl" / "global_step_10" / "actor"
        assert torch.load(dist / "common.pt") == torch.load(verl / "model" / "dist_ckpt" / "common.pt") == {}
        assert (dist / "metadata.json").read_text() == (verl / "model" / "dist_ckpt" / "metadata.json").read_text()
        assert (out / "actor" / "model" / "huggingface" / "config.json").is_file()
        written, trained = (
            json.loads((where / "transformer_config.json").read_text()) for where in (out / "actor", verl)
        )
        assert {key: trained[key] for key in written} == written
        theirs = pickle.load(open(verl / "model" / "dist_ckpt" / ".metadata", "rb")).state_dict_metadata
        assert set(pickle.load(open(dist / ".metadata", "rb")).state_dict_metadata) == set(theirs)

    # (Transformer Engine's spec keeps the norm before a MoE block apart, and latent attention's local spec all its
    # norms: each written under both names; a dense model's norms under the one name both specs load)
    config = json.loads((src / "config.json").read_text())
    twice = norms_under_each_spec_name(dist)
    if config.get("kv_lora_rank"):  # (the query's norm where it has a down projection: not DeepSeek-V2-Lite's)
        query = ("self_attention.linear_q_up_proj.layer_norm_weight", "self_attention.q_layernorm.weight")
        assert {name.rpartition("layers.")[2].removeprefix("transformer_layer.") for name in twice} == {
            "mlp.linear_fc1.layer_norm_weight",
            "pre_mlp_layernorm.weight",
            *(query if config.get("q_lora_rank") else ()),
            "self_attention.linear_kv_up_proj.layer_norm_weight",
            "self_attention.kv_layernorm.weight",
        }
    elif any(config.get(key) for key in ("num_local_experts", "num_experts", "n_routed_experts")):
        assert {name.rpartition("layers.")[2].removeprefix("transformer_layer.") for name in twice} == {
            "mlp.linear_fc1.layer_norm_weight",
            "pre_mlp_layernorm.weight",
        }
    else:
        assert not twice

    unshard.convert(out, tmp_path / "back", progress=False)
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()

    if layout != "megatron":  # (verl's layout: the very files of Megatron-LM's, which the case beside loads)
        unshard.convert(src, tmp_path / "megatron", output=replace(options, to="megatron"), progress=False)
        ours = sorted(p.name for p in dist.glob("*.distcp"))
        assert ours and all(
            (dist / name).read_bytes() == (tmp_path / "megatron" / "release" / name).read_bytes() for name in ours
        )
        return
    ranks = info["tp"] * info["pp"]
    done = torchrun(ranks, str(FIXTURES / "dcp_loaders.py"), "megatron", "--dcp", str(dist), "--fixture", str(fixture))
    assert done.returncode == 0, done.stderr[-3000:]

    if case not in FORWARD:
        return
    # megatron-core's forward pass on it, the model built from the args unshard wrote: the Megatron tests' oracle
    expected = torch.load(fixture / "oracle.pt")
    logits = megatron_logits(dist, expected["tokens"], tmp_path)
    torch.testing.assert_close(logits[..., : info["true_vocab"]], expected["logits"], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits[..., : info["true_vocab"]], hf_logits(src, expected["tokens"]), atol=1e-4, rtol=0)


def megatron_logits(dist, tokens, tmp_path, *more):
    """megatron-core's logits on the Megatron-LM checkpoint in `dist`, its model built from the args written in it
    (fixtures/dcp_loaders.py megatron-forward; `more`: its options), in one process."""
    torch.save(tokens, tmp_path / "tokens.pt")
    done = subprocess.run(
        [sys.executable, "dcp_loaders.py", "megatron-forward", "--dcp", str(dist), *more]
        + ["--tokens", str(tmp_path / "tokens.pt"), "--out", str(tmp_path / "logits.pt")],
        capture_output=True,
        text=True,
        cwd=FIXTURES,
        env=dict(os.environ, MASTER_PORT=str(free_port())),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(tmp_path / "logits.pt")


def test_latent_attention_with_plain_rope_runs_in_megatron_core(tmp_path):
    """torchtitan's DeepSeek-V3 (plain rope, three layers, the first dense) as a Hugging Face folder, written into
    Megatron at TP 2 and EP 2: megatron-core's model built from the args unshard wrote gives transformers' logits."""
    pytest.importorskip("megatron.core")
    src, _ = titan_source(tmp_path, "deepseekv3")
    out = tmp_path / "megatron"
    unshard.convert(src, out, output=OutputOptions(to="megatron", tp=2, ep=2), progress=False)
    args = vars(torch.load(out / "release" / "common.pt", weights_only=False)["args"])
    assert (args["rope_type"], args["mscale_all_dim"], args["moe_layer_freq"]) == ("rope", 0.0, [0, 1, 1])
    logits = megatron_logits(out / "release", TOKENS, tmp_path)
    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    torch.testing.assert_close(logits[..., :vocab], hf_logits(src, TOKENS), atol=1e-4, rtol=0)


def hub_mtp_logits(folder, tokens):
    """The first MTP layer's logits (position i predicting token i + 2) as the Hub's DeepSeek-V3 and GLM-4.5 mean
    their layer model.layers.N (DeepSeek's and vLLM's MTP module): the model's normed last hidden state at i and token
    i + 1's embedding, normed (hnorm, enorm), concatenated embedding first, projected (eh_proj), through the decoder
    layer, normed (shared_head.norm) into the head (shared_head.head). Computed with transformers' own modules: its
    decoder layers (the MTP one loaded as layer N of the model made one layer longer) and the model's RMSNorm."""
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    n = config["num_hidden_layers"]
    longer = transformers.AutoModelForCausalLM.from_pretrained(
        folder, num_hidden_layers=n + 1, dtype=torch.float32, attn_implementation="eager"
    ).model.eval()
    mtp = {k.removeprefix(f"model.layers.{n}."): t for k, t in load_file(folder / "model.safetensors").items()}

    def norm(name):
        module = type(longer.norm)(config["hidden_size"], eps=config["rms_norm_eps"])
        module.weight.data = mtp[name]
        return module

    positions = torch.arange(tokens.shape[1])[None]
    causal = torch.full((tokens.shape[1],) * 2, float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        hidden = longer.embed_tokens(tokens)
        rope = longer.rotary_emb(hidden, positions)
        run = dict(attention_mask=causal, position_ids=positions, position_embeddings=rope)
        for layer in longer.layers[:n]:
            hidden = layer(hidden, **run)
        hidden = longer.norm(hidden)
        following = longer.embed_tokens(tokens.roll(-1, dims=1))
        joined = torch.cat((norm("enorm.weight")(following), norm("hnorm.weight")(hidden)), -1)
        hidden = longer.layers[n](joined @ mtp["eh_proj.weight"].T, **run)
        return norm("shared_head.norm.weight")(hidden) @ mtp["shared_head.head.weight"].T


@pytest.mark.parametrize("case", ["megatron-deepseekv3-tp2-pp2-ep2", "megatron-glm45-tp2-ep2-dp2"])
def test_mtp_layer_predicts_in_megatron_core_as_on_the_hub(case, tmp_path):
    """megatron-core's DeepSeek-V3 and GLM-4.5 with an MTP layer (fixtures it trained) as Hugging Face folders, the
    MTP layer as the Hub's checkpoints hold it (model.layers.N), written back into Megatron: megatron-core's MTP
    layer, built from the args unshard wrote, predicts as that layer means on the Hub (hub_mtp_logits), so the names
    are right both ways and not only consistent (test_megatron_core_loads_it_at_its_parallelism: every tensor equal
    to megatron-core's own)."""
    pytest.importorskip("megatron.core")
    fixture = SHIPPED / case
    info = json.loads((fixture / "fixture.json").read_text())
    src, out = tmp_path / "hf", tmp_path / "megatron"
    unshard.convert(fixture / "torch_dist", src, progress=False)
    options = OutputOptions(to="megatron", tp=info["tp"], pp=info["pp"], ep=info["ep"])
    unshard.convert(src, out, output=options, progress=False)
    assert vars(torch.load(out / "release" / "common.pt", weights_only=False)["args"])["mtp_num_layers"] == 1
    tokens = torch.load(fixture / "oracle.pt")["tokens"]
    logits = megatron_logits(out / "release", tokens, tmp_path, "--mtp")
    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    expected = hub_mtp_logits(src, tokens)
    # (the last position's next token is past the sequence: megatron-core's and the roll above differ there)
    torch.testing.assert_close(logits[:, :-1, :vocab], expected[:, :-1], atol=1e-4, rtol=0)


def test_megatron_refusals(hf_model, tmp_path):
    cases = [
        ({"tp": 3}, "4 attention heads do not split over --tp 3"),
        ({"pp": 2, "vpp": 2}, "2 layers do not split over --pp times --vpp 4"),
    ]
    for sizes, expected in cases:
        with pytest.raises(unshard.UnshardError, match=expected):
            unshard.convert(hf_model, tmp_path / "out", output=OutputOptions(to="megatron", **sizes), progress=False)
        assert not (tmp_path / "out").exists()
    deepseek, _ = titan_source(tmp_path, "deepseekv3")
    config = json.loads((deepseek / "config.json").read_text())
    for key, value, said in [
        ("rope_interleave", False, "the config has rope_interleave false, which megatron-core's latent attention"),
        ("rope_parameters", {"rope_type": "yarn", "factor": 4.0, "mscale_all_dim": 1.0}, "YaRN's mscale_all_dim"),
    ]:
        (deepseek / "config.json").write_text(json.dumps({**config, key: value}))
        code, _, err = run_cli("convert", deepseek, tmp_path / "out", "--to", "megatron")
        assert code == 1 and said in err and "--to megatron: DeepSeek-V3: the config has" in err, err
        assert not (tmp_path / "out").exists()
    mixtral = SHIPPED / "mixtral-fsdp2" / "global_step_1" / "actor"
    code, _, err = run_cli("convert", mixtral, tmp_path / "out", "--to", "megatron", "--ep", "2")
    assert code == 1 and "3 experts do not split over --ep 2" in err and not (tmp_path / "out").exists()
    code, _, err = run_cli("convert", mixtral, tmp_path / "out", "--to", "megatron", "--etp", "3")
    assert code == 1 and "40 experts' rows do not split over --etp 3" in err and not (tmp_path / "out").exists()


def test_a_tied_head_is_stored_under_both_names(tmp_path):
    """A tied model's folder holds the embedding once; the state dict DCP loads names it twice (lm_head too)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    model = tied_qwen2(tmp_path / "tied")
    config = model.config
    to_dcp(tmp_path / "tied", tmp_path / "dcp", verify=True)
    loaded = transformers.Qwen2ForCausalLM(config).eval()
    state = get_model_state_dict(loaded)
    assert "lm_head.weight" in state
    dcp.load(state, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    set_model_state_dict(loaded, state)
    tokens = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, model(tokens).logits)
    unshard.convert(tmp_path / "dcp", tmp_path / "back", progress=False)
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == (
        tmp_path / "tied" / "model.safetensors"
    ).read_bytes()


def test_megatron_args_say_llama3_rope_and_yarn_and_refuse_other_scalings(hf_model, tmp_path):
    """Megatron-LM's args carry Llama 3.1's rope scaling (--use-rope-scaling and its factor) and YaRN (the yarn_*
    settings megatron-core's GPTModel reads: the Megatron reader's way back to the same rope_scaling); a scaling they
    cannot say is refused rather than written as no scaling."""
    for kind, factor in (("llama3", 32.0), ("yarn", 4.0), ("linear", 2.0)):
        src = tmp_path / f"{kind}-hf"
        shutil.copytree(hf_model, src)
        config = json.loads((src / "config.json").read_text())
        config["rope_parameters"] = {**config.get("rope_parameters", {}), "rope_type": kind, "factor": factor}
        config["rope_parameters"].update(low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)
        (src / "config.json").write_text(json.dumps(config))
        out = tmp_path / f"{kind}-megatron"
        if kind == "linear":
            with pytest.raises(unshard.UnshardError, match="rope scaling of type 'linear'"):
                unshard.convert(src, out, output=OutputOptions(to="megatron"), progress=False)
            assert not out.exists()
            continue
        unshard.convert(src, out, output=OutputOptions(to="megatron"), progress=False)
        args = vars(torch.load(out / "release" / "common.pt", weights_only=False)["args"])
        if kind == "llama3":
            assert args["use_rope_scaling"] and args["rope_scaling_factor"] == factor
            continue
        assert args["position_embedding_type"] == "yarn" and args["yarn_mscale"] is None
        scaling = yarn_config(args)["rope_scaling"]
        assert {
            key: scaling[key] for key in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow")
        } == {
            "factor": factor,
            "original_max_position_embeddings": 64,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
        }
