"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE as GGUF, the vision-language models verl trains most: the text
model as llama.cpp's qwen2vl, qwen3vl or qwen3vlmoe (M-RoPE's sections in the header; the fused experts as stacks of
gate, up and down) and the vision tower with its patch merger (and Qwen3-VL's deepstack mergers) as the mmproj file
beside it; GLM-4.1V, GLM-4.5V and GLM-OCR the same way (llama.cpp's glm4 and glm4moe, its glm4v projector). Each file
equals what llama.cpp's converter writes (test_gguf.py's oracle) with and without `--mmproj`; llama.cpp runs the text
model as transformers does, and its multimodal library (mtmd) encodes an image through the mmproj into transformers'
own image features. (A file of its own, so that CI's two workers share the GGUF tests.)"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import SHIPPED
from test_gguf import (  # noqa: F401  (converter and llama_cpp: the fixtures, used by name)
    LLAMA_CPP_TOLERANCE,
    assert_refused_in_one_line,
    assert_same_file,
    contents,
    converter,
    for_the_converter,
    llama_cpp,
    llama_cpp_client,
)

import unshard

CASES = [
    "qwen2vl-fsdp2",
    "qwen25vl-fsdp2",
    "qwen3vl-fsdp2",
    "qwen3vlmoe-fsdp2",
    "qwen35vl-fsdp2",
    "qwen35moevl-fsdp2",
    "glm4v-fsdp2",
    "glm4vmoe-fsdp2",
    "glmocr-fsdp2",
]
# llama.cpp's image features against transformers' (relative distance, f32), measured: Qwen2-VL 4e-4, Qwen2.5-VL
# 6.7e-3 (its windowed attention), Qwen3-VL 4.2e-4 (with its deepstack features), Qwen3-VL-MoE 4.3e-4 (its text
# logits 3.2e-4), Qwen3.5 4.0e-4 (its text logits, through Gated DeltaNet layers, 1.6e-4), GLM-4.1V 7.5e-4 (its
# learned positions resized from 4 x 4 patches to 6 x 6, bicubic both), GLM-OCR 4.5e-4 (no learned positions),
# Qwen2.5-Omni 9.5e-3 (Qwen2.5-VL's tower)
IMAGE_TOLERANCE = {
    "qwen25omni-fsdp2": 1.5e-2,
    "qwen2vl-fsdp2": 1e-3,
    "qwen25vl-fsdp2": 1e-2,
    "qwen3vl-fsdp2": 1e-3,
    "qwen3vlmoe-fsdp2": 1e-3,
    "qwen35vl-fsdp2": 1e-3,
    "qwen35moevl-fsdp2": 1e-3,
    "glm4v-fsdp2": 2e-3,
    "glm4vmoe-fsdp2": 2e-3,
    "glmocr-fsdp2": 1e-3,
}
# an image mtmd keeps at its size (84 pixels: 3 x 3 tokens of 28; Qwen3-VL's patches of 16: 96 pixels)
IMAGE_SIDE = {
    "qwen2vl-fsdp2": 84,
    "qwen25vl-fsdp2": 84,
    "qwen3vl-fsdp2": 96,
    "qwen3vlmoe-fsdp2": 96,
    "qwen35vl-fsdp2": 96,
    "qwen35moevl-fsdp2": 96,
    "glm4v-fsdp2": 84,
    "glm4vmoe-fsdp2": 84,
    "glmocr-fsdp2": 84,
}
# M-RoPE's sections, as the fixtures' configs state them (padded to 4)
SECTIONS = {
    "qwen35vl-fsdp2": [2, 1, 1, 0],
    "qwen35moevl-fsdp2": [2, 1, 1, 0],
    "glm4v-fsdp2": [2, 1, 1, 0],
    "glm4vmoe-fsdp2": [2, 1, 1, 0],
    "glmocr-fsdp2": [2, 1, 1, 0],
}
# Qwen3-VL-MoE's fused experts as Qwen's release holds them, each expert transposed: the one layout the converter
# reads (transformers 5 saves them as it holds them, and loads either)
RELEASED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def as_released(folder) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    released = {n: t.transpose(1, 2).contiguous() if n.endswith(RELEASED) else t for n, t in weights.items()}
    save_file(released, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("case", CASES)
def test_text_model_and_mmproj_as_the_converter_writes_them(case, converter, tmp_path):
    """Both files, in f16 and q8_0 (f32 takes f16's path with other types): every tensor (q, k and v of the tower
    apart; the Conv3D patch embedding as two 2-D ones, in F16 in an f16 file and F32 otherwise; Qwen3-VL's mergers
    under the converter's own names) and every metadata field (the projector, Qwen2.5-VL's window pattern, Qwen3-VL's
    deepstack blocks) but the name; --verify reads each back. Qwen3-VL-MoE's experts are read as transformers 5 holds
    them and as Qwen's release does (each transposed: the converter reads only that)."""
    src = SHIPPED / case / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    theirs = tmp_path / "for-the-converter"
    shutil.copytree(tmp_path / "hf", theirs)
    as_released(theirs)
    if case == "qwen3vlmoe-fsdp2":  # (a folder in the release's layout converts to the same file)
        unshard.convert(theirs, tmp_path / "released.gguf", output=unshard.OutputOptions(gguf="f16"), progress=False)
    pre = for_the_converter(theirs)
    for kind in ("f16", "q8_0"):
        ours = tmp_path / f"{kind}.gguf"
        result = unshard.convert(src, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        assert sorted(result.files) == ["mmproj.gguf", "model.gguf"]
        more = ("--no-mtp",) if case.startswith("qwen35") else ()  # (its text model's MTP layer: none once trained)
        assert_same_file(ours, converter(theirs, kind, tmp_path / f"oracle-{kind}.gguf", pre=pre, more=more))
        mmproj = converter(theirs, kind, tmp_path / f"oracle-mmproj-{kind}.gguf", pre=pre, mmproj=True)
        assert_same_file(tmp_path / f"mmproj-{kind}.gguf", mmproj)
    if case == "qwen3vlmoe-fsdp2":
        assert_same_file(tmp_path / "released.gguf", tmp_path / "oracle-f16.gguf")
    fields, tensors = contents(tmp_path / "f16.gguf")
    architecture = fields["general.architecture"]
    sections = SECTIONS.get(case, [2, 3, 3, 0])
    assert fields[f"{architecture}.rope.dimension_sections"] == sections and not any("visual" in t[0] for t in tensors)
    types = {t[0]: t[1] for t in contents(tmp_path / "mmproj-f16.gguf")[1]}
    assert types["v.patch_embd.weight.1"] == "F16" and types["v.blk.0.ffn_up.weight"] == "F16"


@pytest.mark.parametrize("case", CASES)
def test_llama_cpp_reads_text_and_images_as_transformers_does(case, llama_cpp, tmp_path):
    """llama.cpp runs the text model (f32): a text prompt's logits are transformers' within f32's tolerance, and the
    same greedy tokens; mtmd encodes an image (of a size it keeps) through the mmproj into 9 tokens whose embeddings
    are transformers' image features of the same pixels (Qwen3-VL's with its deepstack features beside them)."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    src = SHIPPED / case / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    unshard.convert(src, tmp_path / "m.gguf", output=unshard.OutputOptions(gguf="f32"), progress=False)
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    prompt, new = [1, 5, 20, 33, 64, 70, 90, 2], 6
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([prompt])).logits[0]
        sequence = list(prompt)
        for _ in range(new):
            sequence.append(int(model(input_ids=torch.tensor([sequence])).logits[0, -1].argmax()))
    logits, greedy = llama_cpp(tmp_path / "m.gguf", prompt, new)
    assert ((logits - expected).norm() / expected.norm()).item() <= LLAMA_CPP_TOLERANCE["f32"]
    assert greedy == sequence[len(prompt) :]

    side = IMAGE_SIDE[case]
    image = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    image.tofile(tmp_path / "image.rgb")
    pixels = AutoImageProcessor.from_pretrained(tmp_path / "hf")(images=[image], do_resize=False, return_tensors="pt")
    with torch.no_grad():
        features = model.model.get_image_features(
            pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"]
        )
    deepstack = [torch.cat(list(d)) for d in getattr(features, "deepstack_features", None) or ()]
    expected = torch.cat([torch.cat(list(features.pooler_output)), *deepstack], dim=-1)
    args = (tmp_path / "m.gguf", tmp_path / "mmproj-m.gguf", side, side, tmp_path / "image.rgb", tmp_path / "image.npy")
    llama_cpp_client("image", *args)
    embeddings = torch.from_numpy(np.load(tmp_path / "image.npy"))
    distance = ((embeddings - expected).norm() / expected.norm()).item()
    assert embeddings.shape == expected.shape == (9, 64 * (1 + len(deepstack))), (embeddings.shape, expected.shape)
    assert distance <= IMAGE_TOLERANCE[case], distance


def test_fused_experts_that_cannot_be_told_from_their_transpose_are_refused():
    """Where hidden_size is twice moe_intermediate_size, gate_up_proj held either way has one shape: one line."""
    from unshard.errors import ConfigMismatchError
    from unshard.families.vlm import qwen3vl_moe_experts

    name, hparams = "model.language_model.layers.0.mlp.experts.gate_up_proj", {"hidden_size": 64}
    assert qwen3vl_moe_experts(name, (4, 192, 64), {**hparams, "moe_intermediate_size": 96}, "config.json")
    with pytest.raises(ConfigMismatchError, match="cannot be told apart from its transpose"):
        qwen3vl_moe_experts(name, (4, 64, 64), {**hparams, "moe_intermediate_size": 32}, "config.json")


@pytest.mark.parametrize(
    "part, change, message",
    [
        (
            "text_config",
            {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}},
            "rope_parameters name no partial_rotary_factor: transformers' GLM-4.1V then rotates whole heads",
        ),
        ("vision_config", {"spatial_merge_size": 4}, "spatial_merge_size is 4, and llama.cpp's glm4v merges 2 x 2"),
        ("vision_config", {"rope_parameters": {"rope_type": "axial", "rope_theta": 5e5}}, "rope_theta is 500000.0"),
        ("vision_config", {"hidden_act": "gelu_pytorch_tanh"}, "hidden_act is 'gelu_pytorch_tanh'"),
    ],
)
def test_what_llama_cpp_s_glm4v_computes_otherwise_is_one_line(part, change, message, tmp_path):
    """A GLM-4.1V whose text or images llama.cpp would compute otherwise than transformers: refused while planning, in
    one line naming the file, nothing written."""
    assert_refused_in_one_line("glm4v-fsdp2", lambda config: config[part].update(change), message, tmp_path)


OMNI = SHIPPED / "qwen25omni-fsdp2" / "global_step_1"


def test_qwen25_omni_s_thinker_as_the_converter_writes_it_and_sees_as_transformers(converter, llama_cpp, tmp_path):
    """Qwen2.5-Omni's thinker: its text model is the converter's file (given the class the Hub's config names,
    Qwen2_5OmniModel, which the converter knows it by), its vision tower the converter's mmproj file of Qwen2.5-VL
    with the same tower (its own file of Qwen2.5-Omni holds the audio encoder too, which llama.cpp runs as
    Qwen2-Audio's: left out, with the reason), each in f16 and q8_0; llama.cpp computes the thinker's logits and mtmd
    its image features. (The folder unshard writes carries the model's voices, spk_dict.pt, without which transformers
    does not load it.)"""
    from safetensors.torch import load_file, save_file
    from transformers import AutoImageProcessor, AutoModelForMultimodalLM

    unshard.convert(OMNI, tmp_path / "hf", progress=False)
    hub, tower = tmp_path / "hub", tmp_path / "qwen25vl"
    for folder in (hub, tower):
        shutil.copytree(tmp_path / "hf", folder)
    pre = for_the_converter(hub) and for_the_converter(tower)
    config = json.loads((hub / "config.json").read_text())
    (hub / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen2_5OmniModel"]}))
    thinker = config["thinker_config"]
    vl = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl"}
    vl.update({key: thinker[key] for key in ("vision_config", "text_config")})
    (tower / "config.json").write_text(json.dumps(vl))
    weights = load_file(tower / "model.safetensors")
    visual = {n.removeprefix("thinker."): t for n, t in weights.items() if n.startswith("thinker.visual.")}
    save_file(visual, tower / "model.safetensors", metadata={"format": "pt"})
    for kind in ("f16", "q8_0"):
        ours = tmp_path / f"{kind}.gguf"
        unshard.convert(OMNI, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        assert_same_file(ours, converter(hub, kind, tmp_path / f"oracle-{kind}.gguf", pre=pre))
        # (the same folder as the Hub's config names the class: unshard writes the same file of it)
        unshard.convert(hub, tmp_path / f"hub-{kind}.gguf", output=unshard.OutputOptions(gguf=kind), progress=False)
        assert_same_file(tmp_path / f"hub-{kind}.gguf", tmp_path / f"oracle-{kind}.gguf")
        mmproj = converter(tower, kind, tmp_path / f"oracle-mmproj-{kind}.gguf", pre=pre, mmproj=True)
        assert_same_file(tmp_path / f"mmproj-{kind}.gguf", mmproj)
    plan = unshard.plan(OMNI, output=unshard.OutputOptions(gguf="f32"))
    left_out = "no mmproj file of them (the audio encoder's, which llama.cpp runs as Qwen2-Audio's"
    assert any(left_out in note for note in plan.notes)

    unshard.convert(OMNI, tmp_path / "m.gguf", output=unshard.OutputOptions(gguf="f32"), progress=False)
    model = AutoModelForMultimodalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).thinker
    prompt = [1, 5, 20, 33, 64, 70, 90, 2]
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([prompt])).logits[0]
    logits, _ = llama_cpp(tmp_path / "m.gguf", prompt, 0)
    assert ((logits - expected).norm() / expected.norm()).item() <= LLAMA_CPP_TOLERANCE["f32"]
    image = np.random.default_rng(0).integers(0, 256, (84, 84, 3), dtype=np.uint8)
    image.tofile(tmp_path / "image.rgb")
    pixels = AutoImageProcessor.from_pretrained(tmp_path / "hf")(images=[image], do_resize=False, return_tensors="pt")
    with torch.no_grad():
        features = model.get_image_features(**{key: pixels[key] for key in ("pixel_values", "image_grid_thw")})
    expected = torch.cat(list(features.pooler_output))
    args = (tmp_path / "m.gguf", tmp_path / "mmproj-m.gguf", 84, 84, tmp_path / "image.rgb", tmp_path / "image.npy")
    llama_cpp_client("image", *args)
    embeddings = torch.from_numpy(np.load(tmp_path / "image.npy"))
    distance = ((embeddings - expected).norm() / expected.norm()).item()
    assert embeddings.shape == expected.shape == (9, 64) and distance <= IMAGE_TOLERANCE["qwen25omni-fsdp2"], distance
