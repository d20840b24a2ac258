"""ERNIE 4.5 (Baidu's dense models): Llama's layout whose rotary turns interleaved pairs, a SentencePiece vocabulary;
llama.cpp's ernie4_5, the converter's TextModel header and the tokenizer's space prefix after the vocabulary. ERNIE 4.5
MoE: dense first layers, then experts and shared ones behind a softmax router that chooses by a correction bias;
llama.cpp's ernie4_5-moe, the experts stacked gate, up, down.

PaddleOCR-VL (`PaddleOCRVLForConditionalGeneration`): ERNIE 4.5's text model with M-RoPE, as llama.cpp's paddleocr,
beside a SigLIP tower with learned positions and 2-D rotary whose patches the projector (`mlp_AR`) merges 2 x 2: the
mmproj file of llama.cpp's paddleocr projector."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import fixed_in_code, json_or_empty, mmproj_model_forced_type, pixel_bounds, text_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY
from .parts import (
    NO_META_NAMES,
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    MmprojPart,
    Unsupported,
    multimodal_family,
)


def ernie_space_prefix(writer, hparams: dict, folder: Path) -> None:
    """Whether the tokenizer puts a space before the text, where tokenizer_config.json says, as the converter."""
    config = json_or_empty(folder / "tokenizer_config.json")
    if "add_prefix_space" in config:
        writer.add_add_space_prefix(config["add_prefix_space"])


def ernie_moe_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Ernie4_5MoeModel's: the TextModel's, then the experts' counts, the MoE layers' step, the dense
    first layers, the experts' width, the shared experts' count and width (intermediate_size over the key-value
    heads, as the converter computes it)."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_expert_count(hparams["moe_num_experts"])
    writer.add_expert_used_count(hparams["moe_k"])
    writer.add_interleave_moe_layer_step(hparams["moe_layer_interval"])
    writer.add_leading_dense_block_count(hparams["moe_layer_start_index"])
    if hparams.get("moe_intermediate_size") is not None:
        writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
    if (shared := hparams.get("moe_num_shared_experts")) is not None:
        writer.add_expert_shared_count(shared)
        if shared > 0 and hparams.get("intermediate_size") and hparams.get("num_key_value_heads"):
            writer.add_expert_shared_feed_forward_length(hparams["intermediate_size"] // hparams["num_key_value_heads"])


def ernie_moe_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's ernie4_5-moe would compute otherwise, or not load: MoE layers that end before the last, shared
    experts of another width than the converter's header says."""
    last = hparams["num_hidden_layers"] - 1
    if hparams.get("moe_layer_end_index", last) not in (last, -1):
        raise ConfigMismatchError(
            f"{where}: moe_layer_end_index is {hparams['moe_layer_end_index']}, and llama.cpp's ernie4_5-moe runs "
            f"experts up to the last layer ({last}); serve this model with transformers or vLLM"
        )
    shared, width = hparams.get("moe_num_shared_experts") or 0, hparams.get("moe_intermediate_size")
    said = hparams["intermediate_size"] // hparams["num_key_value_heads"]
    if shared and width and shared * width != said:
        raise ConfigMismatchError(
            f"{where}: the shared experts are {shared * width} wide, and the converter writes llama.cpp's "
            f"ernie4_5-moe intermediate_size / num_key_value_heads = {said}; llama.cpp could not load the file"
        )


def paddleocr_sizes(vision: dict, where: Path) -> dict:
    """The tower as the converter's PaddleOCRVisionModel reads it (its image size the side of the largest image the
    processor makes), refusing what llama.cpp's paddleocr computes otherwise: 2 x 2 merges, 2-D rotary at 10000,
    GELU (as the tanh approximation, which SigLIP's gelu_pytorch_tanh is), norms at the epsilon the converter writes
    (rms_norm_eps, which SigLIP's config lacks, else 1e-6: not its layer_norm_eps)."""
    runs = {
        "spatial_merge_size": (vision.get("spatial_merge_size", 2), 2),
        "rope_theta": ((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0), 10000.0),
        "hidden_act": (vision.get("hidden_act", "gelu_pytorch_tanh"), "gelu_pytorch_tanh"),
        "layer_norm_eps": (vision.get("layer_norm_eps", 1e-6), vision.get("rms_norm_eps", 1e-6)),
    }
    fixed_in_code(where, "vision", "paddleocr projector", runs)
    processor = where.parent / "preprocessor_config.json"
    return {**vision, "image_size": int(pixel_bounds(json_or_empty(processor), processor)[1] ** 0.5)}


def paddleocr_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The largest and smallest images in pixels, GELU, the tower's norms' epsilon."""
    smallest, largest = pixel_bounds(processor, Path("preprocessor_config.json"))
    writer.add_vision_max_pixels(largest)
    writer.add_vision_min_pixels(smallest)
    writer.add_vision_use_gelu(True)
    writer.add_vision_attention_layernorm_eps(vision.get("rms_norm_eps", 1e-6))


def paddleocr_name(name: str) -> str:
    """The tower under the name the converter maps it by (`visual.` as `model.`)."""
    return name.replace("visual.", "model.", 1) if name.startswith("visual.") else name


PADDLEOCR_MMPROJ = MmprojPart(
    "PADDLEOCR",
    r"^(?:model\.)?(?:visual|mlp_AR)\.",
    paddleocr_sizes,
    paddleocr_projector_keys,
    forced_type=mmproj_model_forced_type,
    converter_name=paddleocr_name,
)


FAMILIES = (
    Family(
        "ERNIE 4.5",
        "ernie4_5",
        "Ernie4_5ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's ERNIE 4.5 layout is not mapped yet"),
        meta_names=NO_META_NAMES,
        fused_siblings=SIBLINGS,
        gguf=GGUFPart("ERNIE4_5", after_vocabulary=ernie_space_prefix),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
        also=("Ernie4_5_ForCausalLM",),  # (Baidu's own class, as its releases' configs name it)
    ),
    Family(
        "ERNIE 4.5 MoE",
        "ernie4_5_moe",
        "Ernie4_5_MoeForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's ERNIE 4.5 MoE layout is not mapped yet"),
        meta_names=NO_META_NAMES,
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "ERNIE4_5_MOE",
            hyperparameters=ernie_moe_hyperparameters,
            after_vocabulary=ernie_space_prefix,
            check_config=ernie_moe_checked,
            expert_stack_order=("gate_proj.weight", "up_proj.weight", "down_proj.weight"),
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    ),
    multimodal_family(
        "PaddleOCR-VL",
        "paddleocr_vl",
        "PaddleOCRVLForConditionalGeneration",
        GGUFPart("PADDLEOCR", after_vocabulary=ernie_space_prefix),
        PADDLEOCR_MMPROJ,
        "its SigLIP tower and mlp_AR projector",
    ),
)
