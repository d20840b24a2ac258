"""Meta-style names (torchtitan, torchtune) -> Hugging Face names, by the family's table (its `meta_names`,
families/llama.py), and the rotary permutation.

torchtitan and torchtune keep the names of Meta's reference Llama and apply rotary embeddings to
interleaved pairs (complex numbers); Hugging Face's Llama rotates the two halves of each head. The
same weights serve both once the rows of each q and k head are reordered: HF row (head, half, i) is
row (head, 2 i + half) here. The head counts come from the Hugging Face config (--config-from),
which these checkpoints do not carry.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


LAYER = re.compile(r"^layers\.(\d+)\.")


def trainer(names) -> str | None:
    """ "torchtune", "torchtitan", or None for names of neither."""
    if "tok_embeddings.weight" not in names:
        return None
    return "torchtune" if any(".attn." in n for n in names) else "torchtitan"


def interleaved_to_halves(heads: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def permute(w: torch.Tensor) -> torch.Tensor:
        rows, cols = w.shape
        return w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)

    return permute


def rename(
    table: dict[str, tuple[str, str | None]], family: str, names, config: dict[str, Any], where: str
) -> tuple[dict[str, str], dict[str, Callable]]:
    """(torchtitan name -> HF name, HF name -> transform) by the family's table: name (layer as {i}) -> (Hugging
    Face name, which rotary permutation: q, k or None)."""
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    renamed, transforms, unknown = {}, {}, []
    for name in names:
        match = LAYER.match(name)
        key = LAYER.sub("layers.{i}.", name) if match else name
        if key not in table:
            unknown.append(name)
            continue
        hf, rotary = table[key]
        hf = hf.format(i=match.group(1)) if match else hf
        renamed[name] = hf
        if rotary:
            transforms[hf] = interleaved_to_halves(heads if rotary == "q" else kv_heads)
    if unknown:
        from ..errors import CheckpointError

        raise CheckpointError(
            f"{where}: {len(unknown)} tensors have no rule in unshard's table of {family} names (e.g. {unknown[0]}); "
            "`unshard families` says which trainers' names it maps for each family; report the model if it should"
        )
    return renamed, transforms


def to_meta(
    table: dict[str, tuple[str, str | None]], family: str, names, config: dict[str, Any], where: str
) -> dict[str, tuple[str, int]]:
    """The other way (writing torchtitan's names): Hugging Face name -> (the table's name, heads whose q or k rows
    go from halves to interleaved pairs; 0: none). Every name must have a rule."""
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    rules = []
    for meta, (hf, rotary) in table.items():
        pattern = re.compile("^" + re.escape(hf).replace(r"\{i\}", r"(\d+)") + "$")
        rules.append((pattern, meta, {"q": heads, "k": kv_heads}.get(rotary or "", 0)))
    renamed, unknown = {}, []
    for name in names:
        for pattern, meta, permuted in rules:
            if match := pattern.match(name):
                renamed[name] = (meta.format(i=match.group(1)) if match.groups() else meta, permuted)
                break
        else:
            unknown.append(name)
    if unknown:
        from ..errors import UnshardError

        raise UnshardError(
            f"{where}: {len(unknown)} tensors have no torchtitan name in unshard's table of {family} names (e.g. "
            f"{unknown[0]}); --names hf writes the Hugging Face names"
        )
    return renamed
