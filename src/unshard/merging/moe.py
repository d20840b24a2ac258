"""`unshard merge-moe RECIPE OUT`: a mixture of experts assembled from dense models of one architecture, as
mergekit-moe 0.1.5 assembles it, from any layout unshard reads.

The recipe is mergekit-moe's: `base_model`, `experts` (each a `source_model` with `positive_prompts`,
`negative_prompts`, `noise_scale`, `residual_scale`), `gate_mode`, `experts_per_token`, `shared_experts`,
`dtype`, `architecture`. The output takes everything but the MLPs from the base model; each expert's MLP
becomes that expert in every layer (its down projection times `residual_scale`, its weights plus
`noise_scale` times seeded normal noise); the routers' rows are the gate vectors (gates.py).

Output architectures, as mergekit's: Mixtral (from Llama or Mistral, no shared expert; mergekit's default),
Qwen MoE (Qwen2-MoE, from Llama, Mistral or Qwen2, exactly one shared expert) and Qwen3 MoE (from Qwen3, no
shared expert). The tensors are named as those models' checkpoints on the Hub are (Mixtral's
`block_sparse_moe.experts.E.w1`, ...): what vLLM, llama.cpp's converter and transformers (which fuses the
experts as it loads) read. mergekit 0.1.5 writes transformers 5's fused layout of the same numbers.
"""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from .. import dtypes, families
from ..families.parts import INTERMEDIATE, MoELayout
from ..hub import hub_ids
from ..names import hf_names
from ..plan import TOKENIZER_FILES, build_plan, choose_dtype
from ..sources import SourceOptions, SourceTensor
from ..types import OutputOptions, Plan
from .checkpoint import FromInputs
from .gates import GATE_MODES, PROMPT_MODES, degenerate_layers, gate_vectors
from .inputs import LAYER, Input, open_input
from .recipe import RecipeError, read_yaml

MOE_KEYS = {"base_model", "experts", "gate_mode", "dtype", "experts_per_token", "shared_experts", "architecture"}
EXPERT_KEYS = {"source_model", "positive_prompts", "negative_prompts", "noise_scale", "residual_scale"}
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")  # a dense MLP's, as Llama, Mistral and Qwen name them
RESIDUAL = "down_proj"  # the projection `residual_scale` scales


@dataclass(frozen=True)
class Expert:
    model: str
    positive: tuple[str, ...]
    negative: tuple[str, ...]
    noise_scale: float | None
    residual_scale: float | None


@dataclass
class MoERecipe:
    base: str
    experts: list[Expert]
    shared: list[Expert]
    gate_mode: str
    dtype: str | None
    per_token: int
    architecture: str | None
    text: str

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys([self.base, *(e.model for e in self.experts + self.shared)]))


# ---- reading the recipe ----


