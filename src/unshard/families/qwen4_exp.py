"""Qwen4-Exp (`Qwen4ExpForCausalLM`: Qwen3.8-Flash-Next's text model): Qwen3.5-MoE's layers (Gated DeltaNet on three
of four, gated attention on the fourth, experts with a shared one), the residual stream kept as several mixed by
hyper-connections in place of every norm, the full-attention layers' attention sparse (QSA: an indexer scores blocks of
compressed keys, each query attends to the best few), and hashed n-gram embeddings (PLE) added on one layer; llama.cpp's
qwen4exp, which PyPI's gguf-py 0.19 lacks."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .llama import SIBLINGS, TEXT_ONLY
from .parts import LLAMA_CPP_GGUF_PY, NO_TABLE, Family, Rearrangement, no_trainer_model
from .qwen_next import MEGATRON, NO_MOE, deltanet_gguf, deltanet_tensors, qwen35_hyperparameters

# transformers' name of a full-attention layer in a saved config (the Hub's `full_attention`, renamed on loading)
INDEXED = ("indexed_attention", "full_attention")
# the n-gram hash's constants the converter reads from the checkpoint into the header, by the end of their names
PLE_CONSTANTS = ("layer_multipliers", "ngram_heads_offsets", "ngram_heads_vocab_sizes")
# gguf-py's name of llama.cpp's n-gram table (Gemma 3n's per-layer embeddings')
PER_LAYER_TABLE = "model.embed_tokens_per_layer.weight"
# Gemma's norms (1 + weight) the converter shifts beyond those ending in norm.weight
ALSO_SHIFTED = (".ple.norm_key.weight", ".ple.norm_query.weight", ".ple.norm_conv.weight")


def ple_layers(hparams: dict) -> list[int]:
    """The layers with n-gram embeddings, from 0 (the config's ple_layer_ids count from 1)."""
    return [layer - 1 for layer in hparams.get("ple_layer_ids") or []]


def qwen4exp_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Qwen4ExpTextModel's: Qwen3.5-MoE's, then the hyper-connections' streams and rank, the indexer's
    heads, their width, the tokens it keeps and each layer's compression of keys (a full-attention layer's ratio, 0
    elsewhere), and where there are n-gram embeddings their layer, n-gram size, heads, convolution, end token, width
    and the hash's constants (from the checkpoint: GGUFPart.header_tensors)."""
    qwen35_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_hyper_connection_count(hparams["hc_count"])
    writer.add_hyper_connection_low_rank(hparams["hc_lowrank"])
    writer.add_indexer_head_count(hparams["indexer_n_heads"])
    writer.add_indexer_key_length(hparams["indexer_head_dim"])
    writer.add_indexer_top_k(hparams["indexer_budget"])
    ratio = hparams["indexer_compress_ratio"]
    writer.add_attention_compress_ratios([ratio if kind in INDEXED else 0 for kind in hparams["layer_types"]])
    if not ple_layers(hparams):
        return
    writer.add_ple_layers(ple_layers(hparams))
    writer.add_ple_ngram_size(hparams["ngram_size"])
    writer.add_ple_heads_per_ngram(hparams["heads_per_ngram"])
    writer.add_ple_conv_kernel(hparams["ple_conv_kernel_size"])
    ends = hparams["eos_token_id"]
    writer.add_ple_eos_token_id(int(ends[-1] if isinstance(ends, list) else ends))
    if hparams.get("image_token_id") is not None:
        writer.add_ple_image_token_id(int(hparams["image_token_id"]))
    writer.add_embedding_length_per_layer_input(hparams["ple_embed_dim"] // ngram_heads(hparams))
    constants = hparams["header_tensors"]
    for end, add in zip(
        PLE_CONSTANTS,
        (writer.add_ple_layer_multipliers, writer.add_ple_head_offsets, writer.add_ple_head_vocab_sizes),
    ):
        add([int(value) for name, values in constants.items() if name.endswith(end) for value in values])


def ngram_heads(hparams: dict) -> int:
    return (hparams["ngram_size"] - 1) * hparams["heads_per_ngram"]


def qwen4exp_tensors(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """Qwen3.5's DeltaNet tensors; the indexer's one projection as its q and k apart, as the converter splits it; the
    n-gram embeddings' convolution kernel without its middle axis of 1; the n-gram norms shifted (1 + weight)."""
    if name.endswith(".indexer.index_qk_proj.weight"):
        rows = hparams["indexer_n_heads"] * hparams["indexer_head_dim"]
        base = name.removesuffix("indexer.index_qk_proj.weight")
        pieces = {
            base + "index_q_proj.weight": (rows, shape[1]),
            base + "index_k_proj.weight": (shape[0] - rows, shape[1]),
        }
        return Rearrangement(pieces, partial(rows_apart, rows=rows), shape[0])
    if name.endswith(".ple.conv1d.weight"):
        return Rearrangement({name: (shape[0], shape[-1])}, kernel_2d)
    if name.endswith(ALSO_SHIFTED):
        return Rearrangement({name: shape}, plus_one)
    return deltanet_tensors(name, shape, hparams, where, tiled_values=True)


def rows_apart(band, rows: int) -> tuple:
    return band[:rows], band[rows:]


def kernel_2d(band) -> tuple:
    return (band.reshape(band.shape[0], band.shape[-1]),)


def plus_one(band) -> tuple:
    return (band + band.dtype.type(1),)


def qwen4exp_checked(hparams: dict, where: Path) -> list[str]:
    """What llama.cpp's qwen4exp computes: QSA on the full-attention layers (llama.cpp needs its indexer), n-gram
    embeddings on one layer at most (transformers refuses them on a full-attention one), the linear attention's output
    gated by a sigmoid (Qwen3.5's by SiLU). Another config is one line. The note: where llama.cpp's sparse attention
    chooses otherwise."""
    layers = ple_layers(hparams)
    why = None
    if hparams.get("indexer_n_heads") is None:
        why = "it has no QSA indexer (indexer_n_heads and the rest), which llama.cpp's qwen4exp needs"
    elif len(layers) > 1:
        why = f"ple_layer_ids names {len(layers)} layers, and llama.cpp's qwen4exp adds n-gram embeddings on one"
    elif (gate := hparams.get("output_gate_type") or hparams.get("hidden_act", "silu")) != "sigmoid":
        why = (
            f"the linear attention's output gate is {gate!r} (output_gate_type, else hidden_act), and llama.cpp's "
            "qwen4exp gates it by a sigmoid"
        )
    if why:
        raise ConfigMismatchError(
            f"{where}: {why}: it would compute another model; serve this one with transformers or vLLM"
        )
    ratio = hparams["indexer_compress_ratio"]
    notes = [
        f"past {hparams['indexer_budget'] + ratio - 1} tokens, llama.cpp's QSA chooses a query's keys as transformers' "
        f"does only where the query sees {ratio - 1} tokens after its last complete block of {ratio}: for the other "
        "queries it keeps other blocks, and its logits differ from transformers'"
    ]
    ends = hparams.get("eos_token_id")
    if layers and isinstance(ends, list) and ends[0] != ends[-1]:
        notes.append(
            f"the n-gram hash starts afresh after end token {ends[-1]} in llama.cpp (the converter writes the last of "
            f"eos_token_id) and after {ends[0]} in transformers (the first)"
        )
    return notes


QWEN4EXP_GGUF = replace(
    deltanet_gguf("QWEN4EXP", qwen4exp_hyperparameters, qwen4exp_checked, tiled_values=True),
    rearranged=qwen4exp_tensors,
    renames=(
        (r"^model\.layers\.\d+\.ple\.ple_embedding\.ngram_embedding\.weight$", "model.embed_tokens_per_layer.weight"),
    ),
    header_tensors=r"\.ple\.ple_embedding\.(?:" + "|".join(PLE_CONSTANTS) + r")$",
    # (the n-gram table, saved in shards of its rows, which the converter joins)
    stacked=r"^(.*\.ngram_embedding)\.shard_(\d+)\.(weight)$",
    joined_rows=True,
)

FAMILIES = (
    Family(
        "Qwen4-Exp (text)",
        "qwen4_exp_text",
        "Qwen4ExpForCausalLM",
        tensors=NO_TABLE,
        megatron=MEGATRON,
        **no_trainer_model("Qwen4-Exp"),
        fused_siblings=SIBLINGS,
        gguf=QWEN4EXP_GGUF,
        mmproj=TEXT_ONLY,
        moe_layout=NO_MOE,
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="qwen4exp")},
    ),
)
