"""Muse Glimmer (Meta's, which torchtitan 0.3 trains) as llama.cpp's muse-glimmer and its DFlash drafter as dflash,
straight from torchtitan's checkpoint, and its vision tower, adapter and projection as the mmproj file of llama.cpp's
muse-glimmer projector: written with llama.cpp's own gguf-py (PyPI's lacks them). Each file is the converter's and
llama-quantize's; llama.cpp computes transformers' logits, and mtmd its image features (transformers' image processor
is torchvision's alone, whose PyPI build loads only beside CUDA's torch: they come from the peer venv of both,
generate.py's "torchvision")."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import generate
import numpy as np
import pytest
import torch
from conftest import SHIPPED
from test_gguf import (  # noqa: F401  (converter, llama_cpp and ggml_library: the fixtures, used by name)
    LLAMA_CPP_TOLERANCE,
    assert_same_file,
    contents,
    converter,
    for_the_converter,
    ggml_library,
    llama_cpp,
    llama_cpp_client,
)
from test_gguf_mmproj import IMAGE_TOLERANCE, image_embeddings, relative_distance
from test_gguf_newer_architectures import folder_of_the_reference, unshard_files, unshard_with_llama_cpp_gguf_py

import unshard

MUSE_GLIMMER = SHIPPED / "torchtitan-museglimmer-fsdp2"
# (a byte-level BPE tokenizer of the suite's, which the fixture's model was not trained with: ids alone matter here)
TOKENIZER = SHIPPED / "olmo2-fsdp2" / "global_step_1" / "actor" / "huggingface"


def muse_glimmer_folder(tmp_path: Path) -> Path:
    """unshard's folder of the torchtitan fixture's Muse Glimmer, with the suite's tokenizer: the converter's input,
    transformers', and the config unshard reads the checkpoint by."""
    folder = tmp_path / "hf"
    unshard.convert(MUSE_GLIMMER / "checkpoint" / "step-1", folder, config_from=MUSE_GLIMMER / "hf", progress=False)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / name, folder)
    return folder


def test_muse_glimmer_from_torchtitan_s_checkpoint_as_the_converter_and_llama_quantize_write_it(
    converter, llama_cpp, ggml_library, tmp_path
):
    """Muse Glimmer (gated attention, q and k norms the converter makes from qk_scale_factor, four norms a layer as
    1 + weight, rope on the sliding layers alone) straight from torchtitan's checkpoint: in f32 and q8_0 the
    converter's file of unshard's folder, in q4_k_m llama-quantize's of the converter's f32 file; llama.cpp computes
    transformers' logits from the f32 file (over a prompt past the window)."""
    import transformers

    folder = muse_glimmer_folder(tmp_path)
    pre = for_the_converter(folder)
    checkpoint = MUSE_GLIMMER / "checkpoint" / "step-1"
    unshard_files(checkpoint, tmp_path, ("f32", "q8_0", "q4_k_m"), ggml_library, "--config-from", folder)
    assert (tmp_path / "mmproj-f32.gguf").is_file()  # (its towers, in their own file: the tests below)
    for kind in ("f32", "q8_0"):
        assert_same_file(tmp_path / f"{kind}.gguf", converter(folder, kind, tmp_path / f"oracle-{kind}.gguf", pre=pre))
    llama_cpp_client("quantize", tmp_path / "oracle-f32.gguf", tmp_path / "llama-quantize.gguf", "q4_k_m")
    assert_same_file(tmp_path / "q4_k_m.gguf", tmp_path / "llama-quantize.gguf")
    window = json.loads((folder / "config.json").read_text())["text_config"]["sliding_window"]
    prompt = [1] + [(7 * i) % 60 + 4 for i in range(2 * window + 3)]
    model = transformers.AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    expected = model(torch.tensor([prompt])).logits[0].detach()
    # (keys and values cached in f32: q's norm scales its scores by qk_scale_factor, past f16's precision here)
    logits, _ = llama_cpp(tmp_path / "f32.gguf", prompt, 0, kv_cache="f32")
    assert ((logits - expected).norm() / expected.norm()).item() <= LLAMA_CPP_TOLERANCE["f32"]  # (measured 2.7e-6)


