"""Blend several models into one, tensor by tensor, from any layout unshard reads.

Recipes use mergekit's YAML format for what both support, and each method computes what mergekit
0.1.5 computes (its defaults and parameter names), so a mergekit recipe gives the same model.

A merge is planned and written like a conversion: `MergedCheckpoint` is a Checkpoint whose tensors
are the output tensors and whose `read` (or, for a large tensor, `read_rows`, a band of rows at a
time) computes one of them from the inputs' tensors of the same name. Planner, streaming writer,
progress bar, --verify and the output folder are the conversion's; memory is a 64 MB band per input
at a time, or a whole tensor per input where an input cannot be read in bands (split experts, a LoRA
adapter to fold, Megatron's fused QKV, ZeRO's flat partitions).
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from .errors import UnshardError, read_json
from . import dtypes, hf_names
from .hub import fetch, hub_ids, is_hub_id
from .plan import TOKENIZER_FILES, Group, Plan, build_plan, choose_dtype, pieces_read
from .sinks import OutputOptions
from .sinks.hf_folder import MODEL_FILE_PATTERNS
from .readers import Checkpoint, SourceTensor, open_checkpoint

RECIPE_KEYS = {"merge_method", "base_model", "models", "parameters", "dtype", "out_dtype", "tokenizer_source"}
MODEL_KEYS = {"model", "parameters"}


class RecipeError(UnshardError, ValueError):
    pass


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
            raise RecipeError(f"parameter value {setting!r}: a list holds numbers (a gradient) or "
                              "{filter: ..., value: ...} entries")
        where = condition.get("filter")
        if where in (None, "*") or where in tensor:
            return evaluate(condition["value"], tensor, t)
    return None


def layer_position(name: str, layers: int) -> float:
    """mergekit's `t`: index / (layers - 1) inside the layer stack, 0 for embeddings, norm and head."""
    parts = name.split(".")
    if "layers" in parts:
        index = parts.index("layers") + 1
        if index < len(parts) and parts[index].isdigit():
            return int(parts[index]) / (layers - 1) if layers > 1 else 1.0
    return 0.0


# ---- methods: each merges one band of rows of a tensor, from numbers its survey took over the whole ----
#
# `combine(base, others, params, shared, numbers, generator)` gets the band of the base (or None) and of
# each other input, in their own buffers, which it may use, and returns the merged band. What a method
# needs from the whole tensor (a norm, an angle, the magnitude that keeps the top `density` of a task
# vector) its `survey(bands, params, shared)` finds first, reading the bands (`bands()` starts them
# again, as often as it needs). So a tensor larger than a band is merged a band at a time, and memory
# follows the band, not the tensor; a smaller tensor is one band, read once.

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


def _linear(base, others, params, shared, numbers, generator):
    result = torch.zeros_like(others[0], dtype=torch.float32)
    for tensor, p in zip(others, params):
        result.add_(tensor, alpha=p["weight"])
    return result / sum(p["weight"] for p in params) if shared["normalize"] else result


