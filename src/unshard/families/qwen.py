"""Qwen2 (and Qwen2.5) and Qwen3: Llama's layout with biases on q, k and v (Qwen2) or q and k norms (Qwen3);
llama.cpp's qwen2 and qwen3, which rotate halves of each head as transformers does; torchtitan's Qwen3 names. Their
layers alone (`Qwen2Model`, `Qwen3Model`: embedding models, Qwen3-Embedding's and gte-Qwen2's) too, pooled in
llama.cpp as their sentence-transformers folder says."""

from __future__ import annotations

from pathlib import Path

from ..names import dense_tables as t
from ..names import megatron_rules as m
from .gguf_hooks import text_hyperparameters
from .llama import (
    MEGATRON_RULES,
    SIBLINGS,
    TEXT_ONLY,
    TORCHTITAN,
    TORCHTITAN_BEFORE_0_3,
    TORCHTUNE,
    TORCHTUNE_ENDS,
    L,
)
from .parts import Family, GGUFPart, MegatronRules, Unsupported
from .sentence_transformers import pooled

# torchtitan's Qwen3 (the names its Qwen3StateDictAdapter maps): Llama's, with q and k norms; its rotary already
# turns halves of each head, as transformers' does, so no rows are permuted
TORCHTITAN_QWEN3 = {
    **{name: (hf, None) for name, (hf, _) in TORCHTITAN.items()},
    "layers.{i}.attention.q_norm.weight": (L + "self_attn.q_norm.weight", None),
    "layers.{i}.attention.k_norm.weight": (L + "self_attn.k_norm.weight", None),
}
TORCHTITAN_QWEN3_BEFORE_0_3 = {name: (hf, None) for name, (hf, _) in TORCHTITAN_BEFORE_0_3.items()}
# torchtune's Qwen2 (and Qwen2.5; its qwen2_tune_to_hf): Llama's torchtune names with q, k and v biases, and no rows
# permuted (its rotary turns halves of each head, as transformers')
TORCHTUNE_QWEN2 = {
    **{name: (hf, None) for name, (hf, _) in {**TORCHTUNE, **TORCHTUNE_ENDS}.items()},
    **{f"layers.{{i}}.attn.{p}_proj.bias": (L + f"self_attn.{p}_proj.bias", None) for p in "qkv"},
}


def qwen_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The TextModel's, then the pooling a sentence-transformers folder names (an embedding model's: Qwen3-Embedding's
    last token, gte-Qwen2's mean), as the converter's Qwen2Model writes them."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    pooled(writer, hparams, folder)


FAMILIES = (
    Family(
        "Qwen2",
        "qwen2",
        "Qwen2ForCausalLM",
        tensors=t.TensorTable(
            "Qwen2ForCausalLM", {**t.SIZES, "num_key_value_heads": 32}, {**t.LAYER, **t.QKV_BIAS}, {}
        ),
        megatron=MegatronRules(MEGATRON_RULES, m.Signature(qkv_bias=True)),
        meta_names=TORCHTUNE_QWEN2,
        torchtune_names=TORCHTUNE_QWEN2,
        torchtitan_names=Unsupported("torchtitan has no Qwen2 model", applies=False),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart("QWEN2", hyperparameters=qwen_hyperparameters),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("a dense family: merge-moe assembles Qwen MoE from it", applies=False),
        notes={"meta_names": "torchtune's names (torchtitan has no Qwen2)"},
        also=("Qwen2Model",),  # (its layers alone, as embedding models have them: gte-Qwen2's)
    ),
    Family(
        "Qwen3",
        "qwen3",
        "Qwen3ForCausalLM",
        tensors=t.TensorTable(
            "Qwen3ForCausalLM",
            {**t.SIZES, "num_key_value_heads": 32, "head_dim": 128},
            {**t.LAYER, **t.QK_NORM},
            {"attention_bias": (False, t.ATTENTION_BIAS)},
        ),
        megatron=MegatronRules(MEGATRON_RULES, m.Signature(qk_norm=True)),
        meta_names={**TORCHTITAN_QWEN3, **TORCHTITAN_QWEN3_BEFORE_0_3},
        torchtitan_names=TORCHTITAN_QWEN3,
        fused_siblings=SIBLINGS,
        gguf=GGUFPart("QWEN3", hyperparameters=qwen_hyperparameters),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("a dense family: merge-moe assembles Qwen3 MoE from it", applies=False),
        notes={"meta_names": "torchtitan's names (torchtune's last release, 0.6.1, has no Qwen3)"},
        also=("Qwen3Model",),  # (its layers alone, as embedding models have them: Qwen3-Embedding's)
    ),
)
