"""Vision towers as llama.cpp's mmproj files, beside the text model (test_gguf_families.py), where the converter's
own file would not do as it is; each file is checked against the converter's `--mmproj` file, and mtmd encodes an
image through it into transformers' image features of the same pixels.

- Mistral Small 3.1's Pixtral tower and its patch merger (llama.cpp's `pixtral` projector): the converter's file with
  one tensor more, the [IMG_BREAK] token's embedding, which llama.cpp needs and the converter drops (its `--mmproj`
  reads none of a Hugging Face folder's text tensors, so mtmd cannot load its file); mtmd puts that embedding after
  each row of the image's features.
- Gemma 4's vision tower (llama.cpp's `gemma4v`), its linear layers clipped: the converter's file with one key more,
  `clip.use_gelu`, without which llama.cpp runs the tower's MLPs with its default quick GELU where Gemma 4 has GELU
  (tanh); E2B's and E4B's audio tower beside it (`gemma4a`) in the same file, and mtmd hears a sound as transformers.
- Llama 4's vision tower (llama.cpp's `llama4`): the converter's file but each layer's norm before its MLP named
  `ln2`, which the converter names as Gemma 4's norm after attention (gguf-py 0.19 maps that name for both), so that
  llama.cpp would norm the attention's output and leave the MLP's input unnormed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import generate
import numpy as np
import pytest
import torch
from conftest import SHIPPED
from test_gguf import (  # noqa: F401  (converter and llama_cpp: the fixtures, used by name)
    LLAMA_CPP_TOLERANCE,
    assert_same_file,
    contents,
    converter,
    for_the_converter,
    llama_cpp,
    llama_cpp_client,
    with_hub_vision_names,
)
from test_gguf_families import QWEN3_ASR_THINKER

import unshard
from unshard import families

PIXTRAL = SHIPPED / "mistral3-fsdp2" / "global_step_1"
GEMMA4 = SHIPPED / "gemma4vl-fsdp2" / "global_step_1"
GEMMA4_AUDIO = SHIPPED / "gemma4av-fsdp2" / "global_step_1"
LLAMA4 = SHIPPED / "llama4-fsdp2" / "global_step_1"
SMOLVLM = SHIPPED / "smolvlm-fsdp2" / "global_step_1"
QWEN2_AUDIO = SHIPPED / "qwen2audio-fsdp2" / "global_step_1"
VOXTRAL = SHIPPED / "voxtral-fsdp2" / "global_step_1"
AUDIO_FLAMINGO = SHIPPED / "audioflamingo3-fsdp2" / "global_step_1"
QWEN3_ASR = SHIPPED / "qwen3asr-fsdp2" / "global_step_1"
QWEN3_OMNI = SHIPPED / "qwen3omni-fsdp2" / "global_step_1"
GRANITE_SPEECH = SHIPPED / "granitespeech-fsdp2" / "global_step_1"
GRANITE_SPEECH_PLUS = SHIPPED / "granitespeechplus-fsdp2" / "global_step_1"
JANUS = SHIPPED / "janus-fsdp2" / "global_step_1"
HUNYUAN_OCR = SHIPPED / "hunyuanocr-fsdp2" / "global_step_1"
PADDLE_OCR = SHIPPED / "paddleocr-fsdp2-spm" / "global_step_1"
INTERNVL = SHIPPED / "internvl-fsdp2" / "global_step_1"
# InternVL3's text model and InternVL3.5's, by the class the Hub's configs name
INTERNVL_TEXT = {"internvl-fsdp2": "Qwen2ForCausalLM", "internvl35-fsdp2": "Qwen3ForCausalLM"}
LLAVA = SHIPPED / "llava-pixtral-fsdp2" / "global_step_1"
LFM2_VL = SHIPPED / "lfm2vl-fsdp2" / "global_step_1"
LIGHTON_OCR = SHIPPED / "lightonocr-fsdp2" / "global_step_1"
BREAK = "v.token_embd.img_break"
IMAGE_BREAK_ID = 5  # (the fixture's tokenizer: [IMG], [IMG_BREAK], [IMG_END] are 4, 5 and 6)
# mtmd's image embeddings against transformers' image features (relative distance), measured: Pixtral f32 1.6e-4,
# q8_0 5.1e-3; Gemma 4 f32 6.7e-5, q8_0 1.0e-2 (with the converter's file, its quick GELU: 3.9e-3); Llama 4 f32
# 4.9e-4, q8_0 1.6e-2; SmolVLM f32 2.8e-4, q8_0 7.3e-3; Pixtral-12B's layout f32 2.5e-4, q8_0 7.9e-3;
# LFM2-VL f32 4.3e-4, q8_0 1.1e-2
IMAGE_TOLERANCE = {"f32": 1e-3, "q8_0": 3e-2}
# mtmd's sound embeddings against transformers' audio features, measured on Gemma 4's tower: f32 1.5e-3 (of the mel
# spectrograms, which each computes its own way), f16 1.6e-3, bf16 4.1e-3, q8_0 1.7e-2; Qwen2-Audio's f32 1.5e-4, f16
# 2.7e-4, q8_0 9.9e-3; Qwen3-ASR's f32 2.3e-5, q8_0 5.0e-3; Qwen3-Omni's f32 2.8e-5, q8_0 6.0e-3; Granite Speech's f32
# 2.0e-5, q8_0 7.3e-3
AUDIO_TOLERANCE = {"f32": 3e-3, "q8_0": 3e-2}


def image_embeddings(
    gguf: Path, width: int, height: int, tmp_path: Path, image: np.ndarray | None = None
) -> tuple[np.ndarray, torch.Tensor]:
    """A random image's pixels (or `image`'s, height x width x 3 bytes), and its embeddings as mtmd gives them to the
    text model from GGUF and mmproj-GGUF."""
    if image is None:
        image = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    image.tofile(tmp_path / "image.rgb")
    files, out = (gguf, gguf.with_name("mmproj-" + gguf.name)), tmp_path / "image.npy"
    llama_cpp_client("image", *files, width, height, tmp_path / "image.rgb", out)
    return image, torch.from_numpy(np.load(out))


def transformers_image_features(model, folder: Path, image: np.ndarray, *inputs: str) -> torch.Tensor:
    """The image's features as transformers computes them from its own processor's pixels (`inputs`: what else of the
    processor's output the tower takes), every image's tokens in one tensor where it gives them image by image."""
    from transformers import AutoImageProcessor

    pixels = AutoImageProcessor.from_pretrained(folder)(images=[image], return_tensors="pt")
    with torch.no_grad():
        features = model.model.get_image_features(
            pixel_values=pixels["pixel_values"], **{name: pixels[name] for name in inputs}
        ).pooler_output
    return torch.cat(list(features)) if isinstance(features, (list, tuple)) else features


# transformers_image_features in the peer venv of torchvision (generate.py's "torchvision"), for the image processors
# torchvision alone backs, whose PyPI build loads only beside CUDA's torch. argv: the folder, the image (.npy), where
# the features go (.npy), and the processor's other outputs the tower takes
PEER_IMAGE_FEATURES = """
import sys
import numpy as np, torch
from transformers import AutoImageProcessor, AutoModelForImageTextToText
folder, image, out, *inputs = sys.argv[1:]
model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
pixels = AutoImageProcessor.from_pretrained(folder)(images=[np.load(image)], return_tensors="pt")
with torch.no_grad():
    features = model.model.get_image_features(
        pixel_values=pixels["pixel_values"], **{name: pixels[name] for name in inputs}
    ).pooler_output
np.save(out, (torch.cat(list(features)) if isinstance(features, (list, tuple)) else features).numpy())
"""


def torchvision_image_features(folder: Path, image: np.ndarray, tmp_path: Path, *inputs: str) -> torch.Tensor:
    """transformers_image_features, computed in the torchvision peer venv."""
    np.save(tmp_path / "image.npy", image)
    args = [folder, tmp_path / "image.npy", tmp_path / "features.npy", *inputs]
    python = generate.peer_python("torchvision")
    done = subprocess.run([python, "-c", PEER_IMAGE_FEATURES, *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.from_numpy(np.load(tmp_path / "features.npy"))


def relative_distance(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape, (got.shape, expected.shape)
    return ((got - expected).norm() / expected.norm()).item()


def assert_same_tensors(ours: list, theirs: list) -> None:
    """contents()' tensors: the same names, types, shapes and bytes, in the same order."""
    assert [t[:3] for t in ours] == [t[:3] for t in theirs]
    for a, b in zip(ours, theirs):
        assert a[3] == b[3], a[0]


def mmproj_as_the_converter_writes(src: Path, folder: Path, kind: str, converter, tmp_path: Path) -> tuple[Path, tuple]:
    """The fixture's files of `kind` as unshard writes them (read back), its mmproj file the converter's of the folder:
    every field in order and every tensor's name, type, shape and bytes. (OUT, the mmproj file's contents)"""
    out = tmp_path / "m.gguf"
    unshard.convert(src, out, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
    ours = contents(tmp_path / "mmproj-m.gguf")
    theirs = contents(converter(folder, kind, tmp_path / "oracle-mmproj.gguf", mmproj=True))
    assert ours[0] == theirs[0] and list(ours[0]) == list(theirs[0])
    assert_same_tensors(ours[1], theirs[1])
    return out, ours


def unsharded(case: Path, tmp_path_factory) -> Path:
    """The fixture's model as the folder unshard writes (the converter's input, and transformers')."""
    out = tmp_path_factory.mktemp(case.parent.name) / "hf"
    unshard.convert(case, out, progress=False)
    return out


def with_config(folder: Path, tmp_path: Path, change) -> Path:
    """A copy of the folder, its config.json as `change` (a function of it) leaves it."""
    changed = tmp_path / "hf"
    shutil.copytree(folder, changed)
    config = json.loads((changed / "config.json").read_text())
    change(config)
    (changed / "config.json").write_text(json.dumps(config))
    return changed


def merged_into(change: dict, within: str = ""):
    """with_config's change that merges `change` into the config (`within`: one of its sections), a dict in it into
    the config's dict of that key."""

    def changed_config(config: dict) -> None:
        target = config[within] if within else config
        for key, value in change.items():
            target[key] = {**target[key], **value} if isinstance(value, dict) else value

    return changed_config


def assert_refused(folder: Path, tmp_path: Path, change: dict, message: str, within: str = "", check: bool = True):
    """A copy of the folder whose config takes `change` (merged_into): planning its GGUF files is one line matching
    message, before anything is written."""
    changed = with_config(folder, tmp_path, merged_into(change, within))
    with pytest.raises(unshard.ConfigMismatchError, match=message):
        unshard.plan(changed, output=unshard.OutputOptions(gguf="f32"), check=check)


@pytest.fixture(scope="module")
def pixtral_folder(tmp_path_factory):
    return unsharded(PIXTRAL, tmp_path_factory)


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0"])
def test_the_mmproj_is_the_converter_s_with_the_image_break_embedding(kind, pixtral_folder, converter, tmp_path):
    """Every field in order and every tensor's name, type, shape and bytes are the converter's, with one tensor more,
    first: row [IMG_BREAK] of the text model's embedding in F32. Written in the one pass that writes the text model,
    read back by --verify; the text model's file holds the embedding whole."""
    out = tmp_path / "m.gguf"
    unshard.convert(PIXTRAL, out, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
    ours = contents(tmp_path / "mmproj-m.gguf")
    theirs = contents(converter(pixtral_folder, kind, tmp_path / "oracle.gguf", mmproj=True))
    assert ours[0] == theirs[0] and list(ours[0]) == list(theirs[0])
    assert ours[0]["clip.projector_type"] == "pixtral" and ours[0]["clip.vision.spatial_merge_size"] == 2
    (name, tensor_type, shape, data), *rest = ours[1]
    assert_same_tensors(rest, theirs[1])
    from safetensors.torch import load_file

    embedding = load_file(pixtral_folder / "model.safetensors")["language_model.model.embed_tokens.weight"]
    assert (name, tensor_type, shape) == (BREAK, "F32", [embedding.shape[1]])
    assert data == embedding[IMAGE_BREAK_ID].float().numpy().tobytes()
    text = {t[0]: t for t in contents(out)[1]}
    assert BREAK not in text and text["token_embd.weight"][2] == [embedding.shape[1], embedding.shape[0]]


def test_mistral4_s_mmproj_is_mistral3_s(converter, tmp_path_factory, tmp_path):
    """Mistral Small 4's Pixtral tower beside its Mistral 4 text model (which llama.cpp runs as mistral4): the same
    mmproj file as the converter's, but the [IMG_BREAK] embedding first, as for Mistral 3."""
    src = SHIPPED / "mistral4-fsdp2" / "global_step_1"
    folder = unsharded(src, tmp_path_factory)
    unshard.convert(src, tmp_path / "m.gguf", output=unshard.OutputOptions(gguf="f32"), verify=True, progress=False)
    ours = contents(tmp_path / "mmproj-m.gguf")
    theirs = contents(converter(folder, "f32", tmp_path / "oracle.gguf", mmproj=True))
    assert ours[0] == theirs[0] and list(ours[0]) == list(theirs[0]) and ours[1][0][0] == BREAK
    assert_same_tensors(ours[1][1:], theirs[1])
    assert contents(tmp_path / "m.gguf")[0]["general.architecture"] == "mistral4"


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_llama_cpp_reads_images_as_transformers_does(kind, pixtral_folder, tmp_path):
    """mtmd encodes an image of 128 x 64 pixels (a size it keeps: 8 x 4 patches, merged 2 x 2 into 4 x 2 tokens)
    into transformers' image features of the same pixels, the [IMG_BREAK] embedding after the first row of them, as
    Mistral 3's processor puts the token there."""
    from transformers import AutoModelForImageTextToText

    unshard.convert(PIXTRAL, tmp_path / "m.gguf", output=unshard.OutputOptions(gguf=kind), progress=False)
    model = AutoModelForImageTextToText.from_pretrained(pixtral_folder, dtype=torch.float32)
    width, height = 128, 64
    image, embeddings = image_embeddings(tmp_path / "m.gguf", width, height, tmp_path)
    features = transformers_image_features(model, pixtral_folder, image, "image_sizes")
    rows = features.reshape(height // 32, width // 32, -1)
    image_break = model.get_input_embeddings().weight[IMAGE_BREAK_ID].detach()
    expected = torch.cat([torch.cat([rows[0], image_break[None]]), rows[1]])
    assert embeddings.shape == (9, 64)
    assert relative_distance(embeddings, expected) <= IMAGE_TOLERANCE[kind]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"vision_feature_layer": -2}, "vision_feature_layer is -2, and llama.cpp's pixtral projector computes -1"),
        ({"projector_hidden_act": "silu"}, "projector_hidden_act is silu, and llama.cpp's pixtral projector"),
        ({"text_config": {"rms_norm_eps": 1e-6}}, "rms_norm_eps .the patch merger's norm's. is 1e-06"),
        ({"vision_config": {"hidden_act": "relu"}}, "the vision tower's hidden_act is 'relu'"),
        ({"vision_config": {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}}, "rope_theta is 500000"),
        ("no image break", "the tokenizer has no \\[IMG_BREAK\\] token"),
    ],
)
def test_what_llama_cpp_s_pixtral_computes_otherwise_is_one_line(change, message, pixtral_folder, tmp_path):
    """A Mistral 3 whose images llama.cpp's pixtral would make into another model's input, or without the token it
    puts between their rows: one line, before anything is written."""

    def changed_config(config: dict) -> None:
        for key, value in {} if change == "no image break" else change.items():
            config[key] = {**config[key], **value} if isinstance(value, dict) else value

    changed = with_config(pixtral_folder, tmp_path, changed_config)
    if change == "no image break":  # (the token under another name, where the converter looks for it)
        text = (changed / "tokenizer.json").read_text().replace("[IMG_BREAK]", "[IMG_ROW]")
        (changed / "tokenizer.json").write_text(text)
    with pytest.raises(unshard.ConfigMismatchError, match=message):
        unshard.plan(changed, output=unshard.OutputOptions(gguf="f32"))


