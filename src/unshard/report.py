"""What `unshard inspect` and `--dry-run` print: the checkpoint's facts and the plan, as data and text."""

from __future__ import annotations

from collections import Counter
from typing import Any

from .plan import Plan
from .sinks.compressed_tensors import ROUTER


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def describe(plan: Plan) -> dict[str, Any]:
    ckpt = plan.checkpoint
    dtypes = Counter(t.dtype.name for t in ckpt.tensors.values())
    return {
        "source": str(ckpt.path),
        "layout": ckpt.layout,
        **ckpt.facts,
        "huggingface_folder": str(ckpt.hf_folder) if ckpt.hf_folder else None,
        "tensors": len(ckpt.tensors),
        "parameters": sum(t.numel for t in ckpt.tensors.values()),
        "dtypes": dict(dtypes),
        "bytes": sum(t.nbytes for t in ckpt.tensors.values()),
        "output": plan.summary(),
        "peak_memory_estimate": plan.peak_memory_estimate(threads=2),
    }


def as_text(info: dict[str, Any]) -> str:
    out = info["output"]
    lines = [f"source       {info['source']}", f"layout       {info['layout']}"]
    for key in ("method", "inputs", "seed", "format", "iteration", "architecture", "zero_stage", "weights", "epoch",
                "step", "experts", "optimizer_files", "world_size", "ranks", "naming", "fsdp_version", "files", "chunks",
                "base_model"):
        if info.get(key) is not None:
            lines.append(f"  {key.replace('_', ' '):<15s} {info[key]}")
    if info.get("parallel"):
        lines.append("  parallel        " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in info["parallel"].items()))
    if info.get("padded_vocab_size"):
        lines.append(f"  vocabulary      {info['vocab_size']} (padded to {info['padded_vocab_size']} in the checkpoint)")
    if info.get("fsdp_config_json") is False:
        lines.append("  (no fsdp_config.json: world size taken from the file names)")
    for how, count in info.get("sharding", {}).items():
        lines.append(f"  sharding   {count:4d} x {how}")
    for what, count in info.get("skipped", {}).items():
        lines.append(f"  skipped    {count:4d} {what}")
    lines += [
        f"hf files     {out['config_from'] or info['huggingface_folder'] or 'none (pass --config-from DIR)'}"
        if not info.get("config") else f"hf files     none; {info['config']}",
        f"tensors      {info['tensors']}, {info['parameters']:,} parameters, "
        + ", ".join(f"{n} {d}" for d, n in info["dtypes"].items()) + f", {human_bytes(info['bytes'])}",
        f"will write   {out['tensors']} tensors in {out['dtype']} ({out['dtype_reason']}), {human_bytes(out['bytes'])} "
        f"in {len(out['files'])} file(s)",
    ]
    lines += _output_format_lines(out)
    for name, size in out["files"].items():
        lines.append(f"  {name}  {human_bytes(size)}")
    for why, count in Counter(out["dropped"].values()).items():
        example = next(name for name, reason in out["dropped"].items() if reason == why)
        lines.append(f"  skipped {count} tensor(s): {why} (e.g. {example})")
    for note in out["notes"]:
        lines.append(f"note         {note}")
    lines.append(f"peak memory  about {human_bytes(info['peak_memory_estimate'])} of tensors with the default "
                 "2 threads, plus the Python process itself (about 30 MB; 0.25-0.4 GB where torch is needed: "
                 "the first conversion of a model outside the common dense families, merges, rarer casts)")
    return "\n".join(lines)