def _prompts(path: Path, where: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise RecipeError(f"{path}: {where} must be a list of strings")
    return tuple(value)


def _expert(path: Path, where: str, entry: Any) -> Expert:
    if not isinstance(entry, dict) or "source_model" not in entry or set(entry) - EXPERT_KEYS:
        raise RecipeError(
            f"{path}: {where} must be a mapping with `source_model` and optional "
            "`positive_prompts`, `negative_prompts`, `noise_scale`, `residual_scale`"
        )
    scales = {}
    for key in ("noise_scale", "residual_scale"):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise RecipeError(f"{path}: {where}.{key} must be a number (got {value!r})")
        scales[key] = None if value is None else float(value)
    return Expert(
        str(entry["source_model"]),
        _prompts(path, f"{where}.positive_prompts", entry.get("positive_prompts")),
        _prompts(path, f"{where}.negative_prompts", entry.get("negative_prompts")),
        **scales,
    )


def parse_moe_recipe(path: Path, allow_same: bool = False) -> MoERecipe:
    """mergekit-moe's config, with the checks mergekit-moe makes before it starts, as one-line errors."""
    data, text = read_yaml(path, "recipe")
    if not isinstance(data, dict) or "base_model" not in data or not isinstance(data.get("experts"), list):
        raise RecipeError(f"{path}: a MoE recipe is a YAML mapping with base_model and experts (a list)")
    if unknown := sorted(set(data) - MOE_KEYS):
        raise RecipeError(f"{path}: unknown key {unknown[0]!r}; merge-moe reads {', '.join(sorted(MOE_KEYS))}")
    mode = data.get("gate_mode", "hidden")
    if mode not in GATE_MODES:
        raise RecipeError(f"{path}: gate_mode {mode!r}: use one of {', '.join(GATE_MODES)}")
    per_token = data.get("experts_per_token", 2)
    experts = [_expert(path, f"experts[{i}]", e) for i, e in enumerate(data["experts"])]
    shared = data.get("shared_experts") or []
    if not isinstance(shared, list):
        raise RecipeError(f"{path}: shared_experts must be a list")
    shared = [_expert(path, f"shared_experts[{i}]", e) for i, e in enumerate(shared)]
    if type(per_token) is not int or per_token < 1:
        raise RecipeError(f"{path}: experts_per_token must be a whole number of 1 or more (got {per_token!r})")
    if len(experts) < per_token:
        raise RecipeError(
            f"{path}: {len(experts)} expert(s) for experts_per_token {per_token}: list at least as many "
            "experts as each token uses"
        )
    if data.get("dtype") is not None and data["dtype"] not in dtypes.OUTPUT:
        raise RecipeError(f"{path}: dtype {data['dtype']!r}: use one of {', '.join(dtypes.OUTPUT)}")
    if mode in PROMPT_MODES:
        for i, expert in enumerate(experts):
            if not expert.positive:
                raise RecipeError(
                    f"{path}: experts[{i}] has no positive_prompts, which gate_mode {mode} routes by "
                    "(or use gate_mode random)"
                )
        if len(experts) > 1 and len({(e.positive, e.negative) for e in experts}) == 1:
            raise RecipeError(
                f"{path}: every expert has the same prompts, so the router cannot tell them apart; give "
                "each expert prompts of what should go to it"
            )
        if shared and len({bool(e.positive) for e in shared}) > 1:
            raise RecipeError(f"{path}: give prompts to every shared expert or to none")
    if not allow_same and len(experts) > 1 and len({e.model for e in experts}) == 1:
        raise RecipeError(
            f"{path}: every expert is the same model, which gives the model's own output at more cost; "
            "pass --i-understand-this-is-not-useful-without-training if you will train it further"
        )
    architecture = data.get("architecture")
    return MoERecipe(
        str(data["base_model"]),
        experts,
        shared,
        mode,
        data.get("dtype"),
        per_token,
        None if architecture is None else str(architecture),
        text,
    )


def _layout(recipe: MoERecipe, model_types: dict[str, str], where: str) -> MoELayout:
    """The first output architecture (Mixtral before the others, as mergekit) that takes these models."""
    layouts = families.moe_layouts()
    candidates = [
        a for a in layouts if not recipe.architecture or a.name.lower().startswith(recipe.architecture.lower())
    ]
    if not candidates:
        raise RecipeError(
            f"{where}: architecture {recipe.architecture!r}: use one of {', '.join(a.name for a in layouts)}"
        )
    kinds = set(model_types.values())
    why = []
    for layout in candidates:
        if len(recipe.shared) != layout.shared_experts:
            why.append(f"{layout.name} takes {layout.shared_experts} shared expert(s)")
        elif len(kinds) != 1 or not kinds <= set(layout.inputs):
            why.append(f"{layout.name} is made from {' or '.join(layout.inputs)} models")
        elif layout.shared_experts and recipe.gate_mode in PROMPT_MODES and not recipe.shared[0].positive:
            why.append(f"{layout.name} routes to its shared expert by its prompts, which it lacks")
        else:
            return layout
    found = ", ".join(f"{m}: {t}" for m, t in model_types.items())
    raise RecipeError(
        f"{where}: no MoE architecture takes these models ({found}; {len(recipe.shared)} shared "
        f"expert(s)): {'; '.join(why)}"
    )


# ---- the assembled model ----


@dataclass(frozen=True)
class Copied:
    """An output tensor that is an input's, as it is or scaled and with noise added."""

    item: Input
    name: str
    scale: float | None = None
    noise: float | None = None


@dataclass(frozen=True)
class Routed:
    """A layer's router rows: the gate vectors [start, stop) of that layer."""

    layer: int
    start: int
    stop: int


class AssembledMoE(FromInputs):
    """The MoE's tensors, each read from an input (or, for the routers, from the gate vectors, computed from
    the base model when the first router is asked for). Set up by `plan_moe`."""

    made_from: dict[str, Copied | Routed | None]  # None: zeros (an attention bias the base has not)
    recipe: MoERecipe
    prompts: list[tuple[list[str], list[str]]]
    seed: int
    warnings: list[str]

    def setup(self, made_from, recipe: MoERecipe, base_config: dict, prompts, seed: int, inputs: list[Input]) -> None:
        self.made_from, self.recipe, self.base_config, self.prompts = made_from, recipe, base_config, prompts
        self.seed, self.inputs, self.warnings = seed, inputs, []
        self._gates: torch.Tensor | None = None
        self._computing = threading.Lock()

    def read(self, name: str) -> torch.Tensor:
        what = self.made_from[name]
        if what is None:
            return torch.zeros(self.tensors[name].shape)
        if isinstance(what, Routed):
            return self.gates()[what.layer, what.start : what.stop].clone()
        tensor = what.item.read(what.name)
        if what.scale is not None or what.noise is not None:
            tensor = tensor.to(what.item.groups[what.name].source.dtype.torch)  # (as mergekit: in the stored dtype)
        if what.noise is not None:  # seeded per tensor: the same whatever the threads
            generator = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}/{name}".encode()))
            tensor = tensor + torch.randn(tensor.shape, generator=generator).to(tensor.dtype) * what.noise
        if what.scale is not None:
            tensor = tensor * what.scale
        return tensor

    def gates(self) -> torch.Tensor:
        with self._computing:
            if self._gates is None:
                (base, *_) = self.inputs
                self._gates = gate_vectors(self.recipe.gate_mode, base, self.prompts, self.base_config, self.seed)
                if self.recipe.gate_mode in PROMPT_MODES and (bad := degenerate_layers(self._gates)):
                    self.warnings.append(
                        f"the gate vectors of layer(s) {', '.join(map(str, bad))} are nearly "
                        "dependent (prompts too alike): some experts will hardly be chosen there"
                    )
        return self._gates


