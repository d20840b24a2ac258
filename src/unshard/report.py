"""What `unshard inspect` and `--dry-run` print: the checkpoint's facts and the plan, as data and text."""

from __future__ import annotations

from collections import Counter
from typing import Any

from . import families, sinks
from .names.hf_names import read_config
from .names.model_facts import built_by_transformers
from .types import Plan
from .units import human_bytes


def describe(plan: Plan) -> dict[str, Any]:
    ckpt = plan.checkpoint
    dtypes = Counter(t.dtype.name for t in ckpt.tensors.values())
    return {
        "source": ckpt.facts.get("url") or str(ckpt.path),
        "layout": ckpt.layout,
        **ckpt.facts,
        "family": family_paths(_model_type({**(read_config(plan.config_folder) or {}), **plan.config_updates})),
        "huggingface_folder": str(ckpt.hf_folder) if ckpt.hf_folder else None,
        "tensors": len(ckpt.tensors),
        "parameters": sum(t.numel for t in ckpt.tensors.values()),
        "dtypes": dict(dtypes),
        "bytes": sum(t.nbytes for t in ckpt.tensors.values()),
        "output": plan.summary(),
        "peak_memory_estimate": plan.peak_memory_estimate(threads=2),
    }


def _model_type(config: dict[str, Any]) -> str | None:
    """The config's model type; for a config without one (speculators' drafters') or of a model transformers' class
    of it is not (SpecForge's drafters, saved under their target's model type), that of its class's family."""
    family = families.by_architecture((config.get("architectures") or [None])[0] or "")
    if family and (not config.get("model_type") or not built_by_transformers(config)):
        return family.model_type
    return config.get("model_type")


def family_paths(model_type: str | None) -> dict[str, Any] | None:
    """The family of the model's config as the registry knows it: its name and, for each path of `unshard
    families`, "yes" (or "yes: " and what to know) or why not; None for a config without a model type."""
    if model_type is None:
        return None
    row = next((r for r in families.matrix() if r["model_type"] == model_type), None)
    if row is None:
        return {"name": None, "model_type": model_type}
    return {"name": row["family"], "model_type": model_type, "paths": {p: row[p] for p in families.PATHS}}


def _family_lines(family: dict[str, Any] | None) -> list[str]:
    if family is None:
        return []
    if family["name"] is None:
        return [
            f"family       {family['model_type']}: not in unshard's registry; converts where transformers knows it "
            "(rank files, DCP, DeepSpeed, --quantize); Megatron, torchtitan's names, GGUF and merge-moe refuse it"
        ]
    said = {p: v for p, v in family["paths"].items() if not v.startswith("n/a")}
    heading = {p: families.PATHS[p][0] for p in said}
    lines = [f"family       {family['name']} ({family['model_type']})"]
    lines.append("  yes             " + ", ".join(heading[p] for p, v in said.items() if v.startswith("yes")))
    if no := [heading[p] for p, v in said.items() if not v.startswith("yes")]:
        lines.append("  not yet         " + ", ".join(no) + " (`unshard families` says why)")
    return lines


def as_text(info: dict[str, Any]) -> str:
    out = info["output"]
    lines = [f"source       {info['source']}", f"layout       {info['layout']}"]
    for key in (
        "method",
        "inputs",
        "seed",
        "format",
        "iteration",
        "architecture",
        "zero_stage",
        "weights",
        "epoch",
        "step",
        "experts",
        "optimizer_files",
        "world_size",
        "ranks",
        "naming",
        "fsdp_version",
        "files",
        "chunks",
        "base_model",
        "dequantized",
        "remote",
    ):
        if info.get(key) is not None:
            lines.append(f"  {key.replace('_', ' '):<15s} {info[key]}")
    if info.get("parallel"):
        lines.append(
            "  parallel        " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in info["parallel"].items())
        )
    if info.get("padded_vocab_size"):
        lines.append(
            f"  vocabulary      {info['vocab_size']} (padded to {info['padded_vocab_size']} in the checkpoint)"
        )
    if info.get("fsdp_config_json") is False:
        lines.append("  (no fsdp_config.json: world size taken from the file names)")
    for how, count in info.get("sharding", {}).items():
        lines.append(f"  sharding   {count:4d} x {how}")
    for what, count in info.get("skipped", {}).items():
        lines.append(f"  skipped    {count:4d} {what}")
    lines += _family_lines(info.get("family"))
    lines += [
        f"hf files     {out['config_from'] or info['huggingface_folder'] or 'none (pass --config-from DIR)'}"
        if not info.get("config")
        else f"hf files     none; {info['config']}",
        f"tensors      {info['tensors']}, {info['parameters']:,} parameters, "
        + ", ".join(f"{n} {d}" for d, n in info["dtypes"].items())
        + f", {human_bytes(info['bytes'])}",
        f"will write   {out['tensors']} tensors in {out['dtype']} ({out['dtype_reason']}), {human_bytes(out['bytes'])} "
        f"in {len(out['files'])} file(s)",
    ]
    lines += sinks.summary_lines(out)
    for name, size in out["files"].items():
        lines.append(f"  {name}  {human_bytes(size)}")
    for why, count in Counter(out["dropped"].values()).items():
        example = next(name for name, reason in out["dropped"].items() if reason == why)
        lines.append(f"  skipped {count} tensor(s): {why} (e.g. {example})")
    for note in out["notes"]:
        lines.append(f"note         {note}")
    lines.append(
        f"peak memory  about {human_bytes(info['peak_memory_estimate'])} of tensors with the default "
        "2 threads, plus the Python process itself (about 30 MB; 0.25-0.4 GB where torch is needed: "
        "the first conversion of a model outside the common dense families, merges, rarer casts)"
    )
    return "\n".join(lines)


def families_table(rows: list[dict[str, Any]], paths: dict[str, tuple[str, Any]]) -> str:
    """`unshard families`: the matrix as a table of yes and no, then each no's reason (and each yes's note)."""
    headings = ["family", "model_type", *(heading for heading, _ in paths.values())]

    def cell(value: str) -> str:
        return "-" if value.startswith("n/a: ") else "yes*" if value.startswith("yes: ") else "no"

    cells = [
        [row["family"], row["model_type"], *("yes" if row[p] == "yes" else cell(row[p]) for p in paths)] for row in rows
    ]
    widths = [max(len(line[i]) for line in [headings, *cells]) for i in range(len(headings))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in [headings, *cells]]
    lines += [
        "",
        "no: why not; yes*: how; -: the family has no such part (a text model's mmproj, a dense model as a "
        "merge-moe output)",
    ]
    for row in rows:
        said: dict[str, list[str]] = {}  # reason -> the paths it is given for
        for path, (heading, _) in paths.items():
            if row[path] != "yes" and not row[path].startswith("n/a: "):
                said.setdefault(row[path].removeprefix("yes: "), []).append(heading)
        lines += [f"  {row['family']}, {' and '.join(headings)}: {reason}" for reason, headings in said.items()]
    lines += [
        "",
        "A family not listed still converts wherever transformers knows it: FSDP/DCP/DeepSpeed rank files "
        "and --quantize.",
    ]
    return "\n".join(lines)