def _output_format_lines(out: dict[str, Any]) -> list[str]:
    if out.get("gguf"):
        gguf, mmproj = out["gguf"], out["gguf"].get("mmproj")
        lines = [f"gguf         one file for llama.cpp ({gguf['architecture']}), type {gguf['type']}: "
                 + ", ".join(f"{n} tensor(s) in {t}" for t, n in gguf["tensor_types"].items()),
                 f"vocabulary   {gguf['vocabulary']}"]
        if mmproj:
            lines.append(f"mmproj       the vision part, for llama.cpp's multimodal library, in a second file beside OUT "
                         f"(mmproj-OUT), type {mmproj['type']}: "
                         + ", ".join(f"{n} tensor(s) in {t}" for t, n in mmproj["tensor_types"].items()))
        return lines
    quantize = out.get("quantize")
    if not quantize:
        return []
    lines = [f"quantize     {quantize['scheme']} (compressed-tensors {quantize['format']}): {quantize['quantized']} Linear "
             f"weights, {human_bytes(quantize['bytes_as_is'])} unquantized; other tensors as they are"]
    if quantize.get("surveyed"):
        lines.append("  read twice: a first pass finds each weight's largest magnitude (its global scale, shared by fused "
                     "siblings) before any is written")
    by_pattern: dict[str, list[str]] = {}
    for module, pattern in quantize["ignored"].items():
        by_pattern.setdefault(pattern, []).append(module)
    for pattern, modules in by_pattern.items():
        why = "that are MoE routers" if pattern == ROUTER else f"matching {pattern}"
        lines.append(f"  left as they are: {len(modules)} Linear layer(s) {why} (e.g. {modules[0]})")
    return lines


# What a model's class says it does, in the Hub's pipeline names (the card's pipeline_tag).
PIPELINES = (("ForCausalLM", "text-generation"), ("ForConditionalGeneration", "image-text-to-text"),
             ("ForImageTextToText", "image-text-to-text"), ("ForTokenClassification", "token-classification"),
             ("ForSequenceClassification", "text-classification"))


def front_matter(plan: Plan) -> list[str]:
    """The YAML block that opens README.md, which the Hub reads: library, base models, tags, pipeline."""
    import yaml

    from .names.hf_names import read_config

    config = {**({} if plan.checkpoint.config_whole else read_config(plan.config_folder) or {}), **plan.config_updates}
    merged = plan.checkpoint.layout in ("merge", "moe")
    data: dict[str, Any] = {"library_name": "transformers"}
    if plan.base_models:
        data["base_model"] = plan.base_models if merged or len(plan.base_models) > 1 else plan.base_models[0]
    tags = ["unshard"] + (["mergekit", "merge"] if merged else []) + (["moe"] if plan.checkpoint.layout == "moe" else [])
    if plan.quantization is not None:
        tags += ["compressed-tensors", plan.quantization.scheme.name.lower()]
    data["tags"] = tags
    architecture = (config.get("architectures") or [""])[0]
    for ending, pipeline in PIPELINES:
        if architecture.endswith(ending):
            data["pipeline_tag"] = pipeline
            break
    return ["---", yaml.safe_dump(data, sort_keys=False).rstrip(), "---", ""]


def model_card(plan: Plan, checksums: dict[str, str | None], intro: str | None = None) -> str:
    """README.md for OUT: where the weights came from, how they were written, its files (and their
    sha256, when computed)."""
    from . import __version__

    ckpt = plan.checkpoint
    lines = front_matter(plan)
    if intro is None:
        lines += ["# Converted model", "", f"Converted with unshard {__version__} from `{ckpt.path}` "
                 f"(layout `{ckpt.layout}`).", ""]
        for key in ("world_size", "parallel", "zero_stage", "format", "iteration", "architecture", "naming"):
            if ckpt.facts.get(key) is not None:
                lines.append(f"- {key.replace('_', ' ')}: {ckpt.facts[key]}")
    else:
        lines += [intro.rstrip(), "", f"Written by unshard {__version__}."]
    lines += [f"- dtype: {plan.dtype.name} ({plan.dtype_reason})"]
    if plan.quantization is not None:
        scheme = plan.quantization.scheme
        lines += [f"- quantized: {scheme.name} (compressed-tensors `{scheme.format}`, round to nearest, no calibration "
                  f"data), {len(plan.quantization.encoded)} Linear weights; left as they are: "
                  + (", ".join(f"`{m}`" for m in plan.quantization.ignored) or "none")]
    lines += [f"- note: {note}" for note in plan.notes]
    sizes = {name: sum(g.nbytes for g in groups) for name, groups in plan.files.items()}
    if any(digest is not None for digest in checksums.values()):
        lines += ["", "| file | bytes of tensors | sha256 |", "|---|---|---|"]
        lines += [f"| {name} | {sizes[name]} | `{digest}` |" for name, digest in checksums.items()]
    else:
        lines += ["", "| file | bytes of tensors |", "|---|---|"]
        lines += [f"| {name} | {sizes[name]} |" for name in checksums]
    return "\n".join(lines) + "\n"
