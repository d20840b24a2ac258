"""`unshard extract-lora FINETUNED BASE OUT --rank R`: a PEFT LoRA adapter from the difference of two models,
computed as mergekit-extract-lora 0.1.5 computes it, from any layout unshard reads.

Per module of the fine-tune's model class (built on the meta device, as mergekit does): a Linear layer's
task vector (fine-tune minus base) is cut to rank R by SVD, B = U√S and A = √S·Vh; an Embedding (with
`embed_lora`) likewise on its transpose, as PEFT's lora_embedding_A/B; the input and output embeddings
(unless `embed_lora`), the modules named in `save_modules` and every other module with a weight (norms)
are saved whole, in modules_to_save. The config is mergekit's: r the largest rank, lora_alpha = r, and
rank_pattern / alpha_pattern where a module's rank is smaller (so every scale is 1).

It is planned and written like a conversion: `ExtractedAdapter` is a Checkpoint whose tensors are the
task vectors (and the saved modules), one module at a time, each a Group whose conversion is the SVD. So
memory is one module's (its two inputs, the task vector and the SVD's factors), not the model's. The
rank of each module is fixed in the plan (mergekit's data-dependent `--sv-epsilon` is not offered), and
the relative reconstruction error ‖Δ - BA‖/‖Δ‖ of each module, which the discarded singular values give,
is recorded as it is computed and listed in README.md.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import dtypes
from ..errors import UnshardError
from ..hub import hub_ids
from ..names import hf_names, model_facts
from ..plan import choose_dtype
from ..sinks.peft_adapter import ADAPTER_WEIGHTS, PeftAdapterFolder
from ..sources import SourceTensor
from ..types import Group, OutputTensor, Plan
from .checkpoint import FromInputs
from .inputs import Input, open_input


@dataclass(frozen=True)
class ExtractionOptions:
    rank: int = 128  # mergekit's --max-rank
    distribute_scale: bool = True  # √S on both factors (False: S on A)
    embed_lora: bool = False  # embeddings as LoRA too, not saved whole
    save_modules: tuple[str, ...] = ()  # saved whole (names or their last part, as modules_to_save)
    include: tuple[str, ...] = ()  # regexes: only these modules are extracted
    exclude: tuple[str, ...] = ()  # regexes: these modules are left out
    skip_undecomposable: bool = False  # leave out modules that are neither Linear nor Embedding
    dtype: str = "auto"  # of the adapter's tensors; auto: the fine-tune's


class ExtractionError(UnshardError, ValueError):
    pass


class ExtractedAdapter(FromInputs):
    """The task vectors of the modules extracted (`deltas`) and the tensors of those saved whole, each read
    from the two inputs (the fine-tune, the base) when the writer asks for it. Set up by `plan_extraction`."""

    deltas: set[str]
    errors: dict[str, tuple[int, float]]  # module -> (rank, relative reconstruction error), as computed

    def read(self, name: str) -> torch.Tensor:
        tuned, base = self.inputs
        return tuned.read(name).float().sub_(base.read(name).float()) if name in self.deltas else tuned.read(name)


def _decompose(
    adapter: ExtractedAdapter, module: str, rank: int, embedding: bool, distribute: bool, names: tuple[str, str]
):
    """The SVD of a module's task vector, cut to `rank`: {A name: A, B name: B}, with its error recorded."""

    def convert(delta: torch.Tensor) -> dict[str, torch.Tensor]:
        u, s, vh = torch.linalg.svd(delta.T if embedding else delta, full_matrices=False)
        if distribute:
            root = s[:rank].sqrt()
            a, b = root[:, None] * vh[:rank], u[:, :rank] * root
        else:
            a, b = s[:rank, None] * vh[:rank], u[:, :rank]
        energy = float(s.double().square().sum())
        kept = float(s[:rank].double().square().sum())
        adapter.errors[module] = (rank, math.sqrt(max(energy - kept, 0.0) / energy) if energy > 0 else 0.0)
        return {names[0]: a, names[1]: b}

    return convert


