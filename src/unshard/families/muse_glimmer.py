"""Muse Glimmer (Meta's vision-language model, which torchtitan 0.3 trains): a text model of gated attention (q and k
normed without a scale), four norms a layer and a normed embedding, beside a vision tower, its adapter and projection.
It converts by transformers' own names; torchtitan's names are read and written as its MuseGlimmerStateDictAdapter
maps them: its text and vision rotary turn interleaved pairs, so q and k rows (and the tower's q and k biases) are
reordered per head."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import json_or_empty, text_hyperparameters
from .parts import (
    DEFAULT_FUSED_SIBLINGS,
    LLAMA_CPP_GGUF_PY,
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    Rearrangement,
    Unsupported,
    no_trainer_model,
)

_T, _V = "model.language_model.layers.{i}.", "model.vision_tower.layers.{i}."
_P = "model.vision_tower.patch_embedder."
# (the vision tower's q and k rows turn in heads of the count its config gives: names.meta_rules)
_VISION_HEADS = "vision_config.num_attention_heads"
TORCHTITAN_MUSE_GLIMMER = {
    "tok_embeddings.embedding.weight": ("model.language_model.embed_tokens.weight", None),
    "norm.weight": ("model.language_model.norm.weight", None),
    "lm_head.weight": ("lm_head.weight", None),
    **{
        f"layers.{{i}}.attention.qkv_linear.w{p}.weight": (f"{_T}self_attn.{p}_proj.weight", p if p != "v" else None)
        for p in "qkv"
    },
    "layers.{i}.attention.wo.weight": (_T + "self_attn.o_proj.weight", None),
    "layers.{i}.attention.o_gate.weight": (_T + "self_attn.gate_proj.weight", None),
    **{
        f"layers.{{i}}.feed_forward.{w}.weight": (f"{_T}mlp.{p}.weight", None)
        for w, p in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj"))
    },
    **{
        f"layers.{{i}}.{norm}.weight": (f"{_T}{hf}.weight", None)
        for norm, hf in (
            ("attention_norm", "input_layernorm"),
            ("post_attention_norm", "post_attention_layernorm"),
            ("ffn_norm", "pre_feedforward_layernorm"),
            ("post_ffn_norm", "post_feedforward_layernorm"),
        )
    },
    "vision_encoder.conv1_linear.weight": (_P + "patch_embedding.weight", None),
    "vision_encoder.positional_embedding_vlm": (_P + "position_embedding_table.weight", None),
    **{
        f"vision_encoder.{n}.{k}": (f"model.vision_tower.{n}.{k}", None)
        for n in ("ln_pre", "ln_post")
        for k in ("weight", "bias")
    },
    **{
        f"vision_encoder.layers.{{i}}.attn.w{p}.{k}": (f"{_V}attn.{p}_proj.{k}", _VISION_HEADS if p != "v" else None)
        for p in "qkv"
        for k in ("weight", "bias")
    },
    **{
        f"vision_encoder.layers.{{i}}.{titan}.{k}": (f"{_V}{hf}.{k}", None)
        for titan, hf in (("attn.proj", "attn.proj"), ("mlp.linear_fc1", "mlp.fc1"), ("mlp.linear_fc2", "mlp.fc2"))
        + (("norm1", "norm1"), ("norm2", "norm2"))
        for k in ("weight", "bias")
    },
    "vision_adapter.c_fc.weight": ("model.vision_adapter.fc1.weight", None),
    "vision_adapter.c_proj.weight": ("model.vision_adapter.fc2.weight", None),
    "vision_projection.weight": ("model.vision_projection.weight", None),
}

# what llama.cpp's muse-glimmer fixes in its code: the epsilon of the norms after attention and the MLP
POST_NORM_EPS = 1e-8


def muse_glimmer_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's TextModel's, then the final soft cap, the logits' scale (output_multiplier) and which layers
    attend within the window."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_final_logit_softcapping(hparams["final_logit_softcapping"])
    writer.add_logit_scale(hparams["output_multiplier"])
    writer.add_sliding_window(hparams["sliding_window"])
    writer.add_sliding_window_pattern([kind == "sliding_attention" for kind in hparams["layer_types"]])


def muse_glimmer_end_of_turn(writer, hparams: dict, folder: Path) -> None:
    """`<|eot|>`'s id as the end of turn, as the converter names it after the vocabulary: transformers' id of that
    token, which is the unknown token's where the tokenizer lacks it (and none without one either)."""
    tokenizer = json_or_empty(folder / "tokenizer.json")
    ids = {t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])}
    ids = {**tokenizer.get("model", {}).get("vocab", {}), **ids}
    unknown = json_or_empty(folder / "tokenizer_config.json").get("unk_token")
    unknown = unknown.get("content") if isinstance(unknown, dict) else unknown
    eot = ids.get("<|eot|>", ids.get(unknown) if isinstance(unknown, str) else None)
    if eot is not None:
        writer.add_eot_token_id(eot)