def test_another_tower_is_one_line():
    """The converter writes Mistral 3's Pixtral tower alone (transformers' Mistral 3 takes another tower's config)."""
    from unshard.families.mistral3 import pixtral_sizes

    with pytest.raises(unshard.ConfigMismatchError, match="'siglip_vision_model'.*Pixtral tower alone"):
        pixtral_sizes({"model_type": "siglip_vision_model"}, "config.json")


@pytest.fixture(scope="module")
def gemma4_folder(tmp_path_factory):
    return unsharded(GEMMA4, tmp_path_factory)


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0"])
def test_gemma4_s_mmproj_is_the_converter_s_with_its_gelu_named(kind, gemma4_folder, converter, tmp_path):
    """Every tensor's name, type, shape and bytes are the converter's (the patch embedding as a 2-D convolution, the
    clipped linear layers' bounds as vectors of one), every field in order too, with one more after the tower's norm
    epsilon: clip.use_gelu, which makes llama.cpp's gemma4v run GELU (tanh) as Gemma 4 does."""
    out = tmp_path / "m.gguf"
    unshard.convert(GEMMA4, out, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
    ours = contents(tmp_path / "mmproj-m.gguf")
    theirs = contents(converter(gemma4_folder, kind, tmp_path / "oracle.gguf", mmproj=True))
    keys = list(theirs[0])
    at = keys.index("clip.vision.attention.layer_norm_epsilon") + 1
    assert list(ours[0]) == [*keys[:at], "clip.use_gelu", *keys[at:]] and ours[0]["clip.use_gelu"] is True
    assert {k: v for k, v in ours[0].items() if k != "clip.use_gelu"} == theirs[0]
    assert theirs[0]["clip.vision.projector_type"] == "gemma4v"
    assert_same_tensors(ours[1], theirs[1])
    assert any(t[0] == "v.blk.0.attn_q.input_max" for t in ours[1])


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_llama_cpp_reads_gemma4_images_as_transformers_does(kind, gemma4_folder, tmp_path):
    """mtmd encodes an image of 480 x 336 pixels (a size both keep: 30 x 21 patches, pooled 3 x 3 into 70 tokens, the
    fewest llama.cpp's gemma4v makes) into transformers' image features of the same pixels."""
    from transformers import AutoModelForImageTextToText

    unshard.convert(GEMMA4, tmp_path / "m.gguf", output=unshard.OutputOptions(gguf=kind), progress=False)
    model = AutoModelForImageTextToText.from_pretrained(gemma4_folder, dtype=torch.float32)
    image, embeddings = image_embeddings(tmp_path / "m.gguf", 480, 336, tmp_path)
    expected = transformers_image_features(model, gemma4_folder, image, "image_position_ids").reshape(-1, 64)
    assert embeddings.shape == (70, 64)
    assert relative_distance(embeddings, expected) <= IMAGE_TOLERANCE[kind]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"pooling_kernel_size": 2}, "pooling_kernel_size is 2, and llama.cpp's gemma4v computes 3"),
        ({"rope_parameters": {"rope_type": "axial", "rope_theta": 1e4}}, "rope_theta is 10000.0, and llama.cpp's"),
        ({"rms_norm_eps": 1e-5}, "rms_norm_eps is 1e-05, and llama.cpp's gemma4v computes 1e-06"),
        (
            {"hidden_activation": "silu"},
            "hidden_activation is silu, and llama.cpp's gemma4v computes gelu_pytorch_tanh",
        ),
    ],
)
def test_what_llama_cpp_s_gemma4v_computes_otherwise_is_one_line(change, message, gemma4_folder, tmp_path):
    assert_refused(gemma4_folder, tmp_path, change, message, within="vision_config")


