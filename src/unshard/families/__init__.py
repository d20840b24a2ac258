"""The model families unshard knows: one module each (llama.py, qwen.py, ...), declaring everything unshard knows
about the family, and this registry, through which every path reads its part.

A family module declares Family values (parts.py): the family's tensor table, its Megatron rules, its
torchtitan/torchtune names, its fused siblings for --quantize, its GGUF mapping and header hooks, its mmproj
projector, its layout as a merge-moe output. A part the family lacks is `Unsupported(reason)`: the path that
needs it refuses with that reason, and `unshard families` shows it. A model of a family not listed here still
converts wherever transformers knows it (rank files, DCP, DeepSpeed, --quantize); the paths that need a family's
own knowledge (Megatron, torchtitan names, GGUF, merge-moe) refuse it in one line.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from . import (
    apertus,
    arcee,
    audio,
    bert,
    bloom,
    chameleon,
    cohere,
    dbrx,
    deepseek,
    deepseek_ocr,
    dots,
    dots3,
    drafters,
    ernie,
    exaone,
    falcon,
    falcon_h1,
    gemma,
    gemma3n,
    gemma4,
    glm,
    glm5_next,
    gpt2,
    gpt_bigcode,
    gpt_neox,
    gpt_oss,
    granite,
    granite_speech,
    granite_vision,
    hrm_text,
    hunyuan,
    hy_v4,
    internlm,
    internvl,
    jais,
    jamba,
    janus,
    kimi_k25,
    kimi_linear,
    laguna,
    lfm2,
    lighton_ocr,
    ling,
    llama,
    llama4,
    llava,
    mamba,
    mamba2,
    mellum,
    mimo,
    minicpm,
    minimax,
    mistral3,
    mixtral,
    mllama,
    mpt,
    muse_glimmer,
    nemotron,
    olmo,
    phi,
    phi3,
    qwen,
    qwen4_exp,
    qwen_moe,
    qwen_next,
    qwen_omni,
    rwkv,
    sarvam,
    seed_oss,
    smolvlm,
    stablelm,
    starcoder2,
    step3,
    t5,
    vlm,
)
from .parts import DEFAULT_FUSED_SIBLINGS, Family, MoELayout, Unsupported

# In the order the matrix lists them; merge-moe tries its layouts in this order too (Mixtral first, as mergekit).
FAMILIES: tuple[Family, ...] = (
    *llama.FAMILIES,
    *mistral3.FAMILIES,
    *apertus.FAMILIES,
    *qwen.FAMILIES,
    *gemma.FAMILIES,
    *gemma3n.FAMILIES,
    *gemma4.FAMILIES,
    *phi3.FAMILIES,
    *olmo.FAMILIES,
    *mellum.FAMILIES,
    *seed_oss.FAMILIES,
    *ernie.FAMILIES,
    *granite.FAMILIES,
    *hunyuan.FAMILIES,
    *hy_v4.FAMILIES,
    *jais.FAMILIES,
    *lfm2.FAMILIES,
    *mamba2.FAMILIES,
    *mamba.FAMILIES,
    *rwkv.FAMILIES,
    *falcon_h1.FAMILIES,
    *jamba.FAMILIES,
    *minicpm.FAMILIES,
    *arcee.FAMILIES,
    *exaone.FAMILIES,
    *stablelm.FAMILIES,
    *starcoder2.FAMILIES,
    *cohere.FAMILIES,
    *nemotron.FAMILIES,
    *gpt_neox.FAMILIES,
    *falcon.FAMILIES,
    *phi.FAMILIES,
    *gpt2.FAMILIES,
    *bloom.FAMILIES,
    *mpt.FAMILIES,
    *gpt_bigcode.FAMILIES,
    *mixtral.FAMILIES,
    *qwen_moe.FAMILIES,
    *qwen_next.FAMILIES,
    *qwen4_exp.FAMILIES,
    *deepseek.FAMILIES,
    *kimi_linear.FAMILIES,
    *glm.FAMILIES,
    *glm5_next.FAMILIES,
    *ling.FAMILIES,
    *dots.FAMILIES,
    *dots3.FAMILIES,
    *laguna.FAMILIES,
    *hrm_text.FAMILIES,
    *minimax.FAMILIES,
    *step3.FAMILIES,
    *mimo.FAMILIES,
    *gpt_oss.FAMILIES,
    *dbrx.FAMILIES,
    *llama4.FAMILIES,
    *vlm.FAMILIES,
    *smolvlm.FAMILIES,
    *drafters.FAMILIES,
    *llava.FAMILIES,
    *internvl.FAMILIES,
    *internlm.FAMILIES,
    *sarvam.FAMILIES,
    *lighton_ocr.FAMILIES,
    *deepseek_ocr.FAMILIES,
    *janus.FAMILIES,
    *audio.FAMILIES,
    *qwen_omni.FAMILIES,
    *chameleon.FAMILIES,
    *granite_speech.FAMILIES,
    *granite_vision.FAMILIES,
    *bert.FAMILIES,
    *t5.FAMILIES,
    *mllama.FAMILIES,
    *muse_glimmer.FAMILIES,
    *kimi_k25.FAMILIES,
)
_BY_MODEL_TYPE = {f.model_type: f for f in FAMILIES}
_BY_ARCHITECTURE = {name: f for f in FAMILIES for name in (f.architecture, *f.also)}
# The tensor tables by model type: the tests and the bench clear it to take the path of every other model.
TENSOR_TABLES = {f.model_type: f.tensors for f in FAMILIES if not isinstance(f.tensors, Unsupported)}


def by_model_type(model_type: str | None) -> Family | None:
    return _BY_MODEL_TYPE.get(model_type)


def by_architecture(architecture: str | None) -> Family | None:
    return _BY_ARCHITECTURE.get(architecture)


def supports(family: Family, part: str) -> bool:
    return not isinstance(getattr(family, part), Unsupported)


def with_part(part: str) -> list[Family]:
    """The families that have this part, in the registry's order."""
    return [f for f in FAMILIES if supports(f, part)]


