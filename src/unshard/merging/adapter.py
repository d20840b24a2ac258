"""A PEFT LoRA adapter folded onto a merge input (`base+adapter`, as mergekit writes it)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from ..errors import read_json
from .recipe import RecipeError

# what peft's save_pretrained writes, with safe_serialization and without (ColossalAI's save_lora_as_pretrained)
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


class Adapter:
    """A PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors or .bin) applied to a base,
    as peft's merge_and_unload does (`lora.fold_weight`): per-module r and alpha from rank_pattern /
    alpha_pattern, rsLoRA, DoRA magnitudes, embedding LoRA; weights in modules_to_save replace the base's."""

    def __init__(self, folder: Path):
        config_path = folder / "adapter_config.json"
        weights = next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), None)
        if not config_path.is_file() or weights is None:
            raise RecipeError(
                f"{folder}: not a PEFT adapter folder (adapter_config.json and adapter_model.safetensors or .bin)"
            )
        config = read_json(config_path, "restore it from where the adapter came from", RecipeError)
        if config.get("peft_type", "LORA") != "LORA":
            raise RecipeError(f"{config_path}: only LoRA adapters are folded (not {config.get('peft_type')})")
        self.folder, self.weights, self.config = folder, weights, config
        self.lora: dict[str, dict[str, str]] = {}  # HF weight name -> {"A", "B"[, "magnitude"]: key}
        self.replaced: dict[str, str] = {}  # HF weight name -> key of its full replacement
        self._pickled: dict[str, torch.Tensor] | None = None  # a .bin's tensors (an adapter is small), read safely
        if weights.suffix == ".bin":
            from ..sources.safe_torch_load import load

            self._pickled = load(weights, mmap=False)
            if not isinstance(self._pickled, dict):
                raise RecipeError(f"{weights}: not a state dict; save the adapter again with peft's save_pretrained")
            keys = list(self._pickled)
        else:
            from safetensors import safe_open

            with safe_open(weights, framework="pt") as f:
                keys = list(f.keys())
        for key in keys:
            name = key.removeprefix("base_model.model.")
            module, _, part = name.partition(".lora_")
            if part:
                kind = {
                    "A.weight": "A",
                    "B.weight": "B",
                    "embedding_A": "A",
                    "embedding_B": "B",
                    "magnitude_vector": "magnitude",
                }.get(part)
                if kind is None:
                    raise RecipeError(f"{weights}: {key}: a LoRA tensor unshard does not know")
                self.lora.setdefault(module + ".weight", {})[kind] = key
            elif not name.endswith(".base_layer.weight"):  # peft saves an adapted embedding's base too
                self.replaced[name.replace(".modules_to_save.", ".")] = key

    def adapts(self, name: str) -> bool:
        return name in self.lora or name in self.replaced

    def _scale(self, module: str, rank: int) -> float:
        def pattern(patterns: dict, default):
            for key, value in (patterns or {}).items():
                if module == key or module.endswith("." + key) or re.fullmatch(key, module):
                    return value
            return default

        alpha = pattern(self.config.get("alpha_pattern"), self.config.get("lora_alpha", 8))
        return alpha / (math.sqrt(rank) if self.config.get("use_rslora") else rank)

    def _tensors(self, *keys: str) -> list[torch.Tensor]:
        if self._pickled is not None:
            return [self._pickled[key] for key in keys]
        from safetensors import safe_open

        with safe_open(self.weights, framework="pt") as f:
            return [f.get_tensor(key) for key in keys]

    def apply(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        from ..plan.lora import fold_weight

        if name in self.replaced:
            return self._tensors(self.replaced[name])[0].float()
        if name not in self.lora:
            return tensor
        keys = self.lora[name]
        a, b, *magnitude = self._tensors(keys["A"], keys["B"], *([keys["magnitude"]] if "magnitude" in keys else []))
        embedding = ".lora_embedding_" in keys["A"]
        return fold_weight(
            tensor,
            a,
            b,
            self._scale(name[: -len(".weight")], a.shape[0]),
            embedding,
            magnitude[0] if magnitude else None,
        )
