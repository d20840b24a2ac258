"""What the model a config describes holds, asked of transformers: the model built on the meta device (no memory, no
weights), its state dict's names and shapes, what `save_pretrained` writes of them, which weights are Linear layers',
and which transformers keeps in float32 beside 16-bit weights. hf_names.py names checkpoints by these facts."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigMismatchError
from . import known


def built_by_transformers(config: dict) -> bool:
    """Whether transformers' class of this config is the model it describes: not custom code (auto_map: building it
    would run code from the checkpoint), nor a drafter saved under its target's model type (a draft vocabulary or
    DFlash's settings beside an architecture transformers lacks: SpecForge's), which transformers would build as the
    target's kind of model."""
    if config.get("auto_map"):
        return False
    architecture = (config.get("architectures") or [None])[0]
    if architecture and {"draft_vocab_size", "dflash_config"} & config.keys():
        try:
            import transformers
        except ImportError:
            return False
        return hasattr(transformers, architecture)
    return True


def meta_model(config_folder: Path, config: dict, updates: dict | None = None, dtype: Any = None) -> Any:
    """The model class the config names, built on the meta device (in `dtype`, a torch dtype, where given; else in the
    config's); None if that cannot be done safely."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return None
    if not built_by_transformers(config):
        return None
    with known.transformers_quiet():
        return _built_on_meta(config_folder, config, updates or {}, dtype)


def _built_on_meta(config_folder: Path, config: dict, updates: dict, dtype: Any) -> Any:
    import transformers

    try:
        if updates.get("model_type", config.get("model_type")) != config.get("model_type"):  # (a MoE of dense models)
            hf_config = transformers.AutoConfig.for_model(**{**config, **updates})
        else:
            hf_config = transformers.AutoConfig.from_pretrained(
                config_folder,
                **{
                    k: v
                    for k, v in updates.items()
                    if k in ("num_labels", "num_hidden_layers", "layer_types", "vocab_size")
                },
            )
    except Exception as e:  # (a value of the wrong type or out of range: transformers' config classes check them)
        raise _unreadable(config_folder, "read it", e) from None
    architectures = updates.get("architectures") or config.get("architectures") or []
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    if model_class is None and updates.get("architectures"):
        raise ConfigMismatchError(f"--architecture {architectures[0]}: transformers has no such model class")
    import torch

    # (transformers < 5 names the dtype `torch_dtype`)
    in_dtype = (
        {} if dtype is None else {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": dtype}
    )
    with torch.device("meta"):
        # a config saved without `architectures`, or naming a class transformers lacks (its makers' own, as MosaicML's
        # MPTForCausalLM and the first T5 releases' T5WithLMHeadModel): the causal or sequence-to-sequence LM of its
        # model_type; a base model's layers alone first where the class is named as one (NVIDIA's
        # LlamaBidirectionalModel)
        if model_class is None:
            named = architectures[0] if architectures else ""
            base = named.endswith("Model") and not named.endswith("LMHeadModel")
            autos = (transformers.AutoModelForCausalLM, transformers.AutoModelForSeq2SeqLM)
            for auto in (transformers.AutoModel, *autos) if base else autos:
                try:
                    return auto.from_config(hf_config, **in_dtype)
                except ValueError:
                    continue
            return None
        try:
            return model_class._from_config(hf_config, **in_dtype)
        except ImportError as e:  # (a library transformers builds part of it with: Gemma 3n's vision tower, timm's)
            why = str(e).strip().split(". ")[0].rstrip(".:") or type(e).__name__
            raise ConfigMismatchError(
                f"{config_folder / 'config.json'}: transformers builds this model with a library that is not installed "
                f"here ({why}); install it, as in the environment that trained the model"
            ) from None
        except Exception as e:  # (values its config class takes and its model cannot be built with: Gemma 4's rope)
            raise _unreadable(config_folder, "build the model from it", e) from None


def _unreadable(config_folder: Path, what: str, e: Exception) -> ConfigMismatchError:
    why = str(e).strip().splitlines()[0].rstrip(":") if str(e).strip() else type(e).__name__
    if isinstance(e, LookupError):  # (a KeyError says the key alone)
        why = f"{type(e).__name__}: {why}"
    return ConfigMismatchError(
        f"{config_folder / 'config.json'}: transformers cannot {what} ({why}); fix it or pass "
        "--config-from the model's own folder"
    )


def rebuild_computed_modules(model: Any) -> None:
    """Modules of a model built on the meta device whose buffers are computed at construction, not saved
    (rotary embeddings' inverse frequencies), made again on the CPU from their config."""
    for name, module in list(model.named_modules()):
        if (
            module._non_persistent_buffers_set
            and not any(True for _ in module.parameters())
            and hasattr(module, "config")
        ):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, type(module)(config=module.config))


