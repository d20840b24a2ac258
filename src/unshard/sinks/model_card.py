"""README.md of an output folder: the front matter the Hub reads (library, base models, tags, pipeline), where the
weights came from, how they were written (the output format adds its own lines: types.Sink.card), and its files."""

from __future__ import annotations

from typing import Any

from ..names.hf_names import read_config
from ..types import Plan
from ..version import __version__

# What a model's class says it does, in the Hub's pipeline names (the card's pipeline_tag).
PIPELINES = (
    ("ForCausalLM", "text-generation"),
    ("ForConditionalGeneration", "image-text-to-text"),
    ("ForImageTextToText", "image-text-to-text"),
    ("ForTokenClassification", "token-classification"),
    ("ForSequenceClassification", "text-classification"),
)


def front_matter(plan: Plan) -> list[str]:
    """The YAML block that opens README.md, which the Hub reads: library, base models, tags, pipeline."""
    import yaml

    config = {**({} if plan.checkpoint.config_whole else read_config(plan.config_folder) or {}), **plan.config_updates}
    merged = plan.checkpoint.layout in ("merge", "moe")
    data: dict[str, Any] = {"library_name": "transformers"}
    if plan.base_models:
        data["base_model"] = plan.base_models if merged or len(plan.base_models) > 1 else plan.base_models[0]
    tags = (
        ["unshard"] + (["mergekit", "merge"] if merged else []) + (["moe"] if plan.checkpoint.layout == "moe" else [])
    )
    data["tags"] = tags + plan.sink.card()[0]
    architecture = (config.get("architectures") or [""])[0]
    for ending, pipeline in PIPELINES:
        if architecture.endswith(ending):
            data["pipeline_tag"] = pipeline
            break
    return ["---", yaml.safe_dump(data, sort_keys=False).rstrip(), "---", ""]


def model_card(plan: Plan, checksums: dict[str, str | None], intro: str | None = None) -> str:
    """README.md for OUT: where the weights came from, how they were written, its files (and their
    sha256, when computed)."""
    ckpt = plan.checkpoint
    source = ckpt.facts.get("url") or ckpt.path  # (a checkpoint read from object storage: its URL)
    lines = front_matter(plan)
    if intro is None:
        lines += [
            "# Converted model",
            "",
            f"Converted with unshard {__version__} from `{source}` (layout `{ckpt.layout}`).",
            "",
        ]
        for key in ("world_size", "parallel", "zero_stage", "format", "iteration", "architecture", "naming"):
            if ckpt.facts.get(key) is not None:
                lines.append(f"- {key.replace('_', ' ')}: {ckpt.facts[key]}")
    else:
        lines += [intro.rstrip(), "", f"Written by unshard {__version__}."]
    lines += [f"- dtype: {plan.dtype.name} ({plan.dtype_reason})"]
    lines += plan.sink.card()[1]
    lines += [f"- note: {note}" for note in plan.notes]
    sizes = {name: sum(g.nbytes for g in groups) for name, groups in plan.files.items()}
    if any(digest is not None for digest in checksums.values()):
        lines += ["", "| file | bytes of tensors | sha256 |", "|---|---|---|"]
        lines += [f"| {name} | {sizes[name]} | `{digest}` |" for name, digest in checksums.items()]
    else:
        lines += ["", "| file | bytes of tensors |", "|---|---|"]
        lines += [f"| {name} | {sizes[name]} |" for name in checksums]
    return "\n".join(lines) + "\n"
