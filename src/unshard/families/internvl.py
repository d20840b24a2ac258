"""InternVL (`InternVLForConditionalGeneration`, transformers' own classes, as the Hub's -hf releases of InternVL3 and
InternVL3.5): a Qwen2 or Qwen3 beside InternViT (a class token, learned positions, layer scales), whose patches a
pixel shuffle merges 2 x 2 into a LayerNorm and a GELU MLP. The text model as llama.cpp's qwen2 or qwen3, the tower
and the projector as the mmproj file of llama.cpp's internvl projector, under the names the converter maps (its
Intern-S1 names: the tower under `model.`, the projector as InternVL's remote code named it, `mlp1`)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import fixed_in_code, mmproj_model_forced_type
from .parts import GGUFPart, MmprojPart, multimodal_family

# InternViT-6B's sizes, which llama.cpp's internvl alone norms by RMS (and its q and k): the smaller towers by LayerNorm
INTERN_VIT_6B = (3200, 45)


def internvl_checked(hparams: dict, where: Path) -> None:
    """A text model unshard writes (Qwen2 or Qwen3), and the features llama.cpp's internvl takes: the tower's last
    layer without its class token, pixel-shuffled by a whole factor, through a GELU MLP."""
    found = hparams.get("model_type")
    if found not in ("qwen2", "qwen3"):
        raise ConfigMismatchError(
            f"{where}: text_config's model_type is {found!r}, and unshard writes InternVL's text model as a Qwen2 or "
            "a Qwen3; write a folder and use llama.cpp's convert_hf_to_gguf.py"
        )
    ratio = hparams.get("downsample_ratio", 0.5)
    runs = {
        "vision_feature_layer": (hparams.get("vision_feature_layer", -1), -1),
        "vision_feature_select_strategy": (hparams.get("vision_feature_select_strategy", "default"), "default"),
        "projector_hidden_act": (hparams.get("projector_hidden_act", "gelu"), "gelu"),
        "downsample_ratio": (ratio, 1 / round(1 / ratio)),
    }
    fixed_in_code(where, "vision", "internvl projector", runs)


def internvl_sizes(vision: dict, where: Path) -> dict:
    """The tower as the converter's InternVisionModel reads it (its image and patch sides, where the config gives
    both), refusing what llama.cpp's internvl computes otherwise: InternViT-6B's norms by RMS with q and k normed,
    every smaller tower's by LayerNorm without; GELU or SiLU."""
    six_b = (vision.get("hidden_size"), vision.get("num_hidden_layers")) == INTERN_VIT_6B
    runs = {
        "norm_type": (vision.get("norm_type", "layer_norm"), "rms_norm" if six_b else "layer_norm"),
        "use_qk_norm": (vision.get("use_qk_norm", False), six_b),
        "hidden_act": (
            vision.get("hidden_act", "gelu"),
            vision.get("hidden_act") if vision.get("hidden_act") in ("gelu", "silu") else "gelu",
        ),
    }
    fixed_in_code(where, "vision", "internvl projector", runs)
    side = {
        key: vision[key][0] if isinstance(vision.get(key), list) else vision.get(key)
        for key in ("image_size", "patch_size")
    }
    return {**vision, **side}


def internvl_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The converter's InternVisionModel's: the tower's norms' epsilon, its activation, the pixel shuffle's factor."""
    writer.add_vision_attention_layernorm_eps(vision["layer_norm_eps"])
    if vision.get("hidden_act", "gelu") == "silu":
        writer.add_vision_use_silu(True)
    else:
        writer.add_vision_use_gelu(True)
    writer.add_vision_projector_scale_factor(int(1.0 / hparams.get("downsample_ratio", 0.5)))


# the projector's layers as InternVL's remote code named them, which gguf-py maps (mlp1.N)
PROJECTOR_LAYERS = {"layer_norm": "mlp1.0", "linear_1": "mlp1.1", "linear_2": "mlp1.3"}


def internvl_name(name: str) -> str:
    """A tensor's name as the converter maps it: the tower under `model.` (Intern-S1's names, which gguf-py maps), the
    projector's layers as `mlp1.N`, and `.weight` after the layer scales and the position embeddings."""
    name = name.removeprefix("model.")
    if name.startswith("multi_modal_projector."):
        layer, suffix = name.removeprefix("multi_modal_projector.").split(".", 1)
        return f"{PROJECTOR_LAYERS.get(layer, layer)}.{suffix}"
    name = "model." + name
    if (".lambda_" in name or "position_embeddings" in name) and not name.endswith(".weight"):
        name += ".weight"
    return name


# the text models unshard writes beside the tower, as llama.cpp's converter writes them alone
TEXT_MODELS = {arch.lower(): GGUFPart(arch, check_config=internvl_checked) for arch in ("QWEN2", "QWEN3")}

INTERNVL_MMPROJ = MmprojPart(
    "INTERNVL",
    r"^(?:model\.)?(?:vision_tower|multi_modal_projector)\.",
    internvl_sizes,
    internvl_projector_keys,
    forced_type=mmproj_model_forced_type,
    converter_name=internvl_name,
    note=(
        "llama.cpp's internvl puts the class token after the patches and adds the learned positions in their order, "
        "so that each patch takes the row before its own (transformers gives the class token the first): its image "
        "features are a few percent from transformers'"
    ),
)

FAMILIES = (
    multimodal_family(
        "InternVL",
        "internvl",
        "InternVLForConditionalGeneration",
        GGUFPart("QWEN2", check_config=internvl_checked, text_models=tuple(TEXT_MODELS.items())),
        INTERNVL_MMPROJ,
        "its InternViT tower",
    ),
)
