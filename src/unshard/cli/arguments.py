"""The `unshard` command's arguments: one parser per command, over the option groups they share (the source, the
output formats, running, scaling out, the Hub). Each command's help ends with examples."""

from __future__ import annotations

import argparse

from .. import verl_command

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


OUT_HELP = "output folder (must not exist or be empty, unless --overwrite)"


# What each command's --help ends with
EXAMPLES = {
    "convert": [
        "unshard convert checkpoints/global_step_100/actor hf_model",
        "unshard convert checkpoints/iter_0001000 model.gguf --gguf-type q8_0",
        "unshard convert checkpoints/global_step_100 hf_w4a16 --quantize W4A16 --push-to-hub me/model-w4a16",
        "unshard convert checkpoints/my_run hf_steps --all-steps --push-to-hub me/my-run",
        "unshard convert s3://my-bucket/run/global_step_500 hf_model   # (pip install 'unshard[remote]')",
    ],
    "extract-lora": ["unshard extract-lora finetuned_model base_model adapter --rank 32"],
    "merge": ["unshard merge recipe.yaml merged_model", "unshard merge recipe.yaml merged.gguf --gguf-type q8_0"],
    "merge-moe": ["unshard merge-moe moe.yaml moe_model"],
    "merge-search": ["unshard merge-search space.yaml best_model --eval eval.jsonl --trials 30"],
    "inspect": ["unshard inspect checkpoints/global_step_100/actor", "unshard inspect checkpoints/iter_0001000 --json"],
    "families": ["unshard families", "unshard families --json"],
    "verl": [
        "unshard verl merge --backend fsdp --local_dir checkpoints/global_step_100/actor --target_dir hf_model",
        "unshard verl test --backend fsdp --local_dir checkpoints/global_step_100/actor --test_hf_dir hf_model",
    ],
}


def parser() -> argparse.ArgumentParser:
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
    for name, command in sub.choices.items():
        command.epilog = "examples:\n" + "\n".join(f"  {line}" for line in EXAMPLES[name])
        command.formatter_class = argparse.RawDescriptionHelpFormatter
    return ap


def _source_options(p: argparse.ArgumentParser) -> None:
    """What describes the checkpoint (SourceOptions), and the output's dtype and file size."""
    p.add_argument(
        "src", help="checkpoint folder (e.g. verl's global_step_N or global_step_N/actor), or its URL (s3://, gs://...)"
    )
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
    """The output formats other than a plain folder: compressed-tensors (--quantize), GGUF, training checkpoints."""
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
        "f16, bf16, q8_0, or llama-quantize's q4_0, q4_1, q5_0, q5_1 and K-quant mixes q2_k, q3_k_s, q3_k_m, "
        "q3_k_l, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k, iq4_nl, iq4_xs (with llama-cpp-python's "
        "library); default auto, as "
        "llama.cpp's converter: bf16 or f16 as the model is. A vision model's image part goes "
        "beside it, as mmproj-OUT",
    )
    p.add_argument(
        "--gguf-split-max-size",
        metavar="SIZE",
        help="split the GGUF file into files of at most SIZE (N, or N followed by K, M or G: powers of 1000), "
        "OUT-00001-of-0000N.gguf..., as llama.cpp's converter splits it; llama.cpp loads the model from the first",
    )
    p.add_argument(
        "--target-from",
        metavar="DIR",
        help="a drafter's GGUF file (speculators' EAGLE-3 and DSpark drafters'): the Hugging Face folder of the model "
        "it drafts for, "
        "whose vocabulary and sizes the file takes (default: the verifier its config names, where that is a folder "
        "here or in the Hugging Face cache)",
    )
    _training_formats(p)


def _training_formats(p: argparse.ArgumentParser) -> None:
    """The way back into training: a DCP, Megatron or FSDP checkpoint (--to) and its parallelism."""
    p.add_argument(
        "--to",
        choices=("dcp", "megatron", "verl-megatron", "fsdp"),
        help="write a training checkpoint instead of a model folder (the weights only): dcp, a "
        "torch.distributed.checkpoint folder that torchtitan and FSDP2's dcp.load read at any world size; megatron, "
        "Megatron-LM's torch_dist checkpoint for --tp/--pp/--vpp; verl-megatron, the same in verl's layout; fsdp, "
        "verl's FSDP rank files for --world-size",
    )
    p.add_argument("--world-size", type=int, default=0, help="with --to fsdp: the number of ranks of the run")
    p.add_argument(
        "--fsdp-size",
        type=int,
        default=0,
        help="with --to fsdp: the ranks each tensor is cut over, as verl's fsdp_size (HSDP: replicated over "
        "world-size / fsdp-size groups, on verl's (ddp, fsdp) mesh); default: all of them",
    )
    p.add_argument(
        "--mesh-device",
        default="cuda",
        help="with --to fsdp: the device type of the run's device mesh, which FSDP compares on loading (default cuda; "
        "npu on Ascend, cpu for a CPU run)",
    )
    p.add_argument("--tp", type=int, default=1, help="with --to [verl-]megatron: the tensor parallelism of the run")
    p.add_argument("--pp", type=int, default=1, help="with --to [verl-]megatron: the pipeline parallelism")
    p.add_argument("--vpp", type=int, help="with --to [verl-]megatron: the virtual pipeline stages per pipeline rank")
    p.add_argument("--ep", type=int, default=1, help="with --to [verl-]megatron: the expert parallelism")
    p.add_argument(
        "--etp", type=int, default=1, help="with --to [verl-]megatron: the experts' tensor parallelism (default 1)"
    )
    p.add_argument(
        "--make-vocab-size-divisible-by",
        type=int,
        default=128,
        help="with --to [verl-]megatron: as Megatron-LM's option (the vocabulary padded to a multiple of it × --tp)",
    )
    p.add_argument(
        "--names",
        choices=("hf", "torchtitan", "torchtune"),
        default="hf",
        help="with --to dcp: the tensors' names, Hugging Face's (default; FSDP2 on a transformers model), "
        "torchtitan's or torchtune's (`unshard families` says for which families)",
    )


def _run_options(
    p: argparse.ArgumentParser, threads: int, threads_help: str, dry_run_help: str = "print the plan, write nothing"
) -> None:
    """What every command that writes OUT takes."""
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    p.add_argument("--dry-run", action="store_true", help=dry_run_help)
    p.add_argument("--threads", type=int, default=threads, help=threads_help)
    p.add_argument("--no-progress", dest="progress", action="store_false", default=None)
    p.add_argument(
        "--no-sync",
        dest="sync",
        action="store_false",
        help="do not flush OUT's files to the disk before putting it in place: faster for scratch outputs, but a "
        "crash or power loss may then leave an OUT that looks complete with files cut short (said in its card)",
    )


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
    convert.add_argument(
        "--all-steps",
        action="store_true",
        help="SRC is a run's folder: convert each step it holds (global_step_N, iter_N, step-N, epoch_N, "
        "checkpoint-N) into OUT/step_N, skipping those already there; with --push-to-hub each to branch step-N",
    )
    convert.add_argument("--steps", metavar="N,M,last", help="as --all-steps, these steps only")
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
    )
    families.add_argument("--json", action="store_true", help="machine-readable output")
