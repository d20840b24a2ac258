"""Llama 3.2 Vision (Mllama): Llama's text model with cross-attention layers between its layers, gated by tanh, a CLIP
tower over image tiles (its position embeddings per tile and per aspect ratio, gated) and a global transformer after
it, and a projector into the text model's width. It converts by transformers' own names, which are the Hub's.

torchtune 0.6.1 trains it (its DeepFusionModel) and its names are read as its checkpointer's converter
(llama3_vision_tune_to_hf) maps them: each cross-attention layer is fused into the decoder layer after it
(`decoder.layers.N.fusion_layer.`), which Hugging Face numbers as a layer of its own; the special tokens' embedding
is apart (`fusion_embedding`); the tile embeddings are kept per (row, column) of tiles, which Hugging Face holds per
aspect ratio; the text model's q and k rows turn interleaved pairs, as Llama's. Written back (`--names torchtune`)
as its llama3_vision_hf_to_tune maps them: the tile embeddings from the rows of the ratios of all tiles (torchtune's
model has no place for the rows of ratios of fewer tiles, which a Hugging Face model trains apart).
"""

from __future__ import annotations

from ..names.meta_rules import CrossLayers, Fused, Tiled
from .llama import TORCHTUNE
from .parts import DEFAULT_FUSED_SIBLINGS, NO_TABLE, Family, Unsupported
from .vlm import MEGATRON, NO_MOE

_T, _X = "language_model.", "language_model.model.layers.{i}."
_V = "vision_model."
# (a CLIP layer of torchtune's, tower and global transformer alike: its names -> transformers')
_CLIP_LAYER = {
    **{f"attn.{p}_proj.weight": f"self_attn.{p}_proj.weight" for p in "qkv"},
    "attn.output_proj.weight": "self_attn.o_proj.weight",
    **{f"mlp.w{n}.{k}": f"mlp.fc{n}.{k}" for n in (1, 2) for k in ("weight", "bias")},
    **{
        f"{own}.{k}": f"{hf}.{k}"
        for own, hf in (("sa_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm"))
        for k in ("weight", "bias")
    },
}
_RATIOS = "vision_config.supported_aspect_ratios"
TORCHTUNE_MLLAMA = {
    "decoder.layers.": CrossLayers("fusion_layer."),
    "decoder.tok_embeddings.weight": Fused(_T + "model.embed_tokens.weight", 0, rows="vocab_size"),
    "decoder.tok_embeddings.fusion_embedding.weight": Fused(_T + "model.embed_tokens.weight", 1),
    "decoder.norm.scale": (_T + "model.norm.weight", None),
    "decoder.output.weight": (_T + "lm_head.weight", None),
    **{"decoder." + own: (_T + hf, rotary) for own, (hf, rotary) in TORCHTUNE.items() if own.startswith("layers.")},
    **{
        f"decoder.layers.{{i}}.fusion_layer.{own}": (_X + hf, None)
        for own, hf in (
            *((f"attn.{p}_proj.weight", f"cross_attn.{p}_proj.weight") for p in "qkv"),
            ("attn.output_proj.weight", "cross_attn.o_proj.weight"),
            ("attn.q_norm.scale", "cross_attn.q_norm.weight"),
            ("attn.k_norm.scale", "cross_attn.k_norm.weight"),
            ("mlp.w1.weight", "mlp.gate_proj.weight"),
            ("mlp.w2.weight", "mlp.down_proj.weight"),
            ("mlp.w3.weight", "mlp.up_proj.weight"),
            ("ca_norm.scale", "input_layernorm.weight"),
            ("mlp_norm.scale", "post_attention_layernorm.weight"),
            ("ca_scale.scale", "cross_attn_attn_gate"),
            ("mlp_scale.scale", "cross_attn_mlp_gate"),
        )
    },
    "encoder.clip.conv.weight": (_V + "patch_embedding.weight", None),
    "encoder.clip.cls_token_embedding.weight": (_V + "class_embedding", None),
    **{
        f"encoder.clip.ln_{n}.{k}": (f"{_V}layernorm_{n}.{k}", None)
        for n in ("pre", "post")
        for k in ("weight", "bias")
    },
    **{
        f"encoder.clip.{n}_tile_pos_embed.embedding": Tiled(
            f"{_V}{n}_tile_positional_embedding.embedding.weight", _RATIOS
        )
        for n in ("pre", "post")
    },
    **{
        f"encoder.clip.{n}_tile_pos_embed.gate": (f"{_V}{n}_tile_positional_embedding.gate", None)
        for n in ("pre", "post")
    },
    "encoder.clip.token_pos_embedding.local_token_positional_embedding": (
        _V + "gated_positional_embedding.embedding",
        None,
    ),
    "encoder.clip.token_pos_embedding.global_token_positional_embedding": Tiled(
        _V + "gated_positional_embedding.tile_embedding.weight", _RATIOS
    ),
    "encoder.clip.token_pos_embedding.gate": (_V + "gated_positional_embedding.gate", None),
    **{
        f"encoder.clip.layers.{{i}}.{own}": (f"{_V}transformer.layers.{{i}}.{hf}", None)
        for own, hf in _CLIP_LAYER.items()
    },
    **{
        f"encoder.projection.layers.{{i}}.{own}": (f"{_V}global_transformer.layers.{{i}}.{hf}", None)
        for own, hf in (*_CLIP_LAYER.items(), ("sa_scale.scale", "gate_attn"), ("mlp_scale.scale", "gate_ffn"))
    },
    **{f"encoder.projection.output.{k}": (f"multi_modal_projector.{k}", None) for k in ("weight", "bias")},
}

FAMILIES = (
    Family(
        "Llama 3.2 Vision",
        "mllama",
        "MllamaForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=MEGATRON,
        meta_names=TORCHTUNE_MLLAMA,
        torchtune_names=TORCHTUNE_MLLAMA,
        fused_siblings=DEFAULT_FUSED_SIBLINGS,
        # (the converter unshard's GGUF files are checked against, llama-cpp-python 0.3.36's, registers no
        # MllamaForConditionalGeneration: llama.cpp converts no Llama 3.2 Vision to compare with, or run it)
        gguf=Unsupported("llama.cpp's converter does not convert Llama 3.2 Vision", applies=False),
        mmproj=Unsupported("llama.cpp's converter does not convert Llama 3.2 Vision", applies=False),
        moe_layout=NO_MOE,
        notes={
            "meta_names": "torchtune's names; its cross-attention layers numbered as Hugging Face's",
            "to_torchtune": "the tile embeddings from the ratios of all tiles, as torchtune's converter takes them",
        },
    ),
)