@pytest.fixture(scope="module")
def gemma4av_folder(tmp_path_factory):
    return unsharded(GEMMA4_AUDIO, tmp_path_factory)


def sound_embeddings(gguf: Path, tmp_path: Path, seconds: int = 1) -> tuple[np.ndarray, torch.Tensor]:
    """A sound at 16 kHz (a tone and noise), and its embeddings as mtmd gives them to the text model."""
    rng, samples = np.random.default_rng(0), 16000 * seconds
    sound = 0.3 * np.sin(2 * np.pi * 440 * np.arange(samples) / 16000) + 0.05 * rng.standard_normal(samples)
    sound.astype(np.float32).tofile(tmp_path / "sound.f32")
    files, out = (gguf, gguf.with_name("mmproj-" + gguf.name)), tmp_path / "sound.npy"
    llama_cpp_client("audio", *files, tmp_path / "sound.f32", out)
    return sound.astype(np.float32), torch.from_numpy(np.load(out))


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0"])
def test_gemma4_s_mmproj_with_its_audio_tower_is_the_converter_s(kind, gemma4av_folder, converter, tmp_path):
    """E2B's and E4B's towers, vision and audio, in one file as the converter writes them: every tensor's name, type,
    shape and bytes (the audio attention's per-dimension scales as softplus of them, the convolutions' kernels in F32,
    the depthwise ones 2-D), every field in order, with clip.use_gelu after the vision tower's epsilon as above."""
    out = tmp_path / "m.gguf"
    unshard.convert(GEMMA4_AUDIO, out, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
    ours = contents(tmp_path / "mmproj-m.gguf")
    theirs = contents(converter(gemma4av_folder, kind, tmp_path / "oracle.gguf", mmproj=True))
    keys = list(theirs[0])
    at = keys.index("clip.vision.attention.layer_norm_epsilon") + 1
    assert list(ours[0]) == [*keys[:at], "clip.use_gelu", *keys[at:]]
    assert {k: v for k, v in ours[0].items() if k != "clip.use_gelu"} == theirs[0]
    assert theirs[0]["clip.audio.projector_type"] == "gemma4a" and theirs[0]["clip.has_audio_encoder"] is True
    assert_same_tensors(ours[1], theirs[1])
    named = {t[0]: t for t in ours[1]}
    assert named["a.blk.0.per_dim_scale.weight"][1] == "F32" and named["a.blk.0.conv_dw.weight"][2] == [5, 32]
    assert not any(t[0].startswith(("v.", "a.", "mm.")) for t in contents(out)[1])
    plan = unshard.plan(GEMMA4_AUDIO, output=unshard.OutputOptions(gguf=kind))
    assert plan.summary()["gguf"]["mmproj"]["towers"] == ["vision", "audio"]


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_llama_cpp_hears_gemma4_s_sounds_as_transformers_does(kind, gemma4av_folder, tmp_path):
    """mtmd makes a second of sound (100 mel frames, subsampled 4 times) into transformers' audio features of the same
    samples, by Gemma 4's feature extractor (its settings, which mtmd's gemma4a fixes in code); and an image through
    the same file into its image features, as for the tower alone."""
    from transformers import AutoModelForImageTextToText
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

    unshard.convert(GEMMA4_AUDIO, tmp_path / "m.gguf", output=unshard.OutputOptions(gguf=kind), progress=False)
    model = AutoModelForImageTextToText.from_pretrained(gemma4av_folder, dtype=torch.float32)
    sound, embeddings = sound_embeddings(tmp_path / "m.gguf", tmp_path)
    features = Gemma4AudioFeatureExtractor()([sound], sampling_rate=16000, return_tensors="pt")
    with torch.no_grad():
        heard = model.model.get_audio_features(features["input_features"], features["input_features_mask"])
    expected = heard.pooler_output.reshape(-1, 64)
    assert embeddings.shape == expected.shape == (25, 64)
    assert relative_distance(embeddings, expected) <= AUDIO_TOLERANCE[kind]
    image, seen = image_embeddings(tmp_path / "m.gguf", 480, 336, tmp_path)
    expected = transformers_image_features(model, gemma4av_folder, image, "image_position_ids")
    assert relative_distance(seen, expected) <= IMAGE_TOLERANCE[kind]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"attention_chunk_size": 8}, "the audio tower's attention_chunk_size is 8, and llama.cpp's gemma4a"),
        ({"attention_context_left": 9}, "the audio tower's attention_context_left is 9, and llama.cpp's gemma4a"),
        ({"hidden_act": "gelu"}, "the audio tower's hidden_act is gelu, and llama.cpp's gemma4a computes silu"),
    ],
)
def test_what_llama_cpp_s_gemma4a_computes_otherwise_is_one_line(change, message, gemma4av_folder, tmp_path):
    assert_refused(gemma4av_folder, tmp_path, change, message, within="audio_config")


@pytest.fixture(scope="module")
def llama4_folder(tmp_path_factory):
    return unsharded(LLAMA4, tmp_path_factory)


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0"])
def test_llama4_s_mmproj_is_the_converter_s(kind, llama4_folder, converter, tmp_path):
    """Every field in order and every tensor's name, type, shape and bytes are the converter's (the patches' linear
    embedding, the class token and the position embedding, the pixel shuffle's MLP and the projector's one linear
    layer, mm.model.fc), but one name: each layer's norm before its MLP is `ln2`, where llama.cpp's llama4 graph
    reads it, not Gemma 4's `attn_post_norm`, as gguf-py 0.19 maps the name for both."""
    out = tmp_path / "m.gguf"
    unshard.convert(LLAMA4, out, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
    ours = contents(tmp_path / "mmproj-m.gguf")
    theirs = contents(converter(llama4_folder, kind, tmp_path / "oracle.gguf", mmproj=True))
    assert ours[0] == theirs[0] and list(ours[0]) == list(theirs[0])
    assert ours[0]["clip.projector_type"] == "llama4" and ours[0]["clip.vision.projector.scale_factor"] == 2
    ln2 = [(n.replace(".attn_post_norm.", ".ln2."), *rest) for n, *rest in theirs[1]]
    assert_same_tensors(ours[1], ln2)
    named = {t[0] for t in ours[1]}
    assert {"mm.model.fc.weight", "v.class_embd", "mm.model.mlp.2.weight", "v.blk.2.ln2.bias"} <= named
    notes = unshard.plan(LLAMA4, output=unshard.OutputOptions(gguf=kind)).notes
    assert any("gives an image's tokens column by column" in note for note in notes)
    assert not any(t[0].startswith(("v.", "mm.")) for t in contents(out)[1])


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_llama_cpp_reads_llama4_images_as_transformers_does(kind, llama4_folder, tmp_path):
    """mtmd encodes an image of one tile (56 x 56 pixels: 4 x 4 patches, shuffled 2 x 2 into 4 tokens) into
    transformers' image features of the same pixels, projected to the text model's width, but column by column:
    llama.cpp's pixel shuffle leaves out transformers' last transpose, in its graph, whatever the file (mtmd warns
    that Llama 4's vision is degraded). The pixels are made as Llama 4's image processor makes one tile (which needs
    torchvision, whose PyPI build is CUDA's): scaled to [0, 1], normalised by the folder's mean and std. With the
    converter's file (each layer's MLP unnormed), the distance is 1.5."""
    from transformers import AutoModelForImageTextToText

    unshard.convert(LLAMA4, tmp_path / "m.gguf", output=unshard.OutputOptions(gguf=kind), progress=False)
    model = AutoModelForImageTextToText.from_pretrained(llama4_folder, dtype=torch.float32)
    image, embeddings = image_embeddings(tmp_path / "m.gguf", 56, 56, tmp_path)
    processor = json.loads((llama4_folder / "preprocessor_config.json").read_text())
    mean, std = (torch.tensor(processor[key])[:, None, None] for key in ("image_mean", "image_std"))
    pixels = ((torch.from_numpy(image).permute(2, 0, 1).float() / 255 - mean) / std)[None]
    with torch.no_grad():
        features = model.get_image_features(pixel_values=pixels).last_hidden_state
        rows = model.multi_modal_projector(features).reshape(2, 2, -1)
    expected = rows.transpose(0, 1).reshape(4, -1)
    assert embeddings.shape == (4, 64)
    assert relative_distance(embeddings, expected) <= IMAGE_TOLERANCE[kind]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}, "rope_theta is 500000.0, and llama.cpp's"),
        ({"pixel_shuffle_ratio": 0.4}, "pixel_shuffle_ratio is 0.4, and llama.cpp's llama4 projector merges n x n"),
    ],
)
def test_what_llama_cpp_s_llama4_projector_computes_otherwise_is_one_line(change, message, llama4_folder, tmp_path):
    assert_refused(llama4_folder, tmp_path, change, message, within="vision_config")


