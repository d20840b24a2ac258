"""Hunyuan dense (Tencent's `HunYuanDenseV1ForCausalLM`): Llama's layout with q and k normed per head after rotary,
whose rope the checkpoints label "dynamic" with a fixed NTK `alpha` that stretches the base (transformers turns it
as ntk_alpha); llama.cpp's hunyuan-dense, the converter writing the stretched base with rope unscaled, the context
it takes the model to reach with it (256k), and the first of generation_config.json's ends as the end of turn.

Hunyuan MoE (Hunyuan-A13B, `HunYuanMoEV1ForCausalLM`): that attention, experts behind a renormalised softmax top-k
beside a shared MLP, as llama.cpp's hunyuan-moe; the release's config lists the experts' settings by layer. Its
vocabulary is written from tokenizer.json: the converter reads A13B's only through Tencent's tokenizer code.

HunyuanOCR (`HunYuanVLForConditionalGeneration`): that text model with XD-RoPE (the alpha's rope, its frequencies in
sections by the axes of an image's positions), as llama.cpp's hunyuan_vl, which stretches the base by alpha itself;
its tower (learned positions after a class token's row, patches merged 2 x 2 by a convolution, the image's begin, end,
newline and separator embeddings) as the mmproj file of llama.cpp's hunyuanvl projector."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import (
    fixed_in_code,
    gguf_py,
    gguf_quiet,
    mmproj_model_forced_type,
    pixel_bounds,
    rope_parameters,
    text_hyperparameters,
)
from .llama import SIBLINGS, TEXT_ONLY
from .parts import (
    LLAMA_CPP_GGUF_PY,
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    MmprojPart,
    Rearrangement,
    Unsupported,
    multimodal_family,
    no_trainer_model,
)

NTK_ALPHA = ("dynamic", "xdrope")  # (the rope types the converter takes as a fixed alpha's stretched base)
LONG_CONTEXT = 256 * 1024


def hunyuan_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's HunYuanModel's: the TextModel's (the rope type it passes over), then, for the NTK alpha rope,
    the base stretched by alpha^(d / (d - 2)) as transformers stretches it, rope unscaled, and for "dynamic" the
    256k context."""
    _, rope = rope_parameters(hparams)
    plain = {k: v for k, v in rope.items() if k != "rope_type"}
    text_hyperparameters(writer, {**hparams, "rope_parameters": plain}, ftype, blocks, folder)
    if rope.get("rope_type") in NTK_ALPHA:
        stretched_rope(writer, rope, hparams["head_dim"], default_alpha=50)


def stretched_rope(writer, rope: dict, dim: int, default_alpha: float) -> None:
    """The NTK alpha rope as the converter writes it: the base stretched by alpha^(d / (d - 2)), rope unscaled, and
    for "dynamic" the 256k context."""
    base = rope.get("rope_theta", 10000.0)
    with gguf_quiet():  # (the base and context written again, as the converter does: the second value counts)
        writer.add_rope_freq_base(base * rope.get("alpha", default_alpha) ** (dim / (dim - 2)))
        writer.add_rope_scaling_type(gguf_py().RopeScalingType.NONE)
        writer.add_rope_scaling_factor(1)
        if rope.get("rope_type") == "dynamic":
            writer.add_rope_scaling_orig_ctx_len(LONG_CONTEXT)
            writer.add_context_length(LONG_CONTEXT)


def hunyuan_moe_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's HunYuanMoEModel's: the TextModel's, the shared MLP's width (the config's intermediate_size),
    the experts' width, count routed and shared MLPs (the first of the Hub's per-layer lists, or transformers' one
    value), then the "dynamic" rope stretched from the width of a head as hidden_size over heads."""
    _, rope = rope_parameters(hparams)
    plain = {k: v for k, v in rope.items() if k != "rope_type"}
    text_hyperparameters(writer, {**hparams, "rope_parameters": plain}, ftype, blocks, folder)
    writer.add_expert_shared_feed_forward_length(hparams["intermediate_size"])
    writer.add_expert_feed_forward_length(_first(hparams.get("moe_intermediate_size", hparams["intermediate_size"])))
    writer.add_expert_used_count(_first(hparams["moe_topk"]))
    writer.add_expert_shared_count(_first(hparams.get("num_shared_expert", 1)))
    if rope.get("rope_type") == "dynamic":
        stretched_rope(writer, rope, hparams["hidden_size"] // hparams["num_attention_heads"], default_alpha=1000)


def _first(value):
    """A per-layer list's first value (the Hub's configs list the experts' settings by layer), or the one value."""
    return value[0] if isinstance(value, list) else value


