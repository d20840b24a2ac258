"""EXAONE 3 and 3.5 (LG AI Research's `ExaoneForCausalLM`, which transformers 5 builds as a Llama and saves under LG's
own names, `transformer.h.N.attn.attention...`): llama.cpp's exaone, as the converter's ExaoneModel writes it (the
TextModel's header with the rotary width, Llama 3's rope factors; q and k as they are, llama.cpp's exaone turning
halves). The converter reads LG's config keys (`activation_function`), which transformers 5 saves otherwise
(`hidden_act`): unshard reads either.

EXAONE 4 (LG AI Research's): q and k normed per head, norms after attention and after the MLP, three sliding-window
layers to each global one; llama.cpp's exaone4, whose converter writes the TextModel's header, the vocabulary's size
and the sliding window's pattern.

EXAONE MoE (K-EXAONE): EXAONE 4's attention (q and k normed per head, rope on the sliding-window layers alone) with
norms before attention and the MLP, dense first layers, then DeepSeek-V3's experts (a sigmoid router choosing by a
correction bias, a shared expert, the routing scaled and renormalised); llama.cpp's exaone-moe. The config counts MTP
layers, which a trained checkpoint lacks (transformers drops them); the converter's file has blocks for them all the
same, and llama.cpp's exaone-moe loads no file without their tensors, so unshard's file has no MTP layers.

EXAONE 4.5 (`Exaone4_5_ForConditionalGeneration`): EXAONE 4's text model (a block for each MTP layer its config counts)
beside a Qwen2.5-VL-style vision tower, which the text model's file leaves out (gguf-py 0.19 has no projector type for
its mmproj file)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import (
    gguf_py,
    mmproj_model_forced_type,
    pixel_bounds,
    rope_parameters,
    routed_by_sigmoid,
    text_hyperparameters,
    with_leading_dense_layers,
)
from .llama import SIBLINGS, TEXT_ONLY, llama_computed
from .parts import (
    DEFAULT_FUSED_SIBLINGS,
    LLAMA_CPP_GGUF_PY,
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    MmprojPart,
    Rearrangement,
    Unsupported,
    no_trainer_model,
)
from .vlm import qwen2vl_sizes, qwen25vl_sizes, qwen_vision_split


def sliding_pattern(hparams: dict) -> list[bool] | None:
    """Which layers have the sliding window, as the converter reads it: the config's layer types, else its pattern
    (a string such as LLLG, or every Nth layer global)."""
    if "layer_types" in hparams:
        return [kind == "sliding_attention" for kind in hparams["layer_types"]]
    pattern, layers = hparams.get("sliding_window_pattern"), hparams["num_hidden_layers"]
    if isinstance(pattern, str) and pattern:
        return [pattern[i % len(pattern)] == "L" for i in range(layers)]
    if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern:
        return [(i + 1) % pattern != 0 for i in range(layers)]
    return None


def exaone_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's ExaoneModel's: the TextModel's, then the rotary width (a fraction of hidden_size / heads)."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    factor = rope_parameters(hparams)[0].get("partial_rotary_factor")
    factor = 1.0 if factor is None else factor
    writer.add_rope_dimension_count(int(factor * (hparams["hidden_size"] // hparams["num_attention_heads"])))


def exaone_checked(hparams: dict, where: Path) -> None:
    """A SiLU MLP, the one llama.cpp's exaone runs (and the converter asserts), under either config's key for it."""
    found = hparams.get("activation_function", hparams.get("hidden_act", "silu"))
    if found != "silu":
        raise ConfigMismatchError(
            f"{where}: the MLP's activation is {found!r}, and llama.cpp's exaone runs SiLU; serve this model with "
            "transformers or vLLM"
        )


def exaone4_hyperparameters(
    writer, hparams: dict, ftype, blocks: int, folder: Path, expert_groups: bool = False
) -> None:
    """The converter's Exaone4Model's: the TextModel's, the vocabulary's size, the sliding window and its layers."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder, expert_groups)
    writer.add_vocab_size(hparams["vocab_size"])
    if hparams.get("sliding_window") is not None:
        writer.add_sliding_window(hparams["sliding_window"])
        pattern = sliding_pattern(hparams)
        if pattern is not None and len(pattern) == hparams["num_hidden_layers"]:
            writer.add_sliding_window_pattern(pattern)


