"""The models a recipe merges, opened as checkpoints of any layout unshard reads (metadata only): a folder,
relative to the recipe's if not found here, or a Hub id; `model+adapter` folds a LoRA adapter on the way."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..hub import fetch, is_hub_id
from ..model_files import MODEL_FILE_PATTERNS
from ..plan import build_plan
from ..sources import SourceOptions, open_checkpoint
from ..types import Group, OutputOptions, OutputTensor, Plan
from .adapter import Adapter
from .recipe import RecipeError

# What a merge reads of a model on the Hub: weights (safetensors, else pickles), config and tokenizer files; of
# an adapter, its config and weights.
MODEL_PATTERNS = ["*.safetensors", "*.safetensors.index.json", *MODEL_FILE_PATTERNS]
PICKLE_PATTERNS = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]
ADAPTER_PATTERNS = ["adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"]

# A tensor of the layer stack: (stack).(layer index).(rest), "model.layers.3.mlp.up_proj.weight"
LAYER = re.compile(r"^((?:[^.]+\.)*?layers)\.(\d+)\.(.+)$")

if TYPE_CHECKING:
    import torch


@dataclass
class Input:
    reference: str
    plan: Plan
    groups: dict[str, Group] = field(default_factory=dict)  # output name -> the group making it
    adapter: Adapter | None = None  # `base+adapter`: a PEFT LoRA adapter applied to this input
    _recent: tuple[Group, dict[str, Any]] | None = None  # the last group of several outputs made, and its outputs

    def output(self, name: str) -> OutputTensor | None:
        """The tensor `name` as this input's plan writes it (None: it has none)."""
        group = self.groups.get(name)
        return next((o for o in group.outputs if o.name == name), None) if group else None

    def read(self, name: str) -> torch.Tensor:
        """The tensor `name`, whole, as its plan makes it, with the adapter folded in: a tensor of its own
        (callers work in it). A group making several outputs (split experts) is made once for them all."""
        from ..write.assemble import materialise

        group = self.groups[name]
        if len(group.outputs) == 1:
            tensor = materialise(self.plan, group)[0][1]
        else:
            if self._recent is None or self._recent[0] is not group:
                self._recent = (group, dict(materialise(self.plan, group)))
            tensor = self._recent[1][name].clone()
        return self.adapter.apply(name, tensor) if self.adapter else tensor

    @cached_property
    def stacks(self) -> dict[str, int]:
        """Its stacks of layers ("model.layers", and "vision_tower.layers" in a VLM), with their layer counts."""
        counts: dict[str, int] = {}
        for name in self.groups:
            if found := LAYER.match(name):
                counts[found[1]] = max(counts.get(found[1], 0), int(found[2]) + 1)
        return counts


def _resolve(reference: str, recipe_dir: Path, adapter: bool = False) -> Path:
    """A model (or adapter) the recipe names: a folder, relative to the recipe's if not here, or a Hub id."""
    path = Path(reference).expanduser()
    if not path.is_absolute() and not path.exists() and (recipe_dir / path).exists():
        path = recipe_dir / path
    if path.exists():
        return path
    if not is_hub_id(reference):
        raise RecipeError(f"{reference}: no such model folder, nor a Hub model id (owner/name)")
    if adapter:
        return fetch(reference, ADAPTER_PATTERNS, "the adapter")
    folder = fetch(reference, MODEL_PATTERNS, "the model")
    if not list(folder.glob("*.safetensors")):  # an older model, saved as pickles (read without running them)
        folder = fetch(reference, PICKLE_PATTERNS, "the model")  # (into the same snapshot folder)
    return folder


def open_input(reference: str, recipe_dir: Path, check: bool) -> Input:
    path, _, adapter = reference.partition("+")  # `base+adapter`, as mergekit writes a LoRA on a base model
    checkpoint = open_checkpoint(_resolve(path, recipe_dir))
    plan = build_plan(checkpoint, OutputOptions(dtype="float32"), SourceOptions(check=check))
    item = Input(reference, plan, adapter=Adapter(_resolve(adapter, recipe_dir, adapter=True)) if adapter else None)
    item.groups = {o.name: g for g in plan.groups for o in g.outputs}
    stray = sorted({*item.adapter.lora, *item.adapter.replaced} - set(item.groups)) if item.adapter else []
    if stray:
        raise RecipeError(
            f"{item.adapter.weights}: adapts {stray[0]}, which {path} does not have; is it the "
            "adapter of another model?"
        )
    return item
