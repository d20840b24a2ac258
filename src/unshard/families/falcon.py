"""Falcon (TII's Falcon 7B, 40B and 180B): attention and MLP in parallel, behind one LayerNorm or (the new decoder
architecture of 40B and 180B) one each, multi-query or grouped-query attention whose q, k and v lie in one tensor
group by group (each key-value group's queries, then its key and its value), no biases, a GELU MLP; llama.cpp's
falcon, whose converter regroups that tensor's rows as every query head, then every key head, then every value head
("jploski" in the header), and writes a header of its own (a context of 2048, four times the width as the MLP's; no
rope base: llama.cpp takes 10000)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import turned_at_llama_cpp_base
from .llama import TEXT_ONLY
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Rearrangement, Unsupported, no_trainer_model


def key_value_heads(hparams: dict) -> int:
    """The key-value heads transformers' Falcon computes with: the config's for the new decoder architecture, one for
    multi-query attention, else one per head."""
    if hparams.get("new_decoder_architecture"):
        return hparams.get("num_kv_heads") or hparams["num_attention_heads"]
    return 1 if hparams.get("multi_query", True) else hparams["num_attention_heads"]


def falcon_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's FalconModel's, in its order."""
    writer.add_context_length(2048)  # (the converter's: the config's is not read)
    writer.add_tensor_data_layout("jploski")  # (q, k and v regrouped)
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_feed_forward_length(4 * hparams["hidden_size"])
    writer.add_block_count(blocks)
    writer.add_head_count(hparams["num_attention_heads"])
    writer.add_head_count_kv(key_value_heads(hparams))
    writer.add_layer_norm_eps(hparams["layer_norm_epsilon"])
    writer.add_file_type(ftype)


def falcon_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's falcon would compute otherwise, or not load: ALiBi (Falcon-RW's), biases, layers that are not
    parallel, an MLP other than four times the width or not GELU, a rope base other than its own."""
    width = hparams["hidden_size"]
    for refused, what in (
        (hparams.get("alibi"), "alibi is set (Falcon-RW's), which llama.cpp's falcon does not compute"),
        (hparams.get("bias"), "bias is set, and llama.cpp's falcon has no biases"),
        (
            not hparams.get("parallel_attn", True) and not hparams.get("new_decoder_architecture"),
            "parallel_attn is false, and llama.cpp's falcon runs attention and MLP in parallel",
        ),
        (
            hparams.get("apply_residual_connection_post_layernorm"),
            "apply_residual_connection_post_layernorm is set, which llama.cpp's falcon does not compute",
        ),
        (
            (hparams.get("ffn_hidden_size") or 4 * width) != 4 * width,
            f"ffn_hidden_size is {hparams.get('ffn_hidden_size')}, and llama.cpp's falcon takes 4 x {width}",
        ),
        (hparams.get("activation", "gelu") != "gelu", f"activation is {hparams.get('activation')}, not GELU"),
    ):
        if refused:
            raise ConfigMismatchError(f"{where}: {what}; serve this model with transformers or vLLM")
    turned_at_llama_cpp_base(hparams, where, "falcon")


def qkv_by_kind(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """query_key_value as the converter stores it: every query head's rows, then every key head's, then every value
    head's. Its rows move across the whole tensor, so a band is the whole tensor."""
    if not name.endswith("self_attention.query_key_value.weight"):
        return None
    heads, groups = hparams["num_attention_heads"], key_value_heads(hparams)
    head = hparams["hidden_size"] // heads
    if heads % groups or shape[0] != (heads + 2 * groups) * head:
        raise ConfigMismatchError(
            f"{where}: {name} has {shape[0]} rows, not {heads} query and {groups} key and value heads of {head}; "
            "pass --config-from the model's own folder"
        )
    return Rearrangement({name: shape}, partial(grouped_by_kind, groups=groups, per_group=heads // groups), shape[0])


def grouped_by_kind(band, groups: int, per_group: int) -> tuple:
    """Rows held group by group (its query heads, its key, its value) as kind by kind."""
    import numpy as np

    rows = band.reshape(groups, per_group + 2, -1, band.shape[-1])
    kinds = (rows[:, :per_group], rows[:, per_group], rows[:, per_group + 1])
    return (np.concatenate([kind.reshape(-1, band.shape[-1]) for kind in kinds]),)


FAMILIES = (
    Family(
        "Falcon",
        "falcon",
        "FalconForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Falcon layout (parallel attention, q, k and v by group) is not mapped yet"),
        **no_trainer_model("Falcon"),
        fused_siblings=(),  # (q, k and v are one tensor already)
        gguf=GGUFPart(
            "FALCON",
            hyperparameters=falcon_hyperparameters,
            check_config=falcon_checked,
            vocabulary="bpe",
            rearranged=qkv_by_kind,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)
