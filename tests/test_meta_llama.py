"""torchtitan and torchtune checkpoints, in DCP folders and in torchtune's single files (Meta's Llama names,
interleaved rotary; torchtitan's Qwen3, Qwen3 MoE, DeepSeek-V3 and gpt-oss, their experts grouped in one tensor per
projection (gpt-oss's turned into transformers' fused ones, which torchtitan's own adapter leaves out); torchtitan's
Qwen3.5 and Qwen3.5-MoE with their vision tower (fused projections and convolutions split, the patch embedding a
Linear layer; Qwen3.5-MoE's experts, which its own adapter fuses otherwise than transformers, each as saved); its Muse
Glimmer, the vision tower's q and k rows and biases reordered as the text model's;
torchtune's Qwen2, Gemma, Gemma 2 and Phi-3, whose q, k and v are three tensors that transformers' Phi-3 fuses) convert
to exactly what each library's own Hugging Face converter makes (but Gemma 2's MLP norms, which torchtune's converter
names the other way round), and the folder's logits match its forward pass."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import SHIPPED
from generate import CASES
from safetensors.torch import load_file
from test_cli_and_errors import run_cli

import unshard
from unshard import families

transformers = pytest.importorskip("transformers")
CASES_HERE = [
    "torchtitan-llama3-fsdp2",
    "torchtune-llama3-fsdp2",
    "torchtitan-qwen3-fsdp2",
    "torchtitan-qwen3moe-fsdp2",
    "torchtitan-deepseekv3-fsdp2",
    "torchtitan-deepseekv3mtp-fsdp2",
    "torchtitan-gptoss-fsdp2",
    "torchtitan-qwen35-fsdp2",
    "torchtitan-qwen35moe-fsdp2",
    "torchtitan-museglimmer-fsdp2",
    "torchtitan-kimik25-fsdp2",
    "torchtune-qwen2-fsdp2",
    "torchtune-gemma-fsdp2",
    "torchtune-gemma2-fsdp2",
    "torchtune-phi3-fsdp2",
    "torchtune-mistral-fsdp2",
    "torchtune-llama32vision-fsdp2",
]
FRESH = [name for name in CASES_HERE if CASES[name].fresh]
# torchtitan runs its grouped experts in bf16 (GroupedExperts casts the weights and tokens), transformers in fp32: the
# MoE models' logits agree to bf16's rounding (the tensors themselves are compared bit for bit)
ATOL = {
    "torchtitan-qwen3moe-fsdp2": 1e-3,
    "torchtitan-deepseekv3-fsdp2": 2e-4,
    "torchtitan-deepseekv3mtp-fsdp2": 2e-4,
    "torchtitan-kimik25-fsdp2": 2e-4,
    "torchtitan-gptoss-fsdp2": 0.1,
}
# (torchtitan's gpt-oss computes in bf16 only, as its trainer shards it: measured 0.064 on logits of up to 4.25; its
# experts' gate and up swapped gives 3.9, its sinks left out 1.5, its experts' output biases 1.2)


# torchtune's single-file checkpointers' files of the same models (FullModelTorchTuneCheckpointer: torchtune's names;
# FullModelMetaCheckpointer: Meta's), written beside each fixture's DCP folder from the same trained weights
SINGLE_FILES = [
    ("torchtune-llama3-fsdp2", "epoch_0"),
    ("torchtune-llama3-fsdp2", "meta/epoch_0"),
    ("torchtune-qwen2-fsdp2", "epoch_0"),
    ("torchtune-gemma-fsdp2", "epoch_0"),
    ("torchtune-gemma2-fsdp2", "epoch_0"),
    ("torchtune-phi3-fsdp2", "epoch_0"),
    ("torchtune-mistral-fsdp2", "epoch_0"),
    ("torchtune-llama32vision-fsdp2", "epoch_0"),
    ("torchtune-llama32vision-fsdp2", "meta/epoch_0"),
]


def mlp_norms_swapped(name: str) -> str:
    """The name unshard gives the tensor torchtune 0.6.1's Gemma 2 converter names `name`: that converter names the norm
    torchtune applies before the MLP (mlp_norm) post_feedforward_layernorm, and the one after it pre_."""
    pre, post = "pre_feedforward_layernorm", "post_feedforward_layernorm"
    return name.replace(pre, "<>").replace(post, pre).replace("<>", post)


def experts_apart(reference: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """torchtitan 0.3's Qwen35StateDictAdapter.to_hf fuses a layer's experts as gate_up_proj [experts, dim, 2 x width]
    and down_proj [experts, width, dim], the transposes of transformers 5's [experts, 2 x width, dim] and [experts,
    dim, width] (test_torchtitans_own_qwen35_moe_adapter_writes_experts_transformers_refuses): each expert's
    projections as save_pretrained writes them, which unshard writes."""
    apart = {}
    for name, tensor in reference.items():
        if name.endswith("experts.gate_up_proj"):
            for e, (gate, up) in enumerate(zip(*tensor.chunk(2, dim=-1))):
                apart[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = gate.T.contiguous()
                apart[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = up.T.contiguous()
        elif name.endswith("experts.down_proj"):
            for e, down in enumerate(tensor):
                apart[name.replace("down_proj", f"{e}.down_proj.weight")] = down.T.contiguous()
        else:
            apart[name] = tensor
    return apart


# The reference's name -> unshard's, where the library's own converter is not what its model computes
RENAMED = {"torchtune-gemma2-fsdp2": mlp_norms_swapped}
# The reference's tensors as transformers holds them, where the library's own converter lays them out otherwise
LAID_OUT = {"torchtitan-qwen35moe-fsdp2": experts_apart}
# What unshard writes that the library's own converter leaves out: torchtitan 0.3's GptOssStateDictAdapter maps
# `mlp1_weight` (not the model's `mlp1_weight_EGD`) to the Hub's MXFP4 `_blocks` names, so its to_hf has no experts
# (and DeepSeekV3StateDictAdapter writes the MTP layer as a layer after the model's, as DeepSeek's release holds it,
# but without the release's copies of the embedding and head in it, which unshard writes, as vLLM reads them)
BEYOND_REFERENCE = {
    "torchtitan-gptoss-fsdp2": ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"),
    "torchtitan-deepseekv3mtp-fsdp2": ("layers.3.embed_tokens.weight", "layers.3.shared_head.head.weight"),
}
# What transformers leaves unloaded in a folder (the MTP layer, which its model has none of)
UNLOADED = {"torchtitan-deepseekv3mtp-fsdp2": "model.layers.3."}
# Vision-language models, loaded as such; Qwen3.5's linear attention has flash-linear-attention's Triton kernels only,
# which no CPU runs: torchtitan saved no logits of its own, and its adapter's tensors are the oracle (Muse Glimmer's
# and Kimi K2.5's logits are their text models', their vision towers' tensors their adapters')
VISION = {
    "torchtitan-qwen35-fsdp2",
    "torchtitan-qwen35moe-fsdp2",
    "torchtitan-museglimmer-fsdp2",
    "torchtitan-kimik25-fsdp2",
    "torchtune-llama32vision-fsdp2",
}


def check(name, fixture, out, src=None):
    case = CASES[name]
    result = unshard.convert(
        fixture / (src or case.src), out, config_from=fixture / case.config_from, progress=False, verify=True
    )
    renamed = RENAMED.get(name, lambda tensor_name: tensor_name)
    reference = LAID_OUT.get(name, dict)(load_file(fixture / "reference" / "model.safetensors"))
    expected = {renamed(n): t for n, t in reference.items()}
    written = load_file(out / "model.safetensors")
    beyond = [n for n in written if n.endswith(BEYOND_REFERENCE.get(name, ()))]
    assert sorted(set(written) - set(beyond)) == sorted(expected) and result.tensors == len(expected) + len(beyond)
    for tensor_name, tensor in expected.items():
        assert torch.equal(written[tensor_name], tensor), tensor_name
    loader = transformers.AutoModelForImageTextToText if name in VISION else transformers.AutoModelForCausalLM
    model, info = loader.from_pretrained(out, output_loading_info=True)
    unexpected = [n for n in info["unexpected_keys"] if not n.startswith(UNLOADED.get(name, "-"))]
    assert not info["missing_keys"] and not unexpected
    if not (fixture / "reference" / "logits.pt").exists():
        return
    oracle = torch.load(fixture / "reference" / "logits.pt")
    with torch.no_grad():
        logits = model.eval()(oracle["tokens"]).logits
    torch.testing.assert_close(logits, oracle["logits"].float(), atol=ATOL.get(name, 1e-5), rtol=0)
    if "image_features" in oracle:  # (Kimi K2.5's tower and projector on an image; transformers takes its patches as
        # Conv2d's input, the same pixels)
        patches, grid = oracle["pixels"][0], oracle["grid_thw"]
        pixels = patches.view(len(patches), 3, *[int((patches.shape[1] // 3) ** 0.5)] * 2)
        with torch.no_grad():
            (features,) = model.model.get_image_features(pixels, image_grid_thw=grid).pooler_output
        torch.testing.assert_close(features, oracle["image_features"][0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", CASES_HERE)
def test_shipped_checkpoint(name, tmp_path):
    check(name, SHIPPED / name, tmp_path / "out")
    info = unshard.inspect(SHIPPED / name / CASES[name].src, config_from=SHIPPED / name / "hf")
    assert info["naming"].startswith(name.split("-")[0])


def test_kimi_k25_keeps_the_hubs_names_whichever_class_its_config_names(tmp_path):
    """Kimi K2.5's folder holds the Hub's names, which transformers renames as it loads: a config naming transformers'
    own class (whose save_pretrained writes other names) gives the same file, not a mismatch, and says so."""
    fixture = SHIPPED / "torchtitan-kimik25-fsdp2"
    shutil.copytree(fixture / "hf", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["architectures"] = ["Kimi_K25ForConditionalGeneration"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli(
        "convert", fixture / "checkpoint" / "step-1", tmp_path / "out", "--config-from", tmp_path / "hf"
    )
    assert code == 0 and "note: tensor names kept as saved, not asked of transformers (its Kimi K2.5 renames" in err, (
        err
    )
    written = load_file(tmp_path / "out" / "model.safetensors")
    reference = load_file(fixture / "reference" / "model.safetensors")
    assert written.keys() == reference.keys() and all(torch.equal(written[n], t) for n, t in reference.items())


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("cross_attention_layers", [1, 3], "the trainer's layer 3 holds a cross-attention layer, which the config's "),
        ("supported_aspect_ratios", [[1, 1], [2, 2]], "not tiles x tiles of the aspect ratios [[1, 1], [2, 2]] "),
    ],
)
def test_a_llama_vision_config_that_does_not_place_its_layers_or_tiles_is_one_line(key, value, said, tmp_path):
    """torchtune's Llama 3.2 Vision numbers its cross-attention layers, and lays out its tile embeddings, by the
    config: a config that places them otherwise is refused in one line naming what, nothing written."""
    fixture = SHIPPED / "torchtune-llama32vision-fsdp2"
    shutil.copytree(fixture / "hf", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["text_config" if key.startswith("cross") else "vision_config"][key] = value
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli("convert", fixture / "dist_epoch_0", tmp_path / "out", "--config-from", tmp_path / "hf")
    assert code == 1 and len(err.strip().splitlines()) == 1 and said in err, err
    assert not (tmp_path / "out").exists()


def test_a_patch_embedding_the_config_does_not_shape_is_one_line(tmp_path):
    """torchtitan's Qwen3.5 patch embedding takes the Conv3d shape the config gives: a config whose patches are
    otherwise is refused in one line naming both, nothing written."""
    import json
    import shutil

    fixture = SHIPPED / "torchtitan-qwen35-fsdp2"
    shutil.copytree(fixture / "hf", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["vision_config"]["patch_size"] = 8
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli(
        "convert", fixture / "checkpoint" / "step-1", tmp_path / "out", "--config-from", tmp_path / "hf"
    )
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "vision_encoder.patch_embed.weight is [32, 1536], not the [32, 3, 2, 8, 8] of " in err
    assert not (tmp_path / "out").exists()


def test_torchtitans_own_qwen35_moe_adapter_writes_experts_transformers_refuses(tmp_path):
    """Why unshard's Qwen3.5-MoE experts are not its adapter's bytes: transformers refuses the folder of torchtitan's
    own to_hf (the fixture's reference), its experts' down_proj turned; unshard's loads (test_shipped_checkpoint)."""
    import shutil

    fixture = SHIPPED / "torchtitan-qwen35moe-fsdp2"
    theirs = tmp_path / "theirs"
    shutil.copytree(fixture / "hf", theirs)
    shutil.copy(fixture / "reference" / "model.safetensors", theirs)
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        transformers.AutoModelForImageTextToText.from_pretrained(theirs)
    _, info = transformers.AutoModelForImageTextToText.from_pretrained(
        theirs, ignore_mismatched_sizes=True, output_loading_info=True
    )
    # (its gate_up_proj, [4, 64, 2 x 32], takes transformers' shape here, dim being twice the width: loaded turned)
    assert sorted(name for name, *_ in info["mismatched_keys"]) == [
        f"model.language_model.layers.{i}.mlp.experts.down_proj" for i in (0, 1)
    ]


def test_torchtunes_own_gemma2_converter_computes_another_model(tmp_path):
    """Why Gemma 2's MLP norms are named by what torchtune computes: the folder of torchtune's own converter
    (gemma2_tune_to_hf, the fixture's reference) gives other logits than the trained model, unshard's the same."""
    import shutil

    from safetensors.torch import save_file

    fixture = SHIPPED / "torchtune-gemma2-fsdp2"
    theirs = tmp_path / "theirs"
    unshard.convert(fixture / "dist_epoch_0", tmp_path / "ours", config_from=fixture / "hf", progress=False)
    theirs.mkdir()
    shutil.copy(tmp_path / "ours" / "config.json", theirs)
    save_file(load_file(fixture / "reference" / "model.safetensors"), theirs / "model.safetensors", {"format": "pt"})
    oracle = torch.load(fixture / "reference" / "logits.pt")
    found = {}
    for folder in ("ours", "theirs"):
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / folder, dtype=torch.float32)
        with torch.no_grad():
            found[folder] = (model.eval()(oracle["tokens"]).logits - oracle["logits"]).abs().max().item()
    assert found["ours"] < 1e-5 and found["theirs"] > 0.1, found


