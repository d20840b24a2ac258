"""The `unshard` command: arguments in, plan, run, one line out. Errors are one line unless --debug."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

from . import verl_command
from .errors import PeerFailedError, UnshardError
from .sinks.safetensors import ROOM_ERRNOS

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


OUT_HELP = "output folder (must not exist or be empty, unless --overwrite)"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="unshard", description="Sharded training checkpoints to Hugging Face folders.")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = ap.add_subparsers(dest="command", required=True)
    for add_arguments in (
        _convert_arguments,
        _extract_lora_arguments,
        _merge_arguments,
        _merge_moe_arguments,
        _merge_search_arguments,
        _inspect_arguments,
        _families_arguments,
    ):
        add_arguments(sub)
    verl_command.add_parser(sub)
    return ap


def _source_options(p: argparse.ArgumentParser) -> None:
    """What describes the checkpoint (SourceOptions), and the output's dtype and file size."""
    p.add_argument("src", help="checkpoint folder (e.g. verl's global_step_N or global_step_N/actor)")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPE_CHOICES,
        help="output dtype; auto: the config's dtype, else the checkpoint's",
    )
    p.add_argument("--max-shard-size", default="5GB", help="largest safetensors file (default 5GB)")
    p.add_argument("--config-from", metavar="DIR", help="Hugging Face folder with config and tokenizer files")
    p.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="write even if the tensors do not fit the config, or a model file does not parse",
    )
    p.add_argument(
        "--weights",
        default="master",
        choices=("master", "module"),
        help="DeepSpeed: fp32 master weights from the optimizer (default) or the 16-bit module states",
    )
    p.add_argument("--tag", help="DeepSpeed: the tag folder to read (default: the one `latest` names)")
    p.add_argument(
        "--iteration", type=int, help="Megatron: the iteration to read (default: latest_checkpointed_iteration.txt's)"
    )
    p.add_argument(
        "--architecture",
        metavar="CLASS",
        help="transformers class for config.json (default: what the weights fit, e.g. "
        "Qwen2ForTokenClassification for a critic's score head)",
    )
    p.add_argument(
        "--lora",
        default="merge",
        choices=("merge", "separate"),
        help="a LoRA adapter in the checkpoint: fold it into the base weights (default), or write "
        "the base as trained and the adapter as a PEFT folder in OUT/lora_adapter/",
    )
    p.add_argument(
        "--lora-alpha", type=float, help="LoRA alpha, when no lora_train_meta.json / adapter_config.json records it"
    )


def _format_options(p: argparse.ArgumentParser) -> None:
    """The output formats other than a plain folder: compressed-tensors (--quantize) and GGUF."""
    p.add_argument(
        "--quantize",
        metavar="SCHEME",
        help="write the Linear weights quantized for vLLM, as llm-compressor does: W4A16, W8A16, "
        "W4A16_ASYM, W8A8, FP8_DYNAMIC, FP8_BLOCK, NVFP4A16, MXFP4A16, MXFP4, MXFP8A16 or MXFP8 "
        "(compressed-tensors' presets)",
    )
    p.add_argument(
        "--quantize-ignore",
        metavar="PATTERN",
        action="append",
        default=[],
        help="a module to leave unquantized, by name or 're:REGEX' (repeatable; lm_head, MoE "
        "routers and vision towers are left by default)",
    )
    p.add_argument(
        "--gguf-type",
        metavar="TYPE",
        help="write one GGUF file for llama.cpp (OUT ending in .gguf; implied by such an OUT): f32, "
        "f16, bf16, q8_0, or llama-quantize's q4_0, q4_1, q5_0, q5_1; default auto, as "
        "llama.cpp's converter: bf16 or f16 as the model is. A vision model's image part goes "
        "beside it, as mmproj-OUT",
    )


def _run_options(
    p: argparse.ArgumentParser, threads: int, threads_help: str, dry_run_help: str = "print the plan, write nothing"
) -> None:
    """What every command that writes OUT takes."""
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    p.add_argument("--dry-run", action="store_true", help=dry_run_help)
    p.add_argument("--threads", type=int, default=threads, help=threads_help)
    p.add_argument("--no-progress", dest="progress", action="store_false", default=None)