def exaone45_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Exaone4_5_TextModel's: EXAONE 4's, then the MTP layers' count where the config has some."""
    exaone4_hyperparameters(writer, hparams, ftype, blocks, folder)
    if int(hparams.get("num_nextn_predict_layers") or 0) > 0:
        writer.add_nextn_predict_layers(hparams["num_nextn_predict_layers"])


def exaone4_checked(hparams: dict, where: Path) -> None:
    """llama.cpp's exaone4 has sliding windows for the 32B model's 64 layers alone (every fourth layer global, without
    rope); for any other depth it runs every layer global with rope, where transformers would not."""
    pattern = sliding_pattern(hparams) if hparams.get("sliding_window") is not None else None
    if pattern and any(pattern) and hparams["num_hidden_layers"] != 64:
        raise ConfigMismatchError(
            f"{where}: a sliding window on {hparams['num_hidden_layers']} layers, which llama.cpp's exaone4 runs as "
            "global layers with rope (it has sliding windows for 64 layers alone): it would compute another model; "
            "serve this one with transformers or vLLM"
        )


def exaone_moe_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's ExaoneMoEModel's: EXAONE 4's (routed by a sigmoid, as transformers routes whatever the config
    says), then the experts' widths and count, the routing's scale and renormalisation, the dense first layers (as
    transformers counts them), no MTP layers (the module's docstring says why), and no rope scaling."""
    where = folder / "config.json"
    hparams = with_leading_dense_layers(routed_by_sigmoid(hparams, where), where, "exaone-moe")
    exaone4_hyperparameters(writer, hparams, ftype, blocks, folder, expert_groups=True)
    width, shared = hparams["moe_intermediate_size"], hparams["num_shared_experts"]
    writer.add_expert_feed_forward_length(width)
    writer.add_expert_shared_count(shared)
    writer.add_expert_shared_feed_forward_length(width * shared)
    writer.add_expert_weights_scale(hparams["routed_scaling_factor"])
    writer.add_expert_weights_norm(hparams["norm_topk_prob"])
    writer.add_leading_dense_block_count(hparams["first_k_dense_replace"])
    writer.add_nextn_predict_layers(0)
    writer.add_rope_scaling_type(gguf_py().RopeScalingType.NONE)


def exaone_moe_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's exaone-moe would compute otherwise than transformers: the experts chosen within groups (it has
    no groups), a rope scaling (the converter writes none)."""
    if (hparams.get("topk_group") or 1) < (hparams.get("n_group") or 1):
        raise ConfigMismatchError(
            f"{where}: the experts are chosen within {hparams['topk_group']} of {hparams['n_group']} groups, and "
            "llama.cpp's exaone-moe chooses among all: it would compute another model; serve this one with "
            "transformers or vLLM"
        )
    rope_type = rope_parameters(hparams)[1].get("rope_type")
    if rope_type not in (None, "default", "llama3"):
        raise ConfigMismatchError(
            f"{where}: rope type {rope_type!r}, and llama.cpp's converter writes EXAONE MoE without rope scaling: it "
            "would compute another model; serve this one with transformers or vLLM"
        )


def exaone45_sizes(vision: dict, where: Path) -> dict:
    """Qwen2-VL's tower's sizes, and Qwen2.5-VL's window pattern (every n-th block whole) where it has one."""
    return (qwen25vl_sizes if vision.get("fullatt_block_indexes") else qwen2vl_sizes)(vision, where)