def hunyuan_moe_checked(hparams: dict, where: Path) -> list[str]:
    """What transformers builds and llama.cpp's hunyuan-moe computes alike: every layer's experts of one count, routed
    by one top-k, of the width transformers builds them at (intermediate_size: it reads no moe_intermediate_size), and
    the "dynamic" rope at the one alpha, base, head width and context the converter takes it at. Noted: the
    vocabulary, which the converter reads through Tencent's tokenizer code alone."""
    for key in ("moe_topk", "num_experts", "moe_intermediate_size", "num_shared_expert"):
        values = hparams.get(key)
        if isinstance(values, list) and len(set(values)) > 1:
            raise ConfigMismatchError(
                f"{where}: {key} differs between layers ({values}), and llama.cpp's hunyuan-moe takes one for all; "
                "serve this model with transformers or vLLM"
            )
    width = _first(hparams.get("moe_intermediate_size", hparams["intermediate_size"]))
    if width != hparams["intermediate_size"]:
        raise ConfigMismatchError(
            f"{where}: moe_intermediate_size {width} is not intermediate_size {hparams['intermediate_size']}, which "
            "transformers builds the experts at; fix the config to the checkpoint's experts"
        )
    _, rope = rope_parameters(hparams)
    kind, dim = rope.get("rope_type"), hparams["hidden_size"] // hparams["num_attention_heads"]
    if kind not in (None, "default", "dynamic"):
        raise ConfigMismatchError(
            f"{where}: rope type {kind!r}, which llama.cpp's hunyuan-moe does not compute; serve this model with "
            "transformers or vLLM"
        )
    if kind == "dynamic" and (
        (rope.get("alpha", 1000), rope.get("rope_theta", 10000.0), dim) != (1000, 10000.0, 128)
        or hparams["max_position_embeddings"] not in (32768, LONG_CONTEXT)
    ):
        raise ConfigMismatchError(
            f"{where}: a dynamic (NTK alpha) rope of alpha {rope.get('alpha')} over rope_theta "
            f"{rope.get('rope_theta')}, heads {dim} wide and max_position_embeddings "
            f"{hparams['max_position_embeddings']}; llama.cpp's converter takes it for Hunyuan-A13B's alone (1000, "
            "10000, 128, 32k or 256k); serve this model with transformers or vLLM"
        )
    return [HUNYUAN_MOE_VOCABULARY]


HUNYUAN_MOE_VOCABULARY = (
    "the vocabulary is tokenizer.json's, as the converter writes a byte-level BPE, with the tokenizer's own special "
    "tokens: the converter reads Hunyuan-A13B's only through Tencent's tokenizer code (a tiktoken file), which unshard "
    "does not run, and sets its start token to 127959"
)


def hunyuan_checked(hparams: dict, where: Path) -> None:
    """The rope llama.cpp computes as transformers does: none, or the fixed alpha, from the base and context the
    converter assumes for "dynamic" (10000, 32k or 256k; it stops on any other)."""
    _, rope = rope_parameters(hparams)
    kind = rope.get("rope_type")
    if kind not in (None, "default", *NTK_ALPHA):
        raise ConfigMismatchError(
            f"{where}: rope type {kind!r}, which llama.cpp's hunyuan-dense does not compute; serve this model with "
            "transformers or vLLM"
        )
    if kind == "dynamic" and (
        rope.get("rope_theta", 10000.0) != 10000.0 or hparams["max_position_embeddings"] not in (32768, LONG_CONTEXT)
    ):
        raise ConfigMismatchError(
            f"{where}: a dynamic (NTK alpha) rope over rope_theta {rope.get('rope_theta')} and "
            f"max_position_embeddings {hparams['max_position_embeddings']}; llama.cpp's converter takes it for a "
            "256k context from 10000 and 32k or 256k only; serve this model with transformers or vLLM"
        )
    if hparams.get("head_dim") is None:
        raise ConfigMismatchError(f"{where}: no head_dim, which llama.cpp's converter stretches the rope base by")