@pytest.fixture(scope="module")
def smolvlm_folder(tmp_path_factory):
    return unsharded(SMOLVLM, tmp_path_factory)


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0"])
def test_smolvlm_s_mmproj_is_the_converter_s(kind, smolvlm_folder, converter, tmp_path):
    """Every field in order and every tensor's name, type, shape and bytes are the converter's: the SigLIP tower (its
    embeddings in F32 whatever the type), the connector's linear layer, the shuffle's n and the image processor's
    longest edge in the header."""
    out, ours = mmproj_as_the_converter_writes(SMOLVLM, smolvlm_folder, kind, converter, tmp_path)
    assert ours[0]["clip.projector_type"] == "idefics3" and ours[0]["clip.vision.projector.scale_factor"] == 2
    assert ours[0]["clip.vision.preproc_image_size"] == 64
    assert not any(t[0].startswith(("v.", "mm.")) for t in contents(out)[1])


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_llama_cpp_reads_smolvlm_images_as_transformers_does(kind, smolvlm_folder, tmp_path):
    """mtmd encodes an image of one tile (64 x 64 pixels: 4 x 4 patches, shuffled 2 x 2 into 4 tokens) as the image's
    overview and its one tile, each transformers' image features of the same pixels (SmolVLM's image processor, which
    makes the one image of them)."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    unshard.convert(SMOLVLM, tmp_path / "m.gguf", output=unshard.OutputOptions(gguf=kind), progress=False)
    model = AutoModelForImageTextToText.from_pretrained(smolvlm_folder, dtype=torch.float32)
    image, embeddings = image_embeddings(tmp_path / "m.gguf", 64, 64, tmp_path)
    pixels = AutoImageProcessor.from_pretrained(smolvlm_folder)(images=[image], return_tensors="pt")
    with torch.no_grad():
        features = model.model.get_image_features(
            pixel_values=pixels["pixel_values"], pixel_attention_mask=pixels["pixel_attention_mask"]
        )
    expected = torch.cat(list(features.pooler_output))
    assert embeddings.shape == (8, 64) and expected.shape == (4, 64)
    for tile in (embeddings[:4], embeddings[4:]):
        assert relative_distance(tile, expected) <= IMAGE_TOLERANCE[kind]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"vision_config": {"hidden_act": "silu"}}, "the vision tower's hidden_act is 'silu', and llama.cpp's"),
        ({"text_config": {"model_type": "mistral"}}, "text_config's model_type is 'mistral', and unshard writes"),
    ],
)
def test_what_llama_cpp_s_idefics3_computes_otherwise_is_one_line(change, message, smolvlm_folder, tmp_path):
    assert_refused(smolvlm_folder, tmp_path, change, message)


@pytest.fixture(scope="module")
def qwen2audio_folder(tmp_path_factory):
    return unsharded(QWEN2_AUDIO, tmp_path_factory)


@pytest.fixture(scope="module")
def flamingo_folder(tmp_path_factory):
    return unsharded(AUDIO_FLAMINGO, tmp_path_factory)


# Whisper's encoder beside a text model: (source, its folder's fixture, llama.cpp's projector, the convolutions'
# kernels' type, a projector's tensor)
WHISPER_ENCODERS = {
    "qwen2-audio": (QWEN2_AUDIO, "qwen2audio_folder", "qwen2a", "F16", "mm.a.fc.weight"),
    "audio-flamingo-3": (AUDIO_FLAMINGO, "flamingo_folder", "musicflamingo", "F32", "mm.a.mlp.2.bias"),
}


@pytest.mark.parametrize("model", WHISPER_ENCODERS)
@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0"])
def test_a_whisper_encoder_s_mmproj_is_the_converter_s(kind, model, converter, request, tmp_path):
    """An audio tower alone (no vision keys): every field in order and every tensor's name, type, shape and bytes are
    the converter's, Whisper's convolutions' kernels in the type it forces whatever the file's (Qwen2-Audio's F16,
    Audio Flamingo 3's F32) and their biases as columns, the projector under `mm.a.`."""
    source, folder, projector, conv_type, projection = WHISPER_ENCODERS[model]
    out, ours = mmproj_as_the_converter_writes(source, request.getfixturevalue(folder), kind, converter, tmp_path)
    assert ours[0]["clip.projector_type"] == projector and "clip.has_vision_encoder" not in ours[0]
    plan = unshard.plan(source, output=unshard.OutputOptions(gguf=kind))
    assert plan.summary()["gguf"]["mmproj"]["towers"] == ["audio"]
    named = {t[0]: t for t in ours[1]}
    assert named["a.conv1d.1.weight"][1] == conv_type and named["a.conv1d.1.bias"][2] == [1, 32]
    assert projection in named
    assert not any(t[0].startswith(("a.", "mm.")) for t in contents(out)[1])


@pytest.mark.parametrize("model", WHISPER_ENCODERS)
@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_llama_cpp_hears_a_sound_as_transformers_does(kind, model, request, tmp_path):
    """mtmd cuts a sound into Whisper's chunks of 30 seconds (the 3,000 mel frames of 30 seconds and one more: two
    chunks here) and makes the first into transformers' audio features of the same samples (the model's feature
    extractor, the encoder over the chunk unmasked, 750 tokens after its pooling), projected to the text's width."""
    from transformers import AutoFeatureExtractor, AutoModelForMultimodalLM, AutoModelForSeq2SeqLM

    source, folder, *_ = WHISPER_ENCODERS[model]
    folder = request.getfixturevalue(folder)
    unshard.convert(source, tmp_path / "m.gguf", output=unshard.OutputOptions(gguf=kind), progress=False)
    flamingo = model == "audio-flamingo-3"  # (its encoder asks for the frames' mask; Qwen2-Audio's takes none)
    auto = AutoModelForSeq2SeqLM if flamingo else AutoModelForMultimodalLM
    model = auto.from_pretrained(folder, dtype=torch.float32)
    sound, embeddings = sound_embeddings(tmp_path / "m.gguf", tmp_path, seconds=30)
    extract = AutoFeatureExtractor.from_pretrained(folder)
    features = extract(sound, sampling_rate=16000, return_attention_mask=True, return_tensors="pt")
    assert bool(features["attention_mask"].all())
    mask = {"input_features_mask": features["attention_mask"]} if flamingo else {}
    with torch.no_grad():
        heard = model.model.audio_tower(features["input_features"], **mask).last_hidden_state
        expected = model.model.multi_modal_projector(heard)[0]
    assert embeddings.shape == (1500, 64) and expected.shape == (750, 64)
    assert relative_distance(embeddings[:750], expected) <= AUDIO_TOLERANCE[kind]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"activation_function": "relu"}, "the audio tower's activation_function is relu, and llama.cpp's whisper"),
        ({"scale_embedding": True}, "the audio tower's scale_embedding is True, and llama.cpp's whisper encoder"),
    ],
)
def test_what_llama_cpp_s_whisper_encoder_computes_otherwise_is_one_line(change, message, qwen2audio_folder, tmp_path):
    assert_refused(qwen2audio_folder, tmp_path, change, message, within="audio_config")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"projector_hidden_act": "silu"}, "the audio tower's projector_hidden_act is silu, and llama.cpp's music"),
        ({"audio_config": {"scale_embedding": True}}, "the audio tower's scale_embedding is True, and llama.cpp's"),
    ],
)
def test_what_llama_cpp_s_musicflamingo_computes_otherwise_is_one_line(change, message, flamingo_folder, tmp_path):
    assert_refused(flamingo_folder, tmp_path, change, message)


def test_a_flamingo_projector_without_biases_is_one_line(flamingo_folder):
    """(A projector without biases has other tensors than the fixture's checkpoint: its config is asked alone.)"""
    config = json.loads((flamingo_folder / "config.json").read_text())
    with pytest.raises(unshard.ConfigMismatchError, match="projector_bias is False, and llama.cpp's musicflamingo"):
        families.audio.flamingo_projector_checked({**config, "projector_bias": False}, flamingo_folder)


@pytest.fixture(scope="module")
def qwen3asr_folder(tmp_path_factory):
    return unsharded(QWEN3_ASR, tmp_path_factory)


