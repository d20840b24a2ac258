"""merge-search's SPACE: a recipe (mergekit's YAML, as `unshard merge` reads it) in which a parameter may be a
range, `{min: 0.1, max: 0.9}` (with an optional `default`: trial 0's value, else the midpoint), or a choice,
`{choice: [true, false]}`, wherever a number may stand (a model's parameter, a point of a gradient, the value
of a filter), and `merge_method` may be a list of methods to choose from. Each dimension is named by where it
stands (`models[1].weight`, `parameters.density[0]`), and `recipe(values)` is the recipe a trial merges."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .methods import METHODS
from .recipe import RecipeError, read_yaml

# Parameters whose meaning bounds them (the others, weights and scales, may be any number).
DOMAINS = {"density": (0.0, 1.0), "t": (0.0, 1.0), "epsilon": (0.0, 1.0)}
RANGE_KEYS, CHOICE_KEYS = {"min", "max", "default", "log"}, {"choice", "default"}


@dataclass(frozen=True)
class Dimension:
    name: str
    at: tuple  # the keys and indices leading to it in the space's data
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple | None = None
    default: Any = None  # trial 0's value

    def describe(self) -> str:
        return f"{self.name} in {list(self.choices)}" if self.choices else f"{self.name} in [{self.low}, {self.high}]"


@dataclass
class Space:
    path: Path
    data: dict[str, Any]
    dimensions: list[Dimension]

    def recipe(self, values: dict[str, Any]) -> str:
        """The recipe (YAML text) with each dimension's value put in its place."""
        import yaml

        data = copy.deepcopy(self.data)
        for dimension in self.dimensions:
            *parents, last = dimension.at
            holder = data
            for key in parents:
                holder = holder[key]
            holder[last] = values[dimension.name]
        return yaml.safe_dump(data, sort_keys=False)

    def defaults(self) -> dict[str, Any]:
        return {d.name: d.default for d in self.dimensions}

    @property
    def methods(self) -> list[str]:
        found = next((d.choices for d in self.dimensions if d.name == "merge_method"), None)
        return list(found) if found else [self.data.get("merge_method")]


def parse_space(path: Path) -> Space:
    data, _ = read_yaml(path, "search space")
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a search space is a recipe (a YAML mapping) whose parameters may be ranges")
    dimensions: list[Dimension] = []
    methods = data.get("merge_method")
    if isinstance(methods, list):
        unknown = [m for m in methods if m not in METHODS]
        if not methods or unknown:
            raise RecipeError(
                f"{path}: merge_method choices {unknown or methods!r}: use methods of {', '.join(METHODS)}"
            )
        dimensions.append(Dimension("merge_method", ("merge_method",), choices=tuple(methods), default=methods[0]))

    def name_of(at: tuple) -> str:
        parts = []
        for key in at:
            if key in ("parameters", "value"):
                continue
            parts.append(f"[{key}]" if isinstance(key, int) else f".{key}" if parts else str(key))
        return "".join(parts)

    def walk(node: Any, at: tuple, parameter: str | None) -> None:
        """`parameter`: the parameter this node belongs to (None: outside any `parameters:`)."""
        if parameter is not None and isinstance(node, dict) and node:
            if set(node) <= RANGE_KEYS and {"min", "max"} <= set(node):
                dimensions.append(_range(path, name_of(at), at, parameter, node))
                return
            if set(node) <= CHOICE_KEYS and "choice" in node:
                dimensions.append(_choice(path, name_of(at), at, node))
                return
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, (*at, key), str(key) if at and at[-1] == "parameters" else parameter)
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, (*at, i), parameter)

    walk(data, (), None)
    if not dimensions:
        raise RecipeError(
            f"{path}: nothing to search: give a parameter a range ({{min: 0.1, max: 0.9}}), a choice "
            "({choice: [...]}) or merge_method a list of methods"
        )
    return Space(Path(path), data, dimensions)


def _range(path: Path, name: str, at: tuple, parameter: str, node: dict) -> Dimension:
    low, high, log = node["min"], node["max"], bool(node.get("log", False))
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)) or not low < high:
        raise RecipeError(f"{path}: {name}: a range needs numbers min < max (got {low!r}, {high!r})")
    bounds = DOMAINS.get(parameter)
    if bounds and not (bounds[0] <= low and high <= bounds[1]):
        raise RecipeError(
            f"{path}: {name}: [{low}, {high}] goes outside {parameter}'s domain [{bounds[0]}, {bounds[1]}]"
        )
    if log and low <= 0:
        raise RecipeError(f"{path}: {name}: a log range needs min > 0")
    default = node.get("default", (low * high) ** 0.5 if log else (low + high) / 2)
    if not isinstance(default, (int, float)) or not low <= default <= high:
        raise RecipeError(f"{path}: {name}: default {default!r} is outside [{low}, {high}]")
    return Dimension(name, at, float(low), float(high), log, default=float(default))


def _choice(path: Path, name: str, at: tuple, node: dict) -> Dimension:
    choices = node["choice"]
    if not isinstance(choices, list) or not choices:
        raise RecipeError(f"{path}: {name}: choice must be a non-empty list")
    default = node.get("default", choices[0])
    if default not in choices:
        raise RecipeError(f"{path}: {name}: default {default!r} is not one of the choices")
    return Dimension(name, at, choices=tuple(choices), default=default)
