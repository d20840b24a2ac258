"""dots3-note's text model (rednote's `Dots3NoteForCausalLM`): DeepSeek's latent attention in two geometries, the
global layers' with DeepSeek-V3.2's sparse attention's indexer, the sliding layers' with more heads over a narrower
latent, in a window, with rope at a base of their own; the query and latent rescaled after their norms by sqrt(width /
rank), the rotary key normed, a sigmoid gate per head on the attention's output; dense first layers, then
DeepSeek-V3's experts. llama.cpp's dots3note (which PyPI's gguf-py 0.19 lacks): the converter reads the Hub's config
(the sliding layers' sizes as `swa_*` keys), which transformers 5 saves otherwise (its per_layer_config, rope by layer
type): unshard reads either, and writes what the converter writes from the Hub's. dots3-note as released
(`Dots3NoteForConditionalGeneration`): that text model beside a vision tower with experts and an audio encoder, which
its file leaves out, as the converter's does (their mmproj file is not written yet)."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .deepseek import DEEPSEEK2, deepseek2_hyperparameters, latent_kv
from .llama import TEXT_ONLY
from .parts import (
    LLAMA_CPP_GGUF_PY,
    NO_TABLE,
    Family,
    GGUFPart,
    Rearrangement,
    Unsupported,
    no_trainer_model,
    rows_of_each_head,
)

# The latent attention's sizes a sliding layer has of its own (the Hub's `swa_` keys; transformers' per_layer_config)
SLIDING_SIZES = (
    "num_attention_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
)
SLIDING = "sliding_attention"


def _sliding(hparams: dict) -> list[bool]:
    return [kind == SLIDING for kind in hparams["layer_types"][: hparams["num_hidden_layers"]]]


def dots3_note_as_the_converter_reads(hparams: dict, where: Path) -> dict:
    """The config as the Hub's release names it, which the converter reads: the sliding layers' sizes as `swa_` keys
    (from transformers' per_layer_config, one for every sliding layer), the window as sliding_window_size, the global
    layers' rope base as rope_theta and the sliding ones' as swa_rope_theta, the dense layers as first_k_dense_replace,
    the sigmoid router named; head_dim, which the converter drops, dropped. A config already in the Hub's form is read
    as it is."""
    read = dict(hparams)
    missing = [key for key in ("layer_types", *SLIDING_SIZES, "index_head_dim") if read.get(key) is None]
    if missing:
        raise ConfigMismatchError(
            f"{where}: has no {', '.join(missing)}, which dots3-note's file carries; pass --config-from the model's "
            "own folder"
        )
    sliding = _sliding(read)
    per_layer = {int(i): values for i, values in (read.pop("per_layer_config", None) or {}).items()}
    kinds = {tuple(sorted(per_layer.get(i, {}).items())) for i, s in enumerate(sliding) if s}
    if len(kinds) > 1 or any(per_layer.get(i) for i, s in enumerate(sliding) if not s):
        raise ConfigMismatchError(
            f"{where}: per_layer_config gives layers of one kind other sizes, and llama.cpp's dots3note has one latent "
            "attention for the global layers and one for the sliding ones; serve this model with transformers or vLLM"
        )
    own = dict(kinds.pop()) if kinds else {}
    for size in SLIDING_SIZES:
        read.setdefault(f"swa_{size}", own.get(size, read.get(size)))
    read.setdefault("swa_head_dim", read["swa_qk_nope_head_dim"] + read["swa_qk_rope_head_dim"])
    if "sliding_window" in read:
        read.setdefault("sliding_window_size", read.pop("sliding_window"))
    rope = read.pop("rope_parameters", None) or {}
    if SLIDING in rope or "indexed_attention" in rope:  # (transformers 5's: rope by layer type)
        read.setdefault("swa_rope_theta", rope.get(SLIDING, {}).get("rope_theta"))
        read.setdefault("rope_theta", rope.get("indexed_attention", rope.get("full_attention", {})).get("rope_theta"))
    elif rope:
        read["rope_parameters"] = rope
    if "mlp_layer_types" in read and "first_k_dense_replace" not in read:
        dense = [kind == "dense" for kind in read.pop("mlp_layer_types")]
        if any(dense[dense.index(False) :] if False in dense else ()):
            raise ConfigMismatchError(
                f"{where}: a dense layer follows a layer with experts, and llama.cpp's dots3note has dense layers "
                "first only; serve this model with transformers or vLLM"
            )
        read["first_k_dense_replace"] = dense.index(False) if False in dense else len(dense)
    read.setdefault("scoring_func", "sigmoid")  # (transformers' router; the converter reads no other)
    read.pop("head_dim", None)
    return read


def dots3_note_checked(hparams: dict, where: Path) -> list[str]:
    """What llama.cpp's dots3note computes, and the converter checks: the indexer on every global layer and on no
    sliding one, a sigmoid router without groups, both geometries' rotary part and query rank one, each sliding head as
    wide as its parts. Another config is one line. The note: the indexer's rotary rows reordered, where the converter's
    file keeps transformers' order."""
    sliding = _sliding(hparams)
    why = None
    if any(kind not in (SLIDING, "indexed_attention") for kind in hparams["layer_types"]):
        why = "a layer is neither sliding nor indexed (the sparse attention's indexer), as llama.cpp's dots3note has"
    elif hparams.get("scoring_func") != "sigmoid" or hparams.get("topk_method", "noaux_tc") != "noaux_tc":
        why = "the router is not noaux_tc's sigmoid, the one llama.cpp's dots3note runs"
    elif (hparams.get("n_group") or 1) != 1 or (hparams.get("topk_group") or 1) != 1:
        why = "the experts are routed in groups, which llama.cpp's dots3note does not read"
    elif hparams["swa_qk_rope_head_dim"] != hparams["qk_rope_head_dim"]:
        why = "the sliding layers turn another part of each head than the global ones, and llama.cpp's dots3note one"
    elif hparams["swa_q_lora_rank"] != hparams["q_lora_rank"]:
        why = "the sliding layers' q_lora_rank is not the global layers', and llama.cpp's dots3note has one"
    elif hparams["swa_head_dim"] != hparams["swa_qk_nope_head_dim"] + hparams["swa_qk_rope_head_dim"]:
        why = "swa_head_dim is not swa_qk_nope_head_dim + swa_qk_rope_head_dim"
    elif not any(sliding) or all(sliding):
        why = "its layers are not both sliding and global, as llama.cpp's dots3note has them"
    if why:
        raise ConfigMismatchError(f"{where}: {why}: it would compute another model; serve this one with transformers")
    return [
        "transformers' dots3-note turns its indexer's rotary part by consecutive pairs and llama.cpp's dots3note by "
        "halves: the indexer's rotary rows are reordered so llama.cpp keeps the tokens transformers keeps (llama.cpp's "
        "converter leaves them, and its file's indexer keeps others past the tokens it keeps)"
    ]


def dots3_note_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Dots3NoteModel's: DeepSeek-V2's with the heads of each layer, then the window, which layers
    slide, the sliding layers' latent and widths, the indexer's heads, width, tokens kept and layers."""
    sliding = _sliding(hparams)
    heads = [hparams["swa_num_attention_heads"] if s else hparams["num_attention_heads"] for s in sliding]
    deepseek2_hyperparameters(writer, {**hparams, "num_attention_heads": heads}, ftype, blocks, folder)
    rank, rope = hparams["swa_kv_lora_rank"], hparams["swa_qk_rope_head_dim"]
    writer.add_sliding_window(hparams["sliding_window_size"])
    writer.add_sliding_window_pattern(sliding)
    writer.add_kv_lora_rank_swa(rank)
    writer.add_key_length_swa(rank + rope)
    writer.add_value_length_swa(rank)
    writer.add_key_length_mla_swa(hparams["swa_qk_nope_head_dim"] + rope)
    writer.add_value_length_mla_swa(hparams["swa_v_head_dim"])
    writer.add_indexer_head_count(hparams["index_n_heads"])
    writer.add_indexer_key_length(hparams["index_head_dim"])
    writer.add_indexer_top_k(hparams["index_topk"])
    writer.add_indexer_types([not s for s in sliding])


def _layer(name: str) -> int | None:
    return int(name.split(".layers.", 1)[1].split(".", 1)[0]) if ".layers." in name else None


def _of_layer(hparams: dict, layer: int | None) -> dict:
    """The config with the latent attention's sizes of that layer's kind."""
    if layer is None or not _sliding(hparams)[layer]:
        return hparams
    return {**hparams, **{size: hparams[f"swa_{size}"] for size in SLIDING_SIZES}}


# The indexer's tensors whose rows are its heads' (each index_head_dim rows, the rotary ones first): its q and k, and
# the k norm's weight and bias (normed before it turns, they follow the rows)
INDEXER_ROWS = ("indexer.wq_b.weight", "indexer.wk.weight", "indexer.k_norm.weight", "indexer.k_norm.bias")


def halves_from_pairs(head_rows: int, rotated: int) -> tuple[int, ...]:
    """The order of a head's rows that takes its first `rotated` rows from transformers' order (turned by consecutive
    pairs) into llama.cpp's (turned by halves: the even rows, then the odd ones), the rows after them as they are."""
    return (*range(0, rotated, 2), *range(1, rotated, 2), *range(rotated, head_rows))


def dots3_note_tensors(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """DeepSeek's kv_b_proj split (k_b transposed, v_b), by the heads and widths of the layer's kind. And the
    indexer's rotary rows in the order llama.cpp's dots3note turns them (by halves, where transformers' dots3-note
    turns its indexer's by consecutive pairs: the converter leaves them, and its file selects other tokens)."""
    if name.endswith(INDEXER_ROWS):
        order = halves_from_pairs(hparams["index_head_dim"], hparams["qk_rope_head_dim"])
        return Rearrangement({name: shape}, partial(rows_of_each_head, order=order), len(order))
    return latent_kv(name, shape, _of_layer(hparams, _layer(name)), where)


def dots3_note_rescaled(name: str, shape: tuple[int, ...], hparams: dict) -> tuple[tuple[int, int, float], ...]:
    """The query's and the latent's norms multiplied by sqrt(width / rank), as transformers multiplies what they
    give (the converter folds it in where the Hub's config asks, apply_mla_qkv_lora_rescale: always here)."""
    if not name.endswith(("q_a_layernorm.weight", "kv_a_layernorm.weight")):
        return ()
    sizes = _of_layer(hparams, _layer(name))
    rank = sizes["q_lora_rank"] if name.endswith("q_a_layernorm.weight") else sizes["kv_lora_rank"]
    return ((0, shape[0], math.sqrt(hparams["hidden_size"] / rank)),)


DOTS3_NOTE_GGUF = GGUFPart(
    "DOTS3NOTE",
    hyperparameters=dots3_note_hyperparameters,
    vocabulary="bpe",
    special_tokens=(("eot", "<|endofassistant|>"),),
    rearranged=dots3_note_tensors,
    first_kv_heads=DEEPSEEK2.first_kv_heads,
    check_config=dots3_note_checked,
    as_the_converter_reads=dots3_note_as_the_converter_reads,
    scaled=dots3_note_rescaled,
)


def dots3_note_family(name: str, model_type: str, architecture: str, gguf: GGUFPart, mmproj) -> Family:
    """dots3-note's text model alone or as released (beside its towers): one layout, two classes."""
    return Family(
        name,
        model_type,
        architecture,
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's dots3-note layout (two latent attentions, an indexer) is not mapped yet"),
        **no_trainer_model("dots3-note"),
        fused_siblings=(("gate_proj", "up_proj"), ("q_a_proj", "kv_a_proj_with_mqa")),
        gguf=gguf,
        mmproj=mmproj,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="dots3note")},
    )


FAMILIES = (
    dots3_note_family("dots3-note (text)", "dots3_note_text", "Dots3NoteForCausalLM", DOTS3_NOTE_GGUF, TEXT_ONLY),
    dots3_note_family(
        "dots3-note",
        "dots3_note",
        "Dots3NoteForConditionalGeneration",
        replace(
            DOTS3_NOTE_GGUF,
            towers=r"^(?:vision_encoder|audio_encoder)\.",
            towers_left_out="its vision tower's and audio encoder's: llama.cpp's dots3note projectors are not written",
        ),
        Unsupported(
            "dots3-note's vision tower and audio encoder (llama.cpp's dots3note projectors) are not written yet"
        ),
    ),
)