@dataclass
class LinearLayers:
    """The weights compressed-tensors treats as Linear layers' (what `--quantize` targets, and what its config's
    ignore list names), in the model's order, tied ones included, under the names save_pretrained writes."""

    weights: list[str]
    held_as: dict[str, str] = field(default_factory=dict)  # saved name -> name in memory, where they differ
    routers: list[str] = field(default_factory=list)  # those that are MoE routers
    # saved name -> the module's name in a config's ignore list, where that is not the saved one: compressed-tensors
    # lists a module by its name in memory turned back by the model's renamings as they match the bare module name,
    # so a renaming that needs the `.weight` after it (GPT-NeoX's embed_out -> lm_head) leaves its name in memory
    listed_as: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"weights": self.weights, "held_as": self.held_as, "routers": self.routers, "listed_as": self.listed_as}

    @classmethod
    def from_json(cls, data: dict) -> LinearLayers:
        return cls(list(data["weights"]), dict(data["held_as"]), list(data["routers"]), dict(data["listed_as"]))


@dataclass
class ModelFacts:
    """What the config's model holds, as plain data: the names and shapes of its state dict, which
    of them are tied to another (saved once), what `save_pretrained` writes, and which weights are
    those of Linear layers (what quantization targets), and which it keeps in float32 when loaded in a 16-bit
    dtype (a MoE's router: `_keep_in_fp32_modules_strict`), as save_pretrained then writes them."""

    in_memory: dict[str, tuple[int, ...]]
    tied: set[str]
    saved: dict[str, tuple[int, ...]]
    linear: LinearLayers
    float32: dict[str, list[str]] = field(default_factory=dict)  # dtype name -> in-memory names kept in float32
    # the tied weights under the names save_pretrained would give them (InternVL's head, `lm_head` in memory, as
    # `language_model.lm_head`): a checkpoint under saved names may lack them
    tied_as_saved: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, model) -> ModelFacts:
        """The facts of a model built on the meta device; built in a 16-bit dtype (meta_model's `dtype`), what it
        holds in float32 is known to be made so."""
        kept = {name for name, _ in model.named_parameters()}
        tied = {name for name, _ in model.named_parameters(remove_duplicate=False)} - kept
        in_memory = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        tied_as_saved = set(_saved_shapes(model, {name: in_memory[name] for name in tied if name in in_memory}))
        saved, linear, float32 = _saved_shapes(model, in_memory), _linear_layers(model), _kept_in_float32(model)
        return cls(in_memory, tied, saved, linear, float32, tied_as_saved)

    def to_json(self) -> dict:
        return {
            "in_memory": self.in_memory,
            "tied": sorted(self.tied),
            "saved": self.saved,
            "linear": self.linear.to_json(),
            "float32": self.float32,
            "tied_as_saved": sorted(self.tied_as_saved),
        }

    @classmethod
    def from_json(cls, data: dict) -> ModelFacts:
        shapes = lambda d: {n: tuple(s) for n, s in d.items()}  # noqa: E731
        return cls(
            shapes(data["in_memory"]),
            set(data["tied"]),
            shapes(data["saved"]),
            LinearLayers.from_json(data["linear"]),
            {dtype: list(names) for dtype, names in data["float32"].items()},
            set(data["tied_as_saved"]),
        )