def plan_moe(
    recipe_path: str | Path,
    output: OutputOptions = OutputOptions(),
    *,
    seed: int = 0,
    allow_same: bool = False,
    check: bool = True,
) -> Plan:
    """Open the models (metadata only) and plan the MoE: every tensor's name, shape, dtype and making."""
    where = str(recipe_path)
    recipe = parse_moe_recipe(Path(recipe_path), allow_same)
    recipe_dir = Path(recipe_path).resolve().parent
    inputs = {reference: open_input(reference, recipe_dir, check) for reference in recipe.models}
    base = inputs[recipe.base]
    configs = {}
    for reference, item in inputs.items():
        if (config := hf_names.read_config(item.plan.config_folder)) is None:
            raise RecipeError(f"{reference}: merge-moe needs each model's config.json (beside its checkpoint)")
        configs[reference] = config
    base_config = configs[recipe.base]
    layout = _layout(recipe, {m: c.get("model_type", "?") for m, c in configs.items()}, where)
    if recipe.gate_mode in PROMPT_MODES and not any((base.plan.config_folder / f).exists() for f in TOKENIZER_FILES):
        raise RecipeError(
            f"{recipe.base}: has no tokenizer, which gate_mode {recipe.gate_mode} needs for the prompts "
            "(or use gate_mode random)"
        )

    routed = recipe.experts + recipe.shared  # (a layout with a shared expert has its prompts: see _layout)
    tensors, made_from = _assembly(recipe, layout, inputs, base_config)

    checkpoint = AssembledMoE(
        layout="moe",
        path=Path(recipe_path),
        tensors=tensors,
        hf_folder=base.plan.config_folder,
        facts={
            "method": f"merge-moe: {layout.name}, {len(recipe.experts)} experts "
            f"({recipe.per_token} per token)"
            + (f" and {len(recipe.shared)} shared" if recipe.shared else "")
            + f", gate_mode {recipe.gate_mode}",
            "inputs": ", ".join(inputs),
            "base_model": recipe.base,
            "seed": seed,
        },
    )
    checkpoint.setup(
        made_from,
        recipe,
        base_config,
        [(list(e.positive), list(e.negative)) for e in routed],
        seed,
        list(inputs.values()),
    )
    checkpoint.config_changes = _config(layout, base_config, len(recipe.experts), recipe.per_token)
    checkpoint.config_whole = True
    requested = output.dtype if output.dtype != "auto" else recipe.dtype
    reason = "asked for with --dtype" if output.dtype != "auto" else "the recipe's dtype"
    if not requested:
        natural, _ = choose_dtype("auto", base_config, base.plan.checkpoint)
        requested, reason = (natural.name if natural.name in dtypes.OUTPUT else "float32"), "the base model's"
    plan = build_plan(checkpoint, replace(output, dtype=requested), SourceOptions(check=check))
    plan.dtype_reason = reason
    plan.copies_per_tensor = 2  # the input's tensor, and its cast
    plan.notes = [note for note in plan.notes if "--config-from" not in note]
    count = len(recipe.experts)
    if count & (count - 1):
        plan.notes.append(f"{count} experts, not a power of two: llama.cpp does not load such a model")
    plan.base_models = hub_ids(recipe.models)
    return plan


