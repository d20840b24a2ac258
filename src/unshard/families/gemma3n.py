"""Gemma 3n's text model (`Gemma3nForCausalLM`), and the whole model (`Gemma3nForConditionalGeneration`, the Hub's E2B
and E4B: that text model beside MobileNetV5's vision tower and a Conformer audio encoder). Gemma 3's attention (q and
k normed, sliding and global layers) with AltUp (the hidden state carried as 4 streams, 3 of them projected in and
out of the model), LAuReL (a low-rank residual beside attention), per-layer embeddings (a second embedding of every
token, a slice for each layer, gated into it), activation sparsity in the first layers' MLPs, and the last layers
reusing earlier layers' keys and values.
Its norms are applied as they are (not as 1 + weight, as Gemma 3's).

llama.cpp's gemma3n, as the converter writes it: the 3 AltUp projections in and out each stacked into one tensor, the
embeddings padded with zero rows to the vocabulary's size (the Hub's per-layer embedding has none for the image and
audio tokens), Gemma 3's header with AltUp's, the per-layer embedding's width, the shared layers' count, each layer's
sparsity as the normal distribution's quantile, and which layers are sliding. Of the whole model, that file and the
mmproj of both towers as the converter writes it (llama.cpp's gemma3nv and gemma3na): MobileNetV5's blocks by their
stage and index, the Conformer's layers, the towers' inputs' projections in F16, the stem and the audio convolutions in
F32, the pixels unnormalised; what llama.cpp's mtmd does with it is noted (docs/outputs/gguf.md)."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import ConfigMismatchError
from .gemma import DENSE_ONLY, MEGATRON, gemma3_after_vocabulary, gemma3_header
from .gguf_hooks import gguf_py, mmproj_model_forced_type, processor_config
from .llama import SIBLINGS, TEXT_ONLY
from .parts import NO_TABLE, Family, GGUFPart, MmprojPart, Rearrangement, Unsupported, gguf_family, no_trainer_model

# What llama.cpp's gemma3n fixes in its code whatever the file says, as E2B and E4B have it: the first 20 layers keys
# and values of their own (E2B's 30 layers and E4B's 35 both share from there), AltUp's 4 streams (as the converter
# asserts) of which the first is active, LAuReL's rank, the per-layer embeddings' width, and activation sparsity in the
# first 10 layers at the 0.95 quantile
OWN_KV_LAYERS = 20
FIXED = {"altup_num_inputs": 4, "altup_active_idx": 0, "laurel_rank": 64, "hidden_size_per_layer_input": 256}
SPARSE_LAYERS, SPARSITY = 10, 0.95
EMBEDDINGS = ("embed_tokens.weight", "embed_tokens_per_layer.weight")


def gemma3n_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Gemma3NModel's, in its order: Gemma 3's, then AltUp's active stream and count, the per-layer
    embedding's width, the shared layers, each layer's activation sparsity as the standard normal's quantile (computed
    by torch in float32, as the converter), and which layers are sliding."""
    import torch

    gemma3_header(writer, hparams, ftype, blocks, folder)
    writer.add_altup_active_idx(hparams["altup_active_idx"])
    writer.add_altup_num_inputs(hparams["altup_num_inputs"])
    writer.add_embedding_length_per_layer_input(hparams["hidden_size_per_layer_input"])
    writer.add_shared_kv_layers(hparams["num_kv_shared_layers"])
    normal = torch.distributions.normal.Normal(0, 1)
    quantiles = [
        normal.icdf(torch.tensor(s, dtype=torch.float32)).item() for s in hparams["activation_sparsity_pattern"]
    ]
    writer.add_activation_sparsity_scale(quantiles)
    writer.add_sliding_window_pattern([kind == "sliding_attention" for kind in hparams["layer_types"]])