def moe_layouts() -> list[MoELayout]:
    """What merge-moe assembles, in the registry's order, each with its family's architecture."""
    return [replace(f.moe_layout, architecture=f.architecture) for f in with_part("moe_layout")]


def tensor_table(model_type: str | None) -> Any | None:
    """The family's TensorTable (names/dense_tables.py), or None: transformers is asked."""
    return TENSOR_TABLES.get(model_type)


# The support matrix: path -> (its heading, the part it needs; None: every family listed, as transformers knows them)
PATHS = {
    "rank_files": ("FSDP/DCP/DeepSpeed", None),
    "megatron_legacy": ("Megatron torch", "megatron"),
    "megatron_dist": ("Megatron torch_dist", "megatron"),
    "meta_names": ("torchtitan/torchtune", "meta_names"),
    "to_megatron": ("to Megatron", "megatron_out"),  # --to megatron (torch_dist)
    "to_torchtitan": ("to torchtitan", "torchtitan_names"),  # --to dcp --names torchtitan (--names hf: every family)
    "to_torchtune": ("to torchtune", "torchtune_names"),  # --to dcp --names torchtune
    "quantize": ("--quantize", "fused_siblings"),
    "gguf": ("GGUF", "gguf"),
    "mmproj": ("GGUF mmproj", "mmproj"),
    "merge_moe": ("merge-moe output", "moe_layout"),
}


def matrix() -> list[dict[str, Any]]:
    """One row per family: its names, and for each path "yes" (or "yes: " and what to know), the reason it is
    refused, or "n/a: " and why the family cannot have it (`unshard families`)."""
    rows = []
    for family in FAMILIES:
        row: dict[str, Any] = {
            "family": family.name,
            "model_type": family.model_type,
            "architecture": family.architecture,
        }
        for path, (_, part) in PATHS.items():
            value = None if part is None else getattr(family, part)
            note = family.notes.get(path)
            if isinstance(value, Unsupported):
                row[path] = value.reason if value.applies else f"n/a: {value.reason}"
            else:
                row[path] = f"yes: {note}" if note else "yes"
        rows.append(row)
    return rows


__all__ = [
    "DEFAULT_FUSED_SIBLINGS",
    "FAMILIES",
    "PATHS",
    "Family",
    "Unsupported",
    "by_architecture",
    "by_model_type",
    "matrix",
    "moe_layouts",
    "supports",
    "tensor_table",
    "with_part",
]