def as_qwen_releases_qwen3_asr(folder: Path, out: Path) -> Path:
    """A copy of Qwen3-ASR's folder in the layout of Qwen's release, which the converter reads (it cannot read
    transformers 5's): the configs within thinker_config, the names under `thinker.`, the projector within the
    encoder (proj1, proj2)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, out)
    config = json.loads((folder / "config.json").read_text())
    config["thinker_config"] = {key: config.pop(key) for key in QWEN3_ASR_THINKER}
    (out / "config.json").write_text(json.dumps(config))
    renames = {
        "model.multi_modal_projector.linear_": "thinker.audio_tower.proj",
        "model.audio_tower.": "thinker.audio_tower.",
        "model.language_model.": "thinker.model.",
        "lm_head.": "thinker.lm_head.",
    }

    def renamed(name: str) -> str:
        ours = next(ours for ours in [*renames, ""] if name.startswith(ours))
        return renames[ours] + name.removeprefix(ours) if ours else name

    tensors = load_file(folder / "model.safetensors")
    save_file({renamed(k): v for k, v in tensors.items()}, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0"])
def test_qwen3_asr_s_files_are_the_converter_s_of_qwen_s_layout(kind, qwen3asr_folder, converter, tmp_path):
    """Both files of transformers 5's Qwen3-ASR are the converter's of the same weights in Qwen's layout, every field
    in order and every tensor's name, type, shape and bytes: the text model as llama.cpp's qwen3vl with ChatML and
    `<|im_end|>` as its start and end (the tokenizer's added tokens listed in tokenizer_config.json, as on the Hub);
    the encoder as qwen3a, its convolutions' kernels in F16 whatever the file's type, their biases [channels, 1, 1],
    the projector under `mm.a.mlp.`, and the positions the converter computes (1500 of them, first)."""
    folder = tmp_path / "hf"
    shutil.copytree(qwen3asr_folder, folder)
    pre = for_the_converter(folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    listed = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in tokenizer["added_tokens"]}
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "added_tokens_decoder": listed}))
    out = tmp_path / "m.gguf"
    unshard.convert(folder, out, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
    release = as_qwen_releases_qwen3_asr(folder, tmp_path / "release")
    theirs = converter(release, kind, tmp_path / "oracle.gguf", pre=pre)
    assert_same_file(out, theirs)
    ours = contents(tmp_path / "mmproj-m.gguf")
    assert_same_file(tmp_path / "mmproj-m.gguf", converter(release, kind, tmp_path / "o-mmproj.gguf", mmproj=True))
    fields = contents(out)[0]
    end = fields["tokenizer.ggml.tokens"].index("<|im_end|>")
    assert fields["tokenizer.ggml.bos_token_id"] == fields["tokenizer.ggml.eos_token_id"] == end
    assert fields["tokenizer.chat_template"] == families.audio.CHATML
    named = {t[0]: t for t in ours[1]}
    assert ours[0]["clip.audio.projector_type"] == "qwen3a" and "clip.projector_type" not in ours[0]
    assert ours[1][0][0] == "a.position_embd.weight" and named["a.position_embd.weight"][1:3] == ("F32", [32, 1500])
    assert named["a.conv2d.1.weight"][1] == "F16" and named["a.conv2d.1.bias"][2] == [1, 1, 8]
    assert "mm.a.mlp.2.weight" in named


def qwen3_asr_sound(seconds: float) -> np.ndarray:
    """A tone and noise at 16 kHz, of as many samples as make whole chunks of 100 mel frames for both: mtmd's frames
    (one a hop, and one more) and Qwen3-ASR's feature extractor's (Whisper's, its last frame dropped) are then the
    same."""
    rng, samples = np.random.default_rng(0), int(16000 * seconds) - 160
    return (0.3 * np.sin(2 * np.pi * 440 * np.arange(samples) / 16000) + 0.05 * rng.standard_normal(samples)).astype(
        np.float32
    )


def qwen3_asr_heard(model, features) -> torch.Tensor:
    return model.get_audio_features(features["input_features"], features["attention_mask"]).pooler_output


def qwen3_omni_heard(model, features) -> torch.Tensor:
    """(The thinker's encoder, its projector within: its last hidden state.)"""
    return model.thinker.get_audio_features(features["input_features"], features["attention_mask"]).last_hidden_state


# Qwen3-ASR's audio encoder, alone and as Qwen3-Omni's thinker's: (source, its folder's fixture, its features)
QWEN3_AUDIO = {
    "qwen3-asr": (QWEN3_ASR, "qwen3asr_folder", qwen3_asr_heard),
    "qwen3-omni": (QWEN3_OMNI, "omni_folder", qwen3_omni_heard),
}


@pytest.mark.parametrize("model", QWEN3_AUDIO)
@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_llama_cpp_hears_a_sound_as_qwen3_asr_does(kind, model, request, tmp_path):
    """mtmd cuts 12 seconds into windows of 800 frames (8 s) and each into chunks of 100 frames, 13 tokens a chunk:
    the audio features in transformers of the same samples (Qwen3-ASR's feature extractor, the encoder attending
    within each window), projected to the text's width."""
    from transformers import AutoModelForMultimodalLM, Qwen3ASRFeatureExtractor

    source, folder, heard = QWEN3_AUDIO[model]
    unshard.convert(source, tmp_path / "m.gguf", output=unshard.OutputOptions(gguf=kind), progress=False)
    sound = qwen3_asr_sound(12)
    sound.tofile(tmp_path / "sound.f32")
    files, out = (tmp_path / "m.gguf", tmp_path / "mmproj-m.gguf"), tmp_path / "sound.npy"
    llama_cpp_client("audio", *files, tmp_path / "sound.f32", out)
    embeddings = torch.from_numpy(np.load(out))
    model = AutoModelForMultimodalLM.from_pretrained(request.getfixturevalue(folder), dtype=torch.float32)
    features = Qwen3ASRFeatureExtractor()(sound, sampling_rate=16000, return_attention_mask=True, return_tensors="pt")
    with torch.no_grad():
        expected = heard(model, features)
    assert embeddings.shape == expected.shape == (12 * 13, 64)  # (12 chunks of 13 tokens)
    assert relative_distance(embeddings, expected) <= AUDIO_TOLERANCE[kind]


@pytest.fixture(scope="module")
def omni_folder(tmp_path_factory):
    return unsharded(QWEN3_OMNI, tmp_path_factory)


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0"])
def test_qwen3_omni_s_audio_encoder_is_the_converter_s_qwen3_asr_file(kind, omni_folder, converter, tmp_path):
    """Qwen3-Omni's thinker hears through Qwen3-ASR's encoder: its mmproj file is the one the converter writes of
    Qwen3-ASR in Qwen's layout with the same encoder (the converter's own Qwen3-Omni file holds the vision tower too,
    which mtmd does not load beside the audio encoder); the text model's file holds no tower, and the dry run says
    what is left out and why."""
    out = tmp_path / "m.gguf"
    unshard.convert(QWEN3_OMNI, out, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
    release = tmp_path / "asr"
    shutil.copytree(omni_folder, release)
    pre = for_the_converter(release)
    config = json.loads((release / "config.json").read_text())
    thinker = {key: config["thinker_config"][key] for key in ("audio_config", "text_config")}
    asr = {"architectures": ["Qwen3ASRForConditionalGeneration"], "model_type": "qwen3_asr", "thinker_config": thinker}
    (release / "config.json").write_text(json.dumps(asr))
    from safetensors.torch import load_file, save_file

    tensors = load_file(release / "model.safetensors")  # (the encoder's: its Qwen3-ASR class takes no vision tower)
    encoder = {name: t for name, t in tensors.items() if name.startswith("thinker.audio_tower.")}
    save_file(encoder, release / "model.safetensors", metadata={"format": "pt"})
    theirs = converter(release, kind, tmp_path / "o-mmproj.gguf", pre=pre, mmproj=True)
    assert_same_file(tmp_path / "mmproj-m.gguf", theirs)
    assert not any(t[0].startswith(("v.", "a.", "mm.")) for t in contents(out)[1])
    plan = unshard.plan(QWEN3_OMNI, output=unshard.OutputOptions(gguf=kind))
    assert plan.summary()["gguf"]["mmproj"]["towers"] == ["audio"]
    assert any("no mmproj file of them (the vision tower's, whose deepstack features" in n for n in plan.notes)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"n_window": 25}, "the audio tower's n_window is 25, and llama.cpp's qwen3a encoder computes 50"),
        ({"n_window_infer": 400}, "the audio tower's n_window_infer is 400, and llama.cpp's qwen3a encoder"),
        ({"activation_function": "relu"}, "the audio tower's activation_function is relu, and llama.cpp's whisper"),
    ],
)
def test_what_llama_cpp_s_qwen3a_computes_otherwise_is_one_line(change, message, qwen3asr_folder, tmp_path):
    assert_refused(qwen3asr_folder, tmp_path, change, message, within="audio_config")


@pytest.fixture(scope="module")
def granite_speech_folder(tmp_path_factory):
    return unsharded(GRANITE_SPEECH, tmp_path_factory)


@pytest.fixture(scope="module")
def granite_speech_plus_folder(tmp_path_factory):
    return unsharded(GRANITE_SPEECH_PLUS, tmp_path_factory)


# Granite Speech, and Granite Speech Plus (its projector reading the encoder's first layer beside its last): (source,
# its folder's fixture)
GRANITE_SPEECHES = {
    "granite-speech": (GRANITE_SPEECH, "granite_speech_folder"),
    "granite-speech-plus": (GRANITE_SPEECH_PLUS, "granite_speech_plus_folder"),
}


# The converter's name of each folded batch norm (its gguf-py's), which llama.cpp's granite_speech does not load: it
# reads conv_norm, the name gguf-py 0.19 gives
CONV_NORM = ("conv_norm_var.", "conv_norm.")