def _modules(tuned: Input) -> list[tuple[str, str]]:
    """(module name, kind) of every module of the fine-tune's class that holds a weight: "linear",
    "embedding", "input" / "output" (the model's embeddings) or "other"."""
    config = hf_names.read_config(tuned.plan.config_folder)
    model = model_facts.meta_model(tuned.plan.config_folder, config) if config else None
    if model is None:
        raise ExtractionError(
            f"{tuned.reference}: extract-lora needs the model's config.json and its class in "
            "transformers (not custom code), to tell Linear layers from the rest"
        )
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    found = []
    for name, module in model.named_modules():
        if getattr(module, "weight", None) is None or not isinstance(module.weight, torch.Tensor):
            continue
        kind = (
            "input"
            if module is inputs
            else "output"
            if module is outputs
            else "embedding"
            if isinstance(module, torch.nn.Embedding)
            else "linear"
            if isinstance(module, torch.nn.Linear)
            else "other"
        )
        found.append((name, kind))
    return found


def plan_extraction(
    finetuned: str | Path, base: str | Path, options: ExtractionOptions = ExtractionOptions(), *, check: bool = True
) -> Plan:
    """Open both models (metadata only) and plan the adapter: every tensor's name, shape and dtype."""
    if options.rank < 1:
        raise ExtractionError(f"--rank {options.rank}: give a rank of 1 or more")
    for pattern in (*options.include, *options.exclude):
        try:
            re.compile(pattern)
        except re.error as e:
            raise ExtractionError(f"{pattern!r}: not a regular expression ({e})") from None
    here = Path.cwd()
    tuned, original = open_input(str(finetuned), here, check), open_input(str(base), here, check)
    config = hf_names.read_config(tuned.plan.config_folder)
    out_dtype, reason = choose_dtype(options.dtype, config, tuned.plan.checkpoint)
    if options.dtype == "auto" and out_dtype.name not in dtypes.OUTPUT:
        out_dtype, reason = dtypes.OUTPUT["float32"], "the fine-tune's is not a float type"
    reason = reason.replace("config.json", "the fine-tune's config.json")
    adapter = ExtractedAdapter(
        layout="lora-extraction",
        path=Path(str(finetuned)),
        tensors={},
        hf_folder=tuned.plan.config_folder,
        facts={"method": f"extract-lora, rank {options.rank}", "inputs": str(finetuned), "base_model": str(base)},
    )
    adapter.inputs, adapter.deltas, adapter.errors = [tuned, original], set(), {}
    modules = _AdapterModules(adapter, options, out_dtype, str(finetuned), str(base))
    modules.walk(tied={"lm_head"} if (config or {}).get("tie_word_embeddings") else set())
    plan = Plan(
        adapter,
        tuned.plan.config_folder,
        out_dtype,
        reason,
        {ADAPTER_WEIGHTS: modules.groups},
        notes=modules.notes,
        extra_files={"adapter_config.json": modules.adapter_config()},
        sink=PeftAdapterFolder(lambda plan, digests: adapter_card(plan, digests, options)),
        base_models=hub_ids([str(base).partition("+")[0]]),
    )
    plan.copies_per_tensor = 5  # the two inputs, the task vector, the SVD's factors and its work
    return plan