def _assembly(recipe: MoERecipe, layout: MoELayout, inputs: dict[str, Input], base_config: dict):
    """The MoE's tensors in the base's order (a layer's MoE block where its MLP was), and how each is made."""
    base = inputs[recipe.base]
    routed = len(recipe.experts) + len(recipe.shared)
    tensors: dict[str, SourceTensor] = {}
    made_from: dict[str, Copied | Routed | None] = {}

    def add(name: str, shape: tuple[int, ...], dtype: dtypes.DType, what: Copied | Routed | None) -> None:
        tensors[name] = SourceTensor(name, shape, dtype, [])
        made_from[name] = what

    def copied(item: Input, name: str, expert: Expert | None = None, residual: bool = False) -> Copied:
        return Copied(
            item, name, expert.residual_scale if expert and residual else None, expert.noise_scale if expert else None
        )

    def moe_block(stack: str, layer: int) -> None:
        at = f"{stack}.{layer}."
        gate_dtype = dtypes.BY_NAME["float32"]
        hidden = base_config["hidden_size"]
        add(at + layout.router, (len(recipe.experts), hidden), gate_dtype, Routed(layer, 0, len(recipe.experts)))
        members = [(layout.expert.format(e=e, part="{part}"), expert) for e, expert in enumerate(recipe.experts)]
        members += [(layout.shared_expert, expert) for expert in recipe.shared]
        for pattern, expert in members:
            item = inputs[expert.model]
            for projection in PROJECTIONS:
                name = f"{at}mlp.{projection}.weight"
                theirs, ours = item.output(name), base.output(name)
                if theirs is None or ours is None or theirs.shape != ours.shape:
                    raise RecipeError(
                        f"{expert.model}: its {name} ({'none' if theirs is None else tuple(theirs.shape)}) "
                        f"is not the base's ({'none' if ours is None else tuple(ours.shape)}); experts "
                        f"must share {recipe.base}'s architecture and sizes"
                    )
                part = layout.parts[projection] if pattern is not layout.shared_expert else projection
                add(
                    at + pattern.format(part=part),
                    tuple(theirs.shape),
                    item.groups[name].source.dtype,
                    copied(item, name, expert, projection == RESIDUAL),
                )
        if layout.shared_router and recipe.shared:
            add(
                at + layout.shared_router,
                (len(recipe.shared), hidden),
                gate_dtype,
                Routed(layer, len(recipe.experts), routed),
            )

    done: set[int] = set()
    names = [o.name for g in base.plan.groups for o in g.outputs]
    for name in names:
        found = LAYER.match(name)
        if found and found[3].startswith("mlp."):
            if found[3].removesuffix(".weight") not in (f"mlp.{p}" for p in PROJECTIONS):
                raise RecipeError(
                    f"{recipe.base}: {name} is not a weight of a dense MLP's {', '.join(PROJECTIONS)}; "
                    f"{layout.name} experts are made of those alone"
                )
            if int(found[2]) not in done:
                done.add(int(found[2]))
                moe_block(found[1], int(found[2]))
            continue
        add(name, tuple(base.output(name).shape), base.groups[name].source.dtype, copied(base, name))
        if found:
            for bias in layout.attention_biases:
                if found[3] == f"{bias}.weight" and f"{found[1]}.{found[2]}.{bias}.bias" not in base.groups:
                    add(
                        f"{found[1]}.{found[2]}.{bias}.bias",
                        (base.output(name).shape[0],),
                        dtypes.BY_NAME["float32"],
                        None,
                    )

    return tensors, made_from


