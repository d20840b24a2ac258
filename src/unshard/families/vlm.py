"""The vision-language models verl trains with FSDP: Qwen2-VL, Qwen2.5-VL and Llama 3.2 Vision (Mllama). They
convert from rank files, DCP and DeepSpeed by transformers' own names (save_pretrained's `visual.*` / `model.*`),
and quantize with their vision towers left as they are; no other path knows them yet."""

from __future__ import annotations

from .parts import DEFAULT_FUSED_SIBLINGS, NO_META_NAMES, NO_TABLE, Family, Unsupported

MEGATRON = Unsupported("verl's Megatron vision-language layouts are not mapped yet")
NO_MOE = Unsupported("a dense family; merge-moe assembles no MoE from vision-language models", applies=False)


def _family(name: str, model_type: str, architecture: str, llama_cpp: str) -> Family:
    return Family(
        name,
        model_type,
        architecture,
        tensors=NO_TABLE,
        megatron=MEGATRON,
        meta_names=NO_META_NAMES,
        fused_siblings=DEFAULT_FUSED_SIBLINGS,
        gguf=Unsupported(f"llama.cpp's {llama_cpp} text model is not written by unshard yet"),
        mmproj=Unsupported(f"llama.cpp's {llama_cpp} projector is not written by unshard yet"),
        moe_layout=NO_MOE,
    )


FAMILIES = (
    _family("Qwen2-VL", "qwen2_vl", "Qwen2VLForConditionalGeneration", "qwen2vl"),
    _family("Qwen2.5-VL", "qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "qwen2vl"),
    _family("Llama 3.2 Vision", "mllama", "MllamaForConditionalGeneration", "mllama"),
)