class _AdapterModules:
    """Walks the fine-tune's modules, deciding for each whether it is extracted (a task vector's two
    factors), saved whole (modules_to_save) or left out, and plans the adapter's tensors accordingly."""

    def __init__(
        self, adapter: ExtractedAdapter, options: ExtractionOptions, out_dtype: dtypes.DType, finetuned: str, base: str
    ):
        self.adapter, self.options, self.out_dtype = adapter, options, out_dtype
        self.tuned, self.original = adapter.inputs
        self.finetuned, self.base = finetuned, base
        self.saved_keys = list(options.save_modules)
        self.groups: list[Group] = []
        self.notes: list[str] = []
        self.ranks: dict[str, int] = {}
        self.biases = False

    def walk(self, tied: set[str]) -> None:
        options, covered = self.options, set()
        for module, kind in _modules(self.tuned):
            if f"{module}.weight" not in self.tuned.groups:
                if module not in tied:
                    self.notes.append(
                        f"{module}: a module of the model class whose weight the fine-tune does not hold; left out"
                    )
                continue
            covered |= {f"{module}.weight", f"{module}.bias"}
            key = module.split(".")[-1]
            excluded = any(re.search(p, module) for p in options.exclude)
            embedding = kind in ("input", "output", "embedding")
            vocabulary_changed = embedding and self._shape(self.tuned, f"{module}.weight") != self._shape(
                self.original, f"{module}.weight"
            )
            if (
                (embedding and not options.embed_lora or vocabulary_changed)
                and not excluded
                and key not in self.saved_keys
            ):
                self.saved_keys.append(key)  # (mergekit saves embeddings whole unless asked)
            if module in self.saved_keys or key in self.saved_keys:
                self._save(module)
            elif excluded or (options.include and not any(re.search(p, module) for p in options.include)):
                continue
            elif kind in ("linear", "embedding", "input", "output"):
                self._extract(module, embedding=kind in ("embedding", "input"))  # (the head is a Linear layer)
            elif options.skip_undecomposable:
                self.notes.append(f"{module}: neither Linear nor Embedding; left out (--skip-undecomposable)")
            else:
                self.saved_keys.append(key)  # (as mergekit: saved whole)
                self._save(module)
        groups = self.tuned.groups
        left = sorted(n for n in groups if n not in covered and groups[n].source.dtype.is_floating_point)
        if left:
            self.notes.append(
                f"{len(left)} tensor(s) belong to no module of the model class (e.g. {left[0]}); left out"
            )
        if not self.ranks:
            raise ExtractionError(f"{self.finetuned}: no module left to extract (check --include / --exclude)")
        if self.biases:
            self.notes.append(
                "the biases' differences are written as lora_B.bias, as mergekit writes them; peft "
                "reads them only with lora_bias, which it cannot merge into the layers that have no "
                "bias, so the config leaves it off and peft leaves the bias differences out"
            )

    def adapter_config(self) -> str:
        """mergekit's: r the largest rank, lora_alpha = r, the smaller ranks (and equal alphas) per module."""
        r = max(self.ranks.values())
        smaller = {m: k for m, k in self.ranks.items() if k != r}
        config = {
            "base_model_name_or_path": self.base,
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "use_rslora": False,
            "target_modules": sorted({m.split(".")[-1] for m in self.ranks}),
            "modules_to_save": self.saved_keys,
            "r": r,
            "lora_alpha": r,
            "rank_pattern": smaller,
            "alpha_pattern": smaller,
            "lora_dropout": 0.0,
            "fan_in_fan_out": False,
            "inference_mode": True,
        }
        return json.dumps(config, indent=2) + "\n"

    @staticmethod
    def _shape(item: Input, name: str) -> tuple[int, ...] | None:
        return tuple(found.shape) if (found := item.output(name)) is not None else None

    def _source(self, name: str, whole_shape: tuple[int, ...], delta: bool) -> SourceTensor:
        dtype = dtypes.BY_NAME["float32"] if delta else self.tuned.groups[name].source.dtype
        self.adapter.tensors[name] = SourceTensor(name, whole_shape, dtype, [])
        if delta:
            self.adapter.deltas.add(name)
        return self.adapter.tensors[name]

    def _save(self, module: str) -> None:
        for part in ("weight", "bias"):
            name = f"{module}.{part}"
            if (found := self._shape(self.tuned, name)) is not None:
                self.groups.append(
                    Group(
                        self._source(name, found, False),
                        [OutputTensor(f"base_model.model.{name}", found, self.out_dtype)],
                    )
                )

    def _extract(self, module: str, embedding: bool) -> None:
        weight = f"{module}.weight"
        tuned_shape, base_shape = self._shape(self.tuned, weight), self._shape(self.original, weight)
        if base_shape is None:
            raise ExtractionError(
                f"{self.base}: has no {weight}, which {self.finetuned} has; extract a LoRA "
                "between two models of one architecture"
            )
        if tuned_shape != base_shape:
            raise ExtractionError(
                f"{self.finetuned}: {weight} has shape {tuned_shape}, {self.base} {base_shape}; "
                "only modules of equal shapes are extracted (embeddings of another vocabulary "
                "are saved whole without --embed-lora)"
            )
        rows, columns = (tuned_shape[1], tuned_shape[0]) if embedding else tuned_shape
        rank = self.ranks[module] = min(self.options.rank, rows, columns)
        kind, suffix = ("lora_embedding", "") if embedding else ("lora", ".weight")
        a, b = f"base_model.model.{module}.{kind}_A{suffix}", f"base_model.model.{module}.{kind}_B{suffix}"
        self.groups.append(
            Group(
                self._source(weight, tuned_shape, True),
                [OutputTensor(a, (rank, columns), self.out_dtype), OutputTensor(b, (rows, rank), self.out_dtype)],
                _decompose(self.adapter, module, rank, embedding, self.options.distribute_scale, (a, b)),
            )
        )
        bias = f"{module}.bias"
        if (found := self._shape(self.tuned, bias)) is not None and self._shape(self.original, bias) == found:
            self.groups.append(
                Group(
                    self._source(bias, found, True),
                    [OutputTensor(f"base_model.model.{module}.lora_B.bias", found, self.out_dtype)],
                )
            )
            self.biases = True


