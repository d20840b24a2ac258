"""Meta's names, as torchtitan and torchtune save them (and Meta's own `consolidated.00.pth`), renamed to Hugging
Face's by the family's table once the config gives the family and the head counts: for any reader of them (DCP
folders; a whole state dict in one file, as torchtune's single-file checkpointers write it)."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

from .. import families
from ..errors import CheckpointError
from ..names import meta_rules
from ..names.mtp_layers import with_shared_copies
from ..names.stacked import Stacked
from .base import SourceTensor, Stack
from .placements import Block


class MetaNamed:
    """A Checkpoint whose tensors may bear Meta's names. A reader that can take one tensor of a stack out of its
    pieces (torchtitan's grouped experts) says how in `_unstacked`."""

    def fit_config(self, config: dict | None) -> None:
        """torchtitan and torchtune save Meta's names: rename them by the family's table once the config gives the
        family and the head counts."""
        trainer = meta_rules.trainer(self.tensors)
        if config is None or trainer is None:
            return
        family = families.by_model_type(config.get("model_type"))
        if family is None or not families.supports(family, "meta_names"):
            why = family.meta_names.reason if family else "not a family unshard knows (unshard families)"
            raise CheckpointError(f"{self.path}: {trainer}'s names of model_type {config.get('model_type')!r}: {why}")
        shapes = {name: tensor.shape for name, tensor in self.tensors.items()}
        renamed, self.transforms, skipped = meta_rules.rename(
            family.meta_names, family.name, shapes, config, str(self.path)
        )
        tensors, fused = {}, {}
        for name, tensor in self.tensors.items():
            if name in skipped:
                continue
            new = renamed[name]
            if isinstance(new, str):
                tensors[new] = dataclasses.replace(tensor, name=new)
            elif isinstance(new, meta_rules.Fused):
                fused.setdefault(new.into, {})[new.part] = tensor
            elif isinstance(new, Stacked):
                tensors[new.name] = self._turned(tensor, new)
            elif isinstance(new, meta_rules.Reshaped):
                tensors[new.into] = self._reshaped(tensor, new)
            elif isinstance(new, meta_rules.Tiled):
                tensors[new.into] = self._tiled(tensor, new)
            else:
                tensors.update((hf, self._unstacked(tensor, index, hf)) for index, hf in enumerate(new))
        tensors.update((hf, _concatenated(hf, [parts[p] for p in sorted(parts)])) for hf, parts in fused.items())
        tensors = with_shared_copies(tensors)  # (MTP layers' copies of the embedding and head, as the Hub's hold them)
        # The tensors keep the checkpoint's order, but grouped experts and fused tensors, whose places among the
        # others no order of the trainer's can give: then the order save_pretrained's files have (safetensors sorts
        # a file's tensors by name), so a Hugging Face model written with these names and read back is the same file
        regrouped = any(not isinstance(new, str) for new in renamed.values())
        self.tensors = dict(sorted(tensors.items())) if regrouped else tensors
        rotary = set(self.transforms) - set(self.tiled_shapes)
        permuted = " (q/k rows permuted to Hugging Face's rotary layout)" if rotary else ""
        self.facts["naming"] = f"{trainer}'s {family.name} names{permuted}"
        # (what the Hugging Face model has no place for, counted as the other entries a conversion skips)
        self.facts["skipped"] = {**self.facts.get("skipped", {}), **Counter(skipped.values())}

    def _turned(self, tensor: SourceTensor, rule: Stacked) -> SourceTensor:
        """Grouped experts as the Hugging Face tensor that holds each turned: read a band of experts at a time, each
        from the chunks that hold it."""
        members = tuple(self._unstacked(tensor, e, f"{rule.name}[{e}]") for e in range(tensor.shape[0]))
        self.stacks[rule.name] = Stack(members, rule.band)
        pieces = [piece for member in members for piece in member.pieces]
        return SourceTensor(rule.name, rule.shape(len(members), tensor.shape[1:]), tensor.dtype, pieces)

    def _reshaped(self, tensor: SourceTensor, rule: meta_rules.Reshaped) -> SourceTensor:
        """The tensor under the Hugging Face shape its rows make (the same bytes): assembled as the trainer's, then
        reshaped (read whole: a patch embedding is small)."""
        shape = (tensor.shape[0], *rule.axes)
        if math.prod(shape) != math.prod(tensor.shape):
            raise CheckpointError(
                f"{self.path}: {tensor.name} is {list(tensor.shape)}, not the {list(shape)} of {rule.into} its config "
                "gives; pass --config-from the model's own config"
            )
        self.tiled_shapes[rule.into] = tensor.shape
        self.transforms[rule.into] = lambda whole: whole.reshape(shape)
        return dataclasses.replace(tensor, name=rule.into, shape=shape)

    def _tiled(self, tensor: SourceTensor, rule: meta_rules.Tiled) -> SourceTensor:
        """A tile embedding as Hugging Face holds it, per aspect ratio: assembled as the trainer's, then laid out (read
        whole: it is small)."""
        tiles = tensor.shape[0]
        if len(tensor.shape) != 4 or tensor.shape[1] != tiles or any(h * w > tiles for h, w in rule.ratios):
            raise CheckpointError(
                f"{self.path}: {tensor.name} is {list(tensor.shape)}, not tiles x tiles of the aspect ratios "
                f"{[list(r) for r in rule.ratios]} its config supports; pass --config-from the model's own config"
            )
        self.tiled_shapes[rule.into] = tensor.shape
        self.transforms[rule.into] = rule.per_ratio
        shape = (len(rule.ratios) + 1, tiles * math.prod(tensor.shape[2:]))
        return dataclasses.replace(tensor, name=rule.into, shape=shape)

    def _unstacked(self, tensor: SourceTensor, index: int, name: str) -> SourceTensor:
        raise CheckpointError(
            f"{self.path}: {tensor.name} stacks experts, which are read from DCP folders only; convert the "
            "trainer's DCP checkpoint"
        )


def _concatenated(name: str, parts: list[SourceTensor]) -> SourceTensor:
    """One tensor of `parts`' rows, one part after another, read straight from the parts' chunks."""
    pieces, rows = [], 0
    for part in parts:
        for piece in part.pieces:
            block = piece.block
            placed = (block.global_offsets[0] + rows, *block.global_offsets[1:])
            pieces.append(dataclasses.replace(piece, block=Block(block.local_offsets, placed, block.sizes)))
        rows += part.shape[0]
    return SourceTensor(name, (rows, *parts[0].shape[1:]), parts[0].dtype, pieces)
