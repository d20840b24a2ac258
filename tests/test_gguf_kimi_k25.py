"""Kimi K2.5's MoonViT and projector as llama.cpp's mmproj file (its kimik25 projector), straight from torchtitan's
checkpoint: q's and k's rows of the fused attention paired by axis for llama.cpp's 2-D rope, the projector's layers
renamed. The file is checked against the converter's `--mmproj` file of the same folder under the Hub's config keys
(which the converter reads), and mtmd's embeddings against transformers' image features of the same pixels. Its image
processor is torchvision's alone, whose PyPI build loads only beside CUDA's torch: transformers' image features come
from the peer venv of both (generate.py's "torchvision")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import SHIPPED
from test_gguf import assert_same_file, contents, converter  # noqa: F401  (converter: the fixture, used by name)
from test_gguf_mmproj import (
    IMAGE_TOLERANCE,
    assert_refused,
    image_embeddings,
    relative_distance,
    torchvision_image_features,
)

import unshard

FIXTURE = SHIPPED / "torchtitan-kimik25-fsdp2"


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, Path]:
    """(unshard's folder of the checkpoint, the folder of unshard's files of each type: f32.gguf, q8_0.gguf and their
    mmproj files), with the fixture's config and image processor and a byte-level BPE tokenizer beside."""
    tmp_path = tmp_path_factory.mktemp("kimik25")
    config = tmp_path / "config"
    shutil.copytree(FIXTURE / "hf", config)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SHIPPED / "deepseekv32-fsdp2" / "global_step_1" / "actor" / "huggingface" / name, config / name)
    src = FIXTURE / "checkpoint" / "step-1"
    unshard.convert(src, tmp_path / "hf", config_from=config, progress=False)
    for kind in ("f32", "q8_0"):
        out = tmp_path / f"{kind}.gguf"
        unshard.convert(src, out, config_from=config, output=unshard.OutputOptions(gguf=kind), progress=False)
    return tmp_path / "hf", tmp_path


def as_the_hub_names_it(folder: Path, tmp_path: Path) -> Path:
    """A copy of the folder whose config and image processor say their sizes under the Hub's remote-code keys as
    well, which the converter reads (init_pos_emb_*; in_patch_limit), where transformers' say pos_emb_* and
    max_patches."""
    hub = tmp_path / "hub"
    shutil.copytree(folder, hub)
    config = json.loads((hub / "config.json").read_text())
    vision = config["vision_config"]
    vision.update({f"init_pos_emb_{axis}": vision[f"pos_emb_{axis}"] for axis in ("height", "width", "time")})
    (hub / "config.json").write_text(json.dumps(config))
    processor = json.loads((hub / "preprocessor_config.json").read_text())
    (hub / "preprocessor_config.json").write_text(json.dumps({**processor, "in_patch_limit": processor["max_patches"]}))
    return hub


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_kimi_k2_5_s_mmproj_is_the_converter_s(kind, written, converter, tmp_path):
    """Every field in order and every tensor's name, type, shape and bytes are the converter's: the position grid
    (4 x 4) and the patch budget (256) read from transformers' own keys, the fused attention's q and k rows paired by
    axis."""
    folder, files = written
    mmproj = converter(as_the_hub_names_it(folder, tmp_path), kind, tmp_path / "oracle-mmproj.gguf", mmproj=True)
    assert_same_file(files / f"mmproj-{kind}.gguf", mmproj)
    fields, tensors = contents(files / f"mmproj-{kind}.gguf")
    assert fields["vision.pos_emb_height"] == 4 and fields["clip.vision.image_max_pixels"] == 256 * 4 * 4
    assert "v.blk.2.attn_qkv.weight" in {t[0] for t in tensors} and "mm.2.weight" in {t[0] for t in tensors}


def test_a_config_in_the_hub_s_keys_alone_gives_the_same_file(written, tmp_path):
    """The Hub's remote-code config names the tower's sizes `vt_hidden_size`..., its position grid
    `init_pos_emb_height`..., the projector's epsilon `projector_ln_eps`, and its image processor the patch budget
    `media_proc_cfg.in_patch_limit` (transformers, reading it, fills its own keys beside them with its defaults: 16
    heads, a 64 x 64 grid). Such a folder gives the mmproj file of transformers' config: the same fields and the same
    tensors, its q and k rows paired by axis in the tower's own 2 heads."""
    folder, files = written
    hub = tmp_path / "hub"
    shutil.copytree(folder, hub)
    config = json.loads((hub / "config.json").read_text())
    vision = config["vision_config"]
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        vision["vt_" + key] = vision.pop(key)
    for axis in ("height", "width", "time"):
        vision[f"init_pos_emb_{axis}"] = vision.pop(f"pos_emb_{axis}")
    vision["projector_ln_eps"] = config.pop("projection_layer_norm_eps")
    (hub / "config.json").write_text(json.dumps(config))
    processor = json.loads((hub / "preprocessor_config.json").read_text())
    media = {"in_patch_limit": processor.pop("max_patches"), "patch_size": processor.pop("patch_size")}
    (hub / "preprocessor_config.json").write_text(json.dumps({**processor, "media_proc_cfg": media}))
    unshard.convert(hub, tmp_path / "f32.gguf", output=unshard.OutputOptions(gguf="f32"), progress=False)
    (ours, mine), (theirs, expected) = contents(tmp_path / "mmproj-f32.gguf"), contents(files / "mmproj-f32.gguf")
    assert list(ours.items()) == list(theirs.items()) and mine == expected


@pytest.mark.parametrize("kind, width, height", [("f32", 16, 16), ("f32", 40, 24), ("q8_0", 40, 24)])
def test_llama_cpp_sees_kimi_k2_5_s_images_as_transformers_does(kind, width, height, written, tmp_path):
    """mtmd encodes an image into transformers' image features of the same pixels: one of the position grid's own
    4 x 4 patches (4 tokens), and one of 10 x 6 patches (15 tokens), whose positions both resample bicubically."""
    folder, files = written
    image, embeddings = image_embeddings(files / f"{kind}.gguf", width, height, tmp_path)
    expected = torchvision_image_features(folder, image, tmp_path, "image_grid_thw")
    assert embeddings.shape == expected.shape == (width * height // 64, 64)
    assert relative_distance(embeddings, expected) <= IMAGE_TOLERANCE[kind]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"merge_kernel_size": [2, 3]}, "vision tower's merge_kernel_size is \\[2, 3\\], and llama.cpp's kimik25 "),
        ({"rope_parameters": {"rope_theta": 5e4}}, "vision tower's rope_theta is 50000.0, and llama.cpp's kimik25 "),
        ({"hidden_act": "gelu"}, "vision tower's hidden_act is gelu, and llama.cpp's kimik25 projector computes "),
        ({"num_attention_heads": 16}, "vision tower's width 32 is not 16 heads of a multiple of 4 rows, as MoonViT"),
    ],
)
def test_a_tower_llama_cpp_would_compute_otherwise_is_one_line(change, message, written, tmp_path):
    """llama.cpp's kimik25 fixes in code what MoonViT's config may say otherwise: patches merged as many down as
    across, rope at a base of 10000, GELU by tanh in the tower's MLPs; and heads whose rows its rope pairs by axis.
    Another is one line, before anything is written."""
    folder, _ = written
    assert_refused(folder, tmp_path, change, message, within="vision_config")
