"""One handler per command (COMMANDS). The commands that write a plan share one flow, `_write`: --dry-run prints
the plan; otherwise the output dtype and the notes, the writing, the report (and the upload)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from .. import verl_command
from ..errors import UnshardError


def _output(args, out: str):
    from ..types import OutputOptions

    gguf = args.gguf_type or ("auto" if str(out).endswith(".gguf") else None)
    return OutputOptions(
        args.dtype,
        args.max_shard_size,
        args.quantize,
        tuple(args.quantize_ignore),
        gguf,
        gguf_split=args.gguf_split_max_size,
        target_from=args.target_from,
        to=args.to,
        names=args.names,
        tp=args.tp,
        pp=args.pp,
        vpp=args.vpp,
        ep=args.ep,
        etp=args.etp,
        vocab_divisible=args.make_vocab_size_divisible_by,
        world_size=args.world_size,
        fsdp_size=args.fsdp_size,
        mesh_device=args.mesh_device,
    )


def _source(args):
    from ..sources import SourceOptions

    return SourceOptions(
        config_from=args.config_from,
        weights=args.weights,
        tag=args.tag,
        iteration=args.iteration,
        lora_alpha=args.lora_alpha,
        lora=args.lora,
        architecture=args.architecture,
        check=args.check,
    )


def _sharing_notes(args, plan) -> list[str]:
    """Work is shared by output file: more writers than files leaves some idle."""
    writers = int(os.environ.get("WORLD_SIZE", 1)) if args.distributed else getattr(args, "workers", 1)
    if writers > len(plan.files):
        return [
            f"{writers} writers but {len(plan.files)} output file(s): only {len(plan.files)} will work; "
            "lower --max-shard-size for more files"
        ]
    return []


def _speaks(args) -> bool:
    """In a distributed run, rank 0 speaks for all (torchrun sets RANK)."""
    return not args.distributed or os.environ.get("RANK", "0") == "0"


def _write(
    args,
    plan,
    out,
    notes: Iterable[str] = (),
    extra_files: dict[str, str] | None = None,
    said_after: Callable[[], Iterable[str]] = tuple,
) -> int:
    """The flow of every command that writes a plan: --dry-run prints it and writes nothing; otherwise the output
    dtype and `notes` (and the writers' sharing of the files), the writing into OUT, what `said_after` says of it,
    and the report (and the upload)."""
    from ..report import as_text, describe
    from ..write.execute import convert

    try:
        if getattr(args, "dry_run", False):
            print(as_text(describe(plan)))
            return 0
        if _speaks(args):
            print(f"output dtype {plan.dtype.name} ({plan.dtype_reason})", file=sys.stderr)
            for note in [*notes, *_sharing_notes(args, plan)]:
                print(f"note: {note}", file=sys.stderr)
        result = convert(
            plan,
            out,
            overwrite=args.overwrite,
            threads=args.threads,
            verify=args.verify,
            checksums=getattr(args, "checksums", False),
            progress=args.progress,
            extra_files=extra_files,
            workers=getattr(args, "workers", 1),
            distributed=args.distributed,
            sync=args.sync,
        )
    finally:
        plan.checkpoint.close()
    for line in said_after():
        print(line, file=sys.stderr)
    places = getattr(plan.sink, "places", None)  # (an output of files: each one's place, OUT's last)
    _report(args, result, list(places(Path(out)).values()) if places else [])
    return 0


def _report(args, result, files: list[Path] | tuple = ()) -> None:
    if not _speaks(args):
        return
    if files and files[-1] != Path(result.out):  # (a split GGUF file: its first file, which llama.cpp loads)
        result = dataclasses.replace(result, out=files[-1])
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(result.line() + (", verified" if args.verify else ""))
    if args.push_to_hub:
        from ..hub import HubTarget, push

        target = HubTarget(args.push_to_hub, args.private, args.revision, args.commit_message)
        url = push(result.out, target, args.progress, files)
        print(f"pushed {', '.join(map(str, files)) if len(files) > 1 else result.out} to {url}")


def convert(args) -> int:
    import unshard

    if args.all_steps or args.steps:
        return _convert_steps(args)
    from ..plan import require_config

    plan = unshard.plan(args.src, output=_output(args, args.out), source=_source(args), ask_later=not args.dry_run)
    if not args.dry_run:
        require_config(plan)  # (before anything is said of the writing)
    return _write(args, plan, args.out, notes=plan.notes)


def _convert_steps(args) -> int:
    """--all-steps / --steps: each step of the run at SRC into OUT/step_N, those already there skipped (an OUT
    appears only when whole, so a run stopped half-way resumes where it stopped), under one progress bar; with
    --push-to-hub each on its own branch, step-N."""
    from dataclasses import replace

    from tqdm import tqdm

    import unshard

    from ..plan import require_config
    from ..sources.remote import is_url
    from ..sources.steps import chosen, find_steps

    if args.distributed or args.workers > 1:
        raise UnshardError("--all-steps and --steps convert one step after another: drop --workers and --distributed")
    if is_url(args.src):
        raise UnshardError(f"{args.src}: --all-steps and --steps read a run on a local disk; convert each step's URL")
    run, root = find_steps(Path(args.src)), Path(args.out)
    wanted = chosen(run, args.steps, Path(args.src))
    todo = [step for step in wanted if args.overwrite or not (root / f"step_{step}").exists()]
    if len(todo) < len(wanted):
        print(f"note: {len(wanted) - len(todo)} step(s) already in {root}: skipped", file=sys.stderr)
    each = replace_args(args, progress=False)
    with tqdm(
        total=len(wanted),
        initial=len(wanted) - len(todo),
        unit="step",
        desc="steps",
        disable=None if args.progress is None else not args.progress,
    ) as bar:
        for step in todo:
            path, options = run[step]
            source = replace(_source(args), **options)
            plan = unshard.plan(path, output=_output(args, ""), source=source, ask_later=not args.dry_run)
            if not args.dry_run:
                require_config(plan)
            revision = args.revision or (f"step-{step}" if args.push_to_hub else None)
            _write(replace_args(each, revision=revision), plan, root / f"step_{step}", notes=plan.notes)
            bar.update(1)
    return 0


def replace_args(args, **changes):
    """A copy of the parsed arguments with these changed."""
    import argparse

    return argparse.Namespace(**{**vars(args), **changes})


def inspect(args) -> int:
    import unshard

    from ..report import as_text

    info = unshard.inspect(args.src, output=_output(args, ""), source=_source(args))
    print(json.dumps(info, indent=2, default=str) if args.json else as_text(info))
    return 0


def families(args) -> int:
    from .. import families
    from ..report import families_table

    rows = families.matrix()
    print(json.dumps(rows, indent=2) if args.json else families_table(rows, families.PATHS))
    return 0


def merge(args) -> int:
    from ..merging import plan_merge, recipe_files

    plan = plan_merge(args.recipe, _output(args, args.out), seed=args.seed)
    return _write(args, plan, args.out, extra_files=recipe_files(plan))


def merge_moe(args) -> int:
    from ..merging.moe import moe_files, plan_moe

    plan = plan_moe(args.recipe, _output(args, args.out), seed=args.seed, allow_same=args.allow_same)
    warnings = lambda: (f"warning: {warning}" for warning in plan.checkpoint.warnings)  # noqa: E731
    return _write(args, plan, args.out, notes=plan.notes, extra_files=moe_files(plan), said_after=warnings)


def extract_lora(args) -> int:
    from ..merging.extract_lora import ExtractionOptions, plan_extraction, summary

    options = ExtractionOptions(
        args.rank,
        args.distribute_scale,
        args.embed_lora,
        tuple(args.save_modules),
        tuple(args.include),
        tuple(args.exclude),
        args.skip_undecomposable,
        args.dtype,
    )
    plan = plan_extraction(args.finetuned, args.base, options)
    return _write(args, plan, args.out, notes=plan.notes, said_after=lambda: summary(plan))


def merge_search(args) -> int:
    from ..merging.search import SearchOptions, leaderboard, prepare, search_and_write
    from ..types import OutputOptions
    from ..units import human_bytes

    if args.trials < 1:
        raise UnshardError(f"--trials {args.trials}: run at least one trial")
    options = SearchOptions(
        Path(args.eval), args.trials, args.seed, args.device, Path(args.study) if args.study else None
    )
    output = OutputOptions(args.dtype, args.max_shard_size)
    if args.dry_run:
        prepared = prepare(args.space, options, output)
        print(f"space        {args.space}: {len(prepared.space.dimensions)} dimension(s)")
        for dimension in prepared.space.dimensions:
            print(f"  {dimension.describe()}, trial 0: {dimension.default}")
        print(
            f"eval         {args.eval}: {len(prepared.evaluation.batches)} batch(es), {prepared.evaluation.tokens} "
            "tokens scored"
        )
        print(f"trials       {args.trials} on {prepared.device}, each merging in memory")
        print(
            f"peak memory  about {human_bytes(prepared.bound)} per trial (the merged model in fp32, the merge's "
            "working set, the logits of a batch), plus the Python process"
        )
        return 0
    result, study = search_and_write(
        args.space, args.out, options, output, args.overwrite, args.threads, args.progress, args.sync
    )
    rows = leaderboard(study)
    first = next((t.value for t in study.trials if t.number == 0), None)
    print(
        f"best loss {rows[0]['loss']:.4f} (trial {rows[0]['trial']} of {len(study.trials)})"
        + (f"; untuned recipe (trial 0) {first:.4f}" if first is not None else ""),
        file=sys.stderr,
    )
    _report(args, result)
    return 0


def verl(args) -> int:
    """verl's merger command line: the same meaning, unshard's conversion."""
    from ..plan import require_config
    from ..write.execute import convert

    plan, notes = verl_command.plan(args, ask_later=args.operation == "merge")
    try:
        for note in notes + (plan.notes if args.operation == "merge" else []):
            print(f"note: {note}", file=sys.stderr)
        if args.operation == "test":
            count = verl_command.compare(plan, Path(args.test_hf_dir), args.progress)
            print(
                f"{count} tensors of {args.local_dir} match {args.test_hf_dir} ({verl_command.VERL_DTYPE}, "
                f"atol/rtol {verl_command.TOLERANCE}), as verl's test checks"
            )
            return 0
        require_config(plan)
        result = convert(
            plan,
            args.target_dir,
            overwrite=args.overwrite,
            threads=args.threads,
            verify=args.verify,
            progress=args.progress,
            sync=getattr(args, "sync", True),
        )
    finally:
        plan.checkpoint.close()
    _report(args, result)
    return 0


COMMANDS = {
    "convert": convert,
    "inspect": inspect,
    "families": families,
    "merge": merge,
    "merge-moe": merge_moe,
    "merge-search": merge_search,
    "extract-lora": extract_lora,
    "verl": verl,
}
