"""unshard: sharded training checkpoints -> Hugging Face model folders.

import unshard
ckpt = unshard.open_checkpoint("checkpoints/global_step_100/actor")
ckpt.tensors["model.embed_tokens.weight"].shape   # every logical tensor, nothing read yet
ckpt.read("model.embed_tokens.weight")              # one whole tensor, assembled from its shards
unshard.convert("checkpoints/global_step_100/actor", "hf_model")
unshard.merge("recipe.yaml", "merged_model")          # mergekit-style recipe, any readable inputs
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from .errors import (
    CheckpointError,
    ConfigMismatchError,
    OutputExistsError,
    UnsafeCheckpointError,
    UnshardError,
)
from .plan import build_plan
from .sources import Checkpoint, SourceOptions, open_checkpoint
from .types import OutputOptions, Plan
from .version import __version__ as __version__
from .write.threads import Result


def plan(
    src: str | Path,
    *,
    dtype: str = "auto",
    max_shard_size: int | str = "5GB",
    quantize: str | None = None,
    quantize_ignore: tuple[str, ...] = (),
    config_from: str | Path | None = None,
    check: bool = True,
    weights: str = "master",
    tag: str | None = None,
    iteration: int | None = None,
    lora_alpha: float | None = None,
    architecture: str | None = None,
    lora: str = "merge",
    ask_later: bool = False,
    output: OutputOptions | None = None,
    source: SourceOptions | None = None,
) -> Plan:
    """Open SRC and plan its conversion; reads metadata only.

    output: what describes the output, grouped (OutputOptions: dtype, max_shard_size, quantize,
    quantize_ignore, gguf); given, it stands for those keyword arguments. OutputOptions(gguf="q8_0")
    plans one GGUF file for llama.cpp (f32, f16, bf16, q8_0, llama-quantize's q4_0, q4_1, q5_0,
    q5_1, or auto: the converter's default).
    source: what describes the source, grouped (SourceOptions: config_from, weights, tag, iteration,
    lora_alpha, lora, architecture, check); given, it stands for those keyword arguments.

    quantize: a compressed-tensors preset scheme (W4A16, W8A16, W4A16_ASYM, W8A8, FP8_DYNAMIC, FP8_BLOCK,
    NVFP4A16, MXFP4A16, MXFP4, MXFP8A16, MXFP8):
    the Linear weights are written quantized, as llm-compressor writes them, for vLLM.
    quantize_ignore: module names, or `re:` regular expressions, left unquantized besides the defaults
    (lm_head, MoE routers, vision towers).
    weights: for DeepSpeed, "master" (the fp32 optimizer copy) or "module" (the 16-bit model states).
    tag: for DeepSpeed, the tag folder to read instead of the one `latest` names.
    iteration: for Megatron, the iteration to read instead of the one latest_checkpointed_iteration.txt names.
    lora_alpha: for checkpoints holding a LoRA adapter whose alpha is recorded nowhere beside them.
    lora: "merge" folds a LoRA adapter into the base weights; "separate" writes the base as trained
    and the adapter as a PEFT folder in OUT/lora_adapter/.
    architecture: the transformers class config.json names (by default the one the weights fit).
    ask_later: for a conversion about to run: a config transformers has not answered for before (which
    names and shapes its model has) is answered on a thread while `convert` writes (or, with several
    writers, before they start), rather than now; the plan keeps the names as saved until then.
    """
    output = output or OutputOptions(dtype, max_shard_size, quantize, tuple(quantize_ignore))
    source = source or SourceOptions(
        config_from=config_from,
        weights=weights,
        tag=tag,
        iteration=iteration,
        lora_alpha=lora_alpha,
        lora=lora,
        architecture=architecture,
        check=check,
    )
    return build_plan(open_checkpoint(src, **source.reader_options()), output, source, ask_later=ask_later)


def convert(
    src: str | Path,
    out: str | Path,
    *,
    dtype: str = "auto",
    max_shard_size: int | str = "5GB",
    quantize: str | None = None,
    quantize_ignore: tuple[str, ...] = (),
    config_from: str | Path | None = None,
    overwrite: bool = False,
    threads: int = 1,
    verify: bool = False,
    check: bool = True,
    progress: bool | None = None,
    weights: str = "master",
    tag: str | None = None,
    iteration: int | None = None,
    lora_alpha: float | None = None,
    architecture: str | None = None,
    workers: int = 1,
    distributed: bool = False,
    lora: str = "merge",
    checksums: bool = False,
    sync: bool = True,
    output: OutputOptions | None = None,
    source: SourceOptions | None = None,
) -> Result:
    """Convert the checkpoint at SRC into a Hugging Face folder OUT (or, for an OUT ending in .gguf, one
    GGUF file of llama.cpp's default type, and a vision model's mmproj-OUT beside it;
    `output=OutputOptions(gguf=TYPE)` chooses another type; `output=OutputOptions(to="dcp", names="torchtitan")`
    writes a torch.distributed.checkpoint folder a trainer loads, `to="megatron"` Megatron-LM's, and
    `to="fsdp", world_size=N` verl's FSDP rank files).

    workers: processes on this host sharing the output files. distributed: this process is one rank
    of a torchrun job; every rank calls convert with the same arguments (OUT on a shared filesystem).
    checksums: list each file's sha256 in OUT/README.md (costs about a second per GB).
    sync: every file flushed to the disk before OUT is put in place (False, for scratch outputs, skips it).
    """
    output = _for(out, output or OutputOptions(dtype, max_shard_size, quantize, tuple(quantize_ignore)))
    source = source or SourceOptions(
        config_from=config_from,
        weights=weights,
        tag=tag,
        iteration=iteration,
        lora_alpha=lora_alpha,
        lora=lora,
        architecture=architecture,
        check=check,
    )
    return _written(
        plan(src, ask_later=True, output=output, source=source),
        out,
        overwrite=overwrite,
        threads=threads,
        verify=verify,
        checksums=checksums,
        progress=progress,
        workers=workers,
        distributed=distributed,
        sync=sync,
    )


def merge(
    recipe: str | Path,
    out: str | Path,
    *,
    dtype: str = "auto",
    max_shard_size: int | str = "5GB",
    quantize: str | None = None,
    quantize_ignore: tuple[str, ...] = (),
    seed: int = 0,
    overwrite: bool = False,
    threads: int = 1,
    verify: bool = False,
    progress: bool | None = None,
    workers: int = 1,
    distributed: bool = False,
    checksums: bool = False,
    output: OutputOptions | None = None,
) -> Result:
    """Merge the models a mergekit-style YAML recipe names into one Hugging Face folder OUT (or GGUF file,
    as for `convert`)."""
    from .merging import plan_merge, recipe_files

    output = _for(out, output or OutputOptions(dtype, max_shard_size, quantize, tuple(quantize_ignore)))
    the_plan = plan_merge(recipe, output, seed=seed)
    return _written(
        the_plan,
        out,
        overwrite=overwrite,
        threads=threads,
        verify=verify,
        checksums=checksums,
        progress=progress,
        extra_files=recipe_files(the_plan),
        workers=workers,
        distributed=distributed,
    )


def extract_lora(
    finetuned: str | Path,
    base: str | Path,
    out: str | Path,
    *,
    rank: int = 128,
    overwrite: bool = False,
    threads: int = 1,
    verify: bool = False,
    progress: bool | None = None,
    **options: Any,
) -> Result:
    """A PEFT LoRA adapter folder OUT from the difference FINETUNED - BASE (any layouts unshard reads), as
    mergekit-extract-lora computes it; further `options` are ExtractionOptions' fields. The relative
    reconstruction error of each module is in OUT/README.md."""
    from .merging.extract_lora import ExtractionOptions, plan_extraction

    the_plan = plan_extraction(finetuned, base, ExtractionOptions(rank=rank, **options))
    return _written(the_plan, out, overwrite=overwrite, threads=threads, verify=verify, progress=progress)


def merge_moe(
    recipe: str | Path,
    out: str | Path,
    *,
    seed: int = 0,
    allow_same: bool = False,
    output: OutputOptions | None = None,
    overwrite: bool = False,
    threads: int = 1,
    verify: bool = False,
    progress: bool | None = None,
    checksums: bool = False,
) -> Result:
    """Assemble the mixture of experts a mergekit-moe YAML recipe describes (Mixtral, Qwen MoE or Qwen3 MoE) from
    dense models of any layout unshard reads, into a Hugging Face folder OUT (or GGUF file, as for `convert`).
    seed: of gate_mode random / uniform_random and of noise_scale."""
    from .merging.moe import moe_files, plan_moe

    the_plan = plan_moe(recipe, _for(out, output or OutputOptions()), seed=seed, allow_same=allow_same)
    return _written(
        the_plan,
        out,
        overwrite=overwrite,
        threads=threads,
        verify=verify,
        checksums=checksums,
        progress=progress,
        extra_files=moe_files(the_plan),
    )


def merge_search(
    space: str | Path,
    out: str | Path,
    eval_file: str | Path,
    *,
    trials: int = 20,
    seed: int = 0,
    device: str = "auto",
    study: str | Path | None = None,
    output: OutputOptions | None = None,
    overwrite: bool = False,
    threads: int = 1,
    progress: bool | None = None,
) -> Result:
    """Search the merge recipes SPACE allows (ranges {min, max}, choices {choice: [...]}, a list of
    merge_method) for the lowest loss per token on EVAL_FILE (text, or JSONL of prompt and completion), with
    Optuna's TPE, the study kept in STUDY (default OUT.study.db, continued if it exists); write the best merge to
    OUT with its recipe and the leaderboard."""
    from .merging.search import SearchOptions, search_and_write

    options = SearchOptions(Path(eval_file), trials, seed, device, Path(study) if study else None)
    return search_and_write(space, out, options, output or OutputOptions(), overwrite, threads, progress)[0]


def _written(the_plan: Plan, out: str | Path, **options: Any) -> Result:
    """The plan written to OUT (write.execute.convert's options), its checkpoint's files closed after."""
    from .write.execute import convert as run

    try:
        return run(the_plan, out, **options)
    finally:
        the_plan.checkpoint.close()


def _for(out: str | Path, output: OutputOptions) -> OutputOptions:
    """An OUT ending in .gguf is one GGUF file, of llama.cpp's default type unless one is asked for."""
    if str(out).endswith(".gguf") and not output.gguf:
        return replace(output, gguf="auto")
    return output


def push_to_hub(
    out: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    progress: bool | None = None,
) -> str:
    """Upload a finished OUT (a folder, or one GGUF file) to the Hub model repository REPO_ID, created if
    needed, in one commit; the commit's URL. A missing token, no network or a refused push raises
    PushFailedError (a ConnectionError), and OUT stays as it is."""
    from .hub import HubTarget, push

    return push(out, HubTarget(repo_id, private, revision, commit_message), progress)


def inspect(src: str | Path, **plan_options: Any) -> dict[str, Any]:
    """What unshard found at SRC and what a conversion would write, as plain data."""
    from .report import describe

    return describe(plan(src, **plan_options))


__all__ = [
    "Checkpoint",
    "CheckpointError",
    "ConfigMismatchError",
    "OutputExistsError",
    "OutputOptions",
    "Plan",
    "Result",
    "SourceOptions",
    "UnsafeCheckpointError",
    "UnshardError",
    "convert",
    "extract_lora",
    "inspect",
    "merge",
    "merge_moe",
    "merge_search",
    "open_checkpoint",
    "plan",
    "push_to_hub",
]