def gemma3n_checked(hparams: dict, where: Path) -> list[str]:
    """What llama.cpp's gemma3n computes otherwise than transformers (FIXED and the rest it fixes in its code), or the
    converter refuses: one line. Noted: the sparse layers' cut-off, which llama.cpp sets by the activations' standard
    deviation over n - 1 and transformers over n, a factor that the model's width makes small."""
    why = _computed_otherwise(hparams)
    if why:
        raise ConfigMismatchError(f"{where}: {why}; serve this model with transformers or vLLM")
    widths = hparams["intermediate_size"]
    width = min(widths) if isinstance(widths, list) else widths
    return [
        f"llama.cpp's gemma3n cuts the first {SPARSE_LAYERS} layers' activations at a standard deviation over n - 1, "
        f"transformers over n: {(width / (width - 1)) ** 0.5:.6f} times transformers' at this width ({width}), "
        "as in the converter's file"
    ]


def _computed_otherwise(hparams: dict) -> str | None:
    layers, shared = hparams["num_hidden_layers"], hparams.get("num_kv_shared_layers") or 0
    for key, value in FIXED.items():
        if hparams.get(key) != value:
            return f"{key} is {hparams.get(key)}, and llama.cpp's gemma3n takes {value}"
    if layers - shared != OWN_KV_LAYERS:
        return (
            f"{layers - shared} layers have keys and values of their own (num_kv_shared_layers {shared} of {layers}), "
            f"and llama.cpp's gemma3n gives them to the first {OWN_KV_LAYERS}"
        )
    if (hparams.get("layer_types") or [])[OWN_KV_LAYERS - 2 : OWN_KV_LAYERS] != ["sliding_attention", "full_attention"]:
        return (
            f"layers {OWN_KV_LAYERS - 2} and {OWN_KV_LAYERS - 1} are not a sliding then a global one, whose keys and "
            "values llama.cpp's gemma3n has the shared layers reuse"
        )
    if hparams.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        return f"hidden_activation is {hparams['hidden_activation']}, and llama.cpp's gemma3n runs GELU (tanh)"
    if list(hparams.get("activation_sparsity_pattern") or []) != [SPARSITY] * SPARSE_LAYERS + [0.0] * (
        layers - SPARSE_LAYERS
    ):
        return (
            f"activation_sparsity_pattern is not {SPARSITY} in the first {SPARSE_LAYERS} layers and 0 after, which "
            "llama.cpp's gemma3n applies whatever the file says"
        )
    return None


def gemma3n_padded_rows(name: str, shape: tuple[int, ...], hparams: dict) -> int | None:
    """The embeddings' rows in the file: the vocabulary's, the tokens past the tensor's own rows zero (the converter
    pads them so)."""
    return hparams["vocab_size"] if name.endswith(EMBEDDINGS) else None


def gemma3n_unused(hparams: dict) -> dict[str, tuple[int, ...]]:
    """The shared layers' keys, values and keys' norm, which llama.cpp's gemma3n loads for every layer (the Hub's
    checkpoints hold them) and computes with for the first 20 only: transformers 5 builds none for the shared layers."""
    layers, shared = hparams["num_hidden_layers"], hparams.get("num_kv_shared_layers") or 0
    head, width = hparams["head_dim"], hparams["num_key_value_heads"] * hparams["head_dim"]
    tensors = {}
    for layer in range(layers - shared, layers):
        for kind in ("attn_k", "attn_v"):
            tensors[f"blk.{layer}.{kind}.weight"] = (width, hparams["hidden_size"])
        tensors[f"blk.{layer}.attn_k_norm.weight"] = (head,)
    return tensors