def test_what_transformers_has_no_place_for_is_said(tmp_path):
    """Qwen3 MoE's load-balancing bias is left out, and inspect says so; DeepSeek-V3's is its router's bias. Its
    multi-token prediction layer is the layer after the model's, as on the Hub (and said), where the config counts
    it, and left out (and said) where the config counts none."""
    found = {}
    for name in ("torchtitan-qwen3moe-fsdp2", "torchtitan-deepseekv3-fsdp2", "torchtitan-deepseekv3mtp-fsdp2"):
        fixture = SHIPPED / name
        found[name] = unshard.inspect(fixture / CASES[name].src, config_from=fixture / "hf")
    bias = families.by_model_type("qwen3_moe").meta_names["layers.{i}.moe.expert_bias_E"].why
    skipped = {name: report["skipped"] for name, report in found.items()}
    assert skipped["torchtitan-qwen3moe-fsdp2"][bias] == 2 and bias not in skipped["torchtitan-deepseekv3-fsdp2"]
    mtp = families.by_model_type("deepseek_v3").meta_names["mtp_layers."].why
    assert not any(why.startswith(mtp) for report in skipped.values() for why in report)
    notes = " ".join(found["torchtitan-deepseekv3mtp-fsdp2"]["output"]["notes"])
    assert "32 tensors of the multi-token prediction layer(s) config.json counts" in notes
    fixture = SHIPPED / "torchtitan-deepseekv3mtp-fsdp2"
    shutil.copytree(fixture / "hf", tmp_path / "hf")
    config = json.loads((fixture / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 0}))
    code, shown, _ = run_cli("inspect", fixture / "checkpoint" / "step-1", "--config-from", tmp_path / "hf")
    assert code == 0 and f"skipped      21 {mtp}: the config counts 0" in shown