class _TopK:
    """The k-th largest of magnitudes (no negatives) seen a band at a time, exactly as `kthvalue` over
    all of them finds it. Magnitudes sort as their bit patterns do, so counting the top 16 bits (`count`,
    one pass) finds the bucket that holds the k-th largest (`settle`), and only that bucket's entries are
    kept (`keep`, a second pass) and searched. No whole tensor is needed, and it is 3x faster than
    `kthvalue`, which is one thread's quickselect over a copy (about 1 s for a 65M-entry embedding)."""

    BUCKETS = 1 << 15

    def __init__(self):
        self.counts = torch.zeros(self.BUCKETS, dtype=torch.int64)
        self.inside: list[torch.Tensor] = []

    @staticmethod
    def _buckets(magnitudes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        wide = magnitudes if magnitudes.element_size() >= 4 else magnitudes.float()  # exact for 16-bit floats
        bits = wide.reshape(-1).view(torch.int32 if wide.element_size() == 4 else torch.int64)
        return wide.reshape(-1), (bits >> (8 * wide.element_size() - 16)).bitwise_and_(0x7FFF)  # a NaN's sign: still largest

    def count(self, magnitudes: torch.Tensor) -> None:
        self.counts += torch.bincount(self._buckets(magnitudes)[1], minlength=self.BUCKETS)

    def settle(self, k: int) -> None:
        from_top = self.counts.flip(0).cumsum(0)
        index = int(torch.searchsorted(from_top, k))  # the first bucket from the top where k entries are reached
        self.rank_in_bucket, self.bucket = k - (int(from_top[index - 1]) if index else 0), self.BUCKETS - 1 - index

    def keep(self, magnitudes: torch.Tensor) -> None:
        wide, buckets = self._buckets(magnitudes)
        self.inside.append(wide[buckets == self.bucket])

    def value(self, dtype: torch.dtype) -> torch.Tensor:
        inside = torch.cat(self.inside)
        return inside.kthvalue(inside.numel() - self.rank_in_bucket + 1).values.to(dtype)


def _task_arithmetic(consensus: bool, sparsify: str | None):
    """Task vectors (each model minus the base), weighted and summed; TIES and DARE keep a `density`
    fraction of each first, by magnitude or at random, and TIES keeps only the entries that agree with
    the sign of the sum."""

    def kept(delta, p, numbers, generator):
        """A task vector's kept entries (in place), rescaled as the survey found."""
        if sparsify is None or p["density"] >= 1:
            return delta
        if sparsify == "magnitude":
            if numbers["threshold"] is None:  # density 0
                return delta.zero_()
            delta.mul_(delta.abs().ge_(numbers["threshold"]))  # 1.0 kept, 0.0 dropped
        else:  # kept where a uniform draw is below `density`: bernoulli_'s odds, drawn 3x faster
            delta.mul_(torch.empty(delta.shape, dtype=torch.float32).uniform_(generator=generator).lt_(p["density"]))
        return delta.mul_(numbers["rescale"]) if numbers.get("rescale", 1) != 1 else delta

    def survey(bands, params, shared):
        numbers = [{} for _ in params]
        sparse = [i for i, p in enumerate(params) if sparsify and p["density"] < 1]
        buffers: dict[int, torch.Tensor] = {}

        def task_vector(i, other, base):
            """other - base in a buffer of input i's, kept for the survey: a fresh one for each band costs
            its page faults, and a tensor that is one band has its magnitudes found once, not per pass."""
            if i not in buffers or buffers[i].numel() < base.numel():
                buffers[i] = torch.empty(base.numel(), dtype=base.dtype)
            return torch.sub(other, base, out=buffers[i][:base.numel()].view(base.shape))

        if sparsify == "magnitude" and sparse:
            tops, numel, seen = {i: _TopK() for i in sparse if params[i]["density"] > 0}, 0, 0
            for base, others, _ in bands():
                numel, seen = numel + base.numel(), seen + 1
                for i, top in tops.items():
                    top.count(task_vector(i, others[i], base).abs_())
            for i in sparse:
                numbers[i]["threshold"] = None
            if numel and tops:
                for i, top in tops.items():
                    top.settle(max(1, int(params[i]["density"] * numel)))
                if seen == 1:  # the magnitudes are still in the buffers
                    for i, top in tops.items():
                        top.keep(buffers[i][:numel])
                else:
                    for base, others, _ in bands():
                        for i, top in tops.items():
                            top.keep(task_vector(i, others[i], base).abs_())
                for i, top in tops.items():
                    numbers[i]["threshold"] = top.value(buffers[i].dtype)
        if sparse and shared["rescale"]:
            # Kept entries carry the task vector's L1 norm (mergekit's `rescale`): both sums over the
            # whole tensor, the draws made again as the combining will make them.
            before, after = [0.0] * len(params), [0.0] * len(params)
            for base, others, generator in bands():
                for i, (other, p) in enumerate(zip(others, params)):
                    delta = task_vector(i, other, base)
                    before[i] += float(torch.linalg.vector_norm(delta, ord=1))
                    after[i] += float(torch.linalg.vector_norm(kept(delta, p, numbers[i], generator), ord=1))
            for i in sparse:
                numbers[i]["rescale"] = 1 if before[i] < 1e-7 or after[i] < 1e-7 else before[i] / after[i]
        return numbers

    def combine(base, others, params, shared, numbers, generator):
        # Task vectors are made in the inputs' own buffers, one at a time: memory stays at the inputs
        # plus a few bands, however many models are merged.
        deltas = [kept(other.sub_(base), p, n, generator).mul_(p["weight"]) for other, p, n in zip(others, params, numbers)]
        mixed = deltas[0].clone()
        for delta in deltas[1:]:
            mixed.add_(delta)
        if consensus:  # TIES sign election: keep the entries agreeing with the sign of the weighted sum
            # Worked in the elected sign's frame (times +-1, exact): agreeing entries are the positive
            # ones, a clamp drops the rest, and the sum is turned back once. Bool masks would cost
            # a float copy each (type promotion), twice as slow on a large embedding; buffers are
            # reused, as a fresh one costs as much again in page faults.
            elected = mixed.ge_(0).mul_(2).sub_(1)  # +1 where the sum is >= 0, else -1
            mixed, divisor, agreed = torch.zeros_like(base), torch.zeros_like(base), torch.empty_like(base)
            for delta, p in zip(deltas, params):
                kept_here = delta.mul_(elected).clamp_(min=0)
                divisor.add_(torch.sign(kept_here, out=agreed), alpha=p["weight"])
                mixed.add_(kept_here)
            mixed.mul_(elected)
            divisor.masked_fill_(divisor == 0, 1)
        else:
            total = sum(p["weight"] for p in params)
            divisor = 1 if abs(total) < 1e-8 else total
        del deltas
        if shared["normalize"]:
            mixed.div_(divisor)
        if shared["lambda"] != 1:
            mixed.mul_(shared["lambda"])
        return mixed.add_(base)

    return combine, survey  # (which reads nothing when nothing is sparsified)


def _dot(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(torch.dot(x.reshape(-1), y.reshape(-1)))


def _slerp_survey(bands, params, shared, eps=1e-8) -> float:
    """The cosine of the angle between the base and the other model, over the whole tensor."""
    aa = bb = ab = 0.0
    for base, others, _ in bands():
        a, b = base.float(), others[0].float()
        aa, bb, ab = aa + _dot(a, a), bb + _dot(b, b), ab + _dot(a, b)
    norm_a, norm_b = math.sqrt(aa), math.sqrt(bb)
    return max(-1.0, min(1.0, ab / ((norm_a if norm_a > eps else 1.0) * (norm_b if norm_b > eps else 1.0))))


def _slerp(base, others, params, shared, cosine, generator, threshold=0.9995):
    """Spherical interpolation from the base (t=0) to the other model (t=1), at the angle between the
    whole tensors; linear where the two are nearly parallel."""
    t = shared["t"]
    a, b = base.float(), others[0].float()
    if abs(cosine) > threshold:
        return (1 - t) * a + t * b
    theta = math.acos(cosine)
    return (math.sin((1 - t) * theta) * a + math.sin(t * theta) * b) / math.sin(theta)


def _model_stock_survey(bands, params, shared) -> float:
    """Model Stock's interpolation ratio, from the mean angle between the fine-tunes' offsets from the base."""
    n = len(params)
    dots = [[0.0] * n for _ in range(n)]
    for base, others, _ in bands():
        offsets = [other.float() - base.float() for other in others]
        for i in range(n):
            for j in range(i, n):
                dots[i][j] += _dot(offsets[i], offsets[j])
    cosines = [max(-1.0, min(1.0, dots[i][j] / max(math.sqrt(dots[i][i] * dots[j][j]), 1e-6)))
               for i in range(n) for j in range(i + 1, n)]
    cos = sum(cosines) / len(cosines)
    denominator = 1 + (n - 1) * cos
    return 0.0 if abs(denominator) < 1e-6 else n * cos / denominator


def _model_stock(base, others, params, shared, t, generator):
    """Model Stock: move from the base towards the average by the angle between the fine-tunes."""
    average = sum(other.float() for other in others) / len(others)
    return t * average + (1 - t) * base.float()


def _passthrough(base, others, params, shared, numbers, generator):
    scale = params[0]["scale"]
    return others[0] if scale is None else others[0] * scale


METHODS = {
    "linear": Method(False, {"normalize": True}, {"weight": REQUIRED}, _linear),
    "task_arithmetic": Method(True, {"normalize": False, "lambda": 1.0, "rescale": False},
                              {"weight": REQUIRED}, *_task_arithmetic(False, None)),
    "ties": Method(True, {"normalize": True, "lambda": 1.0, "rescale": False},
                   {"weight": REQUIRED, "density": 1.0}, *_task_arithmetic(True, "magnitude")),
    "dare_linear": Method(True, {"normalize": False, "lambda": 1.0, "rescale": True},
                          {"weight": REQUIRED, "density": 1.0}, *_task_arithmetic(False, "random")),
    "dare_ties": Method(True, {"normalize": False, "lambda": 1.0, "rescale": True},
                        {"weight": REQUIRED, "density": 1.0}, *_task_arithmetic(True, "random")),
    "slerp": Method(True, {"t": REQUIRED}, {}, _slerp, _slerp_survey, (1, 1)),
    "model_stock": Method(True, {}, {}, _model_stock, _model_stock_survey, (2, None)),
    "passthrough": Method(False, {}, {"scale": None}, _passthrough, inputs=(1, 1)),
}


# ---- the recipe ----

@dataclass
class Input:
    reference: str
    parameters: dict[str, Any]
    plan: Plan
    groups: dict[str, Group] = field(default_factory=dict)  # output name -> the group making it
    adapter: "Adapter | None" = None  # `base+adapter`: a PEFT LoRA adapter applied to this input


class Adapter:
    """A PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors) applied to a base,
    as peft's merge_and_unload does (`lora.fold_weight`): per-module r and alpha from rank_pattern /
    alpha_pattern, rsLoRA, DoRA magnitudes, embedding LoRA; weights in modules_to_save replace the base's."""

    def __init__(self, folder: Path):
        from safetensors import safe_open

        config_path, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
        if not config_path.is_file() or not weights.is_file():
            raise RecipeError(f"{folder}: not a PEFT adapter folder (adapter_config.json and "
                              "adapter_model.safetensors)")
        config = read_json(config_path, "restore it from where the adapter came from", RecipeError)
        if config.get("peft_type", "LORA") != "LORA":
            raise RecipeError(f"{config_path}: only LoRA adapters are folded (not {config.get('peft_type')})")
        self.folder, self.weights, self.config = folder, weights, config
        self.lora: dict[str, dict[str, str]] = {}  # HF weight name -> {"A", "B"[, "magnitude"]: key}
        self.replaced: dict[str, str] = {}  # HF weight name -> key of its full replacement
        with safe_open(weights, framework="pt") as f:
            keys = list(f.keys())
        for key in keys:
            name = key.removeprefix("base_model.model.")
            module, _, part = name.partition(".lora_")
            if part:
                kind = {"A.weight": "A", "B.weight": "B", "embedding_A": "A", "embedding_B": "B",
                        "magnitude_vector": "magnitude"}.get(part)
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

    def apply(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        from safetensors import safe_open

        from .lora import fold_weight

        if name in self.replaced:
            with safe_open(self.weights, framework="pt") as f:
                return f.get_tensor(self.replaced[name]).float()
        if name not in self.lora:
            return tensor
        keys = self.lora[name]
        with safe_open(self.weights, framework="pt") as f:
            a, b = f.get_tensor(keys["A"]), f.get_tensor(keys["B"])
            magnitude = f.get_tensor(keys["magnitude"]) if "magnitude" in keys else None
        embedding = ".lora_embedding_" in keys["A"]
        return fold_weight(tensor, a, b, self._scale(name[: -len(".weight")], a.shape[0]), embedding, magnitude)


@dataclass
class Recipe:
    method: str
    base: str | None
    models: list[tuple[str, dict[str, Any]]]
    parameters: dict[str, Any]
    dtype: str | None
    out_dtype: str | None
    tokenizer_source: str | None
    text: str


def parse_recipe(path: Path) -> Recipe:
    import yaml

    try:
        text = Path(path).read_text()
        data = yaml.safe_load(text)
    except FileNotFoundError:
        raise RecipeError(f"{path}: no such recipe file") from None
    except yaml.YAMLError as e:
        raise RecipeError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a YAML mapping with merge_method and models")
    unknown = sorted(set(data) - RECIPE_KEYS)
    if unknown:
        raise RecipeError(f"{path}: unknown key {unknown[0]!r}; unshard reads {', '.join(sorted(RECIPE_KEYS))} "
                          "(mergekit's slices and per-slice settings are not supported)")
    method = data.get("merge_method")
    if method not in METHODS:
        raise RecipeError(f"{path}: merge_method {method!r} is not one unshard has; use one of "
                          f"{', '.join(METHODS)}")
    models = []
    for i, entry in enumerate(data.get("models") or []):
        entry = {"model": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or "model" not in entry or set(entry) - MODEL_KEYS:
            raise RecipeError(f"{path}: models[{i}] must be a mapping with `model` and optional `parameters`")
        models.append((str(entry["model"]), dict(entry.get("parameters") or {})))
    for key in ("dtype", "out_dtype"):
        if data.get(key) is not None and data[key] not in dtypes.OUTPUT:
            raise RecipeError(f"{path}: {key} {data[key]!r}: use one of {', '.join(dtypes.OUTPUT)}")
    return Recipe(method, str(data["base_model"]) if data.get("base_model") else None, models,
                  dict(data.get("parameters") or {}), data.get("dtype"), data.get("out_dtype"),
                  data.get("tokenizer_source"), text)


# What a merge reads of a model on the Hub: weights (safetensors, else pickles), config and tokenizer files; of
# an adapter, its config and weights.
MODEL_PATTERNS = ["*.safetensors", "*.safetensors.index.json", *MODEL_FILE_PATTERNS]
PICKLE_PATTERNS = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]
ADAPTER_PATTERNS = ["adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"]


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


class MergedCheckpoint(Checkpoint):
    """The merge's output tensors; reading one computes it from the inputs: whole, or, for a tensor larger
    than a band whose inputs can all be read a band of rows at a time, band by band."""

    BAND_BYTES = 64 << 20  # of each input, in the working dtype: a larger tensor is merged in bands

    def read(self, name: str) -> torch.Tensor:
        return next(self._merged(name, None))[1]

    def band_rows(self, name: str) -> int | None:
        return self._band_rows.get(name)

    def read_rows_as_bytes(self, name: str, start: int, stop: int, out=None) -> None:
        return None  # (computed, never in a file)

    def read_rows(self, name: str, start: int, stop: int, local=None) -> torch.Tensor:
        # The writer (and --verify) asks for a tensor's bands in order, from one thread: the first band
        # starts the tensor's merge, which surveys the whole tensor, and each call takes the next band.
        if start == 0:
            self._merging[name] = self._merged(name, self._band_rows[name])
        at, band = next(self._merging[name])
        assert at == start, (name, at, start)
        if stop == self.tensors[name].shape[0]:
            del self._merging[name]
        return band

    def check_records(self, pieces) -> None:
        # (a merged tensor lies in no file: the records read are its inputs')
        for item in self._inputs:
            item.plan.checkpoint.check_records(pieces_read(item.plan.groups))

    def close(self) -> None:
        for item in self._inputs:
            item.plan.checkpoint.close()


def plan_merge(recipe_path: str | Path, output: OutputOptions = OutputOptions(), *, seed: int = 0,
               check: bool = True) -> Plan:
    """Open every input (metadata only) and plan the merged model (`output.dtype` auto: the recipe's)."""
    from .execute import materialise

    recipe = parse_recipe(Path(recipe_path))
    method = METHODS[recipe.method]
    recipe_dir = Path(recipe_path).resolve().parent
    if method.needs_base and not recipe.base:
        raise RecipeError(f"{recipe_path}: {recipe.method} needs base_model")
    references = [m for m, _ in recipe.models]
    if recipe.base and recipe.base not in references:
        references_with_base = [(recipe.base, {})] + recipe.models
    else:
        references_with_base = list(recipe.models)
    work = dtypes.OUTPUT[recipe.dtype or "float32"]
    inputs: list[Input] = []
    for reference, parameters in references_with_base:
        # `base+adapter`, as mergekit writes a LoRA on a base model
        path, _, adapter = reference.partition("+")
        checkpoint = open_checkpoint(_resolve(path, recipe_dir))
        plan = build_plan(checkpoint, OutputOptions(dtype="float32"), check=check)
        item = Input(reference, parameters, plan, adapter=Adapter(_resolve(adapter, recipe_dir, adapter=True)) if adapter else None)
        item.groups = {o.name: g for g in plan.groups for o in g.outputs}
        inputs.append(item)
    base = next((i for i in inputs if i.reference == recipe.base), None)
    others = [i for i in inputs if i is not base] if method.needs_base else [
        i for i in inputs if i.reference in references]
    least, most = method.inputs
    if len(others) < least or (most is not None and len(others) > most):
        wanted = f"exactly {least}" if least == most else f"at least {least}"
        raise RecipeError(f"{recipe_path}: {recipe.method} takes {wanted} model(s) besides the base, got {len(others)}")
    for item in others:
        for key, default in method.per_input.items():
            if default is REQUIRED and key not in item.parameters and key not in recipe.parameters:
                raise RecipeError(f"{recipe_path}: model {item.reference} needs parameters.{key} for {recipe.method}")
    for key, default in method.shared.items():
        if default is REQUIRED and key not in recipe.parameters:
            raise RecipeError(f"{recipe_path}: {recipe.method} needs parameters.{key}")

    # The output: the base's tensors (or the first model's), checked against every input.
    reference_input = base or others[0]
    outputs = {o.name: o for g in reference_input.plan.groups for o in g.outputs}
    for item in inputs:
        for name, out in outputs.items():
            theirs = next((o for o in item.groups[name].outputs if o.name == name), None) if name in item.groups else None
            if theirs is None:
                raise RecipeError(f"{item.reference}: has no {name}, which {reference_input.reference} has; "
                                  "models merged together must share an architecture")
            if theirs.shape != out.shape:
                raise RecipeError(f"{item.reference}: {name} has shape {tuple(theirs.shape)}, {reference_input.reference} "
                                  f"{tuple(out.shape)}; unshard merges equal shapes only (different vocabularies: "
                                  "resize the embeddings first)")
    for item in inputs:
        stray = sorted({*item.adapter.lora, *item.adapter.replaced} - set(outputs)) if item.adapter else []
        if stray:
            raise RecipeError(f"{item.adapter.weights}: adapts {stray[0]}, which {item.reference.partition('+')[0]} "
                              "does not have; is it the adapter of another model?")
    layers = 1 + max((int(p[p.index("layers") + 1]) for n in outputs for p in [n.split(".")]
                      if "layers" in p and p.index("layers") + 1 < len(p) and p[p.index("layers") + 1].isdigit()),
                     default=0)
    recent: dict[int, tuple[Group, dict[str, torch.Tensor]]] = {}

    def tensor_of(item: Input, name: str) -> torch.Tensor:
        # A group may make several outputs (split experts): keep its last result for the next name.
        group = item.groups[name]
        if len(group.outputs) == 1:
            tensor = materialise(item.plan, group)[0][1]
        else:
            cached = recent.get(id(item))
            if cached is None or cached[0] is not group:
                cached = (group, dict(materialise(item.plan, group)))
                recent[id(item)] = cached
            tensor = cached[1][name].clone()  # methods work in their inputs' buffers
        return (item.adapter.apply(name, tensor) if item.adapter else tensor).to(work.torch)

    def rows_of(item: Input, name: str, start: int, stop: int, buffers: dict) -> torch.Tensor:
        """Rows [start, stop) of an input's `name`, in the working dtype, in `buffers` kept for all the bands
        of the tensor (fresh ones for each band cost as much again in page faults as the reading)."""
        checkpoint, source = item.plan.checkpoint, item.groups[name].source
        shape = (stop - start, *source.shape[1:])

        def buffer(dtype: torch.dtype) -> torch.Tensor:
            if (id(item), dtype) not in buffers:  # (made for the first band, the largest)
                buffers[id(item), dtype] = torch.empty(math.prod(shape), dtype=dtype)
            return buffers[id(item), dtype][:math.prod(shape)].view(shape)

        rows = buffer(source.dtype.torch)
        if checkpoint.read_rows_as_bytes(source.name, start, stop, out=rows.view(-1).view(torch.uint8).numpy()) is None:
            rows = checkpoint.read_rows(source.name, start, stop, checkpoint.local_tensor)
        return rows if rows.dtype == work.torch else buffer(work.torch).copy_(rows)

    def in_bands(name: str) -> int | None:
        """Rows per band if `name` is merged a band at a time: larger than a band, and every input reads
        its rows as they are (no split, no transformers conversion, no adapter to fold)."""
        out = outputs[name]
        if not out.dtype.is_floating_point or len(out.shape) < 2:
            return None
        rows = max(1, MergedCheckpoint.BAND_BYTES // (math.prod(out.shape[1:]) * work.itemsize))
        groups = [(item, item.groups[name]) for item in inputs]
        if rows >= out.shape[0] or not all(
                len(g.outputs) == 1 and g.convert is None and item.plan.checkpoint.reads_rows(g.source.name)
                and not (item.adapter and item.adapter.adapts(name)) for item, g in groups):
            return None
        return rows

    def merged(name: str, rows: int | None) -> Iterator[tuple[int, torch.Tensor]]:
        """(first row, merged band) of `name`, a band of `rows` rows at a time, or whole (rows None)."""
        if not outputs[name].dtype.is_floating_point:
            yield 0, tensor_of(reference_input, name)  # integer buffers are copied from the base
            return
        t = layer_position(name, layers)
        value = lambda key, params: evaluate(params.get(key, recipe.parameters.get(key)), name, t)  # noqa: E731
        shared = {k: (d if (v := value(k, {})) is None else v) for k, d in method.shared.items()}
        params = [{k: (d if (v := value(k, item.parameters)) is None else v) for k, d in method.per_input.items()}
                  for item in others]
        with_base = base is not None and method.needs_base

        def draws(start: int) -> torch.Generator:  # seeded per tensor and band: repeats whatever the threads
            return torch.Generator().manual_seed(zlib.crc32(f"{seed}/{name}{f'/{start}' if start else ''}".encode()))

        if rows is None:  # one band, read once
            whole = (tensor_of(base, name) if with_base else None, [tensor_of(item, name) for item in others])
            starts, bands = [0], lambda: iter([(*whole, draws(0))])
        else:
            total, buffers = outputs[name].shape[0], {}
            starts = list(range(0, total, rows))

            def bands():  # (each band read into the buffers of the one before: it is done with when the next is asked for)
                for start in starts:
                    stop = min(start + rows, total)
                    yield (rows_of(base, name, start, stop, buffers) if with_base else None,
                           [rows_of(item, name, start, stop, buffers) for item in others], draws(start))
        numbers = method.survey(bands, params, shared) if method.survey else None
        for start, (base_band, other_bands, generator) in zip(starts, bands()):
            yield start, method.combine(base_band, other_bands, params, shared, numbers, generator)

    tensors = {name: SourceTensor(name, tuple(o.shape), work if o.dtype.is_floating_point else o.dtype, [])
               for name, o in outputs.items()}
    source = reference_input if recipe.tokenizer_source in (None, "base") else next(
        (i for i in inputs if i.reference == recipe.tokenizer_source), None)
    if source is None:
        raise RecipeError(f"{recipe_path}: tokenizer_source {recipe.tokenizer_source!r} is neither `base` nor one of "
                          "the models (mergekit's `union` vocabularies are not supported)")
    checkpoint = MergedCheckpoint(layout="merge", path=Path(recipe_path), tensors=tensors,
                                  hf_folder=source.plan.config_folder,
                                  facts={"method": recipe.method, "inputs": ", ".join(i.reference for i in inputs),
                                         "base_model": recipe.base, "seed": seed})
    checkpoint._merged, checkpoint._inputs, checkpoint.recipe = merged, inputs, recipe
    checkpoint._band_rows = {name: rows for name in outputs if (rows := in_bands(name)) is not None}
    checkpoint._merging = {}
    requested, reason = next((value, why) for value, why in (
        (None if output.dtype == "auto" else output.dtype, "asked for with --dtype"), (recipe.out_dtype, "the recipe's out_dtype"),
        (recipe.dtype, "the recipe's dtype"), ("", "the base model's")) if value is not None)
    if not requested:  # asked for nowhere: the dtype the base would be converted to
        natural, _ = choose_dtype("auto", hf_names.read_config(reference_input.plan.config_folder),
                                  reference_input.plan.checkpoint)
        requested = natural.name if natural.name in dtypes.OUTPUT else "float32"
    plan = build_plan(checkpoint, replace(output, dtype=requested), check=check)
    plan.dtype_reason = reason
    # Per tensor in flight: one copy per input, the stacked task vectors and the result.
    plan.copies_per_tensor = 2 * len(inputs) + 1
    plan.notes = [note for note in plan.notes if "--config-from" not in note]
    plan.base_models = hub_ids([recipe.base] + [model for model, _ in recipe.models])
    if not any((source.plan.config_folder / name).exists() for name in TOKENIZER_FILES):
        plan.notes.append(f"{source.reference} has no tokenizer: set tokenizer_source to a model that has one")
    return plan


def model_card(plan: Plan) -> str:
    """The opening of README.md for the merged folder: the method, the inputs and the recipe
    (the writer adds the dtype and the list of files)."""
    recipe = plan.checkpoint.recipe
    lines = ["# Merged model", "",
             f"Made with [unshard](https://pypi.org/project/unshard/) `merge` using the **{recipe.method}** method.", ""]
    if recipe.base:
        lines += [f"Base model: `{recipe.base}`", ""]
    lines += ["Models:", ""] + [f"- `{m}`" for m, _ in recipe.models] + ["", "Recipe:", "", "```yaml",
                                                                          recipe.text.rstrip(), "```", ""]
    return "\n".join(lines)


def recipe_files(plan: Plan) -> dict[str, str]:
    return {"mergekit_config.yml": plan.checkpoint.recipe.text, "README.md": model_card(plan)}


__all__ = ["METHODS", "RecipeError", "evaluate", "parse_recipe", "plan_merge", "recipe_files"]
