"""Phi-3 (and Phi-3.5, Phi-4-mini): q, k and v in one projection, gate and up in another; llama.cpp's phi3, with
its 128k models' long and short rope factors computed into the file."""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import ConfigMismatchError
from ..names import dense_tables as t
from ..names.meta_rules import Fused
from .gguf_hooks import rope_parameters, rotary_dimensions
from .llama import TEXT_ONLY, TORCHTUNE, TORCHTUNE_ENDS, L
from .parts import Family, GGUFPart, Unsupported


def phi3_rope_factors(writer, hparams: dict, rope: dict, where: Path) -> dict[str, list[float]]:
    """Phi-3's 128k models: the long and short rope factors as tensors, and the attention factor their scaling
    implies, which the converter writes into the header before anything else of the model."""
    long, short, original = (
        rope.get("long_factor"),
        rope.get("short_factor"),
        rope.get("original_max_position_embeddings"),
    )
    rotary, rope_type = rotary_dimensions(hparams, rope), str(rope.get("rope_type") or "").lower()
    if rope_type not in ("su", "longrope", "yarn") or not original or not short:
        raise ConfigMismatchError(
            f"{where}: rope long and short factors with rope type {rope_type!r}, which "
            "llama.cpp's converter does not take; pass --config-from the model's own folder"
        )
    if len(long) != len(short) or len(long) != rotary / 2:
        raise ConfigMismatchError(
            f"{where}: {len(long)} long and {len(short)} short rope factors for {rotary} rotary "
            f"dimensions (one per pair, {rotary // 2}); pass --config-from the model's own folder"
        )
    scale = hparams["max_position_embeddings"] / original
    if scale <= 1.0:
        attention = 1.0
    elif rope_type == "yarn":
        attention = 0.1 * math.log(scale) + 1.0
    else:
        attention = math.sqrt(1 + math.log(scale) / math.log(original))
    writer.add_rope_scaling_attn_factors(attention)
    return {"rope_factors_long.weight": long, "rope_factors_short.weight": short}


def phi3_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """Phi-3's, as the converter writes them: the original context length, the rotary dimensions (of a partial
    rotary factor), a sliding window of 0 for none. (The 128k models' rope factors: phi3_rope_factors.)"""
    where = folder / "config.json"
    _, rope = rope_parameters(hparams)
    original, theta = rope.get("original_max_position_embeddings"), rope.get("rope_theta")
    missing = [
        key for key, value in (("original_max_position_embeddings", original), ("rope_theta", theta)) if value is None
    ]
    if missing:
        raise ConfigMismatchError(
            f"{where}: no {', '.join(missing)}, which llama.cpp's phi3 needs; pass --config-from the model's own folder"
        )
    heads = hparams["num_attention_heads"]
    writer.add_context_length(hparams["max_position_embeddings"])
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_feed_forward_length(hparams["intermediate_size"])
    writer.add_block_count(blocks)
    writer.add_head_count(heads)
    writer.add_head_count_kv(hparams.get("num_key_value_heads") or heads)
    writer.add_layer_norm_rms_eps(hparams["rms_norm_eps"])
    writer.add_rope_dimension_count(rotary_dimensions(hparams, rope))
    writer.add_rope_freq_base(theta)
    writer.add_file_type(ftype)
    writer.add_sliding_window(hparams.get("sliding_window") or 0)


def phi3_computed(writer, hparams: dict, rope: dict, head_dim: int, where: Path) -> dict[str, list[float]]:
    return phi3_rope_factors(writer, hparams, rope, where) if rope.get("long_factor") else {}


# torchtune's Phi-3 (its phi3_tune_to_hf): Llama's torchtune names, but q, k and v, gate and up each a part of one
# transformers tensor; no rows permuted (its rotary turns halves of each head, as transformers')
TORCHTUNE_PHI3 = {
    **{name: (hf, None) for name, (hf, _) in {**TORCHTUNE, **TORCHTUNE_ENDS}.items()},
    **{
        f"layers.{{i}}.attn.{p}_proj.weight": Fused(L + "self_attn.qkv_proj.weight", n, heads)
        for n, (p, heads) in enumerate(zip("qkv", ("num_attention_heads", *["num_key_value_heads"] * 2)))
    },
    "layers.{i}.mlp.w1.weight": Fused(L + "mlp.gate_up_proj.weight", 0),
    "layers.{i}.mlp.w3.weight": Fused(L + "mlp.gate_up_proj.weight", 1),
}

FAMILIES = (
    Family(
        "Phi-3",
        "phi3",
        "Phi3ForCausalLM",
        tensors=t.TensorTable("Phi3ForCausalLM", t.SIZES, t.FUSED_LAYER, {}, pad_token_default=32000),
        megatron=Unsupported("Megatron's Phi-3 layout is not mapped yet"),
        meta_names=TORCHTUNE_PHI3,
        torchtune_names=TORCHTUNE_PHI3,
        torchtitan_names=Unsupported("torchtitan has no Phi-3 model", applies=False),
        fused_siblings=(),  # (q, k and v are one Linear layer already, as are gate and up)
        gguf=GGUFPart("PHI3", hyperparameters=phi3_hyperparameters, computed=phi3_computed, phi3_tokens=True),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("a dense family; merge-moe assembles no MoE from Phi-3 models", applies=False),
        notes={"meta_names": "torchtune's names (torchtitan has no Phi-3)"},
    ),
)
