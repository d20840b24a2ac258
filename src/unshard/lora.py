"""PEFT LoRA adapters inside a checkpoint, folded into their base weights.

A PEFT model's state dict names a wrapped layer's weight `base_model.model.<module>.base_layer.weight`
and its adapter `<module>.lora_A.<adapter>.weight` ([r, in]) and `lora_B.<adapter>.weight` ([out, r]).
Folding writes `W + scale * B @ A`, computed in fp32, with scale = alpha / r (alpha / sqrt(r) for
rsLoRA); r comes from the shapes, alpha from `lora_train_meta.json` (verl), an
`adapter_config.json` beside the checkpoint, or `--lora-alpha`. An unknown alpha is an error, never
a guess.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Callable

import torch

from .errors import CheckpointError
from .readers import Checkpoint

PEFT_PREFIX = "base_model.model."
ADAPTER = re.compile(r"^(?P<module>.+)\.lora_(?P<part>A|B)\.(?P<adapter>[^.]+)\.weight$")


@dataclass
class LoraFold:
    """Renames that drop PEFT's wrapping, and a fold for every adapted base weight."""

    renames: dict[str, str] = field(default_factory=dict)
    folds: dict[str, Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _peft_name(name: str) -> str:
    name = name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name
    return name.replace(".base_layer.", ".")


def _alpha_and_rslora(checkpoint: Checkpoint, alpha: float | None) -> tuple[float | None, bool, str]:
    if alpha is not None:
        return alpha, False, "--lora-alpha"
    folders = [checkpoint.path if checkpoint.path.is_dir() else checkpoint.path.parent]
    folders.append(folders[0].parent)
    for folder in folders:
        for filename in ("lora_train_meta.json", "adapter_config.json"):
            path = folder / filename
            if path.is_file():
                meta = json.loads(path.read_text())
                if meta.get("lora_alpha") is not None:
                    return float(meta["lora_alpha"]), bool(meta.get("use_rslora")), str(path)
    return None, False, ""


def plan_fold(checkpoint: Checkpoint, alpha: float | None = None) -> LoraFold:
    names = list(checkpoint.tensors)
    adapters: dict[str, dict[str, str]] = {}
    for name in names:
        m = ADAPTER.match(name)
        if m:
            adapters.setdefault(m.group("module"), {})[m.group("part")] = name
    if not adapters:
        return LoraFold()
    adapter_names = {ADAPTER.match(n).group("adapter") for parts in adapters.values() for n in parts.values()}
    if len(adapter_names) > 1:
        raise CheckpointError(f"{checkpoint.path}: several LoRA adapters ({sorted(adapter_names)}); fold one at a time")
    alpha, rslora, source = _alpha_and_rslora(checkpoint, alpha)
    if alpha is None:
        raise CheckpointError(f"{checkpoint.path}: holds LoRA adapters but no lora_alpha (no lora_train_meta.json or "
                              "adapter_config.json beside it); pass --lora-alpha, the value the run trained with")
    fold = LoraFold(renames={n: _peft_name(n) for n in names})
    for module, parts in adapters.items():
        if set(parts) != {"A", "B"}:
            raise CheckpointError(f"{checkpoint.path}: {module} has lora_{next(iter(parts))} without its pair")
        base = f"{module}.base_layer.weight"
        if base not in checkpoint.tensors:
            raise CheckpointError(f"{checkpoint.path}: {module} has a LoRA adapter but no {base}")
        rank = checkpoint.tensors[parts["A"]].shape[0]
        scale = alpha / (math.sqrt(rank) if rslora else rank)
        fold.folds[base] = _folder(checkpoint, parts["A"], parts["B"], scale)
        for part in parts.values():
            fold.dropped[part] = "LoRA, folded into its base weight"
    fold.notes.append(f"LoRA folded into {len(adapters)} weights (alpha {alpha:g} from {source}"
                      + (", rsLoRA" if rslora else "") + ")")
    return fold


def _folder(checkpoint: Checkpoint, a_name: str, b_name: str, scale: float):
    def fold(weight: torch.Tensor) -> torch.Tensor:
        a, b = checkpoint.read(a_name).float(), checkpoint.read(b_name).float()
        return weight.float() + scale * (b @ a)
    return fold
