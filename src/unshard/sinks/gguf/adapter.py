"""A LoRA adapter kept apart (--lora separate) as llama.cpp's own file for it, beside the model's GGUF file: what
`convert_lora_to_gguf.py` writes from the PEFT folder unshard would have written. Each adapted weight's lora_A
([r, in]) and lora_B ([out, r]) under its llama.cpp name with `.lora_a` / `.lora_b`, lora_B's rows reordered per
head where the model's weight's are (a llama's q and k: B @ A is then the reordered weight), in the type the model's
weight would take, in the PEFT file's order; the header names the architecture, the file an adapter of type lora, and
its alpha. llama.cpp computes B @ A scaled by alpha / r, the rank read from lora_a's shape: PEFT's scale, but for
rsLoRA (alpha / sqrt(r)), which it has no way to say."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from ... import dtypes
from ...errors import UnshardError
from ...families.gguf_hooks import gguf_py
from ...types import Group, OutputTensor
from .plan import gguf_type
from .tensors import QUANTIZED, GGUFPlan, GGUFTensor

LORA_FILE_NAME = "lora.gguf"  # inside the staging folder; committed beside OUT (lora_path)
# PEFT's name of an adapted Linear layer's halves, as the plan writes them (plan._adapter_plan)
HALF = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<half>A|B)\.weight$")


def lora_path(out: Path) -> Path:
    """Where the adapter goes: beside OUT, named after it as the converter names an adapter (...-LoRA)."""
    return out.with_name(f"{out.stem}-LoRA{out.suffix}")


def plan_lora(model: GGUFPlan, groups: list[Group], config: dict[str, Any], where: str) -> GGUFPlan:
    """The adapter file's plan, each group's output given its encoding; one line for an adapter llama.cpp's file
    cannot hold as trained."""
    gguf = gguf_py()
    unsupported = [
        (config.get("use_rslora"), "rsLoRA scales by alpha / sqrt(r), and llama.cpp by alpha / r"),
        (config.get("use_dora"), "DoRA's magnitudes have no place in llama.cpp's adapter"),
        (config.get("modules_to_save"), f"modules_to_save ({config.get('modules_to_save')}) are whole weights"),
    ]
    for found, why in unsupported:
        if found:
            raise UnshardError(
                f"{where}: this LoRA adapter cannot be a llama.cpp adapter file ({why}); write it with --lora merge, "
                "or as a folder (OUT without .gguf) with --lora separate"
            )
    file_type = model.file_type if model.file_type not in QUANTIZED else "f16"
    plan = GGUFPlan(file_type, model.architecture, gguf.GGUFWriter(None, model.architecture))
    if file_type != model.file_type:
        plan.notes.append(
            f"the LoRA adapter in f16: llama.cpp's adapters are f32, f16, bf16 or q8_0, not {model.file_type}"
        )
    qtype = getattr(gguf.GGMLQuantizationType, file_type.upper())
    modules: dict[str, int] = {}  # (the converter's order: each module where the file first has it, A then B)
    for group in groups:
        output = group.outputs[0]
        half = HALF.match(output.name)
        base = model.encoded.get(f"{half['module']}.weight") if half else None
        if not isinstance(base, GGUFTensor) or base.stored[0].name.endswith("]"):
            raise UnshardError(
                f"{where}: {output.name} adapts a tensor llama.cpp's file stores otherwise than as one weight (an "
                "embedding, an expert, a tensor it rearranges); write it with --lora merge, or as a folder"
            )
        weight = base.stored[0].name
        kind, _ = gguf_type(plan, weight, output.shape, qtype, False, 0, None)
        byte_shape = tuple(gguf.quant_shape_to_byte_shape(output.shape, kind))
        stored = OutputTensor(f"{weight}.lora_{half['half'].lower()}", byte_shape, dtypes.BY_NAME["uint8"])
        head_dim = base.head_dim if half["half"] == "B" else 0  # (B's rows are the weight's: reordered as they are)
        plan.encoded[output.name] = GGUFTensor((stored,), kind, output.dtype, head_dim, max(1, head_dim))
        plan.positions[stored.name] = (modules.setdefault(half["module"], len(modules)), half["half"])
        group.outputs = [replace(output, encoding=plan.encoded[output.name])]
    writer = plan.writer
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    general = gguf.Metadata()
    base_name = model.writer.kv_data[0].get(gguf.Keys.General.NAME)
    general.name = f"{base_name.value} LoRA" if base_name else "LoRA"
    general.set_gguf_meta_model(writer)
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(config["lora_alpha"]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    plan.vocabulary = "none (an adapter)"
    return plan
