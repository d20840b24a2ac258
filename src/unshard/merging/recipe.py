"""The recipe: mergekit's YAML (merge_method, base_model, models or slices, parameters, dtype, out_dtype,
tokenizer_source or tokenizer), read as mergekit 0.1.5 reads it, and its parameters' values per tensor."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import dtypes
from ..errors import UnshardError
from .methods import METHODS

RECIPE_KEYS = {
    "merge_method",
    "base_model",
    "models",
    "slices",
    "parameters",
    "dtype",
    "out_dtype",
    "tokenizer_source",
    "tokenizer",
}
MODEL_KEYS = {"model", "parameters"}
SOURCE_KEYS = {"model", "layer_range", "parameters"}
SLICE_KEYS = {
    "sources",
    "base_model",
    "parameters",
    "residual_weight",
}  # (mergekit reads residual_weight, uses it nowhere)


class RecipeError(UnshardError, ValueError):
    pass


@dataclass(frozen=True)
class Source:
    """A model in a slice (or in `models:`): its layers [start, stop), or all of them (None)."""

    model: str
    layers: tuple[int, int] | None
    parameters: dict[str, Any]


@dataclass
class Slice:
    """A run of output layers, merged from the same number of layers of each source."""

    sources: list[Source]
    base: str | None  # the slice's own base_model, or None for the recipe's
    parameters: dict[str, Any]


@dataclass
class Recipe:
    method: str
    base: str | None
    slices: list[Slice]  # `models:` is one slice of every layer
    sliced: bool  # written as `slices:`: the output's layers are the slices', renumbered
    parameters: dict[str, Any]
    dtype: str | None
    out_dtype: str | None
    vocabulary: (
        VocabularyRecipe | None
    )  # tokenizer_source / tokenizer: the output's vocabulary, else the base's as it is
    text: str

    @property
    def models(self) -> list[str]:
        """Every model the recipe merges (not the base, unless listed), in the order written, once."""
        return list(dict.fromkeys(s.model for piece in self.slices for s in piece.sources))

    def base_of(self, piece: Slice) -> str | None:
        return piece.base or self.base


@dataclass(frozen=True)
class TokenSetting:
    """`tokens: {TOKEN: {source: ..., force: ...}}`: where a token's row comes from."""

    model: str | None = None  # a model's row for this token (or for `token` / `token_id`)
    token: str | None = None
    token_id: int | None = None
    zero: bool = False
    force: bool = False  # every input takes this row, even one that has the token


@dataclass(frozen=True)
class VocabularyRecipe:
    source: str  # "union", "base" or a model
    tokens: dict[str, TokenSetting]
    pad_to_multiple_of: int | None


def parse_vocabulary(path: Path, data: dict[str, Any]) -> VocabularyRecipe | None:
    """The recipe's tokenizer_source or tokenizer (mergekit takes one of them), or None: neither."""
    if data.get("tokenizer_source") is not None and data.get("tokenizer") is not None:
        raise RecipeError(f"{path}: give tokenizer_source or tokenizer, not both")
    if data.get("tokenizer") is None:
        return (
            None if data.get("tokenizer_source") is None else VocabularyRecipe(str(data["tokenizer_source"]), {}, None)
        )
    entry = data["tokenizer"]
    if not isinstance(entry, dict) or set(entry) - {"source", "tokens", "pad_to_multiple_of"}:
        raise RecipeError(f"{path}: tokenizer must be a mapping with source, tokens and pad_to_multiple_of")
    pad = entry.get("pad_to_multiple_of")
    if pad is not None and (type(pad) is not int or pad < 1):
        raise RecipeError(f"{path}: tokenizer.pad_to_multiple_of must be a whole number of 1 or more (got {pad!r})")
    tokens = {}
    for token, setting in (entry.get("tokens") or {}).items():
        where = f"tokenizer.tokens[{token!r}]"
        if not isinstance(setting, dict) or set(setting) - {"source", "force"}:
            raise RecipeError(f"{path}: {where} must be a mapping with source and force")
        source = setting.get("source")
        force = bool(setting.get("force", False))
        if isinstance(source, dict):
            kind = source.get("kind")
            if kind == "zero" and set(source) == {"kind"}:
                tokens[token] = TokenSetting(zero=True, force=force)
            elif kind == "model_token" and "model" in source and (("token" in source) != ("token_id" in source)):
                tokens[token] = TokenSetting(
                    str(source["model"]), source.get("token"), source.get("token_id"), force=force
                )
            else:
                raise RecipeError(
                    f"{path}: {where}.source must be a model, {{kind: zero}} or {{kind: model_token, "
                    "model: M, token: T}} (or token_id)"
                )
        elif source is None:
            tokens[token] = TokenSetting(force=force)
        else:
            tokens[token] = TokenSetting(str(source), force=force)
    return VocabularyRecipe(str(entry.get("source", "union")), tokens, pad)


# ---- parameters: scalars, gradients across layers, filters by tensor name (mergekit's rules) ----


def evaluate(setting: Any, tensor: str, t: float) -> Any:
    """A parameter's value for one tensor: `t` runs from 0 (first layer) to 1 (last layer)."""
    if isinstance(setting, dict):
        setting = [setting]
    if isinstance(setting, (bool, int, float, str)) or setting is None:
        return setting
    if not setting:
        return None
    if all(isinstance(v, (bool, int, float)) for v in setting):
        if any(isinstance(v, bool) for v in setting):
            return setting[int(t * (len(setting) - 1))]
        scaled = t * (len(setting) - 1)
        low = int(scaled)
        high = min(len(setting) - 1, low + 1)
        return (1 - (scaled - low)) * setting[low] + (scaled - low) * setting[high]
    for condition in setting:
        if not isinstance(condition, dict) or "value" not in condition:
            raise RecipeError(
                f"parameter value {setting!r}: a list holds numbers (a gradient) or {{filter: ..., value: ...}} entries"
            )
        where = condition.get("filter")
        if where in (None, "*") or where in tensor:
            return evaluate(condition["value"], tensor, t)
    return None