def hunyuan_end_tokens(writer, hparams: dict, folder: Path) -> None:
    """The converter's fix of the end tokens: the first of generation_config.json's ends (where it lists two or more)
    as the end of turn. (It would also take the config's eod_token_id for the end of text, but the transformers it
    pins, 4.57, drops that key of a Hunyuan config: its files keep the config's end of text, and so do unshard's.)"""
    generation = folder / "generation_config.json"
    if generation.is_file():
        try:
            ends = json.loads(generation.read_text()).get("eos_token_id")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigMismatchError(f"{generation}: not valid JSON ({e}); fix or remove it") from None
        if isinstance(ends, list) and len(ends) >= 2:
            writer.add_eot_token_id(ends[0])


def hunyuan_vl_end_tokens(writer, hparams: dict, folder: Path) -> None:
    """The converter's fix of the end tokens, with the end of text as the text config's eod_token_id, which it reads
    of HunyuanOCR's config (its pinned transformers does not know the model, and keeps every key)."""
    if hparams.get("eod_token_id") is not None:
        with gguf_quiet():  # (written again over the tokenizer's, in its place, as the converter does)
            writer.add_eos_token_id(hparams["eod_token_id"])
    hunyuan_end_tokens(writer, hparams, folder)


def hunyuan_vl_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's HunyuanVLTextModel's: the TextModel's (M-RoPE's sections, the base as the config says it,
    unstretched), then XD-RoPE's alpha, which llama.cpp's hunyuan_vl stretches the base by, rope unscaled, and the
    config's context as the one it was trained at."""
    _, rope = rope_parameters(hparams)
    plain = {k: v for k, v in rope.items() if k != "rope_type"}
    text_hyperparameters(writer, {**hparams, "rope_parameters": plain}, ftype, blocks, folder)
    if rope.get("rope_type") not in NTK_ALPHA or "mrope_section" not in rope:
        return
    writer.add_rope_scaling_type(gguf_py().RopeScalingType.NONE)
    writer.add_rope_scaling_factor(float(rope.get("factor", 1)))
    writer.add_rope_scaling_alpha(float(rope["alpha"]))
    writer.add_rope_scaling_orig_ctx_len(int(hparams["max_position_embeddings"]))


def hunyuan_vl_checked(hparams: dict, where: Path) -> None:
    """XD-RoPE as llama.cpp's hunyuan_vl computes it: the fixed alpha's rope in sections (or none at all)."""
    _, rope = rope_parameters(hparams)
    kind = rope.get("rope_type")
    if kind not in (None, "default") and not (kind in NTK_ALPHA and rope.get("alpha") and "mrope_section" in rope):
        raise ConfigMismatchError(
            f"{where}: rope type {kind!r} without XD-RoPE's alpha and sections, which llama.cpp's hunyuan_vl does not "
            "compute; serve this model with transformers or vLLM"
        )


def hunyuan_vl_sizes(vision: dict, where: Path) -> dict:
    """The tower as the converter's HunyuanVLVisionModel reads it (its largest image as the image size), refusing what
    llama.cpp's hunyuanvl computes otherwise: GELU, 2 x 2 merges."""
    runs = {
        "hidden_act": (vision.get("hidden_act", "gelu"), "gelu"),
        "spatial_merge_size": (vision.get("spatial_merge_size", 2), 2),
    }
    fixed_in_code(where, "vision", "hunyuanvl projector", runs)
    return {"image_size": vision.get("max_image_size", 2048), **vision}


def hunyuan_vl_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """GELU, the tower's norms' epsilon, the merge, and the image processor's smallest and largest images in pixels
    (the Hub's min_pixels and max_pixels, which transformers 5 saves as the size's shortest and longest edge)."""
    writer.add_vision_use_gelu(True)
    writer.add_vision_attention_layernorm_eps(vision.get("rms_norm_eps", 1e-5))
    writer.add_vision_spatial_merge_size(vision.get("spatial_merge_size", 2))
    smallest, largest = pixel_bounds(processor, Path("preprocessor_config.json"))
    writer.add_vision_min_pixels(smallest)
    writer.add_vision_max_pixels(largest)


def without_class_row(name: str, shape: tuple[int, ...], vision: dict) -> Rearrangement | None:
    """The position embeddings without the class token's row (the first), as the converter stores them: llama.cpp
    resizes the patches' grid alone."""
    if name.endswith("position_embedding.weight"):
        return Rearrangement({name: (shape[0] - 1, *shape[1:])}, lambda band: (band[1:],), rows_per_band=shape[0])
    return None