def adapter_card(plan: Plan, digests: dict[str, str | None], options: ExtractionOptions) -> str:
    """README.md: the Hub's front matter (library peft, the base), how it was made, each module's error."""
    import yaml

    from ..version import __version__

    facts = plan.checkpoint.facts
    errors = plan.checkpoint.errors
    front = {
        "library_name": "peft",
        **({"base_model": plan.base_models[0]} if plan.base_models else {}),
        "tags": ["unshard", "lora", "extract-lora"],
    }
    worst = max(errors.items(), key=lambda e: e[1][1], default=None)
    lines = [
        "---",
        yaml.safe_dump(front, sort_keys=False).rstrip(),
        "---",
        "",
        "# Extracted LoRA adapter",
        "",
        f"A LoRA adapter extracted by unshard {__version__} from `{facts['inputs']}` on the base "
        f"`{facts['base_model']}`: the SVD of each module's difference, cut to rank {options.rank} "
        f"(mergekit-extract-lora's method). Load it with `PeftModel.from_pretrained(base, this_folder)`.",
        "",
        f"- dtype: {plan.dtype.name} ({plan.dtype_reason})",
    ]
    if worst is not None:
        mean = sum(e for _, e in errors.values()) / len(errors)
        lines.append(
            f"- relative reconstruction error ‖Δ − BA‖/‖Δ‖: mean {mean:.3g} over {len(errors)} modules, "
            f"largest {worst[1][1]:.3g} (`{worst[0]}`)"
        )
    lines += [f"- note: {note}" for note in plan.notes]
    lines += ["", "| module | rank | relative error |", "|---|---|---|"]
    lines += [f"| {module} | {rank} | {error:.3g} |" for module, (rank, error) in sorted(errors.items())]
    lines += ["", "| file | sha256 |", "|---|---|"] + [
        f"| {name} | `{digest or '-'}` |" for name, digest in digests.items()
    ]
    return "\n".join(lines) + "\n"


def summary(plan: Plan) -> list[str]:
    """The lines the command prints once the adapter is written: the errors in short."""
    errors = plan.checkpoint.errors
    if not errors:
        return []
    ordered = sorted(errors.items(), key=lambda e: -e[1][1])
    mean = sum(e for _, e in errors.values()) / len(errors)
    return [
        f"relative reconstruction error: mean {mean:.3g} over {len(errors)} modules; largest "
        + ", ".join(f"{module} {error:.3g}" for module, (_, error) in ordered[:3])
    ]


__all__ = ["ExtractionError", "ExtractionOptions", "plan_extraction", "summary"]