def test_muse_glimmer_s_drafter_as_the_converter_and_llama_quantize_write_it(converter, ggml_library, tmp_path):
    """Muse Glimmer's DFlash drafter (MuseGlimmerAssistantModel: layers without embedding or head, beside the target's
    hidden states of two layers, projected and normed): unshard's folder is the fixture's model tensor for tensor; its
    GGUF file from the rank files (its vocabulary from the drafter's own tokenizer, which is its target's) is the
    converter's, given the target's folder as it requires, in f32 (the block it drafts, the target's layers it reads,
    the window, the mask token in the header), and llama-quantize's in q4_k_m. llama.cpp runs a drafter only beside
    its target, so no logits are compared here; the folder's hidden states are transformers' (test_fsdp_convert)."""
    src, folder = folder_of_the_reference("museglimmerassistant-fsdp2", tmp_path)
    unshard_files(src, tmp_path, ("f32", "q4_k_m"), ggml_library)
    target = muse_glimmer_folder(tmp_path / "target")
    shutil.copy(folder / "chat_template.jinja", target)  # (the target's, which the converter reads: the drafter's)
    pre = for_the_converter(folder)
    for_the_converter(target)
    oracle = converter(folder, "f32", tmp_path / "oracle-f32.gguf", pre=pre, more=("--target-model-dir", target))
    assert_same_file(tmp_path / "f32.gguf", oracle)
    llama_cpp_client("quantize", oracle, tmp_path / "llama-quantize.gguf", "q4_k_m")
    assert_same_file(tmp_path / "q4_k_m.gguf", tmp_path / "llama-quantize.gguf")
    header, tensors = contents(tmp_path / "f32.gguf")
    assert header["general.architecture"] == "dflash" and header["dflash.target_layers"] == [2, 4]
    assert header["tokenizer.ggml.mask_token_id"] == 102 and "token_embd.weight" not in {t[0] for t in tensors}


@pytest.mark.parametrize(
    "change, message",
    [
        ({}, "MODEL_ARCH.MUSE_GLIMMER, which the installed gguf-py \\(0.19.0\\) lacks"),
        ({"post_norm_eps": 1e-6}, "post_norm_eps is 1e-06, and llama.cpp's muse-glimmer fixes 1e-08"),
        ({"layer_rope_theta": [10000.0] * 4}, "layer_rope_theta is not the rope base on the sliding layers"),
        ({"hidden_activation": "gelu"}, "hidden_activation is 'gelu', and llama.cpp's muse-glimmer runs SiLU"),
        ({"projector_hidden_act": "silu"}, "projector_hidden_act is 'silu', and llama.cpp's muse-glimmer projec"),
    ],
)
def test_muse_glimmer_llama_cpp_would_not_compute_or_gguf_py_cannot_write_is_one_line(change, message, tmp_path):
    """Without llama.cpp's gguf-py (PyPI's), or a config llama.cpp's muse-glimmer would compute otherwise: one line
    naming config.json, nothing written."""
    folder = muse_glimmer_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"].update(change)
    (folder / "config.json").write_text(json.dumps(config))
    args = ("convert", folder, tmp_path / "m.gguf", "--no-progress")
    if change:
        done = unshard_with_llama_cpp_gguf_py(*args)
    else:  # (PyPI's gguf-py, this venv's)
        done = subprocess.run([sys.executable, "-m", "unshard", *map(str, args)], capture_output=True, text=True)
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "config.json: " in done.stderr and re.search(message, done.stderr), done.stderr
    assert not (tmp_path / "m.gguf").exists()


@pytest.fixture(scope="module")
def towers(tmp_path_factory) -> tuple[Path, Path]:
    """(unshard's folder of the fixture, with its image processor; the folder of unshard's files of it in f32 and
    q8_0, each with its mmproj file), written from the rank files with llama.cpp's gguf-py."""
    tmp_path = tmp_path_factory.mktemp("museglimmer")
    folder = muse_glimmer_folder(tmp_path)
    for kind in ("f32", "q8_0"):
        args = ("convert", MUSE_GLIMMER / "checkpoint" / "step-1", tmp_path / f"{kind}.gguf", "--config-from", folder)
        done = unshard_with_llama_cpp_gguf_py(*args, "--gguf-type", kind, "--no-progress")
        assert done.returncode == 0, done.stderr
    return folder, tmp_path


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_muse_glimmer_s_mmproj_is_the_converter_s(kind, towers, converter, tmp_path):
    """Every field in order and every tensor's name, type, shape and bytes are the converter's: the tower's q and k
    rows (and biases) turned per head for llama.cpp's rope, the patch embedding over two frames as one convolution of
    their sum, the adapter's two layers and the projection as the projector's three; and from a bfloat16 folder of the
    same model, whose frames the converter sums in float32, in f32, bf16 and f16."""
    folder, files = towers
    assert_same_file(files / f"mmproj-{kind}.gguf", converter(folder, kind, tmp_path / "oracle.gguf", mmproj=True))
    fields, tensors = contents(files / f"mmproj-{kind}.gguf")
    assert fields["clip.projector_type"] == "muse-glimmer" and fields["clip.vision.spatial_merge_size"] == 2
    assert {t[0]: t[2] for t in tensors}["v.patch_embd.weight"] == [4, 4, 3, 32]
    if kind == "f32":
        halves = tmp_path / "bf16"
        unshard.convert(folder, halves, dtype="bfloat16", progress=False)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(folder / name, halves)
        for in_file in ("f32", "bf16", "f16"):
            out = tmp_path / f"halves-{in_file}.gguf"
            done = unshard_with_llama_cpp_gguf_py("convert", halves, out, "--gguf-type", in_file, "--no-progress")
            assert done.returncode == 0, done.stderr
            oracle = converter(halves, in_file, tmp_path / f"oracle-halves-{in_file}.gguf", mmproj=True)
            assert_same_file(out.with_name("mmproj-" + out.name), oracle)


