"""MiniCPM3 (OpenBMB's `MiniCPM3ForCausalLM`): DeepSeek-V2's latent attention (a query down projection, the key and
value up projection whole) with a SwiGLU MLP and muP's scales (the embedding's, each residual branch's, the head's);
llama.cpp's minicpm3, the converter's own header, and LongRoPE's long and short factors as tensors.

MiniCPM-V 4.6 (`MiniCPMV4_6ForConditionalGeneration`): Qwen3.5's text model (llama.cpp's qwen35) beside a SigLIP tower
whose patches a window-attention merger joins 2 x 2 after one of its layers, then an MLP 2 x 2 again into each token:
the mmproj file of llama.cpp's minicpmv4_6 projector."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import fixed_in_code, json_or_empty, mmproj_model_forced_type, rope_parameters
from .llama import TEXT_ONLY
from .parts import (
    DEFAULT_FUSED_SIBLINGS,
    LLAMA_CPP_GGUF_PY,
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    MmprojPart,
    Unsupported,
    no_trainer_model,
)
from .qwen_next import deltanet_gguf, qwen35_hyperparameters

# What llama.cpp's minicpm3 computes with whatever the config says (src/models/minicpm3.cpp: "if the model varies,
# these parameters need to be read from the model"), and the rope base it takes where the converter writes none
LLAMA_CPP_SCALES = {"scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 256}
LLAMA_CPP_ROPE_BASE = 10000.0


def minicpm3_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's MiniCPM3Model's, in its order: no rope base (llama.cpp's default), the key width of a head's
    unrotated and rotated parts, the rotated part's."""
    writer.add_file_type(ftype)
    writer.add_context_length(hparams["max_position_embeddings"])
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(hparams["intermediate_size"])
    writer.add_head_count(hparams["num_attention_heads"])
    writer.add_head_count_kv(hparams["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(hparams["rms_norm_eps"])
    writer.add_vocab_size(hparams["vocab_size"])
    if hparams.get("q_lora_rank") is not None:
        writer.add_q_lora_rank(hparams["q_lora_rank"])
    writer.add_kv_lora_rank(hparams["kv_lora_rank"])
    writer.add_key_length(hparams["qk_nope_head_dim"] + hparams["qk_rope_head_dim"])
    writer.add_rope_dimension_count(hparams["qk_rope_head_dim"])


def minicpm3_rope_factors(writer, hparams: dict, rope: dict, head_dim: int, where: Path) -> dict[str, list[float]]:
    """LongRoPE's long and short factors as the converter writes them (one per rotated pair), where the config has
    them."""
    long, short = rope.get("long_factor"), rope.get("short_factor")
    if not (long or short):
        return {}
    pairs = hparams["qk_rope_head_dim"] // 2
    if long is None or short is None or len(long) != pairs or len(short) != pairs:
        raise ConfigMismatchError(
            f"{where}: rope's long and short factors are not one per rotated pair ({pairs}) each, which llama.cpp's "
            "minicpm3 takes; pass --config-from the model's own folder"
        )
    return {"rope_factors_long.weight": long, "rope_factors_short.weight": short}


def minicpm3_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's minicpm3 computes otherwise than transformers would from this config: other muP scales than
    its own, another rope base (the converter writes none), rope scaling but LongRoPE's factors at the trained
    context (its attention factor is not written), no query down projection, values of another width than a head's
    share of the model, fewer key-value heads than heads; and a folder without tokenizer.model, the converter's
    only vocabulary for it."""
    heads = hparams["num_attention_heads"]
    _, rope = rope_parameters(hparams)
    kind = rope.get("rope_type") or "default"
    original = rope.get("original_max_position_embeddings") or hparams["max_position_embeddings"]
    wrong = [
        f"{key} is {hparams.get(key)}, and llama.cpp's minicpm3 takes {value}"
        for key, value in LLAMA_CPP_SCALES.items()
        if hparams.get(key) != value
    ]
    for bad, why in (
        (
            float(rope.get("rope_theta", LLAMA_CPP_ROPE_BASE)) != LLAMA_CPP_ROPE_BASE,
            f"the rope base is {rope.get('rope_theta')}, and llama.cpp's minicpm3 takes {LLAMA_CPP_ROPE_BASE:g}",
        ),
        (kind not in ("default", "longrope"), f"rope scaling of type {kind!r}, which llama.cpp's minicpm3 does not do"),
        (
            kind == "longrope" and hparams["max_position_embeddings"] > original,
            "LongRoPE past its trained context, whose attention factor the converter does not write",
        ),
        (
            hparams.get("q_lora_rank") is None,
            "q_lora_rank is null, and llama.cpp's minicpm3 takes a query down projection",
        ),
        (
            (hparams.get("v_head_dim") or hparams["hidden_size"] // heads) != hparams["hidden_size"] // heads,
            f"v_head_dim is {hparams.get('v_head_dim')}, and llama.cpp's minicpm3 takes a head's share of the model",
        ),
        (
            (hparams.get("num_key_value_heads") or heads) != heads,
            "num_key_value_heads differs from num_attention_heads, and llama.cpp's minicpm3 attends with every head",
        ),
        (hparams.get("attention_bias") or hparams.get("mlp_bias"), "biases are set, and llama.cpp's minicpm3 has none"),
        (hparams.get("hidden_act", "silu") != "silu", f"hidden_act is {hparams.get('hidden_act')!r}, not SiLU"),
    ):
        if bad:
            wrong.append(why)
    if wrong:
        raise ConfigMismatchError(f"{where}: {wrong[0]}; serve this model with transformers or vLLM")
    if not (where.parent / "tokenizer.model").is_file():
        raise ConfigMismatchError(
            f"{where.parent}: no tokenizer.model, the SentencePiece model llama.cpp's converter reads MiniCPM3's "
            "vocabulary from; pass --config-from a folder with it (MiniCPM3's releases have one)"
        )


# SigLIP's position table as llama.cpp's minicpmv4_6 reads it: 70 x 70 patches (fixed in its code)
LLAMA_CPP_POSITIONS_SIDE = 70


def minicpmv46_sizes(vision: dict, where: Path) -> dict:
    """The tower as the converter's MiniCPMV4_6VisionModel reads it: its image size the processor's scale_resolution
    (the side of a slice), refusing what llama.cpp's minicpmv4_6 computes otherwise: a position table of 70 x 70
    patches, GELU (tanh), both mergers 2 x 2 and once, norms at 1e-6 (the final merger's, fixed in transformers); and
    the 4x mode (the window merger skipped), not written yet."""
    config = json_or_empty(where)
    processor = json_or_empty(where.parent / "preprocessor_config.json")
    image, patch = vision.get("image_size", 224), vision.get("patch_size", 16)
    runs = {
        "image_size / patch_size": (
            image // patch if isinstance(image, int) and isinstance(patch, int) else f"{image} / {patch}",
            LLAMA_CPP_POSITIONS_SIDE,
        ),
        "hidden_act": (vision.get("hidden_act", "gelu_pytorch_tanh"), "gelu_pytorch_tanh"),
        "layer_norm_eps": (vision.get("layer_norm_eps", 1e-6), 1e-6),
        "window_kernel_size": (list(vision.get("window_kernel_size", (2, 2))), [2, 2]),
        "merge_kernel_size": (list(config.get("merge_kernel_size", (2, 2))), [2, 2]),
        "merger_times": (config.get("merger_times", 1), 1),
    }
    fixed_in_code(where, "vision", "minicpmv4_6 projector", runs)
    modes = config.get("downsample_mode", "16x"), processor.get("downsample_mode", "16x")
    if modes != ("16x", "16x"):
        raise ConfigMismatchError(
            f"{where}: downsample_mode is {modes[0]} (and {modes[1]} in preprocessor_config.json), and unshard "
            "writes the 16x mode's tower alone so far (4x skips the window merger); serve this model with "
            "transformers or vLLM"
        )
    return {**vision, "image_size": int(processor.get("scale_resolution", vision.get("image_size", 224)))}


def minicpmv46_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The merge of 4 x 4 patches into a token, the layer after which the window merger runs (in the key of windowed
    attention's layers, as llama.cpp reads it), GELU, the norms' epsilon."""
    writer.add_vision_projector_scale_factor(4)
    writer.add_vision_wa_layer_indexes([int(hparams.get("insert_layer_id", vision.get("insert_layer_id", 6)))])
    writer.add_vision_use_gelu(True)
    writer.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))


FAMILIES = (
    Family(
        "MiniCPM3",
        "minicpm3",
        "MiniCPM3ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's MiniCPM3 layout is not mapped yet"),
        **no_trainer_model("MiniCPM3"),
        fused_siblings=(("gate_proj", "up_proj"),),
        gguf=GGUFPart(
            "MINICPM3",
            hyperparameters=minicpm3_hyperparameters,
            computed=minicpm3_rope_factors,
            check_config=minicpm3_checked,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
    Family(
        "MiniCPM-V 4.6",
        "minicpmv4_6",
        "MiniCPMV4_6ForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=Unsupported("verl's Megatron vision-language layouts are not mapped yet"),
        **no_trainer_model("MiniCPM-V 4.6"),
        fused_siblings=DEFAULT_FUSED_SIBLINGS,
        gguf=deltanet_gguf("QWEN35", qwen35_hyperparameters, tiled_values=True),
        mmproj=MmprojPart(
            "MINICPMV4_6",
            r"^model\.(?:vision_tower|merger)\.",
            minicpmv46_sizes,
            minicpmv46_projector_keys,
            forced_type=mmproj_model_forced_type,
        ),
        moe_layout=Unsupported("a dense family; merge-moe assembles no MoE from vision-language models", applies=False),
        notes={"mmproj": LLAMA_CPP_GGUF_PY.format(arch="its minicpmv4_6 projector")},
    ),
)