def _saved_shapes(model, in_memory: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Names and shapes save_pretrained writes for this model (transformers >= 5 converts some)."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return in_memory
    import torch

    meta = {n: torch.empty(s, device="meta") for n, s in in_memory.items()}
    return {n: tuple(t.shape) for n, t in revert_weight_conversion(model, meta).items()}


def _kept_in_float32(model) -> dict[str, list[str]]:
    """The names transformers loads in float32 whatever 16-bit dtype is asked for, by that dtype's name: the
    model's `_keep_in_fp32_modules_strict` (and in float16 `_keep_in_fp32_modules` too), patterns searched in each
    name with `*` for any text, as transformers' loader matches them, and the tensors its modules make in float32
    whatever the default dtype (LFM2-MoE's router bias, a buffer no plan names); each in memory and as saved
    (Nemotron-H's router, `model.` in memory and `backbone.` as saved, is read by either name)."""
    import torch

    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers < 5 saves in-memory names as they are
        revert_weight_conversion = None
    state = model.state_dict()
    shapes = {name: tensor.shape for name, tensor in state.items()}
    names = list(shapes)
    built_in_16_bits = any(t.dtype in (torch.bfloat16, torch.float16) for t in state.values())
    made_float32 = [n for n, t in state.items() if t.dtype == torch.float32] if built_in_16_bits else []
    kept = {}
    for dtype in (torch.bfloat16, torch.float16):
        plan = model._get_dtype_plan(dtype) if hasattr(model, "_get_dtype_plan") else {}
        found = [re.compile(p.replace("*", ".*")) for p, kept_as in plan.items() if kept_as == torch.float32]
        if matched := [n for n in names if n in made_float32 or any(f.search(n) for f in found)]:
            if revert_weight_conversion is not None:
                meta = {n: torch.empty(shapes[n], device="meta") for n in matched}
                matched += [n for n in revert_weight_conversion(model, meta) if n not in matched]
            kept[str(dtype).removeprefix("torch.")] = matched
    return kept


# compressed-tensors counts a MoE router as a Linear layer (vLLM runs it as one), by its class name.
_ROUTER_CLASS = re.compile(r"Router|Gating|Gate(?![a-z])")
# An expert's projection as saved, and the order llm-compressor makes Linear layers of a fused expert's in.
_EXPERT = re.compile(r".*\.(\d+)\.(\w+)\.weight$")
_EXPERT_ORDER = {"up_proj": 0, "w3": 0, "gate_proj": 1, "w1": 1, "down_proj": 2, "w2": 2}


def _linear_layers(model) -> LinearLayers:
    """The model's Linear layers as compressed-tensors counts them: the Linear modules, the MoE routers, and
    each expert of a module holding them fused in 3-D tensors, which llm-compressor makes Linear layers of
    before it quantizes."""
    import torch

    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers < 5 saves in-memory names as they are
        revert_weight_conversion = None

    def saved(weights: dict[str, torch.Tensor]) -> list[str]:
        if revert_weight_conversion is None:
            return list(weights)
        meta = {n: torch.empty(t.shape, device="meta") for n, t in weights.items()}
        names = list(revert_weight_conversion(model, meta))
        if len(weights) == 1 and names != list(weights):
            linear.held_as[names[0]] = next(iter(weights))
        return names

    def listed_as(module: str) -> str:
        """compressed-tensors' name for the module in a config's ignore list (_map_to_checkpoint_names)."""
        if revert_weight_conversion is None:
            return module
        return next(iter(revert_weight_conversion(model, {module: torch.empty(0, device="meta")})))

    linear = LinearLayers([])
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        own = dict(module.named_parameters(recurse=False))
        type_name = type(module).__name__
        router_named = _ROUTER_CLASS.search(type_name) and "ExpertMLP" not in type_name
        router = router_named and getattr(own.get("weight"), "dim", lambda: 0)() == 2
        if router_named and "weight" not in own:  # (a router module around its Linear layer, AFMoE's: listed too, as
            # compressed-tensors counts modules as Linear by their class's name; under a weight name no tensor has)
            linear.weights.append(f"{listed_as(name)}.weight")
            linear.routers.append(linear.weights[-1])
        elif isinstance(module, torch.nn.Linear) or router:
            linear.weights += saved({f"{prefix}weight": own["weight"]})
            if (listed := listed_as(name)) != linear.weights[-1].removesuffix(".weight"):
                linear.listed_as[linear.weights[-1]] = listed
            if router and not isinstance(module, torch.nn.Linear):
                linear.routers.append(linear.weights[-1])
        elif own and all(p.dim() == 3 for p in own.values()):  # fused experts (saved one tensor per expert)
            experts = [_EXPERT.match(n) for n in saved({f"{prefix}{n}": p for n, p in own.items()})]
            if all(experts):  # (not a convolution's kernel, say)
                experts.sort(key=lambda found: (int(found[1]), _EXPERT_ORDER.get(found[2], 3)))
                linear.weights += [found[0] for found in experts]
    return linear
