"""MPT (MosaicML's): a decoder with ALiBi in place of positions, q, k and v in one `Wqkv`, LayerNorms and Linear layers
without biases, an MLP four times as wide as the model, the head tied to the embedding; llama.cpp's mpt, whose
converter writes a header of its own (no file type in it) and the byte-level BPE vocabulary."""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import ConfigMismatchError
from .llama import TEXT_ONLY
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model

# What transformers' MptForCausalLM computes with whatever the config says: ALiBi's largest bias of 8
ALIBI_BIAS_MAX = 8


def mpt_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's MPTModel's header: the context, sizes, heads, its LayerNorms' epsilon (1e-5, as MPT's), the
    clamp of q, k and v, ALiBi's largest bias."""
    attention = hparams.get("attn_config") or {}
    writer.add_context_length(hparams["max_seq_len"])
    writer.add_embedding_length(hparams["d_model"])
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(4 * hparams["d_model"])
    writer.add_head_count(hparams["n_heads"])
    if attention.get("kv_n_heads"):
        writer.add_head_count_kv(attention["kv_n_heads"])
    writer.add_layer_norm_eps(1e-5)
    if attention.get("clip_qkv") is not None:
        writer.add_clamp_kqv(attention["clip_qkv"])
    writer.add_max_alibi_bias(attention["alibi_bias_max"] if attention.get("alibi") else 0.0)


def mpt_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's mpt would compute otherwise than transformers' MptForCausalLM, which takes ALiBi's largest bias
    as 8, every head's own keys and values, the config's LayerNorm epsilon and softmax scale: one line."""
    attention = hparams.get("attn_config") or {}
    other_model = "; serve this model with transformers or vLLM"
    head_scale = 1 / math.sqrt(hparams["d_model"] / hparams["n_heads"])
    refused = [
        (
            not attention.get("alibi", True) or attention.get("alibi_bias_max", ALIBI_BIAS_MAX) != ALIBI_BIAS_MAX,
            f"attn_config's alibi is {attention.get('alibi')} with alibi_bias_max {attention.get('alibi_bias_max')}, "
            f"and transformers' MPT turns ALiBi on with {ALIBI_BIAS_MAX} whatever it says, where llama.cpp's mpt "
            "follows it",
        ),
        (
            attention.get("kv_n_heads") not in (None, hparams["n_heads"]),
            f"attn_config's kv_n_heads is {attention.get('kv_n_heads')}, and transformers' MPT gives every head its "
            "own keys and values",
        ),
        (
            hparams.get("layer_norm_epsilon", 1e-5) != 1e-5,
            f"layer_norm_epsilon is {hparams.get('layer_norm_epsilon')}, and llama.cpp's converter writes MPT's 1e-5",
        ),
        (
            attention.get("softmax_scale") not in (None, head_scale),
            f"attn_config's softmax_scale is {attention.get('softmax_scale')}, and llama.cpp's mpt scales the "
            "attention's scores by 1/sqrt(head width)",
        ),
    ]
    for refuse, why in refused:
        if refuse:
            raise ConfigMismatchError(f"{where}: {why}{other_model}")


FAMILIES = (
    Family(
        "MPT",
        "mpt",
        "MptForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's MPT layout (ALiBi) is not mapped yet"),
        **no_trainer_model("MPT"),
        fused_siblings=(),  # (q, k and v are one tensor already)
        gguf=GGUFPart("MPT", hyperparameters=mpt_hyperparameters, check_config=mpt_checked, vocabulary="bpe"),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
        also=("MPTForCausalLM",),  # (MosaicML's own class, as the Hub's configs name it: the converter's one name)
    ),
)