def _scale_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes on this host, each writing its share of the output files (default 1)",
    )
    p.add_argument(
        "--distributed",
        action="store_true",
        help="run as one rank of `torchrun ... -m unshard convert`: the ranks share the output "
        "files on a shared filesystem",
    )


def _hub_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--push-to-hub",
        metavar="REPO_ID",
        help="upload OUT to this Hub model repository once it is complete (created if needed)",
    )
    p.add_argument("--private", action="store_true", help="with --push-to-hub: a new repository is private")
    p.add_argument("--revision", metavar="BRANCH", help="with --push-to-hub: the branch to commit to")
    p.add_argument("--commit-message", metavar="MSG", help="with --push-to-hub: the commit's message")


def _convert_arguments(sub) -> None:
    convert = sub.add_parser("convert", help="write a Hugging Face model folder")
    _source_options(convert)
    _format_options(convert)
    convert.add_argument("out", help=OUT_HELP)
    _run_options(convert, 2, "tensors assembled in parallel (default 2)")
    convert.add_argument(
        "--verify", action="store_true", help="read every written byte back and compare it with the checkpoint's"
    )
    convert.add_argument(
        "--checksums",
        action="store_true",
        help="list each file's sha256 in OUT/README.md (hashing runs at about 1 GB/s per file)",
    )
    _scale_options(convert)
    _hub_options(convert)


def _extract_lora_arguments(sub) -> None:
    extract = sub.add_parser(
        "extract-lora",
        help="a PEFT LoRA adapter from the difference of a fine-tune and its base (as mergekit-extract-lora)",
    )
    extract.add_argument("finetuned", help="the fine-tuned model: any layout unshard reads, or a Hub id")
    extract.add_argument("base", help="the model it was tuned from")
    extract.add_argument("out", help="output adapter folder (must not exist or be empty, unless --overwrite)")
    extract.add_argument(
        "--rank",
        "--max-rank",
        type=int,
        default=128,
        help="LoRA rank (default 128; a smaller module keeps its full rank)",
    )
    extract.add_argument(
        "--no-distribute-scale",
        dest="distribute_scale",
        action="store_false",
        help="the singular values on A only (default: their square roots on A and B)",
    )
    extract.add_argument(
        "--embed-lora",
        action="store_true",
        help="extract the embeddings as LoRA too (default: saved whole, in modules_to_save)",
    )
    extract.add_argument(
        "--save-module",
        dest="save_modules",
        metavar="NAME",
        action="append",
        default=[],
        help="save this module whole (a name or its last part, e.g. lm_head; repeatable)",
    )
    extract.add_argument(
        "--include-regex",
        "-i",
        dest="include",
        metavar="REGEX",
        action="append",
        default=[],
        help="extract only the modules this matches (repeatable)",
    )
    extract.add_argument(
        "--exclude-regex",
        "-e",
        dest="exclude",
        metavar="REGEX",
        action="append",
        default=[],
        help="leave out the modules this matches (repeatable)",
    )
    extract.add_argument(
        "--skip-undecomposable",
        action="store_true",
        help="leave out modules that are neither Linear nor Embedding (default: saved whole)",
    )
    extract.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help="of the adapter; auto: the fine-tune's")
    _run_options(extract, 1, "modules decomposed in parallel (default 1: each SVD uses every core already)")
    extract.add_argument(
        "--verify", action="store_true", help="re-read the adapter and compare with a fresh extraction"
    )
    _hub_options(extract)
    extract.set_defaults(distributed=False)  # (one process: it speaks for itself)


def _merge_output_options(p: argparse.ArgumentParser, dtype_help: str, out_help: str = OUT_HELP) -> None:
    """OUT and what it is written as, for the commands that make a model from others (from a recipe)."""
    p.add_argument("out", help=out_help)
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=f"output dtype; auto: {dtype_help}")
    p.add_argument("--max-shard-size", default="5GB", help="largest safetensors file (default 5GB)")