@pytest.mark.parametrize("model", GRANITE_SPEECHES)
@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0"])
def test_granite_speech_s_mmproj_is_the_converter_s_under_the_names_llama_cpp_loads(
    kind, model, converter, request, tmp_path
):
    """Granite Speech's encoder and Q-Former: every field in order and every tensor's type, shape and bytes are the
    converter's (each batch norm folded from its running statistics into a scale and a shift, keys and values apart,
    the convolutions' kernels 2-D and in F32; Granite Speech Plus's feature layers), each tensor under the converter's
    name but the folded norms', which llama.cpp loads as conv_norm where the converter writes conv_norm_var (mtmd does
    not load its file); the text model's file holds neither."""
    from safetensors.torch import load_file

    source, folder = GRANITE_SPEECHES[model]
    granite_speech_folder = request.getfixturevalue(folder)
    out = tmp_path / "m.gguf"
    unshard.convert(source, out, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
    ours = contents(tmp_path / "mmproj-m.gguf")
    theirs = contents(converter(granite_speech_folder, kind, tmp_path / "oracle-mmproj.gguf", mmproj=True))
    assert ours[0].get("clip.audio.feature_layer") == ([1] if model == "granite-speech-plus" else None)
    assert ours[0] == theirs[0] and list(ours[0]) == list(theirs[0])
    assert_same_tensors(ours[1], [(t[0].replace(*CONV_NORM), *t[1:]) for t in theirs[1]])
    assert ours[0]["clip.projector_type"] == "granite_speech"
    assert not any(t[0].startswith("a.") for t in contents(out)[1])
    named = {t[0]: t for t in ours[1]}
    weights = load_file(granite_speech_folder / "model.safetensors")
    norm = {k.rsplit(".", 1)[1]: t for k, t in weights.items() if k.startswith("encoder.layers.1.conv.batch_norm.")}
    scale = norm["weight"] / torch.sqrt(norm["running_var"] + 1e-5)
    shift = norm["bias"] - norm["running_mean"] * scale
    for values, stored in ((scale, "weight"), (shift, "bias")):
        name, qtype, shape, data = named[f"a.blk.1.conv_norm.{stored}"]
        assert qtype == "F32" and np.array_equal(np.frombuffer(data, np.float32), values.float().numpy())
    assert named["a.blk.0.conv_dw.weight"][1:3] == ("F32", [15, 64]) and "a.blk.0.attn_k.weight" in named


def test_granite_speech_s_tensors_in_bands_of_a_few_rows_are_the_same(monkeypatch, tmp_path):
    """Each tensor handed to its encoding a few rows at a time (as a large model's are, in bands of a few MB): the
    same mmproj file, keys and values cut apart from the whole fused tensor, not from each band."""
    from unshard.write import assemble

    whole, banded = tmp_path / "whole.gguf", tmp_path / "banded.gguf"
    unshard.convert(GRANITE_SPEECH, whole, output=unshard.OutputOptions(gguf="f32"), progress=False)
    monkeypatch.setattr(assemble, "ENCODING_BAND_BYTES", 4 * 32 * 4)  # (4 rows of 32 f32 columns)
    unshard.convert(GRANITE_SPEECH, banded, output=unshard.OutputOptions(gguf="f32"), progress=False, verify=True)
    assert_same_tensors(contents(tmp_path / "mmproj-banded.gguf")[1], contents(tmp_path / "mmproj-whole.gguf")[1])


def granite_speech_features(sound: np.ndarray) -> torch.Tensor:
    """Granite Speech's feature extractor's (torchaudio's mel spectrogram of 80 bins, its log scaled as Whisper's, two
    frames stacked into one of 160), computed as torchaudio computes it: torch's STFT of a periodic Hann window, the
    HTK mel filters (transformers' own, which its extractor's torchaudio is not installed for)."""
    from transformers.audio_utils import mel_filter_bank

    window = torch.hann_window(400)
    spectrum = torch.stft(torch.from_numpy(sound), 512, 160, 400, window, return_complex=True).abs() ** 2
    filters = mel_filter_bank(257, 80, 0.0, 8000.0, 16000, norm=None, mel_scale="htk")
    mel = (torch.from_numpy(filters).float().T @ spectrum).T.clip(min=1e-10).log10()
    mel = torch.maximum(mel, mel.max() - 8.0) / 4 + 1
    return mel[: len(mel) // 2 * 2].reshape(1, -1, 160)


@pytest.mark.parametrize("model", GRANITE_SPEECHES)
@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_llama_cpp_hears_a_sound_as_granite_speech_does(kind, model, request, tmp_path):
    """mtmd's embeddings of 2 seconds (100 stacked frames, 7 windows of 15 for the Q-Former, 3 queries each) are
    transformers' audio features of the same samples: the Conformer's chunks of 20 frames, its mid-layer CTC
    feedback, the batch norms with their running statistics (Granite Speech Plus's first layer's output beside the
    last)."""
    from transformers import AutoModelForMultimodalLM

    source, folder = GRANITE_SPEECHES[model]
    unshard.convert(source, tmp_path / "m.gguf", output=unshard.OutputOptions(gguf=kind), progress=False)
    sound, embeddings = sound_embeddings(tmp_path / "m.gguf", tmp_path, seconds=2)
    model = AutoModelForMultimodalLM.from_pretrained(request.getfixturevalue(folder), dtype=torch.float32)
    with torch.no_grad():
        expected = model.get_audio_features(granite_speech_features(sound)).pooler_output[0]
    assert embeddings.shape == expected.shape == (21, 64)
    assert relative_distance(embeddings, expected) <= AUDIO_TOLERANCE[kind]


@pytest.mark.parametrize(
    "part, change, message",
    [
        ("encoder_config", {"dim_head": 8}, "the encoder's heads are 8 wide, and llama.cpp's granite_speech takes"),
        ("projector_config", {"num_hidden_layers": 3}, "the audio tower's projector's num_hidden_layers is 3"),
        ("projector_config", {"cross_attention_frequency": 2}, "projector's cross_attention_frequency is 2"),
        ("projector_config", {"layer_norm_eps": 1e-5}, "projector's layer_norm_eps is 1e-05, and llama.cpp's"),
    ],
)
def test_what_llama_cpp_s_granite_speech_computes_otherwise_is_one_line(part, change, message, granite_speech_folder):
    """(Such configs have other tensors than the fixture's checkpoint: the config is asked alone.)"""
    config = json.loads((granite_speech_folder / "config.json").read_text())
    config[part] = {**config[part], **change}
    with pytest.raises(unshard.ConfigMismatchError, match=message):
        families.granite_speech.granite_speech_sizes(config, granite_speech_folder / "config.json")


def test_voxtral_s_audio_tower_is_left_out_with_the_reason(tmp_path):
    """llama.cpp's voxtral pools the encoder's frames where Voxtral does not: no mmproj file, the tower left out of
    the text model's file (as the converter leaves it out) with a note saying why; the text model is written."""
    plan = unshard.plan(VOXTRAL, output=unshard.OutputOptions(gguf="f32"))
    assert plan.summary()["gguf"]["mmproj"] is None
    assert any("no mmproj file of them (llama.cpp's voxtral pools the encoder's frames 2 to 1" in n for n in plan.notes)
    unshard.convert(VOXTRAL, tmp_path / "m.gguf", output=unshard.OutputOptions(gguf="f32"), progress=False)
    assert not (tmp_path / "mmproj-m.gguf").exists()
    assert not any(t[0].startswith(("a.", "mm.")) for t in contents(tmp_path / "m.gguf")[1])


@pytest.fixture(scope="module")
def llava_folder(tmp_path_factory):
    return unsharded(LLAVA, tmp_path_factory)


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_llava_s_pixtral_tower_is_mistral3_s_without_its_merger(kind, llava_folder, converter, tmp_path):
    """Pixtral-12B's layout (LLaVA's classes): the converter's --mmproj file, the [IMG_BREAK] embedding first as for
    Mistral 3; mtmd encodes an image of 128 x 64 pixels into transformers' image features of the same pixels, a token
    for each patch (8 x 4), the [IMG_BREAK] embedding after each row of them but the last."""
    from transformers import AutoModelForImageTextToText

    out = tmp_path / "m.gguf"
    unshard.convert(LLAVA, out, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
    ours = contents(tmp_path / "mmproj-m.gguf")
    theirs = contents(converter(llava_folder, kind, tmp_path / "oracle.gguf", mmproj=True))
    assert ours[0] == theirs[0] and list(ours[0]) == list(theirs[0]) and ours[1][0][0] == BREAK
    assert ours[0]["clip.projector_type"] == "pixtral" and "clip.vision.spatial_merge_size" not in ours[0]
    assert_same_tensors(ours[1][1:], theirs[1])
    model = AutoModelForImageTextToText.from_pretrained(llava_folder, dtype=torch.float32)
    image, embeddings = image_embeddings(out, 128, 64, tmp_path)
    rows = transformers_image_features(model, llava_folder, image, "image_sizes").reshape(4, 8, -1)
    image_break = model.get_input_embeddings().weight[IMAGE_BREAK_ID].detach()[None]
    expected = torch.cat([torch.cat([row, image_break]) for row in rows[:3]] + [rows[3]])
    assert embeddings.shape == (35, 64)
    assert relative_distance(embeddings, expected) <= IMAGE_TOLERANCE[kind]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"vision_feature_select_strategy": "default"}, "vision_feature_select_strategy is 'default', and llama.cpp"),
        ({"vision_feature_layer": -2}, "vision_feature_layer is -2, and llama.cpp's pixtral projector computes -1"),
        ({"text_config": {"sliding_window": 4096}}, "sliding_window is 4096, and llama.cpp's llama has no sliding"),
    ],
)
def test_what_llama_cpp_s_llava_computes_otherwise_is_one_line(change, message, llava_folder, tmp_path):
    assert_refused(llava_folder, tmp_path, change, message, check=False)


