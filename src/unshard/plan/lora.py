"""PEFT LoRA adapters inside a checkpoint: folded into their base weights, or written as a PEFT adapter.

A PEFT model's state dict names a wrapped layer's weight `base_model.model.<module>.base_layer.weight`
and its adapter `<module>.lora_A.<adapter>.weight` ([r, in]) and `lora_B.<adapter>.weight` ([out, r]).
Folding writes `W + scale * B @ A`, computed in fp32, with scale = alpha / r (alpha / sqrt(r) for
rsLoRA); r comes from the shapes, alpha from `lora_train_meta.json` (verl), an
`adapter_config.json` beside the checkpoint, or `--lora-alpha`. An unknown alpha is an error, never
a guess. Kept separate, the adapter goes to OUT/lora_adapter/ under the names PEFT's save_pretrained
writes (`base_model.model.<module>.lora_A.weight`), with an adapter_config.json PEFT loads.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import CheckpointError, read_json
from ..sources import Checkpoint

if TYPE_CHECKING:
    import torch

PEFT_PREFIX = "base_model.model."
ADAPTER = re.compile(
    r"^(?P<module>.+)\.lora_(?P<part>A|B|embedding_A|embedding_B|magnitude_vector)"
    r"\.(?P<adapter>[^.]+)(\.weight)?$"
)
SAVED_MODULE = re.compile(
    r"^(?P<module>.+)\.(?P<which>modules_to_save\.[^.]+|original_module)\.(?P<param>weight|bias)$"
)


ADAPTER_FOLDER = "lora_adapter"
ADAPTER_FILE = f"{ADAPTER_FOLDER}/adapter_model.safetensors"


@dataclass
class Adapter:
    """A LoRA adapter kept apart from the base: its tensors by adapted module, and what PEFT needs."""

    modules: dict[str, dict[str, str]]  # checkpoint module name -> {"A": tensor name, "B": tensor name}
    alpha: float
    rslora: bool
    ranks: dict[str, int]
    meta: dict  # the adapter_config.json / lora_train_meta.json found beside the checkpoint, if any
    saved: dict[str, str]  # modules_to_save: the trained copy -> the original it stands for

    @property
    def embeddings(self) -> list[str]:
        return [m for m, parts in self.modules.items() if ".lora_embedding_" in parts["A"]]

    def config(self, hf_modules: dict[str, str], hf_saved: list[str]) -> dict:
        """adapter_config.json; `hf_modules` maps checkpoint module names to the written model's,
        `hf_saved` lists the written names of the modules_to_save."""
        rank = max(set(self.ranks.values()), key=list(self.ranks.values()).count)
        return {
            "peft_type": "LORA",
            "task_type": self.meta.get("task_type", "CAUSAL_LM"),
            "base_model_name_or_path": self.meta.get("base_model_name_or_path"),
            "r": rank,
            "lora_alpha": self.alpha,
            "use_rslora": self.rslora,
            "use_dora": any("magnitude_vector" in parts for parts in self.modules.values()),
            "target_modules": sorted({m.rsplit(".", 1)[-1] for m in hf_modules.values()}),
            "rank_pattern": {hf_modules[m]: r for m, r in sorted(self.ranks.items()) if r != rank},
            "alpha_pattern": {},
            "lora_dropout": self.meta.get("lora_dropout", 0.0),
            "bias": "none",
            "fan_in_fan_out": False,
            # module names, as peft matches them: `lm_head` for lm_head.weight
            "modules_to_save": sorted({n.rsplit(".", 1)[0].rsplit(".", 1)[-1] for n in hf_saved}) or None,
            "inference_mode": True,
        }


@dataclass
class LoraFold:
    """Renames that drop PEFT's wrapping, and a fold for every adapted base weight (or, kept
    separate, the adapter to write beside the base)."""

    renames: dict[str, str] = field(default_factory=dict)
    folds: dict[str, Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    adapter: Adapter | None = None


def _peft_name(name: str) -> str:
    name = name[len(PEFT_PREFIX) :] if name.startswith(PEFT_PREFIX) else name
    return name.replace(".base_layer.", ".")


def _recorded(checkpoint: Checkpoint) -> tuple[dict, str]:
    """What a LoRA run recorded beside the checkpoint (verl's lora_train_meta.json, PEFT's
    adapter_config.json), and where."""
    folders = [checkpoint.path if checkpoint.path.is_dir() else checkpoint.path.parent]
    folders.append(folders[0].parent)
    for folder in folders:
        for filename in ("lora_train_meta.json", "adapter_config.json"):
            path = folder / filename
            if path.is_file():
                meta = read_json(path, "restore it from the run, or delete it and pass --lora-alpha")
                if not isinstance(meta, dict):
                    raise CheckpointError(
                        f"{path}: holds no JSON object; restore it from the run, or delete it and pass --lora-alpha"
                    )
                if meta.get("lora_alpha") is not None:
                    return meta, str(path)
    return {}, ""


def plan_fold(
    checkpoint: Checkpoint, alpha: float | None = None, mode: str = "merge", kept_in: str = f"{ADAPTER_FOLDER}/"
) -> LoraFold:
    """mode "merge": fold each adapter into its base weight; "separate": leave the base as it is and
    keep the adapter for `kept_in` (OUT/lora_adapter/, or a GGUF output's adapter file)."""
    names = list(checkpoint.tensors)
    adapters: dict[str, dict[str, str]] = {}
    adapter_names = set()
    for name in names:
        m = ADAPTER.match(name)
        if m:
            adapters.setdefault(m.group("module"), {})[m.group("part").removeprefix("embedding_")] = name
            adapter_names.add(m.group("adapter"))
    saved = {m.group("module") for n in names if (m := SAVED_MODULE.match(n))}
    if not adapters:
        if mode == "separate":
            raise CheckpointError(f"{checkpoint.path}: --lora separate, but the checkpoint holds no LoRA adapter")
        return LoraFold()
    if len(adapter_names) > 1:
        raise CheckpointError(f"{checkpoint.path}: several LoRA adapters ({sorted(adapter_names)}); fold one at a time")
    meta, source = _recorded(checkpoint)
    rslora = bool(meta.get("use_rslora"))
    if alpha is not None:
        source = "--lora-alpha"
    elif meta:
        alpha = float(meta["lora_alpha"])
    if alpha is None:
        raise CheckpointError(
            f"{checkpoint.path}: holds LoRA adapters but no lora_alpha (no lora_train_meta.json or "
            "adapter_config.json beside it); pass --lora-alpha, the value the run trained with"
        )
    fold = LoraFold(renames={n: _peft_name(n) for n in names})
    ranks = {}
    for module, parts in adapters.items():
        if not {"A", "B"} <= set(parts):
            raise CheckpointError(f"{checkpoint.path}: {module} has lora_{next(iter(parts))} without its pair")
        base = f"{module}.base_layer.weight"
        if base not in checkpoint.tensors:
            raise CheckpointError(f"{checkpoint.path}: {module} has a LoRA adapter but no {base}")
        embedding = ADAPTER.match(parts["A"]).group("part").startswith("embedding")
        rank = ranks[module] = checkpoint.tensors[parts["A"]].shape[0]
        if mode == "merge":
            scale = alpha / (math.sqrt(rank) if rslora else rank)
            fold.folds[base] = _folder(checkpoint, parts, scale, embedding)
        for part in parts.values():
            fold.dropped[part] = (
                "LoRA, folded into its base weight" if mode == "merge" else f"LoRA, written to {kept_in}"
            )
    kept = _modules_to_save(fold, names, mode, kept_in)
    dora = sum("magnitude_vector" in parts for parts in adapters.values())
    what = (
        f"{len(adapters)} modules"
        + (f" ({dora} DoRA)" if dora else "")
        + (f", {len(saved)} modules_to_save" if saved else "")
    )
    how = (
        f"LoRA folded into {what}"
        if mode == "merge"
        else f"LoRA of {what} kept apart in {kept_in} (base weights as trained)"
    )
    fold.notes.append(f"{how} (alpha {alpha:g} from {source}" + (", rsLoRA" if rslora else "") + ")")
    if mode == "separate":
        fold.adapter = Adapter(adapters, alpha, rslora, ranks, meta, kept)
    return fold


def _modules_to_save(fold: LoraFold, names: list[str], mode: str, kept_in: str) -> dict[str, str]:
    """PEFT's modules_to_save, of which it keeps the module as it was (original_module) and the trained copy: the
    trained copy written under the plain name when folding, the module as it was when the adapter is kept apart (the
    trained copies then go with the adapter: returned, each with the name of the module as it was)."""
    kept = {}
    for name in names:
        m = SAVED_MODULE.match(name)
        if not m:
            continue
        plain = _peft_name(f"{m.group('module')}.{m.group('param')}")
        trained = m.group("which") != "original_module"
        if mode == "merge" and trained:
            fold.renames[name] = plain
        elif mode == "merge":
            fold.dropped[name] = "the module as before training; its modules_to_save copy is written"
        elif trained:
            fold.dropped[name] = f"a modules_to_save copy, written to {kept_in}"
            kept[name] = f"{m.group('module')}.original_module.{m.group('param')}"
        else:
            fold.renames[name] = plain
    return kept


def fold_weight(
    weight: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scale: float,
    embedding: bool = False,
    magnitude: torch.Tensor | None = None,
) -> torch.Tensor:
    """W + scale * B @ A in fp32 (transposed for an embedding, whose A is [r, vocab]); with DoRA, each
    output row (embedding: each hidden column) rescaled to its trained magnitude. The operations
    are peft's merge's, in its order, so the result is the same to the bit."""
    a, b = a.float(), b.float()
    merged = weight.float() + ((b @ a).T * scale if embedding else scale * (b @ a))
    if magnitude is None:
        return merged
    import torch

    if embedding:
        return (magnitude.float() / torch.linalg.norm(merged.T, dim=1)).view(1, -1) * merged
    return (magnitude.float() / torch.linalg.norm(merged, dim=1)).view(-1, 1) * merged


def _folder(checkpoint: Checkpoint, parts: dict[str, str], scale: float, embedding: bool):
    def fold(weight: torch.Tensor) -> torch.Tensor:
        magnitude = checkpoint.read(parts["magnitude_vector"]) if "magnitude_vector" in parts else None
        return fold_weight(
            weight, checkpoint.read(parts["A"]), checkpoint.read(parts["B"]), scale, embedding, magnitude
        )

    return fold