GEMMA3N = GGUFPart(
    "GEMMA3N",
    hyperparameters=gemma3n_hyperparameters,
    after_vocabulary=gemma3_after_vocabulary,
    check_config=gemma3n_checked,
    renames=((r"_scale$", "_scale.weight"),),
    stacked=r"^(.*\.altup_(?:unembed_)?projections)\.(\d+)\.(weight)$",
    padded_rows=gemma3n_padded_rows,
    unused=gemma3n_unused,
)
# (the whole model's towers and their embedders, by the names transformers saves them under)
TOWERS = r"^model\.(?:vision_tower|audio_tower|embed_vision|embed_audio)\."
# The converter's audio tensors: those whose names hold any of these (its Conformer audio models' test)
AUDIO_WORDS = ("audio", "codebook", "conformer", "depth_embedding", "depthformer", "depth_linear")
# The audio subsampling's norms, which the pinned converter has no name for (it stops on the first): named as Gemma 4's
# of the same place (a.conv1d.N.norm), which mtmd reads of Gemma 4's tower and of Gemma 3n's none
SUBSAMPLING_NORM = re.compile(r"^model\.audio_tower\.subsample_conv_projection\.conv_(\d+)\.norm\.(weight|bias)$")
# MobileNetV5's blocks, indexed by stage and block within it, which the converter names itself (gguf-py maps names of
# one index): the parts of a block it knows, under llama.cpp's v.blk.<stage>.<block>.
MOBILENET_BLOCK = re.compile(r"^model\.vision_tower\.timm_model\.blocks\.(\d+)\.(\d+)\.(.+)$")
MOBILENET_PARTS = frozenset(
    {
        *(f"{conv}.weight" for conv in ("conv_exp", "bn1", "conv_pwl", "bn2", "norm")),
        *(f"{layer}.{kind}.weight" for layer in ("dw_start", "dw_mid", "pw_exp", "pw_proj") for kind in ("conv", "bn")),
        *(f"attn.{proj}.proj.weight" for proj in ("query", "key", "value", "output")),
        *(f"attn.{proj}.{kind}.weight" for proj in ("key", "value") for kind in ("down_conv", "norm")),
        "layer_scale.gamma",
    }
)
# The image and its tokens as llama.cpp's gemma3nv takes them whatever the processor says otherwise: 768 pixels a
# side, 256 tokens (the Hub's processor's), its pixels unnormalised; the tower's sizes the converter writes beside
IMAGE_SIZE, IMAGE_TOKENS = 768, 256
UNNORMALISED = ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0])


