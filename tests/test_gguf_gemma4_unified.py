"""Gemma 4 Unified's towers without layers as llama.cpp's mmproj file (its gemma4uv and gemma4ua projectors, with
llama.cpp's own gguf-py): an image's 12-pixel patches normed, projected and given learned positions by axis, and a
sound's frames of 640 samples projected, each into the text model. The file is checked against the converter's
`--mmproj` file, and mtmd's embeddings against transformers' features of the same pixels and samples. Its image
processor is torchvision's alone, whose PyPI build loads only beside CUDA's torch: transformers' image features come
from the peer venv of both (generate.py's "torchvision")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_gguf import assert_same_file, converter  # noqa: F401  (converter: the fixture, used by name)
from test_gguf_mmproj import (
    AUDIO_TOLERANCE,
    IMAGE_TOLERANCE,
    image_embeddings,
    relative_distance,
    sound_embeddings,
    torchvision_image_features,
)
from test_gguf_newer_architectures import (
    folder_of_the_reference,
    the_text_model_alone_with_pypi_gguf_py,
    unshard_with_llama_cpp_gguf_py,
)

CASE = "gemma4unified-fsdp2"


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(the rank files, unshard's folder of them, the folder of unshard's files of each type: f32.gguf, q8_0.gguf and
    their mmproj files), written with llama.cpp's gguf-py."""
    tmp_path = tmp_path_factory.mktemp("gemma4unified")
    src, folder = folder_of_the_reference(CASE, tmp_path)
    for kind in ("f32", "q8_0"):
        done = unshard_with_llama_cpp_gguf_py("convert", src, tmp_path / f"{kind}.gguf", "--gguf-type", kind)
        assert done.returncode == 0, done.stderr
    return src, folder, tmp_path


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_gemma4_unified_s_mmproj_is_the_converter_s(kind, written, converter, tmp_path):
    """Every field in order and every tensor's name, type, shape and bytes are the converter's (the patch projection's
    columns and first norm in im2col's order of a patch's pixels, the positions as a table per axis); with PyPI's
    gguf-py, the same text model's file and the towers left out, with a note saying how to write them."""
    src, folder, files = written
    mmproj = converter(folder, kind, tmp_path / "oracle-mmproj.gguf", mmproj=True)
    assert_same_file(files / f"mmproj-{kind}.gguf", mmproj)
    if kind == "f32":
        (tmp_path / "f32.gguf").symlink_to(files / "f32.gguf")
        the_text_model_alone_with_pypi_gguf_py(src, tmp_path, "GEMMA4UV")


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_llama_cpp_hears_gemma4_unified_s_sounds_as_transformers_does(kind, written, tmp_path):
    """mtmd cuts a second of sound into 25 frames of 640 samples, as transformers' feature extractor does, and
    projects them into its audio features."""
    from transformers import AutoModelForImageTextToText
    from transformers.models.gemma4_unified.feature_extraction_gemma4_unified import (
        Gemma4UnifiedAudioFeatureExtractor,
    )

    _, folder, files = written
    sound, embeddings = sound_embeddings(files / f"{kind}.gguf", tmp_path)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    frames = Gemma4UnifiedAudioFeatureExtractor()([sound], sampling_rate=16000, return_tensors="pt")
    with torch.no_grad():
        expected = model.model.get_audio_features(frames["input_features"]).pooler_output.reshape(-1, 64)
    assert embeddings.shape == expected.shape == (25, 64)
    assert relative_distance(embeddings, expected) <= AUDIO_TOLERANCE[kind]


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_llama_cpp_sees_gemma4_unified_s_images_as_transformers_does(kind, written, tmp_path):
    """mtmd encodes an image of 120 x 84 pixels (10 x 7 patches of 12: the 70 tokens both make of it, the fewest
    llama.cpp's gemma4uv makes) into transformers' image features of the same pixels."""
    _, folder, files = written
    image, embeddings = image_embeddings(files / f"{kind}.gguf", 120, 84, tmp_path)
    expected = torchvision_image_features(folder, image, tmp_path, "image_position_ids")
    assert embeddings.shape == expected.shape == (70, 64)
    assert relative_distance(embeddings, expected) <= IMAGE_TOLERANCE[kind]