def muse_glimmer_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's muse-glimmer computes: SwiGLU, rope on the sliding layers alone (at the config's base) and
    none on the global ones, its own epsilon after attention and the MLP. Another config is one line."""
    theta = hparams.get("rope_parameters", {}).get("rope_theta")
    turns = [theta if kind == "sliding_attention" else 0 for kind in hparams["layer_types"]]
    why = None
    if hparams.get("hidden_activation", "silu") != "silu":
        why = f"hidden_activation is {hparams['hidden_activation']!r}, and llama.cpp's muse-glimmer runs SiLU"
    elif hparams.get("layer_rope_theta", turns) != turns:
        why = (
            "layer_rope_theta is not the rope base on the sliding layers and none on the global ones, as llama.cpp's "
            "muse-glimmer turns them"
        )
    elif hparams.get("post_norm_eps", POST_NORM_EPS) != POST_NORM_EPS:
        why = f"post_norm_eps is {hparams['post_norm_eps']}, and llama.cpp's muse-glimmer fixes {POST_NORM_EPS}"
    if why:
        raise ConfigMismatchError(
            f"{where}: {why}: it would compute another model; serve this one with transformers or vLLM"
        )


def muse_glimmer_queries(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """A layer's q_proj as the converter writes it: after the norms it makes for q and k (transformers' norms have no
    weight; q's takes qk_scale_factor, k's ones), its rows reordered per head for llama.cpp's rotary (the whole
    tensor one band, the norms made once)."""
    if not name.endswith(".self_attn.q_proj.weight") or ".language_model." not in name:
        return None
    head_dim, heads = hparams["head_dim"], hparams["num_attention_heads"]
    if shape[0] != heads * head_dim:
        raise ConfigMismatchError(
            f"{where}: {name} has {shape[0]} rows, not {heads} heads of {head_dim}; pass --config-from the model's "
            "own folder"
        )
    layer = name.removesuffix("q_proj.weight")
    made = {layer + "q_norm.weight": (head_dim,), layer + "k_norm.weight": (head_dim,), name: shape}
    return Rearrangement(
        made, partial(norms_then_queries, head_dim=head_dim, scale=hparams["qk_scale_factor"]), shape[0]
    )


def norms_then_queries(band, head_dim: int, scale: float) -> tuple:
    import numpy as np

    turned = band.reshape(-1, 2, head_dim // 2, band.shape[-1]).swapaxes(1, 2).reshape(band.shape)
    return np.full(head_dim, scale, np.float32), np.ones(head_dim, np.float32), turned


def muse_glimmer_drafter_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's MuseGlimmerAssistantModel's: its TextModel's, then the block of tokens it drafts at once, the
    target's layers whose hidden states it reads (as the layers they go into: one past the config's), and the window
    where the config has layers in it."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_block_size(int(hparams["block_size"]))
    writer.add_target_layers([int(layer) + 1 for layer in hparams["target_layer_ids"]])
    if hparams.get("sliding_window") and hparams.get("layer_types"):
        writer.add_sliding_window(int(hparams["sliding_window"]))
        writer.add_sliding_window_pattern([kind == "sliding_attention" for kind in hparams["layer_types"]])


def muse_glimmer_drafter_tokens(writer, hparams: dict, folder: Path) -> None:
    """The target's end of turn (the drafter's tokenizer is its target's), then the token the drafter fills its block
    with, as the converter names them after the vocabulary."""
    muse_glimmer_end_of_turn(writer, hparams, folder)
    if hparams.get("mask_token_id") is not None:
        writer.add_mask_token_id(int(hparams["mask_token_id"]))


FAMILIES = (
    Family(
        "Muse Glimmer",
        "muse_glimmer",
        "MuseGlimmerForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Muse Glimmer layout is not mapped yet"),
        meta_names=TORCHTITAN_MUSE_GLIMMER,
        torchtitan_names=TORCHTITAN_MUSE_GLIMMER,
        fused_siblings=DEFAULT_FUSED_SIBLINGS,
        gguf=GGUFPart(
            "MUSE_GLIMMER",
            hyperparameters=muse_glimmer_hyperparameters,
            check_config=muse_glimmer_checked,
            vocabulary="bpe",
            after_vocabulary=muse_glimmer_end_of_turn,
            rearranged=muse_glimmer_queries,
            permute_qk=True,  # (k's rows; q's, rearranged above)
            norm_shift=1.0,
            unshifted_norms=("language_model.norm.weight",),
            towers=r"^model\.vision_(?:tower|adapter|projection)\.",
            towers_left_out="its projector (llama.cpp's muse_glimmer) is not written yet",
        ),
        mmproj=Unsupported("its projector (llama.cpp's muse_glimmer) is not written yet"),
        moe_layout=NOT_A_MOE_INPUT,
        notes={
            "meta_names": "torchtitan's names, its vision tower's too",
            "to_torchtitan": "its vision tower's q and k biases reordered with their rows",
            "gguf": LLAMA_CPP_GGUF_PY.format(arch="muse-glimmer"),
        },
    ),
    Family(
        "Muse Glimmer Assistant",
        "muse_glimmer_assistant",
        "MuseGlimmerAssistantModel",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Muse Glimmer drafter is not mapped yet"),
        **no_trainer_model("Muse Glimmer Assistant"),
        fused_siblings=DEFAULT_FUSED_SIBLINGS,
        # (llama.cpp's dflash: a drafter without embedding or head, which llama.cpp runs beside its target alone; the
        # converter reads the vocabulary from the target's folder, unshard from the drafter's, which is its target's)
        gguf=GGUFPart(
            "DFLASH",
            hyperparameters=muse_glimmer_drafter_hyperparameters,
            vocabulary="bpe",
            after_vocabulary=muse_glimmer_drafter_tokens,
            # (gguf-py's special tokens read the drafter's config.json, which names its mask token among the
            # vocabulary's; the converter's read the target's, which does not, and name it last)
            unnamed_special_tokens=("mask",),
        ),
        mmproj=Unsupported("a drafter has no towers", applies=False),
        moe_layout=NOT_A_MOE_INPUT,
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="dflash")},
    ),
)
