"""Muse Glimmer (Meta's vision-language model, which torchtitan 0.3 trains): a text model of gated attention (q and k
normed without a scale), four norms a layer and a normed embedding, beside a vision tower, its adapter and projection.
It converts by transformers' own names; torchtitan's names are read and written as its MuseGlimmerStateDictAdapter
maps them: its text and vision rotary turn interleaved pairs, so q and k rows (and the tower's q and k biases) are
reordered per head."""

from __future__ import annotations

from .parts import DEFAULT_FUSED_SIBLINGS, NO_TABLE, NOT_A_MOE_INPUT, Family, Unsupported

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
        gguf=Unsupported("llama.cpp's converter writes it as muse-glimmer, which gguf-py 0.19 (PyPI's newest) lacks"),
        mmproj=Unsupported("llama.cpp's converter writes its projector as one gguf-py 0.19 (PyPI's newest) lacks"),
        moe_layout=NOT_A_MOE_INPUT,
        notes={
            "meta_names": "torchtitan's names, its vision tower's too",
            "to_torchtitan": "its vision tower's q and k biases reordered with their rows",
        },
    ),
)
