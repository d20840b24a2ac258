"""Muse Glimmer (Meta's vision-language model, which torchtitan 0.3 trains): a text model of gated attention (q and k
normed without a scale), four norms a layer and a normed embedding, beside a vision tower, its adapter and projection.
It converts by transformers' own names; torchtitan's names are read and written as its MuseGlimmerStateDictAdapter
maps them: its text and vision rotary turn interleaved pairs, so q and k rows (and the tower's q and k biases) are
reordered per head.

GGUF: the text model as llama.cpp's muse-glimmer; the tower, its adapter and the projection into the text model as the
mmproj file of llama.cpp's muse-glimmer projector (both with llama.cpp's own gguf-py, which names them)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import fixed_in_code, json_or_empty, mmproj_model_forced_type, text_hyperparameters
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
    prefix_renamed,
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
    none on the global ones, its own epsilon after attention and the MLP; and its muse-glimmer projector: GELU (erf)
    in the adapter. Another config is one line."""
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
    elif hparams.get("projector_hidden_act", "gelu") != "gelu":  # (the adapter's, before the projection)
        act = hparams["projector_hidden_act"]
        why = f"projector_hidden_act is {act!r}, and llama.cpp's muse-glimmer projector runs GELU"
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


def muse_glimmer_vision_sizes(vision: dict, where: Path) -> dict:
    """The tower as the converter reads it, its image size the position grid's merged tokens' pixels. Refuses what
    llama.cpp's muse-glimmer projector fixes in code: rope at a base of 10000, GELU (erf) in the tower, a square
    position grid (each window's side), and the layers that attend globally: every fourth and the last, the others
    within windows (transformers' own default)."""
    layers = vision.get("num_hidden_layers", 0)
    global_every_fourth = [
        "full_attention" if (i + 1) % 4 == 0 or i == layers - 1 else "window_attention" for i in range(layers)
    ]
    runs = {
        "rope_theta": ((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0), 10000.0),
        "hidden_act": (vision.get("hidden_act", "gelu"), "gelu"),
        "pos_emb_width": (vision.get("pos_emb_width", 32), vision.get("pos_emb_height", 32)),
        "layer_types": (vision.get("layer_types", global_every_fourth), global_every_fourth),
    }
    fixed_in_code(where, "vision", "muse-glimmer projector", runs)
    grid, patch, merge = vision.get("pos_emb_height", 32), vision.get("patch_size", 14), vision.get("merge_size", 2)
    return {**vision, "image_size": grid * patch * merge}


def muse_glimmer_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The converter's MuseGlimmerVisionModel's: the tower's norm epsilon and the merge."""
    writer.add_vision_attention_layernorm_eps(float(vision.get("layer_norm_eps", 1e-5)))
    writer.add_vision_spatial_merge_size(int(vision.get("merge_size", 2)))


# the converter's names of the adapter's two layers and the projection into the text model: the projector's three
MUSE_GLIMMER_PROJECTOR = (
    ("model.vision_adapter.fc1.", "mm.0."),
    ("model.vision_adapter.fc2.", "mm.1."),
    ("model.vision_projection.", "mm.2."),
)


def muse_glimmer_patches(name: str, shape: tuple[int, ...], vision: dict) -> Rearrangement | None:
    """The converter's patch embedding: a Linear layer over each patch's frames (an image is the same pixels in
    each), as one 2-D convolution of their sum (in float32 from bfloat16, as the converter sums)."""
    if not name.endswith("patch_embedder.patch_embedding.weight"):
        return None
    patch = vision.get("patch_size", 14)
    return Rearrangement({name: (shape[0], 3, patch, patch)}, partial(frames_summed, patch=patch))


def frames_summed(band, patch: int) -> tuple:
    """A band of rows over (frames, channels, patch, patch) pixels as their sum over the frames."""
    return (band.reshape(len(band), -1, 3, patch, patch).sum(axis=1),)


MUSE_GLIMMER_MMPROJ = MmprojPart(
    "MUSE_GLIMMER",
    r"^model\.vision_(?:tower|adapter|projection)\.",
    muse_glimmer_vision_sizes,
    muse_glimmer_projector_keys,
    forced_type=mmproj_model_forced_type,
    converter_name=partial(prefix_renamed, MUSE_GLIMMER_PROJECTOR),
    rearranged=muse_glimmer_patches,
    permute_qk=True,
    note="llama.cpp's muse-glimmer resamples the tower's learned positions otherwise than transformers (the model's "
    "reference) for an image of another size than the position grid's: clamped at the edges, where transformers pads "
    "with zeros, and, for an image wider than high or higher than wide, not transposed as transformers reads them; "
    "its image features differ then (measured on a tiny model: 4e-2 on a square image, 0.15 on a wide one)",
)


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
        ),
        mmproj=MUSE_GLIMMER_MMPROJ,
        moe_layout=NOT_A_MOE_INPUT,
        notes={
            "meta_names": "torchtitan's names, its vision tower's too",
            "to_torchtitan": "its vision tower's q and k biases reordered with their rows",
            "gguf": LLAMA_CPP_GGUF_PY.format(arch="muse-glimmer"),
            "mmproj": LLAMA_CPP_GGUF_PY.format(arch="its muse-glimmer projector")
            + "; llama.cpp resamples the tower's positions otherwise than transformers for an image of another size "
            "than the position grid's (the conversion notes how)",
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