def _config(layout: MoELayout, base_config: dict, experts: int, per_token: int) -> dict[str, Any]:
    """The output's config.json: the base's, made the MoE's config class (whose defaults fill what the base
    lacks), with the expert counts and the settings mergekit gives."""
    import transformers

    config_class = getattr(transformers, layout.config_class)
    dense = transformers.AutoConfig.for_model(**base_config).to_dict()  # (as transformers reads the base's)
    made = config_class(**{k: v for k, v in dense.items() if k not in ("model_type", "architectures")})
    intermediate = base_config.get("intermediate_size")
    settings = {**layout.settings, layout.experts_key: experts, "num_experts_per_tok": per_token}
    for key, value in settings.items():  # (set on the config, whose attribute map knows the names it saves them by)
        setattr(made, key, intermediate if value is INTERMEDIATE else value)
    made.architectures = [layout.architecture]
    written = made.to_diff_dict()  # (what save_pretrained writes)
    written.pop("transformers_version", None)
    return written


def moe_files(plan: Plan) -> dict[str, str]:
    """The recipe, as mergekit-moe keeps it, and the opening of README.md."""
    checkpoint = plan.checkpoint
    recipe = checkpoint.recipe
    lines = [
        "# Mixture of experts",
        "",
        f"Assembled with [unshard](https://pypi.org/project/unshard/) "
        f"{checkpoint.facts['method'].replace('merge-moe:', '`merge-moe`:')}, seed {checkpoint.seed}.",
        "",
        f"Base model: `{recipe.base}`",
        "",
        "Experts:",
        "",
    ]
    lines += [
        f"- `{e.model}`" + (f": {', '.join(repr(p) for p in e.positive[:3])}" if e.positive else "")
        for e in recipe.experts
    ]
    if recipe.shared:
        lines += ["", "Shared experts:", ""] + [f"- `{e.model}`" for e in recipe.shared]
    lines += ["", "Recipe:", "", "```yaml", recipe.text.rstrip(), "```", ""]
    return {"mergekit_moe_config.yml": recipe.text, "README.md": "\n".join(lines)}


__all__ = ["AssembledMoE", "MoERecipe", "moe_files", "parse_moe_recipe", "plan_moe"]