@pytest.fixture(scope="module")
def lfm2vl_folder(tmp_path_factory):
    return unsharded(LFM2_VL, tmp_path_factory)


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_lfm2_vl_s_mmproj_is_the_converter_s_and_sees_as_transformers(kind, lfm2vl_folder, converter, tmp_path):
    """SigLIP2's tower and the projector as llama.cpp's lfm2 (the patch embedding, a linear layer over each patch's
    pixels, as a 2-D convolution; the image size the converter writes, 256): every field and tensor is the
    converter's, which reads the tower under the Hub's names (transformers 5 saves them without `vision_model.`).
    mtmd encodes an image of 256 x 256 pixels (16 x 16 patches, the positions' grid as it is, shuffled 2 x 2 into 64
    tokens, the fewest llama.cpp makes) into transformers' image features of the same pixels (SigLIP2's patches)."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    hub = with_hub_vision_names(lfm2vl_folder, tmp_path / "hub")
    out, ours = mmproj_as_the_converter_writes(LFM2_VL, hub, kind, converter, tmp_path)
    assert ours[0]["clip.projector_type"] == "lfm2"
    model = AutoModelForImageTextToText.from_pretrained(lfm2vl_folder, dtype=torch.float32)
    image, embeddings = image_embeddings(out, 256, 256, tmp_path)
    pixels = AutoImageProcessor.from_pretrained(lfm2vl_folder)(images=[image], return_tensors="pt")
    with torch.no_grad():
        features = model.model.get_image_features(
            pixel_values=pixels["pixel_values"],
            spatial_shapes=pixels["spatial_shapes"],
            pixel_attention_mask=pixels["pixel_attention_mask"],
        )
    assert embeddings.shape == (64, 64)
    assert relative_distance(embeddings, torch.cat(list(features.pooler_output))) <= IMAGE_TOLERANCE[kind]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"projector_hidden_act": "silu"}, "projector_hidden_act is 'silu', and llama.cpp's lfm2 projector runs GELU"),
        ({"vision_feature_layer": -2}, "vision_feature_layer is -2, which transformers ignores"),
    ],
)
def test_what_llama_cpp_s_lfm2_projector_computes_otherwise_is_one_line(change, message, lfm2vl_folder, tmp_path):
    assert_refused(lfm2vl_folder, tmp_path, change, message)


@pytest.fixture(scope="module")
def janus_folder(tmp_path_factory):
    return unsharded(JANUS, tmp_path_factory)


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_janus_pro_s_mmproj_is_the_converter_s_and_sees_as_transformers(kind, janus_folder, converter, tmp_path):
    """Janus-Pro's SigLIP tower and aligner as llama.cpp's janus_pro (the aligner's layers as mm.0 and mm.1): every
    field and tensor is the converter's, its image generator in neither file (with a note), and mtmd encodes an
    image of the tower's size (64 pixels: 4 x 4 patches) into transformers' image features of the same pixels."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    out = tmp_path / "m.gguf"
    plan = unshard.plan(JANUS, output=unshard.OutputOptions(gguf=kind))
    assert any("(the image generator's: llama.cpp runs no image generation)" in n for n in plan.notes)
    out, ours = mmproj_as_the_converter_writes(JANUS, janus_folder, kind, converter, tmp_path)
    assert ours[0]["clip.projector_type"] == "janus_pro"
    assert {"mm.0.weight", "mm.1.bias"} <= {t[0] for t in ours[1]}
    assert not any("gen" in t[0] or "vq" in t[0] for t in ours[1] + contents(out)[1])
    model = AutoModelForImageTextToText.from_pretrained(janus_folder, dtype=torch.float32)
    image, embeddings = image_embeddings(out, 64, 64, tmp_path)
    pixels = AutoImageProcessor.from_pretrained(janus_folder)(images=[image], return_tensors="pt")
    with torch.no_grad():
        expected = model.model.get_image_features(pixel_values=pixels["pixel_values"]).pooler_output[0]
    assert embeddings.shape == (16, 64)
    assert relative_distance(embeddings, expected) <= IMAGE_TOLERANCE[kind]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"depth": 3}, "the vision tower's depth is 3, and llama.cpp's janus_pro projector computes 2"),
        ({"use_qk_norm": True}, "the vision tower's use_qk_norm is True, and llama.cpp's janus_pro projector"),
        ({"hidden_act": "relu"}, "the vision tower's hidden_act is relu, and llama.cpp's janus_pro projector computes"),
    ],
)
def test_what_llama_cpp_s_janus_pro_computes_otherwise_is_one_line(change, message, janus_folder, tmp_path):
    assert_refused(janus_folder, tmp_path, change, message, within="vision_config", check=False)


# llama.cpp samples HunyuanOCR's learned positions bilinearly at a scale of (grid + 0.1) / grid (Tencent's code's scale
# factor), off the grid's points even at the tower's own size, where torch (transformers 5.24, and Tencent's code)
# takes the grid as it is: measured 1.8e-3 in f32 (q8_0 4.6e-3); transformers with llama.cpp's sampling, 1.7e-4
HUNYUAN_OCR_IMAGE_TOLERANCE = {"f32": 3e-3, "q8_0": 3e-2}


@pytest.fixture(scope="module")
def hunyuanocr_folder(tmp_path_factory):
    """The folder with the image processor's pixel bounds as the Hub's preprocessor_config.json has them (min_pixels,
    max_pixels), which the converter reads; transformers 5 saves them as the size's shortest and longest edge."""
    folder = unsharded(HUNYUAN_OCR, tmp_path_factory)
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    bounds = {"min_pixels": processor["size"]["shortest_edge"], "max_pixels": processor["size"]["longest_edge"]}
    (folder / "preprocessor_config.json").write_text(json.dumps({**processor, **bounds}))
    assert for_the_converter(folder) == "gpt-2"  # (the tokenizer's class as the converter's transformers knows it)
    return folder


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_hunyuan_ocr_s_files_are_the_converter_s_and_see_as_transformers(kind, hunyuanocr_folder, converter, tmp_path):
    """HunyuanOCR's text model as llama.cpp's hunyuan_vl (XD-RoPE's alpha and sections in the header, the text
    config's end of text) and its tower as the hunyuanvl projector (the position embeddings without the class token's
    row, the merging convolutions' kernels in F32): both files are the converter's, field for field and byte for byte;
    mtmd encodes an image of the tower's size (128 x 128 pixels: 8 x 8 patches, merged into 4 x 4 tokens) into
    transformers' image features of the same pixels: the image's begin, each row of tokens and its newline, the
    image's end."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    out, ours = mmproj_as_the_converter_writes(HUNYUAN_OCR, hunyuanocr_folder, kind, converter, tmp_path)
    assert contents(out) == contents(converter(hunyuanocr_folder, kind, tmp_path / "oracle.gguf", pre="gpt-2"))
    assert ours[0]["clip.projector_type"] == "hunyuanvl" and ours[0]["clip.vision.image_max_pixels"] == 128 * 128
    notes = unshard.plan(HUNYUAN_OCR, output=unshard.OutputOptions(gguf=kind)).notes
    assert any("samples the tower's learned positions off their grid" in n for n in notes)
    named = {t[0]: t for t in ours[1]}
    assert named["v.position_embd.weight"][2] == [32, 64] and named["mm.0.weight"][1] == "F32"
    fields = contents(out)[0]
    assert fields["hunyuan_vl.rope.scaling.alpha"] == 1000.0 and fields["hunyuan_vl.rope.freq_base"] == 10000.0
    model = AutoModelForImageTextToText.from_pretrained(hunyuanocr_folder, dtype=torch.float32)
    image, embeddings = image_embeddings(out, 128, 128, tmp_path)
    pixels = AutoImageProcessor.from_pretrained(hunyuanocr_folder)(images=[image], return_tensors="pt")
    with torch.no_grad():
        features = model.model.get_image_features(
            pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"]
        ).pooler_output[0]
    assert embeddings.shape == features.shape == (2 + 4 * 5, 64)
    assert relative_distance(embeddings, features) <= HUNYUAN_OCR_IMAGE_TOLERANCE[kind]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"vision_config": {"hidden_act": "silu"}}, "the vision tower's hidden_act is silu, and llama.cpp's hunyuanvl"),
        ({"vision_config": {"spatial_merge_size": 4}}, "spatial_merge_size is 4, and llama.cpp's hunyuanvl projector"),
        (
            {"text_config": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}},
            "rope type 'linear' without XD-RoPE's alpha and sections",
        ),
    ],
)
def test_what_llama_cpp_s_hunyuan_vl_computes_otherwise_is_one_line(change, message, hunyuanocr_folder, tmp_path):
    assert_refused(hunyuanocr_folder, tmp_path, change, message, check=False)


@pytest.fixture(scope="module")
def paddleocr_folder(tmp_path_factory):
    """The folder with what the Hub's PaddleOCR-VL has and transformers 5 saves otherwise, which the converter reads:
    the tower's class in vision_config (by which its --mmproj finds its class), the image processor's min_pixels and
    max_pixels (saved as the size's shortest and longest edge)."""
    folder = unsharded(PADDLE_OCR, tmp_path_factory)
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    bounds = {"min_pixels": processor["size"]["shortest_edge"], "max_pixels": processor["size"]["longest_edge"]}
    (folder / "preprocessor_config.json").write_text(json.dumps({**processor, **bounds}))
    config = json.loads((folder / "config.json").read_text())
    config["vision_config"]["architectures"] = ["PaddleOCRVisionModel"]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_paddleocr_vl_s_mmproj_is_the_converter_s_and_sees_as_transformers(kind, paddleocr_folder, converter, tmp_path):
    """PaddleOCR-VL's SigLIP tower and mlp_AR projector as llama.cpp's paddleocr (the image size the side of the
    largest image the processor makes): every field and tensor is the converter's, and mtmd encodes an image of 56 x
    56 pixels (4 x 4 patches, merged 2 x 2 by the projector) into transformers' image features of the same pixels."""
    from transformers import AutoModelForImageTextToText

    out, ours = mmproj_as_the_converter_writes(PADDLE_OCR, paddleocr_folder, kind, converter, tmp_path)
    assert ours[0]["clip.projector_type"] == "paddleocr" and ours[0]["clip.vision.image_size"] == 56
    model = AutoModelForImageTextToText.from_pretrained(paddleocr_folder, dtype=torch.float32)
    image, embeddings = image_embeddings(out, 56, 56, tmp_path)
    features = transformers_image_features(model, paddleocr_folder, image, "image_grid_thw")
    assert embeddings.shape == features.shape == (4, 64)
    assert relative_distance(embeddings, features) <= IMAGE_TOLERANCE[kind]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"spatial_merge_size": 4}, "the vision tower's spatial_merge_size is 4, and llama.cpp's paddleocr projector"),
        ({"hidden_act": "silu"}, "the vision tower's hidden_act is silu, and llama.cpp's paddleocr projector computes"),
        ({"layer_norm_eps": 1e-5}, "the vision tower's layer_norm_eps is 1e-05, and llama.cpp's paddleocr projector"),
    ],
)
def test_what_llama_cpp_s_paddleocr_computes_otherwise_is_one_line(change, message, paddleocr_folder, tmp_path):
    assert_refused(paddleocr_folder, tmp_path, change, message, within="vision_config", check=False)


