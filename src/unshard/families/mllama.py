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

from ..names.meta_rules import CrossLayers, Fused, Reshaped, Tiled, Zeros
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

# Meta's own names (its consolidated.00.pth, and torchtune's FullModelMetaCheckpointer's), as torchtune's
# llama3_vision_meta_to_tune reads them: the cross-attention layers numbered on their own, the tower's layers
# `resblocks`, its patch embedding a Linear layer (of transformers' Conv2d), the rotary frequencies kept (skipped)
_M, _E = "text_model.", "vision_model.vision_encoder."
_META_CLIP_LAYER = {
    **{f"attn.w{p}.weight": f"self_attn.{p}_proj.weight" for p in "qkv"},
    "attn.wo.weight": "self_attn.o_proj.weight",
    **{
        f"mlp.{own}.{k}": f"mlp.{hf}.{k}"
        for own, hf in (("c_fc", "fc1"), ("c_proj", "fc2"))
        for k in ("weight", "bias")
    },
    **{
        f"{own}.{k}": f"{hf}.{k}"
        for own, hf in (("ln_1", "input_layernorm"), ("ln_2", "post_attention_layernorm"))
        for k in ("weight", "bias")
    },
}
META_MLLAMA = {
    _M + "layers.": CrossLayers(),
    _M + "cross_attention_layers.": CrossLayers(apart=True),
    _M + "rope.freqs": Zeros(_T + "model.norm.weight", "the rotary frequencies Meta's checkpoint keeps"),
    _M + "tok_embeddings.weight": Fused(_T + "model.embed_tokens.weight", 0, rows="vocab_size"),
    _M + "learnable_embedding.weight": Fused(_T + "model.embed_tokens.weight", 1),
    _M + "norm.weight": (_T + "model.norm.weight", None),
    _M + "output.weight": (_T + "lm_head.weight", None),
    **{
        _M + f"layers.{{i}}.{own}": (_X + hf, rotary)
        for own, (hf, rotary) in {
            **{f"attention.w{p}.weight": (f"self_attn.{p}_proj.weight", p if p != "v" else None) for p in "qkv"},
            "attention.wo.weight": ("self_attn.o_proj.weight", None),
            "attention_norm.weight": ("input_layernorm.weight", None),
            "ffn_norm.weight": ("post_attention_layernorm.weight", None),
            **{
                f"feed_forward.w{n}.weight": (f"mlp.{p}_proj.weight", None)
                for n, p in zip("123", ("gate", "down", "up"))
            },
        }.items()
    },
    **{
        _M + f"cross_attention_layers.{{i}}.{own}": (_X + hf, None)
        for own, hf in (
            *((f"attention.w{p}.weight", f"cross_attn.{p}_proj.weight") for p in "qkv"),
            ("attention.wo.weight", "cross_attn.o_proj.weight"),
            ("attention.q_norm.weight", "cross_attn.q_norm.weight"),
            ("attention.k_norm.weight", "cross_attn.k_norm.weight"),
            *((f"feed_forward.w{n}.weight", f"mlp.{p}_proj.weight") for n, p in zip("123", ("gate", "down", "up"))),
            ("attention_norm.weight", "input_layernorm.weight"),
            ("ffn_norm.weight", "post_attention_layernorm.weight"),
            ("gate_attn", "cross_attn_attn_gate"),
            ("gate_ffwd", "cross_attn_mlp_gate"),
        )
    },
    _E + "conv1._linear.weight": Reshaped(_V + "patch_embedding.weight", (3, *["vision_config.patch_size"] * 2)),
    _E + "class_embedding": (_V + "class_embedding", None),
    **{f"{_E}ln_{n}.{k}": (f"{_V}layernorm_{n}.{k}", None) for n in ("pre", "post") for k in ("weight", "bias")},
    **{
        f"{_E}{n}_tile_pos_embed.embedding": Tiled(f"{_V}{n}_tile_positional_embedding.embedding.weight", _RATIOS)
        for n in ("pre", "post")
    },
    **{f"{_E}{n}_tile_pos_embed.gate": (f"{_V}{n}_tile_positional_embedding.gate", None) for n in ("pre", "post")},
    _E + "positional_embedding": (_V + "gated_positional_embedding.embedding", None),
    _E + "gated_positional_embedding": Tiled(_V + "gated_positional_embedding.tile_embedding.weight", _RATIOS),
    _E + "gated_positional_embedding_gate": (_V + "gated_positional_embedding.gate", None),
    **{
        f"{_E}transformer.resblocks.{{i}}.{own}": (f"{_V}transformer.layers.{{i}}.{hf}", None)
        for own, hf in _META_CLIP_LAYER.items()
    },
    **{
        f"{_E}global_transformer.resblocks.{{i}}.{own}": (f"{_V}global_transformer.layers.{{i}}.{hf}", None)
        for own, hf in (*_META_CLIP_LAYER.items(), ("gate_attn", "gate_attn"), ("gate_ffn", "gate_ffn"))
    },
    **{f"vision_model.vision_projection.{k}": (f"multi_modal_projector.{k}", None) for k in ("weight", "bias")},
}

FAMILIES = (
    Family(
        "Llama 3.2 Vision",
        "mllama",
        "MllamaForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=MEGATRON,
        meta_names={**TORCHTUNE_MLLAMA, **META_MLLAMA},  # (the name sets do not overlap)
        torchtune_names=TORCHTUNE_MLLAMA,
        fused_siblings=DEFAULT_FUSED_SIBLINGS,
        # (the converter unshard's GGUF files are checked against, llama-cpp-python 0.3.36's, registers no
        # MllamaForConditionalGeneration: llama.cpp converts no Llama 3.2 Vision to compare with, or run it)
        gguf=Unsupported("llama.cpp's converter does not convert Llama 3.2 Vision", applies=False),
        mmproj=Unsupported("llama.cpp's converter does not convert Llama 3.2 Vision", applies=False),
        moe_layout=NO_MOE,
        notes={
            "meta_names": "torchtune's names and Meta's; their cross-attention layers numbered as Hugging Face's",
            "to_torchtune": "the tile embeddings from the ratios of all tiles, as torchtune's converter takes them",
        },
    ),
)
