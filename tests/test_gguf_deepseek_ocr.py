"""DeepSeek-OCR's layout to GGUF, in transformers' two classes of it: Unlimited-OCR
(`UnlimitedOcrForConditionalGeneration`) and DeepSeek-OCR 2 (`DeepseekOcr2ForConditionalGeneration`). The text model
as llama.cpp's deepseek2-ocr; SAM with CLIP (Unlimited-OCR's) or with a Qwen2 encoder (OCR 2's) and the projector as
the mmproj file of its deepseekocr or deepseekocr2 projector. llama.cpp's converter reads the makers' config.json
(DeepSeek-OCR's form), which transformers reads into its own and does not write back: the converter is run on
unshard's folder with that form of its config (as_released), and each of unshard's files, made from transformers'
config, is the converter's; llama.cpp computes transformers' logits from the text model's file, and mtmd
transformers' image features from the mmproj file."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

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
from test_gguf_mmproj import assert_refused, image_embeddings, merged_into, with_config
from test_gguf_newer_architectures import (
    folder_of_the_reference,
    the_text_model_alone_with_pypi_gguf_py,
    unshard_files,
    unshard_with_llama_cpp_gguf_py,
)

UNLIMITED, OCR2 = "unlimitedocr-fsdp2", "deepseekocr2-fsdp2"
# DeepSeek-OCR's language_config, as its makers publish it: DeepSeek-V2's keys of the text model, taken from
# transformers' text_config, and those of latent attention off (no latent ranks, no rotary part of its own), the
# router's softmax named, no rope base (10000) and no head width
LANGUAGE_KEYS = (
    "bos_token_id",
    "eos_token_id",
    "hidden_act",
    "hidden_size",
    "intermediate_size",
    "max_position_embeddings",
    "moe_intermediate_size",
    "n_group",
    "n_routed_experts",
    "n_shared_experts",
    "num_attention_heads",
    "num_experts_per_tok",
    "num_hidden_layers",
    "num_key_value_heads",
    "rms_norm_eps",
    "routed_scaling_factor",
    "topk_group",
    "topk_method",
    "vocab_size",
)
LATENT_OFF = dict(
    use_mla=False, q_lora_rank=None, kv_lora_rank=None, qk_nope_head_dim=0, qk_rope_head_dim=0, v_head_dim=0
)


def as_released(folder: Path, tmp_path: Path, architecture: str, file: str) -> Path:
    """A copy of unshard's folder (whose tensors are already the makers' names: transformers saves them so) for the
    converter to write a file of (`file`: text or mmproj), its config.json in its makers' form, which the converter
    reads: the class `architecture`, the text model's keys in
    language_config (and at the top, as DeepSeek-OCR's has them), its dense first layers counted and its sliding
    window (Unlimited-OCR's) under their name; the towers' sizes in the `width` table, SAM's as `sam_vit_b`, CLIP's as
    `clip-l-14-224`, the Qwen2 encoder's width as `qwen2-0-5b` (its depth, heads and MLP's width beside, which the
    converter takes for DeepSeek-OCR 2's where given: the release's are its defaults); the projector's widths."""
    released = tmp_path / f"released-{file}"
    shutil.copytree(folder, released)
    config = json.loads((folder / "config.json").read_text())
    text, towers = config["text_config"], config["vision_config"]
    sam, second = towers["sam_config"], towers["encoder_config"]
    language = {key: text[key] for key in LANGUAGE_KEYS}
    language.update(LATENT_OFF, scoring_func="softmax", norm_topk_prob=False, tie_word_embeddings=False)
    language.update(first_k_dense_replace=text["mlp_layer_types"].index("sparse"))
    if "sliding_window" in text:
        language["sliding_window_size"] = text["sliding_window"]
    sam_vit_b = dict(width=sam["hidden_size"], layers=sam["num_hidden_layers"], heads=sam["num_attention_heads"])
    sam_vit_b.update(global_attn_indexes=sam["global_attn_indexes"], downsample_channels=sam["downsample_channels"])
    vision = {"image_size": sam["image_size"], "model_type": "vision"}
    if config["model_type"] == "unlimited_ocr":
        clip = dict(width=second["hidden_size"], layers=second["num_hidden_layers"], image_size=second["image_size"])
        clip.update(heads=second["num_attention_heads"], patch_size=second["patch_size"])
        vision["width"] = {"sam_vit_b": sam_vit_b, "clip-l-14-224": clip}
        joined = second["hidden_size"] + sam["downsample_channels"][-1]
    else:
        vision["width"] = {"sam_vit_b": sam_vit_b, "qwen2-0-5b": {"dim": second["hidden_size"]}}
        vision.update(layers=second["num_hidden_layers"], num_attention_heads=second["num_attention_heads"])
        vision["intermediate_size"] = second["intermediate_size"]
        joined = second["hidden_size"]
    makers = {
        "architectures": [architecture],
        "model_type": "deepseek_vl_v2",
        **language,
        "language_config": language,
        "projector_config": {"projector_type": "linear", "input_dim": joined, "n_embed": text["hidden_size"]},
        "vision_config": vision,
        "tile_tag": "2D",
    }
    (released / "config.json").write_text(json.dumps(makers))
    return released


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """unshard's folder of each fixture's rank files, asserted to be its reference model."""
    return {case: folder_of_the_reference(case, tmp_path_factory.mktemp(case))[1] for case in (UNLIMITED, OCR2)}


# Each family: the classes the converter is given for the text model's file and for the mmproj file (the converter
# writes no text model's file of DeepSeek-OCR 2's class: that of DeepSeek-OCR's, whose text model it is), the
# projector, the tiles an image is cut into at most, and images by (width, height) with their tokens
FAMILIES = {
    UNLIMITED: (("UnlimitedOCRForCausalLM",) * 2, "deepseekocr", 32),
    OCR2: (("DeepseekOCRForCausalLM", "DeepseekOCR2ForCausalLM"), "deepseekocr2", 6),
}
# The overview's tokens: SAM's 64 x 64 patches of 1024 pixels, 16 x 16 after its neck (Unlimited-OCR's with a newline
# after each row), the separator between views last. Images by (width, height) and their tokens, mtmd's views cut as
# seen_by_both cuts them: no larger than a tile (640 pixels, OCR 2's 768), the overview alone; two tiles side by side,
# the tiles' tokens first (Unlimited-OCR's 10 x 10 each, their rows side by side with a newline after each; OCR 2's
# 12 x 12 each, one tile after the other). Measured, the overview's rows: 2.6e-5 and 4.1e-5 (Unlimited-OCR), 4.6e-5 and
# 1.9e-5 (OCR 2). The tiles' rows llama.cpp computes otherwise, not asserted: 0.018 apart for OCR 2 on its tiny random
# model, as transformers antialiases SAM's position table when it shrinks it to a tile's patches and llama.cpp does not
# (1.2e-4 without); 0.31 for Unlimited-OCR, whose CLIP's table llama.cpp resizes otherwise still (not found why).
IMAGES = {
    UNLIMITED: (640, {(640, 640): 16 * 17 + 1, (1280, 640): 10 * 21 + 16 * 17 + 1}),
    OCR2: (768, {(768, 768): 16 * 16 + 1, (1536, 768): 2 * 144 + 16 * 16 + 1}),
}
IMAGE_TOLERANCE = 1e-3


@pytest.mark.parametrize("case", [UNLIMITED, OCR2])
def test_the_files_are_the_converter_s_and_compute_as_transformers(
    case, folders, converter, llama_cpp, ggml_library, tmp_path
):
    """From FSDP2's rank files (with llama.cpp's own gguf-py), in f32, f16, bf16 and q8_0: the text model's file is the
    converter's of the makers' config (deepseek2-ocr: each head its own keys and values, no latent's widths, no rope
    base, Unlimited-OCR's sliding window named; the chat template the converter opens the file with, the tokenizer's
    in its place), and so is the mmproj file (SAM's blocks, neck and positions; CLIP's fused q, k and v or the Qwen2
    encoder's layers and queries; the projector, the newline and the separator between views; SAM's sizes, the
    windows, the tiles); the q4_k_m file is llama-quantize's of the converter's f32 file. llama.cpp computes
    transformers' logits over a prompt shorter than Unlimited-OCR's sliding window (llama.cpp attends to every token
    before), and mtmd turns an image no larger than a tile into transformers' image features; of an image of two
    tiles, the overview's rows after the tiles'. With PyPI's gguf-py, which lacks deepseekocr2, OCR 2's text model's
    file alone, with a note."""
    from transformers import AutoModelForImageTextToText

    (text_class, mmproj_class), projector, tiles = FAMILIES[case]
    folder, src = folders[case], SHIPPED / case / "global_step_1"
    pre = for_the_converter(folder)
    unshard_files(src, tmp_path, ("f32", "f16", "bf16", "q8_0", "q4_k_m"), ggml_library)
    for kind in ("f32", "f16", "bf16", "q8_0"):
        released, out = as_released(folder, tmp_path / kind, text_class, "text"), tmp_path / f"oracle-{kind}.gguf"
        assert_same_file(tmp_path / f"{kind}.gguf", converter(released, kind, out, pre=pre))
        released, out = as_released(folder, tmp_path / kind, mmproj_class, "mmproj"), tmp_path / f"oracle-m{kind}.gguf"
        assert_same_file(tmp_path / f"mmproj-{kind}.gguf", converter(released, kind, out, pre=pre, mmproj=True))
    llama_cpp_client("quantize", tmp_path / "oracle-f32.gguf", tmp_path / "llama-quantize.gguf", "q4_k_m")
    assert_same_file(tmp_path / "q4_k_m.gguf", tmp_path / "llama-quantize.gguf")
    text, vision = contents(tmp_path / "f32.gguf")[0], contents(tmp_path / "mmproj-f32.gguf")[0]
    assert text["general.architecture"] == "deepseek2-ocr" and list(text)[1] == "tokenizer.chat_template"
    assert text["deepseek2-ocr.attention.head_count_kv"] == 4 and text["deepseek2-ocr.leading_dense_block_count"] == 1
    assert vision["clip.projector_type"] == projector and vision["clip.vision.preproc_max_tiles"] == tiles
    if case == OCR2:
        the_text_model_alone_with_pypi_gguf_py(src, tmp_path, "DEEPSEEKOCR2")
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    prompt = [1, 5, 20, 33, 64, 70, 90, 2]
    expected = model(input_ids=torch.tensor([prompt])).logits[0].detach()
    for kind in ("f32", "q8_0"):
        logits, _ = llama_cpp(tmp_path / f"{kind}.gguf", prompt, 0)
        assert ((logits - expected).norm() / expected.norm()).item() <= LLAMA_CPP_TOLERANCE[kind], kind
    tile, images = IMAGES[case]
    for (width, height), tokens in images.items():
        embeddings, features = seen_by_both(model, width, height, tile, tmp_path)
        assert embeddings.shape == features.shape == (tokens, 64), (width, height, embeddings.shape, features.shape)
        overview = slice(tokens - (IMAGES[case][1][tile, tile]), tokens)
        seen, expected = embeddings[overview], features[overview]
        assert ((seen - expected).norm() / expected.norm()).item() <= IMAGE_TOLERANCE, (width, height)


def seen_by_both(model, width: int, height: int, tile: int, tmp_path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """mtmd's embeddings of a smooth image (f32.gguf and its mmproj file in tmp_path), and transformers' image features
    of the views mtmd cuts: tiles of `tile` pixels where the image is larger (here its own pixels), and the overview,
    the image fitted into 1024 x 1024 pixels by Pillow's bicubic (mtmd's is Pillow's) and padded with grey, normalised
    as the releases' processors do."""
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width]
    image = np.stack([np.sin(x / 97 + 1), np.cos(y / 83), np.sin(x * y / 50000 + 2)], -1) * 100 + 128
    image, embeddings = image_embeddings(tmp_path / "f32.gguf", width, height, tmp_path, image.astype(np.uint8))
    scale = min(1024 / width, 1024 / height)
    fitted = (round(width * scale), round(height * scale))
    overview = Image.new("RGB", (1024, 1024), (127, 127, 127))
    corner = (round((1024 - fitted[0]) / 2), round((1024 - fitted[1]) / 2))
    overview.paste(Image.fromarray(image).resize(fitted, Image.BICUBIC), corner)
    columns, rows = (width // tile, height // tile) if max(width, height) > tile else (0, 0)
    cut = [image[r * tile : (r + 1) * tile, c * tile : (c + 1) * tile] for r in range(rows) for c in range(columns)]
    local = {}
    if cut:
        local = dict(pixel_values_local=pixels(*cut), num_local_patches=[len(cut)], patches_grid=[[columns, rows]])
    with torch.no_grad():
        features = model.model.get_image_features(pixel_values=pixels(overview), **local)
    return embeddings, features.pooler_output[0]


def pixels(*images) -> torch.Tensor:
    """Images as the releases' processors give them to the model: values in [-1, 1], channels first."""
    arrays = [np.asarray(image, np.float32) / 127.5 - 1 for image in images]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)


@pytest.mark.parametrize(
    "case, change, within, message",
    [
        (UNLIMITED, {"rope_parameters": {"rope_theta": 1e6}}, "text_config", "rope base is 1000000.0, and llama.cpp's"),
        (UNLIMITED, {"num_key_value_heads": 2}, "text_config", "2 key-value heads of 4, and llama.cpp's deepseek2-ocr"),
        (OCR2, {"mlp_layer_types": ["sparse", "dense"]}, "text_config", "dense layers after MoE ones"),
        (UNLIMITED, {"sam_config": {"window_size": 16}}, "vision_config", "sam_config's window_size 16, where llama"),
        (UNLIMITED, {"sam_config": {"global_attn_indexes": [1]}}, "vision_config", "global_attn_indexes \\[1\\]"),
        (UNLIMITED, {"encoder_config": {"layer_norm_eps": 1e-6}}, "vision_config", "encoder_config's layer_norm_eps"),
        (OCR2, {"encoder_config": {"num_key_value_heads": 7}}, "vision_config", "num_key_value_heads 7, where llama"),
        (OCR2, {"encoder_config": {"rope_parameters": {"rope_theta": 1e4}}}, "vision_config", "rope_theta 10000.0"),
        (OCR2, {"encoder_config": {"use_sliding_window": True}}, "vision_config", "use_sliding_window True, where"),
    ],
)
def test_what_llama_cpp_s_deepseek_ocr_computes_otherwise_is_one_line(case, change, within, message, folders, tmp_path):
    """Before anything is written. DeepSeek-OCR 2's towers with llama.cpp's own gguf-py, the one that writes them (with
    PyPI's, which lacks its projector, the text model's file is written alone)."""
    if case == UNLIMITED or within == "text_config":
        return assert_refused(folders[case], tmp_path, change, message, within, check=False)
    changed = with_config(folders[case], tmp_path, merged_into(change, within))
    out = tmp_path / "out.gguf"
    done = unshard_with_llama_cpp_gguf_py("convert", changed, out, "--gguf-type", "f32", "--no-check", "--no-progress")
    said = done.stderr.strip().splitlines()
    assert done.returncode != 0 and re.search(message, said[-1]) and said[-1].startswith("unshard: error:"), said
    assert not out.exists() and not (tmp_path / "mmproj-out.gguf").exists()