@pytest.fixture(scope="module", params=sorted(INTERNVL_TEXT))
def internvl_folder(request, tmp_path_factory):
    """The folder and a copy as the converter maps it: the tower's and the text model's classes in their configs, as
    the Hub's configs name them and transformers 5 does not, and in the copy, the tower and the projector under
    Intern-S1's names (`model.vision_tower.`, `model.multi_modal_projector.`), the only ones the converter's
    InternVisionModel keeps: of transformers 5's names it writes an mmproj file without a tensor."""
    from safetensors.torch import load_file, save_file

    src = SHIPPED / request.param / "global_step_1"
    folder = unsharded(src, tmp_path_factory)
    assert for_the_converter(folder) == "gpt-2"
    config = json.loads((folder / "config.json").read_text())
    config["vision_config"]["architectures"] = ["InternVisionModel"]
    config["text_config"]["architectures"] = [INTERNVL_TEXT[request.param]]
    (folder / "config.json").write_text(json.dumps(config))
    hub = folder.with_name("hub")
    shutil.copytree(folder, hub)
    tensors = load_file(hub / "model.safetensors")
    towers = ("vision_tower.", "multi_modal_projector.")
    renamed = {("model." if name.startswith(towers) else "") + name: t for name, t in tensors.items()}
    save_file(renamed, hub / "model.safetensors", metadata={"format": "pt"})
    return src, folder, hub


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_internvl_s_files_are_the_converter_s_and_see_as_transformers(kind, internvl_folder, converter, tmp_path):
    """InternVL3's layout and InternVL3.5's: the text model as llama.cpp's qwen2 or qwen3, and InternViT with its
    projector as the internvl
    projector (the projector's layers as mlp1.0, mlp1.1 and mlp1.3, the layer scales and positions named as the
    converter names them), each file the converter's; mtmd encodes an image of one tile (56 pixels: 4 x 4 patches,
    shuffled into 2 x 2 tokens) into transformers' image features of the same pixels, but for the positions: llama.cpp
    puts the class token after the patches and adds the learned positions in their order, so that each patch takes
    the row before its own (the class token's, for the first), as the conversion notes; transformers' tower is run so
    for the comparison (as llama.cpp runs it, 3.3e-2 from transformers' own features in f32)."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    src, folder, hub = internvl_folder
    out, ours = mmproj_as_the_converter_writes(src, hub, kind, converter, tmp_path)
    assert contents(out) == contents(converter(folder, kind, tmp_path / "oracle.gguf", pre="gpt-2"))
    assert ours[0]["clip.projector_type"] == "internvl" and ours[0]["clip.vision.projector.scale_factor"] == 2
    assert {"mm.model.mlp.0.weight", "mm.model.mlp.3.bias", "v.class_embd", "v.blk.0.ls1.weight"} <= {
        t[0] for t in ours[1]
    }
    assert contents(out)[0]["general.architecture"] == INTERNVL_TEXT[src.parent.name][:5].lower()
    notes = unshard.plan(src, output=unshard.OutputOptions(gguf=kind)).notes
    assert any("puts the class token after the patches" in n for n in notes)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    image, embeddings = image_embeddings(out, 56, 56, tmp_path)
    pixels = AutoImageProcessor.from_pretrained(folder)(images=[image], return_tensors="pt")
    embedded = model.model.vision_tower.embeddings

    def as_llama_cpp_pairs_them(pixel_values, bool_masked_pos=None):
        patches = embedded.patch_embeddings(pixel_values)
        cls = embedded.cls_token.expand(patches.shape[0], -1, -1)
        tokens = torch.cat([patches, cls], dim=1) + embedded.position_embeddings
        return torch.cat([tokens[:, -1:], tokens[:, :-1]], dim=1)  # (the class token first again, as transformers)

    embedded.forward = as_llama_cpp_pairs_them
    with torch.no_grad():
        features = model.model.get_image_features(
            pixel_values=pixels["pixel_values"], vision_feature_layer=-1, vision_feature_select_strategy="default"
        ).pooler_output
    features = features.reshape(-1, features.shape[-1])
    assert embeddings.shape == features.shape == (4, 64)
    assert relative_distance(embeddings, features) <= IMAGE_TOLERANCE[kind]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"vision_feature_layer": -2}, "the vision tower's vision_feature_layer is -2, and llama.cpp's internvl"),
        ({"projector_hidden_act": "silu"}, "projector_hidden_act is silu, and llama.cpp's internvl projector computes"),
        ({"text_config": {"model_type": "llama"}}, "text_config's model_type is 'llama', and unshard writes InternVL"),
    ],
)
def test_what_llama_cpp_s_internvl_computes_otherwise_is_one_line(change, message, internvl_folder, tmp_path):
    assert_refused(internvl_folder[1], tmp_path, change, message, check=False)


def test_an_intern_vit_normed_otherwise_than_llama_cpp_s_is_one_line(internvl_folder):
    """llama.cpp's internvl norms InternViT-6B (3200 wide, 45 layers) by RMS with q and k normed, every smaller tower
    by LayerNorm without. (Another tower has other tensors than the fixture's checkpoint: its config is asked alone.)"""
    vision = json.loads((internvl_folder[1] / "config.json").read_text())["vision_config"]
    where = internvl_folder[1] / "config.json"
    with pytest.raises(unshard.ConfigMismatchError, match="norm_type is rms_norm, and llama.cpp's internvl projector"):
        families.internvl.internvl_sizes({**vision, "norm_type": "rms_norm"}, where)
    six_b = {**vision, "hidden_size": 3200, "num_hidden_layers": 45}
    with pytest.raises(
        unshard.ConfigMismatchError, match="norm_type is layer_norm, and llama.cpp's internvl projector"
    ):
        families.internvl.internvl_sizes(six_b, where)
    assert families.internvl.internvl_sizes({**six_b, "norm_type": "rms_norm", "use_qk_norm": True}, where)


def test_a_folder_transformers_saved_with_its_head_tied_converts(tmp_path):
    """InternVL's head tied to its embedding is `lm_head` in memory and `language_model.lm_head` as saved: the folder
    save_pretrained writes (the fixture's reference, the Hub's -hf releases) holds neither, and is whole."""
    from safetensors import safe_open

    reference = INTERNVL.parent / "reference"
    with safe_open(reference / "model.safetensors", "pt") as saved:
        assert not any("lm_head" in name for name in saved.keys())
    result = unshard.convert(reference, tmp_path / "hf", verify=True, progress=False)
    assert result.tensors == 108


@pytest.fixture(scope="module")
def lightonocr_folder(tmp_path_factory):
    """The folder, and a copy with the classes the Hub's LightOnOCR config names (LightOnOCRForConditionalGeneration,
    its text model's Qwen3ForCausalLM), by which the converter finds its classes."""
    folder = unsharded(LIGHTON_OCR, tmp_path_factory)
    assert for_the_converter(folder) == "gpt-2"

    def as_the_hub_names_it(config: dict) -> None:
        config["architectures"] = ["LightOnOCRForConditionalGeneration"]
        config["text_config"]["architectures"] = ["Qwen3ForCausalLM"]

    return folder, with_config(folder, tmp_path_factory.mktemp("lightonocr-hub"), as_the_hub_names_it)


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_lightonocr_s_files_are_the_converter_s_and_see_as_transformers(
    kind, lightonocr_folder, converter, llama_cpp, tmp_path
):
    """LightOnOCR: the text model as llama.cpp's qwen3 and the Pixtral tower with its merger under LightOnOCR's names
    as the lightonocr projector, each file the converter's; llama.cpp computes transformers' logits of a prompt, and
    mtmd encodes an image of 128 x 64 pixels (8 x 4 patches merged 2 x 2) into transformers' 8 image features, with no
    [IMG_BREAK] between rows. The merger's norm takes the text model's epsilon (1e-6) where llama.cpp takes the
    tower's (1e-5), which the conversion notes (measured: 2e-7 of the features). Measured: logits f32 2.8e-4, q8_0
    1.4e-2; image features f32 3.7e-4, q8_0 1.2e-2."""
    from transformers import AutoModelForImageTextToText

    folder, hub = lightonocr_folder
    out, ours = mmproj_as_the_converter_writes(LIGHTON_OCR, hub, kind, converter, tmp_path)
    assert contents(out) == contents(converter(hub, kind, tmp_path / "oracle.gguf", pre="gpt-2"))
    assert ours[0]["clip.projector_type"] == "lightonocr" and BREAK not in {t[0] for t in ours[1]}
    assert contents(out)[0]["general.architecture"] == "qwen3"
    notes = unshard.plan(LIGHTON_OCR, output=unshard.OutputOptions(gguf=kind)).notes
    assert any("at the tower's epsilon (1e-05), where LightOnOCR takes the text model's (1e-06)" in n for n in notes)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    prompt = [1, 5, 20, 33, 64, 70, 2]
    logits, _ = llama_cpp(out, prompt, 0)
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([prompt])).logits[0]
    assert relative_distance(logits, expected) <= LLAMA_CPP_TOLERANCE[kind]
    image, embeddings = image_embeddings(out, 128, 64, tmp_path)
    features = transformers_image_features(model, folder, image, "image_sizes")
    assert embeddings.shape == features.shape == (8, 64)
    assert relative_distance(embeddings, features) <= IMAGE_TOLERANCE[kind]


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"text_config": {"model_type": "qwen2"}},
            "text_config's model_type is 'qwen2', and unshard writes LightOnOCR",
        ),
        ({"vision_config": {"hidden_act": "relu"}}, "the vision tower's hidden_act is 'relu'"),
    ],
)
def test_what_llama_cpp_s_lightonocr_computes_otherwise_is_one_line(change, message, lightonocr_folder, tmp_path):
    assert_refused(lightonocr_folder[0], tmp_path, change, message, check=False)
