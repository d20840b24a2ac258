"""Kimi K2.5 (and K2.6, K2.7-Code, Kimi-VL: the same tensors): DeepSeek-V3's text model beside MoonViT, a vision
tower of fused-QKV blocks, and a projector merging 2 x 2 patches into the text model's width.

Its Hugging Face folder holds the names of the Hub's checkpoints (`language_model.model.layers.N.`,
`vision_tower.encoder.blocks.N.wqkv`, `mm_projector.proj.0`), which vLLM and llama.cpp's converter read and
transformers renames as it loads them. (transformers' save_pretrained writes its own module names instead, which no
other tool reads, so they are declared here and not asked of it.) torchtitan 0.3 trains it as `kimi_k2_7`, and its
names are read and written as its KimiK25StateDictAdapter maps them: the text model's as DeepSeek-V3's, the tower's q,
k and v apart (their rows as the Hub's, whose rotary turns interleaved pairs as torchtitan's does), its patch
embedding a Linear layer of the Hub's Conv2d.
"""

from __future__ import annotations

from dataclasses import replace

from ..names.meta_rules import Fused, Reshaped
from .deepseek import DEEPSEEK2, TORCHTITAN_WITHOUT_MTP
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, Unsupported

_B = "vision_tower.encoder.blocks.{i}."
# (the Hub's checkpoints have no multi-token prediction layers: torchtitan's Kimi K2.5 flavors have none either)
TORCHTITAN_KIMI_K25 = {
    **{trainer: ("language_model." + hub, rotary) for trainer, (hub, rotary) in TORCHTITAN_WITHOUT_MTP.items()},
    "vision_encoder.pos_embed": ("vision_tower.patch_embed.pos_emb.weight", None),
    "vision_encoder.patch_embed.weight": Reshaped(
        "vision_tower.patch_embed.proj.weight", (3, "vision_config.patch_size", "vision_config.patch_size")
    ),
    "vision_encoder.patch_embed.bias": ("vision_tower.patch_embed.proj.bias", None),
    **{
        f"vision_encoder.layers.{{i}}.{titan}.{k}": (f"{_B}{hub}.{k}", None)
        for titan, hub in (
            ("norm1", "norm0"),
            ("norm2", "norm1"),
            ("attn.proj", "wo"),
            ("mlp.linear_fc1", "mlp.fc0"),
            ("mlp.linear_fc2", "mlp.fc1"),
        )
        for k in ("weight", "bias")
    },
    **{
        f"vision_encoder.layers.{{i}}.attn.w{p}.{k}": Fused(f"{_B}wqkv.{k}", n)
        for n, p in enumerate("qkv")
        for k in ("weight", "bias")
    },
    **{
        f"vision_encoder.{titan}.{k}": (hub + k, None)
        for titan, hub in (
            ("final_norm", "vision_tower.encoder.final_layernorm."),
            ("projector.pre_norm", "mm_projector.pre_norm."),
            ("projector.linear_1", "mm_projector.proj.0."),
            ("projector.linear_2", "mm_projector.proj.2."),
        )
        for k in ("weight", "bias")
    },
}

FAMILIES = (
    Family(
        "Kimi K2.5",
        "kimi_k25",
        "KimiK25ForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Kimi K2.5 layout is not mapped yet"),
        meta_names=TORCHTITAN_KIMI_K25,
        torchtitan_names=TORCHTITAN_KIMI_K25,
        # (transformers names its modules otherwise than the Hub's tensors, by which its Linear layers are found)
        fused_siblings=Unsupported("not yet compared with what llm-compressor writes for Kimi K2.5"),
        gguf=replace(
            DEEPSEEK2,
            towers=r"^(?:vision_tower|mm_projector)\.",
            towers_left_out="MoonViT's and its projector's: the converter reads them by its remote-code config's keys",
        ),
        mmproj=Unsupported("llama.cpp's converter reads MoonViT by the keys of its remote-code config, not yet mapped"),
        moe_layout=NOT_A_MOE_INPUT,
        hub_names="tensor names kept as saved, not asked of transformers (its Kimi K2.5 renames the Hub's names as it "
        "loads them, and its save_pretrained writes others)",
        notes={
            "meta_names": "torchtitan's names (kimi_k2_7), its vision tower's too; the Hub's names in the folder",
            "to_torchtitan": "its vision tower's q, k and v apart, its patch embedding flat",
        },
    ),
)