def projection_convolutions_forced_type(gguf, source: str, name: str, shape: tuple[int, ...], qtype, file_type: str):
    """The converter's: the merging convolution's and the projection's kernels (mm.0, mm.2) in F16 in an f16 file,
    else F32; then MmprojModel's."""
    if name.startswith(("mm.0.", "mm.2.")) and name.endswith(".weight"):
        return gguf.GGMLQuantizationType.F16 if file_type == "f16" else gguf.GGMLQuantizationType.F32
    return mmproj_model_forced_type(gguf, source, name, shape, qtype, file_type)


HUNYUANVL_MMPROJ = MmprojPart(
    "HUNYUANVL",
    r"^(?:model\.)?vit\.",
    hunyuan_vl_sizes,
    hunyuan_vl_projector_keys,
    forced_type=projection_convolutions_forced_type,
    rearranged=without_class_row,
    note=(
        "llama.cpp's hunyuanvl samples the tower's learned positions off their grid (bilinearly, at a scale of "
        "(grid + 0.1) / grid, as Tencent's code asks of torch), where transformers takes them as they are at the "
        "tower's own size: its image features are about 2e-3 from transformers'"
    ),
)


def hy_v3_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's HYV3Model's: the TextModel's, the experts' and the shared experts' widths, the routing's
    renormalisation and scale, the sigmoid router, the MTP layers' count where the config has some. (llama.cpp tells
    the dense layers by their tensors.)"""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    width = hparams["moe_intermediate_size"]
    writer.add_expert_feed_forward_length(width)
    writer.add_expert_shared_feed_forward_length(width * hparams.get("num_shared_experts", 1))
    writer.add_expert_weights_norm(hparams.get("route_norm", True))
    writer.add_expert_weights_scale(float(hparams.get("router_scaling_factor", 1.0)))
    writer.add_expert_gating_func(gguf_py().ExpertGatingFuncType.SIGMOID)
    if int(hparams.get("num_nextn_predict_layers", 0)) > 0:
        writer.add_nextn_predict_layers(int(hparams["num_nextn_predict_layers"]))


FAMILIES = (
    Family(
        "Hunyuan (dense)",
        "hunyuan_v1_dense",
        "HunYuanDenseV1ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Hunyuan layout is not mapped yet"),
        **no_trainer_model("Hunyuan"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "HUNYUAN_DENSE",
            hyperparameters=hunyuan_hyperparameters,
            check_config=hunyuan_checked,
            vocabulary="bpe",
            after_vocabulary=hunyuan_end_tokens,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
    Family(
        "Hunyuan (MoE)",
        "hunyuan_v1_moe",
        "HunYuanMoEV1ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Hunyuan layout is not mapped yet"),
        **no_trainer_model("Hunyuan"),
        # (compared by hand with llm-compressor 0.14: it stops on the release's per-layer list of the experts' width)
        fused_siblings=Unsupported(
            "not written: llm-compressor 0.14 stops on Hunyuan-A13B's config (its experts' width a list by layer), so "
            "there is no file to be exact against"
        ),
        gguf=GGUFPart(
            "HUNYUAN_MOE",
            hyperparameters=hunyuan_moe_hyperparameters,
            check_config=hunyuan_moe_checked,
            vocabulary="bpe",
            expert_stack_order=("down_proj.weight", "gate_proj.weight", "up_proj.weight"),
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    ),
    Family(
        "Hy3",
        "hy_v3",
        "HYV3ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Hy3 layout is not mapped yet"),
        **no_trainer_model("Hy3"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "HY_V3", hyperparameters=hy_v3_hyperparameters, vocabulary="bpe", extra_blocks="num_nextn_predict_layers"
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="hy_v3")},
    ),
    multimodal_family(
        "HunyuanOCR",
        "hunyuan_vl",
        "HunYuanVLForConditionalGeneration",
        GGUFPart(
            "HUNYUAN_VL",
            hyperparameters=hunyuan_vl_hyperparameters,
            check_config=hunyuan_vl_checked,
            vocabulary="bpe",
            after_vocabulary=hunyuan_vl_end_tokens,
        ),
        HUNYUANVL_MMPROJ,
        "its ViT and perceiver",
    ),
)