def exaone45_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The converter's Exaone4_5VisionModel's: SiLU, the image processor's pixel bounds, the tower's key-value heads
    (its attention is grouped), its norms' epsilon, the window and its pattern."""
    writer.add_vision_use_silu(True)
    smallest, largest = pixel_bounds(processor, Path("preprocessor_config.json"))
    writer.add_vision_min_pixels(smallest)
    writer.add_vision_max_pixels(largest)
    if vision.get("num_key_value_heads") is not None:
        writer.add_vision_head_count_kv(vision["num_key_value_heads"])
    writer.add_vision_attention_layernorm_eps(vision.get("rms_norm_eps", hparams.get("rms_norm_eps", 1e-6)))
    if vision.get("window_size") is not None:
        writer.add_vision_window_size(vision["window_size"])
    if vision.get("fullatt_block_indexes"):
        writer.add_vision_n_wa_pattern(vision["fullatt_block_indexes"][0] + 1)


def exaone45_patches(name: str, shape: tuple[int, ...], vision: dict) -> Rearrangement | None:
    """Qwen2-VL's Conv3D patch embedding as one 2-D convolution per frame; each block's qkv kept whole (its
    attention grouped, as llama.cpp's exaone4_5 reads it)."""
    return None if ".attn.qkv." in name else qwen_vision_split(name, shape, vision)


def exaone45_tower_name(name: str) -> str:
    """The tower's names as the converter maps them: without `model.`."""
    return name.replace("model.visual.", "visual.", 1)


EXAONE45_MMPROJ = MmprojPart(
    "EXAONE4_5",
    r"^(?:model\.)?visual\.",
    exaone45_sizes,
    exaone45_projector_keys,
    forced_type=mmproj_model_forced_type,
    converter_name=exaone45_tower_name,
    rearranged=exaone45_patches,
)
FAMILIES = (
    Family(
        "EXAONE 3",
        "exaone",
        "ExaoneForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's EXAONE 3 layout is not mapped yet"),
        **no_trainer_model("EXAONE 3"),
        # (its MLP saved as c_fc_0 and c_fc_1, siblings SIBLINGS does not name)
        fused_siblings=Unsupported(
            "not yet compared with what llm-compressor writes for EXAONE 3 (its pinned transformers has none)"
        ),
        gguf=GGUFPart(
            "EXAONE", hyperparameters=exaone_hyperparameters, computed=llama_computed, check_config=exaone_checked
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
    Family(
        "EXAONE 4",
        "exaone4",
        "Exaone4ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's EXAONE 4 layout (norms after attention and the MLP) is not mapped yet"),
        **no_trainer_model("EXAONE 4"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "EXAONE4",
            hyperparameters=exaone4_hyperparameters,
            computed=llama_computed,
            check_config=exaone4_checked,
            vocabulary="bpe",
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
    Family(
        "EXAONE 4.5",
        "exaone4_5",
        "Exaone4_5_ForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's EXAONE 4.5 layout is not mapped yet"),
        **no_trainer_model("EXAONE 4.5"),
        fused_siblings=DEFAULT_FUSED_SIBLINGS,
        notes={"mmproj": LLAMA_CPP_GGUF_PY.format(arch="its exaone4_5 projector")},
        gguf=GGUFPart(
            "EXAONE4",
            hyperparameters=exaone45_hyperparameters,
            computed=llama_computed,
            check_config=exaone4_checked,
            vocabulary="bpe",
            extra_blocks="num_nextn_predict_layers",
        ),
        mmproj=EXAONE45_MMPROJ,
        moe_layout=NOT_A_MOE_INPUT,
    ),
    Family(
        "EXAONE MoE",
        "exaone_moe",
        "ExaoneMoeForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's EXAONE MoE layout is not mapped yet"),
        **no_trainer_model("EXAONE MoE"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "EXAONE_MOE",
            hyperparameters=exaone_moe_hyperparameters,
            computed=llama_computed,
            check_config=exaone_moe_checked,
            vocabulary="bpe",
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        also=("ExaoneMoEForCausalLM",),  # (LG's own class, as its releases' configs name it)
    ),
)
