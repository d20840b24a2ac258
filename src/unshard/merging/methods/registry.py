"""The merge methods' registry: a method is a `combine` function declared by keyword with `@merge_method`, its
parameters as named declarations (as mergekit's registry declares its methods).

`combine(base, others, params, shared, numbers, generator)` gets the band of the base (or None) and of
each other input, in their own buffers, which it may use, and returns the merged band. What a method
needs from the whole tensor (a norm, an angle, the magnitude that keeps the top `density` of a task
vector) its `survey(bands, params, shared)` finds first, reading the bands (`bands()` starts them
again, as often as it needs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

Band = tuple[torch.Tensor | None, list[torch.Tensor], torch.Generator]  # base, others, the band's draws
REQUIRED = object()  # a parameter's default where the recipe must give it


@dataclass(frozen=True)
class Parameter:
    name: str
    default: Any = REQUIRED
    per_input: bool = False  # one value per model (a weight, a density), rather than one for the merge


@dataclass(frozen=True)
class Method:
    name: str
    combine: Callable[..., torch.Tensor]
    needs_base: bool
    parameters: tuple[Parameter, ...]
    survey: Callable[[Callable[[], Iterator[Band]], list[dict], dict], Any] | None = None
    inputs: tuple[int, int | None] = (1, None)  # least and most models besides the base

    @property
    def shared(self) -> dict[str, Any]:
        """The merge's parameters -> their defaults (REQUIRED: must be given)."""
        return {p.name: p.default for p in self.parameters if not p.per_input}

    @property
    def per_input(self) -> dict[str, Any]:
        """Each model's parameters -> their defaults (REQUIRED: must be given)."""
        return {p.name: p.default for p in self.parameters if p.per_input}


METHODS: dict[str, Method] = {}


def merge_method(
    name: str,
    *,
    needs_base: bool = False,
    parameters: tuple[Parameter, ...] = (),
    survey: Callable | None = None,
    inputs: tuple[int, int | None] = (1, None),
):
    """Registers the decorated `combine` function as the merge method `name` (a recipe's `merge_method`)."""

    def register(combine: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        if name in METHODS:
            raise ValueError(f"merge method {name!r} is declared twice")
        METHODS[name] = Method(name, combine, needs_base, tuple(parameters), survey, inputs)
        return combine

    return register
