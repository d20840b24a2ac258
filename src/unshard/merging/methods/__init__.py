"""Merge methods: each merges one band of rows of a tensor, from numbers its survey took over the whole.

`combine(base, others, params, shared, numbers, generator)` gets the band of the base (or None) and of
each other input, in their own buffers, which it may use, and returns the merged band. What a method
needs from the whole tensor (a norm, an angle, the magnitude that keeps the top `density` of a task
vector) its `survey(bands, params, shared)` finds first, reading the bands (`bands()` starts them
again, as often as it needs). So a tensor larger than a band is merged a band at a time, and memory
follows the band, not the tensor; a smaller tensor is one band, read once.

Each method computes what mergekit 0.1.5 computes, with its defaults and parameter names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

Band = tuple[torch.Tensor | None, list[torch.Tensor], torch.Generator]  # base, others, the band's draws


@dataclass(frozen=True)
class Method:
    needs_base: bool
    shared: dict[str, Any]  # shared parameter -> default
    per_input: dict[str, Any]  # per-input parameter -> default (REQUIRED: must be given)
    combine: Callable[..., torch.Tensor]
    survey: Callable[[Callable[[], Iterator[Band]], list[dict], dict], Any] | None = None
    inputs: tuple[int, int | None] = (1, None)  # least and most models besides the base


REQUIRED = object()

from . import linear, model_stock, passthrough, slerp, task_arithmetic  # noqa: E402  (they use Method)

METHODS = {
    "linear": linear.METHOD,
    **task_arithmetic.METHODS,
    "slerp": slerp.METHOD,
    "model_stock": model_stock.METHOD,
    "passthrough": passthrough.METHOD,
}

__all__ = ["METHODS", "REQUIRED", "Band", "Method"]