def resolve(key: str, scopes: list[dict[str, Any]], tensor: str, t: float) -> Any:
    """The value of `key` from the first scope (most specific first) that gives one for this tensor: a
    filter that matches nothing there leaves it to the next, as in mergekit."""
    for scope in scopes:
        if key in scope and (value := evaluate(scope[key], tensor, t)) is not None:
            return value
    return None


# ---- reading the YAML ----


def _parameters(path: Path, where: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RecipeError(f"{path}: {where}.parameters must be a mapping of parameter names to values")
    return dict(value)


def _source(path: Path, where: str, entry: Any, sliced: bool) -> Source:
    keys = SOURCE_KEYS if sliced else MODEL_KEYS
    entry = {"model": entry} if isinstance(entry, str) and not sliced else entry
    if not isinstance(entry, dict) or "model" not in entry or set(entry) - keys:
        raise RecipeError(
            f"{path}: {where} must be a mapping with `model`"
            + (", `layer_range` and optional `parameters`" if sliced else " and optional `parameters`")
        )
    layers = None
    if sliced:
        span = entry.get("layer_range")
        if (
            not isinstance(span, list)
            or len(span) != 2
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in span)
            or not 0 <= span[0] < span[1]
        ):
            raise RecipeError(
                f"{path}: {where}.layer_range must be [start, stop] with 0 <= start < stop (got {span!r})"
            )
        layers = (span[0], span[1])
    return Source(str(entry["model"]), layers, _parameters(path, where, entry.get("parameters")))


def read_yaml(path: Path, what: str, text: str | None = None) -> tuple[Any, str]:
    """A YAML file the user wrote (`what`: a recipe, a search space), parsed, and its text (or, given, `text`
    parsed); one that is missing, not UTF-8 text or not YAML is a one-line RecipeError."""
    import yaml

    try:
        text = Path(path).read_bytes().decode() if text is None else text
        return yaml.safe_load(text), text
    except FileNotFoundError:
        raise RecipeError(f"{path}: no such {what} file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RecipeError(f"{path}: cannot be read as text ({str(e)[:120]}); a {what} is a YAML file") from None
    except yaml.YAMLError as e:
        raise RecipeError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None


def parse_recipe(path: Path, text: str | None = None) -> Recipe:
    """The recipe at `path` (or, given, its `text`: a recipe made by merge-search, named by the space's path)."""
    data, text = read_yaml(path, "recipe", text)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a YAML mapping with merge_method and models or slices")
    unknown = sorted(set(data) - RECIPE_KEYS)
    if unknown:
        raise RecipeError(
            f"{path}: unknown key {unknown[0]!r}; unshard reads {', '.join(sorted(RECIPE_KEYS))} "
            "(not mergekit's per-module `modules`)"
        )
    method = data.get("merge_method")
    if method not in METHODS:
        raise RecipeError(f"{path}: merge_method {method!r} is not one unshard has; use one of {', '.join(METHODS)}")
    if (data.get("models") is None) == (data.get("slices") is None):
        raise RecipeError(
            f"{path}: a recipe has either `models` (whole models) or `slices` (layer ranges), not "
            f"{'both' if data.get('models') is not None else 'neither'}"
        )
    sliced = data.get("slices") is not None
    slices = []
    if sliced:
        if not isinstance(data["slices"], list) or not data["slices"]:
            raise RecipeError(f"{path}: slices must be a list of `sources:` entries")
        for i, entry in enumerate(data["slices"]):
            where = f"slices[{i}]"
            if not isinstance(entry, dict) or not isinstance(entry.get("sources"), list) or set(entry) - SLICE_KEYS:
                raise RecipeError(
                    f"{path}: {where} must be a mapping with `sources` (a list) and optional "
                    "`base_model` and `parameters`"
                )
            sources = [_source(path, f"{where}.sources[{j}]", s, True) for j, s in enumerate(entry["sources"])]
            lengths = {s.layers[1] - s.layers[0] for s in sources}
            if len(lengths) > 1:
                raise RecipeError(
                    f"{path}: {where}: every source of a slice spans the same number of layers "
                    f"(got {', '.join(str(s.layers[1] - s.layers[0]) for s in sources)})"
                )
            slices.append(
                Slice(
                    sources,
                    str(entry["base_model"]) if entry.get("base_model") else None,
                    _parameters(path, where, entry.get("parameters")),
                )
            )
    else:
        if not isinstance(data["models"], list):
            raise RecipeError(f"{path}: models must be a list")
        slices.append(Slice([_source(path, f"models[{i}]", m, False) for i, m in enumerate(data["models"])], None, {}))
    for key in ("dtype", "out_dtype"):
        if data.get(key) is not None and data[key] not in dtypes.OUTPUT:
            raise RecipeError(f"{path}: {key} {data[key]!r}: use one of {', '.join(dtypes.OUTPUT)}")
    return Recipe(
        method,
        str(data["base_model"]) if data.get("base_model") else None,
        slices,
        sliced,
        _parameters(path, "the recipe", data.get("parameters")),
        data.get("dtype"),
        data.get("out_dtype"),
        parse_vocabulary(path, data),
        text,
    )