def _merge_arguments(sub) -> None:
    merge = sub.add_parser("merge", help="blend models as a mergekit-style YAML recipe says")
    merge.add_argument("recipe", help="YAML: merge_method, base_model, models, parameters, dtype, out_dtype")
    _merge_output_options(merge, "the recipe's out_dtype or dtype, else the base model's")
    _format_options(merge)
    merge.add_argument("--seed", type=int, default=0, help="seed of DARE's random drops (default 0)")
    _run_options(merge, 2, "tensors merged in parallel (default 2)")
    merge.add_argument("--verify", action="store_true", help="re-read the output and compare with a fresh merge")
    merge.add_argument("--checksums", action="store_true", help="list each file's sha256 in OUT/README.md")
    _scale_options(merge)
    _hub_options(merge)


def _merge_moe_arguments(sub) -> None:
    moe = sub.add_parser(
        "merge-moe", help="assemble a mixture of experts from dense models, as a mergekit-moe YAML recipe says"
    )
    moe.add_argument(
        "recipe",
        help="YAML: base_model, experts (source_model, positive_prompts, ...), gate_mode, "
        "experts_per_token, shared_experts, dtype, architecture",
    )
    _merge_output_options(moe, "the recipe's dtype, else the base model's")
    _format_options(moe)
    moe.add_argument(
        "--seed", type=int, default=0, help="seed of gate_mode random / uniform_random and of noise_scale (default 0)"
    )
    moe.add_argument(
        "--i-understand-this-is-not-useful-without-training",
        dest="allow_same",
        action="store_true",
        help="allow every expert to be the same model",
    )
    _run_options(
        moe,
        2,
        "tensors written in parallel (default 2)",
        dry_run_help="print the plan, write nothing (the gates are not computed)",
    )
    moe.add_argument("--verify", action="store_true", help="re-read the output and compare with a fresh assembly")
    moe.add_argument("--checksums", action="store_true", help="list each file's sha256 in OUT/README.md")
    _hub_options(moe)
    moe.set_defaults(distributed=False)


def _merge_search_arguments(sub) -> None:
    search = sub.add_parser(
        "merge-search",
        help="search merge recipes for the best score on your own data (Optuna), and write the best merge",
    )
    search.add_argument(
        "space",
        help="a recipe whose parameters may be ranges {min: 0.1, max: 0.9} or choices "
        "{choice: [...]}, and merge_method a list of methods",
    )
    _merge_output_options(
        search,
        "the recipe's out_dtype or dtype, else the base model's",
        "output folder for the best merge (must not exist or be empty, unless --overwrite)",
    )
    search.add_argument(
        "--eval",
        required=True,
        metavar="FILE",
        help="text (one example per line) or JSONL of {prompt, completion}: scored by loss per token",
    )
    search.add_argument(
        "--trials", type=int, default=20, help="trials to run now (default 20; trial 0 is the untuned recipe)"
    )
    search.add_argument("--seed", type=int, default=0, help="seed of the search (TPE) and of DARE's drops (default 0)")
    search.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="where trials are scored (auto: CUDA if there is one)",
    )
    search.add_argument(
        "--study", metavar="PATH", help="the study's SQLite file, continued if it exists (default: OUT.study.db)"
    )
    _run_options(
        search,
        2,
        "tensors merged in parallel when OUT is written",
        dry_run_help="check the space and eval file, print the dimensions and the memory a trial takes",
    )
    _hub_options(search)
    search.set_defaults(distributed=False, verify=False)


def _inspect_arguments(sub) -> None:
    inspect = sub.add_parser("inspect", help="say what the checkpoint is and what convert would write")
    _source_options(inspect)
    _format_options(inspect)
    inspect.add_argument("--json", action="store_true", help="machine-readable output")


