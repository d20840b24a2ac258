"""DeepSeek-OCR's layout, in transformers' two classes of it: Unlimited-OCR (`UnlimitedOcrForConditionalGeneration`;
its makers' code names it `UnlimitedOCRForCausalLM`) and DeepSeek-OCR 2 (`DeepseekOcr2ForConditionalGeneration`;
`DeepseekOCR2ForCausalLM`). A DeepSeek-V2 MoE without latent attention (each head its own keys and values, a softmax
router, shared experts) beside SAM, whose neck's output a second tower reads as its patches: Unlimited-OCR's a CLIP,
its output joined to SAM's; DeepSeek-OCR 2's a Qwen2 encoder that reads learned queries after the patches, whose
outputs it keeps. A linear projector to the text model's width. transformers saves them under their makers' names
(`model.sam_model.`, `model.vision_model.` with CLIP's q, k and v in one `qkv_proj`, `model.qwen2_model.`), which
llama.cpp's converter reads; but it reads its makers' config.json, not transformers': the text model's keys in
DeepSeek-V2's form (`language_config`: latent attention off, no rope base, its dense first layers counted), the towers'
sizes in a `width` table. What the converter would write of that config, unshard writes of transformers'
(as_the_makers_config, the families' sizes): the text model as llama.cpp's deepseek2-ocr (DeepSeek-OCR 2's as the
converter writes DeepSeek-OCR's class: its table lacks OCR 2's for a text model's file), the towers as the mmproj file
of its deepseekocr projector (Unlimited-OCR's, tiling images into up to 32 tiles) or deepseekocr2 (OCR 2's, up to 6)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from ..errors import ConfigMismatchError
from .deepseek import deepseek2_hyperparameters
from .gguf_hooks import mmproj_model_forced_type, rope_parameters
from .parts import LLAMA_CPP_GGUF_PY, GGUFPart, MmprojPart, Rearrangement, multimodal_family

# the chat template the converter writes as it opens the file, which the tokenizer's replaces where there is one
PLAIN_TEMPLATE = "{% for m in messages %}{{m['content']}}{% endfor %}"
# the SAM layers llama.cpp's deepseekocr attends globally in (the rest in windows of 14 patches): SAM ViT-B's
SAM_GLOBAL_LAYERS = (2, 5, 8, 11)
# what llama.cpp's deepseekocr (and deepseekocr2) takes of SAM and CLIP whatever the file says, as the makers' sizes: a
# setting of transformers' config it would compute otherwise is refused (for SAM's global layers, those of its depth)
SAM_FIXED = {"window_size": 14, "patch_size": 16, "image_size": 1024, "layer_norm_eps": 1e-6, "hidden_act": "gelu"}
CLIP_FIXED = {"layer_norm_eps": 1e-5, "hidden_act": "quick_gelu"}
# (DeepSeek-OCR 2's Qwen2 encoder: the converter writes 2 key-value heads, and llama.cpp turns it by 1000000)
QWEN2_ENCODER_FIXED = {
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "use_sliding_window": False,
    "rope_theta": 1000000,
}
# the names of the converter's tensors it stores as F32 whatever the file's type (its tensor_force_quant's)
F32_PARTS = (".embeddings.", "pos_embed", ".rel_pos_h", ".rel_pos_w", ".neck.", ".net_")


def opening_template(writer, hparams: dict) -> None:
    writer.add_chat_template(PLAIN_TEMPLATE)


def as_the_makers_config(hparams: dict, where: Path) -> dict:
    """The text model's config as the converter reads the makers' (DeepSeek-OCR's language_config): DeepSeek-V2's
    keys, latent attention off (no latent ranks, no rotary part of its own), the router's softmax named, no rope base
    and no head width (llama.cpp's deepseek2-ocr takes 10000 and the hidden size over the heads); the dense first
    layers counted, from transformers' list of the layers' MLPs."""
    theta = rope_parameters(hparams)[1].get("rope_theta", 10000.0)
    if theta != 10000:
        raise ConfigMismatchError(
            f"{where}: text_config's rope base is {theta}, and llama.cpp's deepseek2-ocr turns by 10000 alone (it "
            "stops on another; the makers' config names none); serve this model with transformers or vLLM"
        )
    kinds = hparams.get("mlp_layer_types") or []
    dense = next((i for i, kind in enumerate(kinds) if kind != "dense"), len(kinds))
    if any(kind == "dense" for kind in kinds[dense:]):
        raise ConfigMismatchError(
            f"{where}: mlp_layer_types has dense layers after MoE ones, which llama.cpp's deepseek2-ocr (dense layers "
            "first only) cannot hold; serve this model with transformers or vLLM"
        )
    dropped = ("head_dim", "rope_parameters", "rope_scaling", "rope_theta")
    makers = {key: value for key, value in hparams.items() if key not in dropped}
    return {
        **makers,
        "first_k_dense_replace": dense,
        "use_mla": False,
        "q_lora_rank": None,
        "kv_lora_rank": None,
        "qk_nope_head_dim": 0,
        "qk_rope_head_dim": 0,
        "v_head_dim": 0,
        "scoring_func": "softmax",
        "norm_topk_prob": False,
    }


def ocr_text_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's deepseek2-ocr computes otherwise than transformers' DeepSeek-OCR text models: fewer key-value
    heads than heads, routing other than a greedy softmax."""
    heads = hparams.get("num_attention_heads")
    kv_heads = hparams.get("num_key_value_heads", heads)
    refused = [
        (f"{kv_heads} key-value heads of {heads}", kv_heads != heads),
        (f"topk_method {hparams.get('topk_method')!r}", hparams.get("topk_method", "greedy") != "greedy"),
    ]
    said = [what for what, bad in refused if bad]
    if said:
        raise ConfigMismatchError(
            f"{where}: text_config has {said[0]}, and llama.cpp's deepseek2-ocr (each head its own keys and values, "
            "a greedy softmax router) would compute another model; serve this one with transformers or vLLM"
        )


def towers(vision_config: dict, where: Path, projector: str) -> tuple[dict, dict]:
    """SAM's config and the second tower's, SAM's checked: a setting llama.cpp's `projector` takes otherwise (SAM
    ViT-B's, as the makers' sizes; its global layers those of SAM ViT-B's its depth has) is one line."""
    sam, second = vision_config.get("sam_config") or {}, vision_config.get("encoder_config") or {}
    if not sam or not second:
        raise ConfigMismatchError(
            f"{where}: vision_config lacks sam_config or encoder_config, the towers' sizes the mmproj file carries; "
            "pass --config-from the model's own folder"
        )
    layers = sam.get("num_hidden_layers", 12)
    fixed = {**SAM_FIXED, "global_attn_indexes": [i for i in SAM_GLOBAL_LAYERS if i < layers]}
    refused = [(f"sam_config's {key}", value) for key, value in fixed.items() if key in sam]
    refuse_other(sam, refused, where, projector)
    return sam, second


def refuse_other(config: dict, settings: list[tuple[str, Any]], where: Path, projector: str) -> None:
    """One line for the first setting ("its section's key", the value llama.cpp takes) the config gives otherwise."""
    for what, value in settings:
        key = what.rsplit(" ", 1)[-1]
        if key in config and list_or_value(config[key]) != value:
            raise ConfigMismatchError(
                f"{where}: vision_config has {what} {config[key]!r}, where llama.cpp's {projector} takes "
                f"{value!r}: it would compute another model; serve this one with transformers or vLLM"
            )


def unlimited_ocr_sizes(vision_config: dict, where: Path) -> dict:
    """The towers' sizes as the converter reads them from the makers' `width` table: CLIP's (its `clip-l-14-224`
    entry over the rest; its MLP's width four times its heads, as the converter computes it whatever the width, which
    llama.cpp reads from the tensors), SAM's beside. A CLIP setting llama.cpp's deepseekocr takes otherwise (CLIP-L's)
    is one line."""
    sam, clip = towers(vision_config, where, "deepseekocr")
    clip_settings = [(f"encoder_config's {key}", value) for key, value in CLIP_FIXED.items()]
    refuse_other(clip, clip_settings, where, "deepseekocr")
    heads = clip["num_attention_heads"]
    return {
        "image_size": clip["image_size"],
        "patch_size": clip["patch_size"],
        "hidden_size": clip["hidden_size"],
        "intermediate_size": heads * 4,
        "num_hidden_layers": clip["num_hidden_layers"],
        "num_attention_heads": heads,
        "sam": sam,
    }


def ocr2_sizes(vision_config: dict, where: Path) -> dict:
    """The towers' sizes as the converter reads them: SAM's images and patches, the Qwen2 encoder's width (the makers'
    `qwen2-0-5b` entry), depth, heads and MLP's width, SAM's beside. An encoder llama.cpp's deepseekocr2 computes
    otherwise is one line: other than 2 key-value heads, a rope base other than 1000000, a sliding window, norms or
    activation other than Qwen2's."""
    sam, encoder = towers(vision_config, where, "deepseekocr2")
    as_taken = {**encoder, "rope_theta": rope_parameters(encoder)[1].get("rope_theta")}
    as_taken["use_sliding_window"] = bool(encoder.get("use_sliding_window"))
    settings = [(f"encoder_config's {key}", value) for key, value in QWEN2_ENCODER_FIXED.items()]
    refuse_other(as_taken, settings, where, "deepseekocr2")
    return {
        "image_size": sam.get("image_size", 1024),
        "patch_size": sam.get("patch_size", 16),
        "hidden_size": encoder["hidden_size"],
        "intermediate_size": encoder["intermediate_size"],
        "num_hidden_layers": encoder["num_hidden_layers"],
        "num_attention_heads": encoder["num_attention_heads"],
        "sam": sam,
    }


def list_or_value(value):
    return list(value) if isinstance(value, (list, tuple)) else value


def deepseekocr_projector_keys(writer, hparams: dict, vision: dict, processor: dict, max_tiles: int = 32) -> None:
    """The converter's DeepseekOCRVisionModel's keys: SAM's norms' epsilon and GELU (the makers' config names neither:
    its defaults), the projector's scale where the processor's tokens an image and CLIP's patches differ from 4, the
    windows' size (its default, 14), the tiles an image is cut into, SAM's depth, width and heads."""
    writer.add_vision_attention_layernorm_eps(1e-6)
    writer.add_vision_use_gelu(True)
    per_side = int(processor.get("image_seq_length", 256) ** 0.5)
    scale = (vision["image_size"] // vision["patch_size"]) // per_side
    if scale > 0 and scale != 4:
        writer.add_vision_projector_scale_factor(scale)
    writer.add_vision_window_size(SAM_FIXED["window_size"])
    writer.add_vision_preproc_min_tiles(2)
    writer.add_vision_preproc_max_tiles(max_tiles)
    sam = vision["sam"]
    writer.add_vision_sam_layers_count(sam["num_hidden_layers"])
    writer.add_vision_sam_embedding_length(sam["hidden_size"])
    writer.add_vision_sam_head_count(sam["num_attention_heads"])


def deepseekocr2_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The converter's DeepseekOCR2VisionModel's keys: DeepSeek-OCR's, up to 6 tiles, then the encoder's 2 key-value
    heads."""
    deepseekocr_projector_keys(writer, hparams, vision, processor, max_tiles=6)
    writer.add_vision_head_count_kv(QWEN2_ENCODER_FIXED["num_key_value_heads"])


def deepseekocr_forced_type(gguf, source: str, name: str, shape: tuple[int, ...], qtype, file_type: str):
    """SAM's positions and neck, CLIP's embeddings in F32, as the converter forces them; then its MmprojModel's."""
    if any(part in source for part in F32_PARTS):
        return gguf.GGMLQuantizationType.F32
    return mmproj_model_forced_type(gguf, source, name, shape, qtype, file_type)


def deepseekocr_name(name: str) -> str:
    """SAM's positions under a weight's name, as the converter maps them."""
    return name + ".weight" if name.endswith(("pos_embed", "rel_pos_h", "rel_pos_w")) else name


def view_separator_as_row(name: str, shape: tuple[int, ...], sizes: dict) -> Rearrangement | None:
    """The separator between views as a matrix of one row, as the converter stores it."""
    if name.endswith("view_seperator"):
        return Rearrangement({name: (1, *shape)}, one_row, shape[0])
    return None


def one_row(band) -> tuple:
    return (band.reshape(1, -1),)


DEEPSEEKOCR_MMPROJ = MmprojPart(
    "DEEPSEEKOCR",
    r"^model\.(?:sam_model\.|vision_model\.|projector\.|image_newline$|view_seperator$)",
    unlimited_ocr_sizes,
    deepseekocr_projector_keys,
    forced_type=deepseekocr_forced_type,
    converter_name=deepseekocr_name,
    rearranged=view_separator_as_row,
)
DEEPSEEKOCR2_MMPROJ = replace(
    DEEPSEEKOCR_MMPROJ,
    projector="DEEPSEEKOCR2",
    vision=r"^model\.(?:sam_model\.|qwen2_model\.|projector\.|view_seperator$)",
    sizes=ocr2_sizes,
    projector_keys=deepseekocr2_projector_keys,
)
# llama.cpp's deepseek2-ocr, as the converter writes DeepSeek-OCR's class
DEEPSEEK2OCR = GGUFPart(
    "DEEPSEEK2OCR",
    hyperparameters=partial(deepseek2_hyperparameters, latent=False),
    opening_keys=opening_template,
    vocabulary="bpe",
    check_config=ocr_text_checked,
    as_the_converter_reads=as_the_makers_config,
)

FAMILIES = (
    multimodal_family(
        "Unlimited-OCR",
        "unlimited_ocr",
        "UnlimitedOcrForConditionalGeneration",
        DEEPSEEK2OCR,
        DEEPSEEKOCR_MMPROJ,
        "its SAM and CLIP towers",
    ),
    replace(
        multimodal_family(
            "DeepSeek-OCR 2",
            "deepseek_ocr2",
            "DeepseekOcr2ForConditionalGeneration",
            DEEPSEEK2OCR,
            DEEPSEEKOCR2_MMPROJ,
            "its SAM and Qwen2 towers",
        ),
        notes={"mmproj": LLAMA_CPP_GGUF_PY.format(arch="its deepseekocr2 projector")},
    ),
)