def gemma3n_vision_sizes(vision: dict, where: Path) -> dict:
    """MobileNetV5's sizes as the converter writes them: the image processor's height as the image's size, over its
    tokens as the patch's (the 16 x 16 tokens llama.cpp computes from them), 128 blocks (its count for a file of two
    towers), 4 x the width as the MLPs' (8 heads where the config says none). One line where the processor's size
    has no height (the converter stops on it)."""
    processor = processor_config(where.parent)
    size = processor.get("size", {"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    if not isinstance(size, dict) or "height" not in size:
        raise ConfigMismatchError(
            f"{where.parent / 'preprocessor_config.json'}: the image processor's size ({size}) has no height, which "
            "llama.cpp's gemma3nv takes as the image's; save Gemma 3n's own processor beside the model"
        )
    image = size["height"]
    return {
        **vision,
        "image_size": image,
        "patch_size": image // processor.get("image_seq_length", IMAGE_TOKENS),
        "intermediate_size": vision.get("intermediate_size", 2048) * 4,
        "num_hidden_layers": 128,
        "num_attention_heads": vision.get("num_attention_heads", 8),
    }


def gemma3n_audio_sizes(config: dict, where: Path) -> dict | None:
    """The Conformer's sizes under the names the converter gives them (its MLPs' width 6144 where the config says
    none)."""
    audio = config.get("audio_config")
    if not audio:
        return None
    return {
        **audio,
        "intermediate_size": audio.get("intermediate_size", 6144),
        "num_hidden_layers": audio.get("conf_num_hidden_layers"),
        "num_attention_heads": audio.get("conf_num_attention_heads"),
    }


def gemma3n_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The vision tower's norm epsilon as the converter reads it (a key Gemma 3n's config has not: 1e-6); the audio
    tower's projector, mel bins and norm epsilon (1e-5, fixed in the converter)."""
    writer.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
    audio = hparams.get("audio_config")
    if audio:
        writer.add_clip_audio_projector_type(gguf_py().VisionProjectorType.GEMMA3NA)
        writer.add_audio_num_mel_bins(audio["input_feat_size"])
        writer.add_audio_attention_layernorm_eps(1e-5)


def gemma3n_tower_name(name: str) -> str:
    """The name the converter maps: the Conformer's layers as conformer.layers.<n>, the subsampling's norms as Gemma
    4's; MobileNetV5's blocks by llama.cpp's names (their two indices), a part it does not know left as it is (then one
    line: no name in the file)."""
    if any(word in name for word in AUDIO_WORDS):
        if norm := SUBSAMPLING_NORM.match(name):  # (gguf-py names Gemma 4's alone: the same place in its tower)
            return f"conformer.subsample_conv_projection.layer{norm[1]}.norm.{norm[2]}"
        return name.replace("model.audio_tower.conformer.", "conformer.layers.")
    block = MOBILENET_BLOCK.match(name)
    if block and block[3] in MOBILENET_PARTS:
        return f"v.blk.{block[1]}.{block[2]}.{block[3]}"
    return name


def gemma3n_forced_type(gguf, source: str, name: str, shape: tuple[int, ...], qtype, file_type: str):
    """The converter's Gemma3nVisionAudioModel's: the projections of the towers' inputs in F16 (the audio subsampling's,
    whatever the file's type), the vision stem in F32, the audio tower's convolutions in F32 (every weight of a name
    holding `_conv`: the whole subsampling), then MmprojModel's; vectors in F32 whatever these say."""
    if len(shape) <= 1:
        return None
    if "input_projection" in source or "input_proj" in source:
        return gguf.GGMLQuantizationType.F16
    if ".embeddings." in source or "stem" in source:
        return gguf.GGMLQuantizationType.F32
    audio = any(word in source for word in AUDIO_WORDS)
    if audio and (".conv" in source or "_conv" in source and source.endswith(".weight")):
        return gguf.GGMLQuantizationType.F32
    return mmproj_model_forced_type(gguf, source, name, shape, qtype, file_type)


def gemma3n_rearranged(name: str, shape: tuple[int, ...], sizes: dict) -> Rearrangement | None:
    """The stem's bias and each block's layer scale as the converter means to store them: (1, C, 1, 1), as ggml
    multiplies an image's channels by them (the pinned converter leaves the blocks' vectors, on which mtmd stops)."""
    if name.endswith(("conv_stem.conv.bias", "layer_scale.gamma")):
        return Rearrangement({name: (1, shape[0], 1, 1)}, per_channel, shape[0])
    return None


def per_channel(band) -> tuple:
    return (band.reshape(1, -1, 1, 1),)


GEMMA3N_MMPROJ = MmprojPart(
    "GEMMA3NV",
    TOWERS,
    gemma3n_vision_sizes,
    gemma3n_projector_keys,
    forced_type=gemma3n_forced_type,
    converter_name=gemma3n_tower_name,
    rearranged=gemma3n_rearranged,
    audio_sizes=gemma3n_audio_sizes,
    projector_type_key="clip.vision",
    note=(
        "llama.cpp (mtmd) reads images from Gemma 3n's mmproj file and no sound (it skips the audio encoder's "
        "tensors, which the converter writes); on CPU from an f16 file only (it stops on f32's depthwise "
        "convolutions); and where the text model is as wide as the vision tower (2048, as E2B's: it refuses E4B's)"
    ),
    image_normalisation=UNNORMALISED,
)

FAMILIES = (
    Family(
        "Gemma 3n (text)",
        "gemma3n_text",
        "Gemma3nForCausalLM",
        tensors=NO_TABLE,
        megatron=MEGATRON,
        **no_trainer_model("Gemma 3n"),
        fused_siblings=SIBLINGS,
        gguf=GEMMA3N,
        mmproj=TEXT_ONLY,
        moe_layout=DENSE_ONLY,
    ),
    gguf_family(
        "Gemma 3n",
        "gemma3n",
        "Gemma3nForConditionalGeneration",
        GEMMA3N,
        # (llm-compressor builds the model, its MobileNetV5 tower with timm, which takes torchvision: PyPI's loads
        # beside CUDA's torch alone, and llm-compressor's venv holds the CPU build)
        Unsupported(
            "not written: llm-compressor builds Gemma 3n's vision tower with timm, which takes torchvision's CUDA "
            "build, so it was not compared here"
        ),
        GEMMA3N_MMPROJ,
        tower="its MobileNetV5 and Conformer towers",
    ),
)