# transformers' image features of an image (image.npy) in the peer venv of torchvision, before the scaleless norm of
# every input embedding (which llama.cpp's text model computes): as transformers computes them (features.npy), and with
# its learned positions resampled as llama.cpp's muse-glimmer resamples them (as-llama-cpp.npy): clamped at the edges
# where transformers pads with zeros, and not transposed (transformers reads them at (w, h), as the reference does)
IMAGE_FEATURES = """
import sys
import numpy as np, torch
import transformers.models.muse_glimmer.modeling_muse_glimmer as muse
from transformers import AutoImageProcessor, AutoModelForImageTextToText
folder, image, out = sys.argv[1:]
model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
model.model.perception_emb_norm = torch.nn.Identity()
pixels = AutoImageProcessor.from_pretrained(folder)(images=[np.load(image)], return_tensors="pt")
def features(name):
    with torch.no_grad():
        found = model.model.get_image_features(pixels["pixel_values"], pixels["image_grid_thw"]).pooler_output
    np.save(f"{out}/{name}.npy", torch.cat(list(found)).numpy())
features("features")
model.model.vision_tower.patch_embedder.interpolation_padding = "border"
indices = muse.get_vision_interpolation_indices_and_weights
muse.get_vision_interpolation_indices_and_weights = lambda grid, *args, **kw: indices(grid[:, [0, 2, 1]], *args, **kw)
features("as-llama-cpp")
"""


@pytest.mark.parametrize("kind, width, height", [("f32", 8, 8), ("f32", 16, 16), ("f32", 40, 24), ("q8_0", 40, 24)])
def test_llama_cpp_sees_muse_glimmer_s_images_as_transformers_does_at_the_grid_s_size(
    kind, width, height, towers, tmp_path
):
    """mtmd encodes an image of the position grid's size (2 x 2 patches) into transformers' image features of the
    same pixels. Of another size (4 x 4 patches, 10 x 6), whose first layer attends within windows of 2 x 2 patches
    and the second globally, into the features transformers computes with the learned positions resampled as
    llama.cpp's muse-glimmer resamples them, which differ from transformers' own, as the file's note says."""
    folder, files = towers
    image, embeddings = image_embeddings(files / f"{kind}.gguf", width, height, tmp_path)
    np.save(tmp_path / "image.npy", image)
    python = generate.peer_python("torchvision")
    done = subprocess.run(
        [python, "-c", IMAGE_FEATURES, folder, tmp_path / "image.npy", tmp_path], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected, as_llama_cpp = (torch.from_numpy(np.load(tmp_path / f"{n}.npy")) for n in ("features", "as-llama-cpp"))
    assert embeddings.shape == expected.shape == (width * height // 64, 64)
    if width == 8:  # (the grid's own size: no resampling)
        assert relative_distance(embeddings, expected) <= IMAGE_TOLERANCE[kind]
    else:
        assert relative_distance(embeddings, as_llama_cpp) <= IMAGE_TOLERANCE[kind]
        assert relative_distance(embeddings, expected) > 2e-2


@pytest.mark.parametrize(
    "change, message",
    [
        ({"layer_types": ["full_attention"] * 2}, "vision tower's layer_types is \\['full_attention', 'full_atte"),
        ({"hidden_act": "gelu_pytorch_tanh"}, "vision tower's hidden_act is gelu_pytorch_tanh, and llama.cpp's mu"),
        ({"pos_emb_width": 3}, "vision tower's pos_emb_width is 3, and llama.cpp's muse-glimmer projector computes 2"),
        ({"rope_parameters": {"rope_theta": 5e4}}, "vision tower's rope_theta is 50000.0, and llama.cpp's muse-glim"),
    ],
)
def test_a_tower_llama_cpp_would_compute_otherwise_is_one_line(change, message, towers, tmp_path):
    """llama.cpp's muse-glimmer projector fixes in code what the tower's config may say otherwise: global attention on
    every fourth layer and the last, windows elsewhere; GELU by erf; a square position grid, each window's side; rope
    at a base of 10000. Another is one line naming config.json, before anything is written (its shapes unchecked)."""
    folder, _ = towers
    changed = tmp_path / "hf"
    shutil.copytree(folder, changed)
    config = json.loads((changed / "config.json").read_text())
    config["vision_config"].update(change)
    (changed / "config.json").write_text(json.dumps(config))
    done = unshard_with_llama_cpp_gguf_py("convert", changed, tmp_path / "m.gguf", "--no-progress", "--no-check")
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "config.json: " in done.stderr and re.search(message, done.stderr), done.stderr
    assert not (tmp_path / "m.gguf").exists()