@pytest.mark.parametrize("name, src", SINGLE_FILES)
def test_single_file_checkpoint(name, src, tmp_path):
    """The folder torchtune's checkpointer saved into (its one `model-00001-of-00001.bin`): the same tensors as
    torchtune's own converter gives, the same logits; inspect says whose names they are."""
    check(name, SHIPPED / name, tmp_path / "out", src)
    info = unshard.inspect(SHIPPED / name / src, config_from=SHIPPED / name / "hf")
    assert info["layout"] == "torch-state-dict"
    assert info["naming"].startswith("Meta's Llama" if src.startswith("meta") else "torchtune's")


@pytest.mark.parametrize("name", FRESH)
def test_freshly_generated_checkpoint(name, fresh_fixtures, tmp_path):
    fixture = fresh_fixtures(name)
    check(name, fixture, tmp_path / "out")
    for single, src in SINGLE_FILES:
        if single == name:
            check(name, fixture, tmp_path / src.replace("/", "-"), src)


def test_needs_the_config_for_head_counts(tmp_path):
    src = SHIPPED / CASES_HERE[0] / CASES[CASES_HERE[0]].src
    code, out, _ = run_cli("inspect", src)
    assert code == 0 and "pass --config-from" in out
    code, _, err = run_cli("convert", src, tmp_path / "out")
    assert code == 1 and "--config-from" in err and not (tmp_path / "out").exists()
