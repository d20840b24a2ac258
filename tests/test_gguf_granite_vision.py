"""Granite 4 Vision (`Granite4VisionForConditionalGeneration`) to GGUF: the text model as llama.cpp's granite with the
projector each layer takes, the SigLIP tower and its Q-Former projectors as the mmproj file of llama.cpp's
granite4_vision projector (which PyPI's gguf-py lacks: written with llama.cpp's own). Each file is the converter's
(given the names it reads), llama.cpp computes transformers' logits, and mtmd turns an image into transformers' image
features, every projector's in each token's row."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SHIPPED
from safetensors.torch import load_file, save_file
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
from test_gguf_mmproj import IMAGE_TOLERANCE, merged_into, with_config
from test_gguf_newer_architectures import (
    folder_of_the_reference,
    the_text_model_alone_with_pypi_gguf_py,
    unshard_commands_with_llama_cpp_gguf_py,
    unshard_files,
    unshard_with_llama_cpp_gguf_py,
)

import unshard

CASE = "granite4vision-fsdp2"
SRC = SHIPPED / CASE / "global_step_1"


def as_released(folder: Path, tmp_path: Path) -> Path:
    """A copy of unshard's folder as the converter reads it: the text model's class named in text_config (Granite's,
    by which the converter writes it with the key of the projector each layer takes: transformers 5 names none, and
    the converter then writes no text model), and SigLIP's pooling head under the name of transformers 4's
    SiglipVisionModel, `vision_tower.vision_model.head`, which the converter leaves out (transformers 5 saves it as
    `vision_tower.head`, which the converter then fails to name)."""
    released = tmp_path / "released"
    shutil.copytree(folder, released)
    config = json.loads((released / "config.json").read_text())
    config["text_config"]["architectures"] = ["GraniteForCausalLM"]
    (released / "config.json").write_text(json.dumps(config))
    tensors = load_file(released / "model.safetensors")
    head = "model.vision_tower.head."
    renamed = {name.replace(head, "model.vision_tower.vision_model.head."): t for name, t in tensors.items()}
    assert len([name for name in renamed if ".vision_model.head." in name]) == 11
    save_file(renamed, released / "model.safetensors", metadata={"format": "pt"})
    return released


def test_granite_4_vision_s_files_as_the_converter_writes_them_and_sees_as_transformers(
    converter, llama_cpp, ggml_library, tmp_path
):
    """From FSDP2's rank files with llama.cpp's own gguf-py, in f32, f16 and q8_0: the text model's file is the
    converter's (Granite's header, then which projector each layer takes: the first projector the input embeddings),
    and so is the mmproj file (the projectors numbered by the text layer they feed, the Q-Former's tensors under
    their number, the tower's layer each reads and the corner each spatial one samples, SigLIP's head left out); the
    text model's q4_k_m file is llama-quantize's of the converter's f32 file. llama.cpp computes transformers' logits
    over text, and mtmd encodes images of one tile, of two and of one whose padding its tokens drop (IMAGES) into
    transformers' features of every projector, each token's in one row in the order of the layers they feed. With
    PyPI's gguf-py, the same text model's file and the towers left out, with a note saying how to write them."""
    from transformers import AutoModelForImageTextToText

    _, folder = folder_of_the_reference(CASE, tmp_path)
    pre = for_the_converter(folder)
    released = as_released(folder, tmp_path)
    done = unshard_files(SRC, tmp_path, ("f32", "f16", "q8_0", "q4_k_m"), ggml_library)
    assert "11 tensors beside the text model left out" in done and "pooling head" in done
    for kind in ("f32", "f16", "q8_0"):
        text = converter(released, kind, tmp_path / f"oracle-{kind}.gguf", pre=pre)
        assert_same_file(tmp_path / f"{kind}.gguf", text)
        mmproj = converter(released, kind, tmp_path / f"oracle-mmproj-{kind}.gguf", pre=pre, mmproj=True)
        assert_same_file(tmp_path / f"mmproj-{kind}.gguf", mmproj)
    llama_cpp_client("quantize", tmp_path / "oracle-f32.gguf", tmp_path / "llama-quantize.gguf", "q4_k_m")
    assert_same_file(tmp_path / "q4_k_m.gguf", tmp_path / "llama-quantize.gguf")
    text, vision = contents(tmp_path / "f32.gguf")[0], contents(tmp_path / "mmproj-f32.gguf")[0]
    # (the projectors by the layer they feed: layerwise 0 (layer 0), spatial 0 (1), layerwise 1 (2), spatial 1-3)
    assert text["granite.deepstack_mapping"] == [-1, 1, 2, 3, 4, 5]
    assert vision["clip.projector_type"] == "granite4_vision"
    assert vision["clip.vision.feature_layer"] == [1, 5, 3, 5, 5, 5]
    assert vision["clip.vision.projector.spatial_offsets"] == [-1, 0, -1, 1, 2, 3]
    the_text_model_alone_with_pypi_gguf_py(SRC, tmp_path, "GRANITE4_VISION")
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    prompt = [1, 5, 20, 33, 64, 70, 90, 2]
    expected = model(input_ids=torch.tensor([prompt])).logits[0].detach()
    logits, _ = llama_cpp(tmp_path / "f32.gguf", prompt, 0)
    assert ((logits - expected).norm() / expected.norm()).item() <= LLAMA_CPP_TOLERANCE["f32"]
    for (height, width), tokens in IMAGES.items():
        assert seen_as_transformers(model, folder, height, width, tokens, tmp_path) <= IMAGE_TOLERANCE["f32"]


# Images and their tokens: the overview's 4 x 4, then the tiles' rows of 4 x 4 each, unpadded, a newline after each
# row. 64 x 64 pixels: the overview and a tile as they are; 64 x 128 (height, width): two tiles side by side, the
# overview resized; 32 x 64: one tile, its rows of padding above and below the image dropped (2 rows of 4 left).
# Measured 3.6e-4 (each projector's 2.7e-4 to 4.3e-4), 3.6e-4, 3.2e-4.
IMAGES = {(64, 64): 16 + 4 * 5, (64, 128): 16 + 4 * 9, (32, 64): 16 + 2 * 5}


def seen_as_transformers(model, folder: Path, height: int, width: int, tokens: int, tmp_path: Path) -> float:
    """mtmd's embeddings of an image of noise (f32.gguf and its mmproj file in tmp_path), asserted to be `tokens`
    rows, against transformers' features of every projector for the same pixels, each token's in one row in the
    order of the text layers they feed: their relative distance."""
    from transformers import AutoImageProcessor

    image = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    image.tofile(tmp_path / "image.rgb")
    pixels = AutoImageProcessor.from_pretrained(folder)(images=[image], return_tensors="pt")
    with torch.no_grad():
        features = model.model.get_image_features(
            pixel_values=pixels["pixel_values"], image_sizes=pixels["image_sizes"]
        ).deepstack_features
    by_layer = sorted(features, key=lambda fed: fed[0])
    expected = torch.cat([torch.cat(list(packed)) for _, packed in by_layer], dim=-1)
    files = (tmp_path / "f32.gguf", tmp_path / "mmproj-f32.gguf")
    llama_cpp_client("image", *files, width, height, tmp_path / "image.rgb", tmp_path / "image.npy")
    embeddings = torch.from_numpy(np.load(tmp_path / "image.npy"))
    assert embeddings.shape == expected.shape == (tokens, 6 * 64), (height, width, embeddings.shape, expected.shape)
    return ((embeddings - expected).norm() / expected.norm()).item()


def test_the_release_s_text_config_gives_the_same_files(tmp_path):
    """IBM's published configs of Granite 4 Vision name the text model `granitemoehybrid` in text_config, which
    transformers reads as its dense Granite 4 Vision text model whatever the name: so does unshard, and both files
    are those of the fixture's own config, field for field and byte for byte."""
    released = with_config(
        SRC / "actor" / "huggingface", tmp_path, merged_into({"model_type": "granitemoehybrid"}, "text_config")
    )
    commands = [
        ("convert", SRC, tmp_path / "own" / "f32.gguf", "--gguf-type", "f32", "--no-progress"),
        (
            "convert",
            SRC,
            tmp_path / "release" / "f32.gguf",
            "--gguf-type",
            "f32",
            "--no-progress",
            "--config-from",
            released,
        ),
    ]
    done = unshard_commands_with_llama_cpp_gguf_py(commands)
    assert done.returncode == 0, done.stderr
    for name in ("f32.gguf", "mmproj-f32.gguf"):
        assert_same_file(tmp_path / "release" / name, tmp_path / "own" / name)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"deepstack_layer_map": [[1, 0], [-3, 2]]}, "takes for layer 1's output where transformers takes layer 0's"),
        ({"deepstack_layer_map": [[-7, 0], [-3, 2]]}, "hidden state -7, its embeddings"),
        ({"spatial_vision_layer": -9}, "hidden state -9, and the tower has 6 layers"),
        ({"spatial_target_layers": [1, 3, 4, -1]}, "transformers feeds none but those from 0 to 5"),
        ({"deepstack_layer_map": [[-3, 0], [-5, 2]]}, "deepstack_layer_map is not in the order of the tower's layers"),
        ({"deepstack_layer_map": [[-5, 1], [-3, 2]]}, "takes the first projector as the input embeddings"),
        ({"spatial_target_layers": [1, 2, 4, 5]}, "and one projector a layer"),
        ({"spatial_target_layers": [1, 3, 4]}, "spatial_target_layers names 3 layers"),
        ({"vision_config": {"num_hidden_layers": 5}}, "6 projectors and a tower of 5 layers"),
    ],
)
def test_a_projector_map_llama_cpp_reads_otherwise_is_one_line(change, message, tmp_path):
    """A map of the projectors llama.cpp would read otherwise than transformers is one line, before anything is
    written, whichever gguf-py is installed (the text model's file says which projector each layer takes): a
    tower's layer counted from its start, layerwise projectors out of the order of the layers they read (the
    converter sorts them), projectors fed from a later layer than the first or to one layer twice, corners other than
    four, more projectors than the tower's layers (the converter names them as its blocks)."""
    folder = with_config(SRC / "actor" / "huggingface", tmp_path, merged_into(change))
    with pytest.raises(unshard.ConfigMismatchError, match=message):
        unshard.convert(SRC, tmp_path / "out.gguf", config_from=folder, output=unshard.OutputOptions(gguf="f32"))
    assert not list(tmp_path.glob("*.gguf"))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"vision_config": {"layer_norm_eps": 1e-5}}, "the vision tower's layer_norm_eps is 1e-05"),
        ({"vision_config": {"hidden_act": "gelu"}}, "the vision tower's hidden_act is gelu"),
        ({"qformer_config": {"num_hidden_layers": 2}}, "Q-Former's num_hidden_layers is 2"),
        ({"qformer_config": {"layer_norm_eps": 1e-6}}, "Q-Former's layer_norm_eps is 1e-06"),
        ({"downsample_rate": None}, "downsample_rate is None, where Granite 4 Vision's projectors take"),
    ],
)
def test_a_tower_llama_cpp_s_granite4_vision_computes_otherwise_is_one_line(change, message, tmp_path):
    """With llama.cpp's gguf-py (which writes the mmproj file), a tower or Q-Former llama.cpp's graph computes
    otherwise is one line naming the setting, and nothing is written: each projector's norm takes the tower's
    epsilon (transformers' is 1e-6), the tower runs GELU's tanh approximation, the Q-Former one layer normed at
    1e-12."""
    folder = with_config(SRC / "actor" / "huggingface", tmp_path, merged_into(change))
    done = unshard_with_llama_cpp_gguf_py("convert", SRC, tmp_path / "out.gguf", "--config-from", folder)
    assert done.returncode != 0 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not list(tmp_path.glob("*.gguf"))
