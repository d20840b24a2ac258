"""dots3-note's text model (rednote's `Dots3NoteForCausalLM`): DeepSeek's latent attention in two geometries, the
global layers' with DeepSeek-V3.2's sparse attention's indexer, the sliding layers' with more heads over a narrower
latent, in a window, with rope at a base of their own; the query and latent rescaled after their norms by sqrt(width /
rank), the rotary key normed, a sigmoid gate per head on the attention's output; dense first layers, then
DeepSeek-V3's experts. llama.cpp's dots3note (which PyPI's gguf-py 0.19 lacks): the converter reads the Hub's config
(the sliding layers' sizes as `swa_*` keys), which transformers 5 saves otherwise (its per_layer_config, rope by layer
type): unshard reads either, and writes what the converter writes from the Hub's. dots3-note as released
(`Dots3NoteForConditionalGeneration`): that text model beside a vision tower with experts on its later blocks (as many
as each block's pyramid says) and an audio encoder (Whisper's layers behind three strided 2-D convolutions, rope on
half of each head, a SwiGLU MLP), both in one mmproj file of llama.cpp's dots3note_v and dots3note_a projectors: each
block's experts stacked, the audio MLP's fused gate and up apart, as the converter writes them from the Hub's config
keys (`embed_dim`, `pyramid_num_routed`, `whisper_config`), which transformers 5 saves otherwise: unshard reads
either."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .deepseek import DEEPSEEK2, deepseek2_hyperparameters, latent_kv
from .gguf_hooks import fixed_in_code, gguf_py, mmproj_model_forced_type
from .llama import TEXT_ONLY
from .parts import (
    LLAMA_CPP_GGUF_PY,
    NO_TABLE,
    Family,
    GGUFPart,
    MmprojPart,
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


def dots3_note_vision_sizes(vision: dict, where: Path) -> dict:
    """The tower as the converter reads its config (the Hub's `embed_dim` for its width, where `hidden_size` is the
    adapter's; transformers' names otherwise), the experts of each block (the Hub's `pyramid_num_routed`, or
    transformers' `mlp_layer_types` with `per_layer_config`) and those each token takes; an image of any size. What
    llama.cpp's dots3note_v computes otherwise, as the converter refuses it, is one line."""
    width = vision.get("embed_dim", vision.get("hidden_size"))
    pyramid = vision.get("pyramid_num_routed")
    if pyramid is None:
        per_layer = {int(i): values for i, values in (vision.get("per_layer_config") or {}).items()}
        experts = vision.get("num_local_experts", 0)
        pyramid = [
            per_layer.get(i, {}).get("num_local_experts", experts) if kind == "sparse" else 0
            for i, kind in enumerate(vision.get("mlp_layer_types") or [])
        ]
    runs = {
        "adapter_type": (vision.get("adapter_type", "patch_merger"), "patch_merger"),
        "pre_pixel_shuffle": (vision.get("pre_pixel_shuffle", True), True),
        "router_scoring_func": (vision.get("router_scoring_func", "sigmoid"), "sigmoid"),
        "router_scale": (vision.get("router_scale", vision.get("router_scaling_factor", 1.0)), 1.0),
        "temporal_patch_size": (vision.get("temporal_patch_size", 1), 1),
        "attention bias": (vision.get("use_bias", vision.get("attention_bias", False)), False),
        "use_qk_norm": (vision.get("use_qk_norm", True), True),
        "hidden_act": (vision.get("hidden_act", "silu"), "silu"),
    }
    fixed_in_code(where, "vision", "dots3note_v", runs)
    return {
        **vision,
        "image_size": 0,  # (any size: the converter's dynamic resolution)
        "hidden_size": width,
        "num_attention_heads": vision.get("num_heads", vision.get("num_attention_heads")),
        "pyramid": [max(0, count) for count in pyramid],
        "experts_used": vision.get("capacity_factor", vision.get("num_experts_per_tok", 2)),
    }


def dots3_note_audio_sizes(config: dict, where: Path) -> dict | None:
    """The audio encoder's sizes, from the Hub's whisper_config or transformers' names; what llama.cpp's dots3note_a
    fixes in code (rope on half of each head at 10000, SwiGLU, chunks of 60 seconds, no frames merged), one line."""
    audio = config.get("audio_config")
    if not audio:
        return None
    whisper = audio.get("whisper_config") or {}
    rope = audio.get("rope_parameters") or {}
    activation = whisper.get("activation_function") or audio.get("hidden_act", "silu")
    activation = "swiglu" if activation == "silu" else activation  # (transformers' SiLU of a fused gate and up)
    runs = {
        "partial_rotary_factor": (rope.get("partial_rotary_factor", 0.5), 0.5),
        "rope_theta": (rope.get("rope_theta", 10000.0), 10000.0),
        "activation": (activation, "swiglu"),
        "chunk_seconds": (audio.get("chunk_seconds", 60), 60),
        "merge_factor": (audio.get("merge_factor", 1), 1),
        "use_causal": (audio.get("use_causal", False), False),
    }
    fixed_in_code(where, "audio", "dots3note_a", runs)
    return {
        "hidden_size": whisper.get("d_model", audio.get("hidden_size")),
        "intermediate_size": whisper.get("encoder_ffn_dim", audio.get("intermediate_size")),
        "num_hidden_layers": whisper.get("encoder_layers", audio.get("num_hidden_layers")),
        "num_attention_heads": whisper.get("encoder_attention_heads", audio.get("num_attention_heads")),
    }


def dots3_note_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The converter's Dots3NoteMmprojModel's: SiLU, the tower's norm epsilon, the patches merged, the image's least
    and most pixels (the Hub's processor nests them in vision_config; transformers' Qwen2-VL processor names them its
    size's shortest and longest edge), each block's experts and those each token takes; then the audio projector,
    its mel bins and norm epsilon (1e-6, as the encoder's norms default)."""
    nested = {**processor, **(processor.get("vision_config") or {})}
    size = nested.get("size") or {}
    writer.add_vision_use_silu(True)
    writer.add_vision_attention_layernorm_eps(vision.get("rms_norm_eps", 1e-5))
    writer.add_vision_spatial_merge_size(vision.get("spatial_merge_size", 2))
    writer.add_vision_min_pixels(nested.get("min_pixels", size.get("shortest_edge")))
    writer.add_vision_max_pixels(nested.get("max_pixels", size.get("longest_edge")))
    writer.add_vision_expert_count_per_layer(vision["pyramid"])
    writer.add_vision_expert_used_count(int(vision["experts_used"]))
    writer.add_clip_audio_projector_type(gguf_py().VisionProjectorType.DOTS3NOTE_A)
    audio = hparams["audio_config"]
    writer.add_audio_num_mel_bins((audio.get("whisper_config") or {}).get("num_mel_bins", audio.get("feature_size")))
    writer.add_audio_attention_layernorm_eps(1e-6)


def dots3_note_tower_name(name: str) -> str:
    """The name the converter maps: the routers' weight and bias as weights."""
    return name + ".weight" if name.endswith((".gate_weight", ".router_bias")) else name


def dots3_note_towers_split(name: str, shape: tuple[int, ...], sizes: dict) -> Rearrangement | None:
    """The audio MLP's fc1, gate and up fused, as two tensors (gate's rows first), as the converter splits it."""
    if ".speech_encoder.layers." not in name or ".fc1." not in name:
        return None
    half = (shape[0] // 2, *shape[1:])
    parts = {name.replace(".fc1.", ".fc1_gate."): half, name.replace(".fc1.", ".fc1_up."): half}
    return Rearrangement(parts, lambda band: (band[: band.shape[0] // 2], band[band.shape[0] // 2 :]))


def dots3_note_forced_type(gguf, source: str, name: str, shape: tuple[int, ...], qtype, file_type: str):
    """The converter's: the vision routers in F32 (near-tied expert scores), the audio stem's convolutions and
    projection in F32, then MmprojModel's."""
    if ".ffn_gate_inp." in name or ".exp_probs_b." in name or ".conv2d" in name or "a.conv_out" in name:
        return gguf.GGMLQuantizationType.F32
    return mmproj_model_forced_type(gguf, source, name, shape, qtype, file_type)


DOTS3_NOTE_MMPROJ = MmprojPart(
    "DOTS3NOTE_V",
    r"^(?:vision_encoder|audio_encoder)\.",
    dots3_note_vision_sizes,
    dots3_note_projector_keys,
    forced_type=dots3_note_forced_type,
    converter_name=dots3_note_tower_name,
    rearranged=dots3_note_towers_split,
    audio_sizes=dots3_note_audio_sizes,
    projector_type_key="clip.vision",
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
        DOTS3_NOTE_GGUF,
        DOTS3_NOTE_MMPROJ,
    ),
)