def _families_arguments(sub) -> None:
    families = sub.add_parser(
        "families",
        help="which model families each path supports (the support matrix)",
        description="One row per model family unshard knows, one column per path: yes, or why "
        "not. A family not listed still converts wherever transformers knows it "
        "(rank files, DCP, DeepSpeed, --quantize).",
        epilog="examples:\n  unshard families\n  unshard families --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    families.add_argument("--json", action="store_true", help="machine-readable output")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    for chatty in ("httpx", "httpx2"):  # huggingface_hub's HTTP client logs every request at INFO
        logging.getLogger(chatty).setLevel(logging.WARNING)
    # A job scheduler (or torchrun, when another rank failed) stops us with SIGTERM: unwind like
    # Ctrl-C, so the staging folder is removed and no partial OUT is left.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if repo_id := getattr(args, "push_to_hub", None):
            from .hub import check_repo_id

            check_repo_id(repo_id)
        return _run(args)
    except PeerFailedError:  # rank 0 prints why
        return 1
    except (UnshardError, FileNotFoundError, PermissionError) as e:
        if args.debug:
            raise
        print(f"unshard: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("unshard: interrupted; nothing was written to the output", file=sys.stderr)
        return 130
    except BrokenPipeError:  # (`unshard families | head` read what it wanted)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # a bug, not bad input: still one line, the traceback with --debug
        if args.debug:
            raise
        if isinstance(e, OSError) and e.errno in ROOM_ERRNOS:  # (weights' writes say which file themselves)
            print(
                f"unshard: error: {e.filename or 'the output'}: {e.strerror}; nothing was written to the output: "
                "free space on that disk (or raise the file size limit, ulimit -f) and run again",
                file=sys.stderr,
            )
            return 1
        print(f"unshard: internal error: {type(e).__name__}: {e}; rerun with --debug and report it", file=sys.stderr)
        return 2


def run() -> None:
    """The program: `main`, then exit without Python's teardown.

    Everything unshard leaves behind is written and closed when `main` returns; what the teardown
    would do then is unregister torch's operator libraries, a third of a second of every run.
    """
    code = main()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # `unshard inspect | head` read what it wanted
            pass
    os._exit(code)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _sharing_notes(args, plan) -> list[str]:
    """Work is shared by output file: more writers than files leaves some idle."""
    writers = int(os.environ.get("WORLD_SIZE", 1)) if args.distributed else args.workers
    if writers > len(plan.files):
        return [
            f"{writers} writers but {len(plan.files)} output file(s): only {len(plan.files)} will work; "
            "lower --max-shard-size for more files"
        ]
    return []


def _speaks(args) -> bool:
    """In a distributed run, rank 0 speaks for all (torchrun sets RANK)."""
    return not args.distributed or os.environ.get("RANK", "0") == "0"


def _report(args, result) -> None:
    if not _speaks(args):
        return
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(result.line() + (", verified" if args.verify else ""))
    if args.push_to_hub:
        from .hub import HubTarget, push

        url = push(
            result.out, HubTarget(args.push_to_hub, args.private, args.revision, args.commit_message), args.progress
        )
        print(f"pushed {result.out} to {url}")


def _run(args) -> int:
    import unshard

    from .report import as_text, describe
    from .sources import SourceOptions

    handlers = {
        "merge": _merge,
        "verl": _verl,
        "extract-lora": _extract_lora,
        "merge-moe": _merge_moe,
        "merge-search": _merge_search,
        "families": _families,
    }
    if args.command in handlers:
        return handlers[args.command](args)
    output = _output(args, getattr(args, "out", ""))
    source = SourceOptions(
        config_from=args.config_from,
        weights=args.weights,
        tag=args.tag,
        iteration=args.iteration,
        lora_alpha=args.lora_alpha,
        lora=args.lora,
        architecture=args.architecture,
        check=args.check,
    )
    options = dict(output=output, source=source)
    if args.command == "inspect":
        info = unshard.inspect(args.src, **options)
        print(json.dumps(info, indent=2, default=str) if args.json else as_text(info))
        return 0
    plan = unshard.plan(args.src, **options, ask_later=not args.dry_run)
    if args.dry_run:
        print(as_text(describe(plan)))
        return 0
    from .plan import require_config
    from .write.execute import convert

    require_config(plan)
    if _speaks(args):
        print(f"output dtype {plan.summary()['dtype']} ({plan.dtype_reason})", file=sys.stderr)
        for note in plan.notes + _sharing_notes(args, plan):
            print(f"note: {note}", file=sys.stderr)
    try:
        result = convert(
            plan,
            args.out,
            overwrite=args.overwrite,
            threads=args.threads,
            verify=args.verify,
            checksums=args.checksums,
            progress=args.progress,
            workers=args.workers,
            distributed=args.distributed,
        )
    finally:
        plan.checkpoint.close()
    _report(args, result)
    return 0


def _families(args) -> int:
    from . import families
    from .report import families_table

    rows = families.matrix()
    print(json.dumps(rows, indent=2) if args.json else families_table(rows, families.PATHS))
    return 0


def _output(args, out: str):
    from .types import OutputOptions

    gguf = args.gguf_type or ("auto" if str(out).endswith(".gguf") else None)
    return OutputOptions(args.dtype, args.max_shard_size, args.quantize, tuple(args.quantize_ignore), gguf)


def _merge(args) -> int:
    from .merging import plan_merge, recipe_files
    from .report import as_text, describe
    from .write.execute import convert

    plan = plan_merge(args.recipe, _output(args, args.out), seed=args.seed)
    try:
        if args.dry_run:
            print(as_text(describe(plan)))
            return 0
        if _speaks(args):
            print(f"output dtype {plan.summary()['dtype']} ({plan.dtype_reason})", file=sys.stderr)
            for note in _sharing_notes(args, plan):
                print(f"note: {note}", file=sys.stderr)
        result = convert(
            plan,
            args.out,
            overwrite=args.overwrite,
            threads=args.threads,
            verify=args.verify,
            checksums=args.checksums,
            progress=args.progress,
            extra_files=recipe_files(plan),
            workers=args.workers,
            distributed=args.distributed,
        )
    finally:
        plan.checkpoint.close()
    _report(args, result)
    return 0


def _merge_moe(args) -> int:
    from .merging.moe import moe_files, plan_moe
    from .report import as_text, describe
    from .write.execute import convert

    plan = plan_moe(args.recipe, _output(args, args.out), seed=args.seed, allow_same=args.allow_same)
    try:
        if args.dry_run:
            print(as_text(describe(plan)))
            return 0
        print(f"output dtype {plan.summary()['dtype']} ({plan.dtype_reason})", file=sys.stderr)
        for note in plan.notes:
            print(f"note: {note}", file=sys.stderr)
        result = convert(
            plan,
            args.out,
            overwrite=args.overwrite,
            threads=args.threads,
            verify=args.verify,
            checksums=args.checksums,
            progress=args.progress,
            extra_files=moe_files(plan),
        )
    finally:
        plan.checkpoint.close()
    for warning in plan.checkpoint.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    _report(args, result)
    return 0


def _merge_search(args) -> int:
    from .merging.search import SearchOptions, leaderboard, prepare, search_and_write
    from .types import OutputOptions
    from .units import human_bytes

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
    result, study = search_and_write(args.space, args.out, options, output, args.overwrite, args.threads, args.progress)
    rows = leaderboard(study)
    first = next((t.value for t in study.trials if t.number == 0), None)
    print(
        f"best loss {rows[0]['loss']:.4f} (trial {rows[0]['trial']} of {len(study.trials)})"
        + (f"; untuned recipe (trial 0) {first:.4f}" if first is not None else ""),
        file=sys.stderr,
    )
    _report(args, result)
    return 0


def _extract_lora(args) -> int:
    from .merging.extract_lora import ExtractionOptions, plan_extraction, summary
    from .report import as_text, describe
    from .write.execute import convert

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
    try:
        if args.dry_run:
            print(as_text(describe(plan)))
            return 0
        print(f"output dtype {plan.dtype.name} ({plan.dtype_reason})", file=sys.stderr)
        for note in plan.notes:
            print(f"note: {note}", file=sys.stderr)
        result = convert(
            plan, args.out, overwrite=args.overwrite, threads=args.threads, verify=args.verify, progress=args.progress
        )
    finally:
        plan.checkpoint.close()
    for line in summary(plan):
        print(line, file=sys.stderr)
    _report(args, result)
    return 0


def _verl(args) -> int:
    """verl's merger command line: the same meaning, unshard's conversion."""
    from .plan import require_config
    from .write.execute import convert

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
        )
    finally:
        plan.checkpoint.close()
    _report(args, result)
    return 0


if __name__ == "__main__":
    run()
