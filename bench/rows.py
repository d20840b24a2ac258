"""The rows bench/run.py times for each layout: the command lines of unshard and of the alternatives, on the same
input (src, within the layout's folder) into the same OUT. python and first: the Python that runs unshard with its
cache of transformers' answers, and with an emptied one (a model's first conversion)."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import generate  # noqa: E402  (tests/fixtures/generate.py: the peer venvs, made as the tests make them)

# The peers only the bench runs, beside the tests' (generate.PEERS: mergekit, llm-compressor, verl's merger...).
BENCH_PEERS = {"accelerate": ["accelerate==1.15.0"], "deepspeed": ["deepspeed==0.19.8", "transformers", "tokenizers"]}

FIRST_RUN = " (first run)"  # the row of a tool run with its caches emptied first


def peer_python(name: str) -> Path:
    """A venv of its own for a peer tool, with the same local torch build."""
    return generate.peer_python(name, BENCH_PEERS.get(name))


def llama_cpp_converter() -> list[str]:
    """llama.cpp's convert_hf_to_gguf.py as the tests get it (llama-cpp-python's source package), in its venv."""
    return [str(generate.peer_python("llamacpp")), str(generate.llama_cpp_source() / "convert_hf_to_gguf.py")]


def verl_merger(src: Path, target: str) -> list[str]:
    """verl's own merger of the run's FSDP rank files (src/actor) into a Hugging Face folder, in its venv."""
    merge = ["-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(src / "actor")]
    return [str(peer_python("verl")), *merge, "--target_dir", target]


def work_of(out: Path) -> Path:
    """A scratch folder beside OUT (removed with it between runs)."""
    (out.parent / "scratch").mkdir(parents=True, exist_ok=True)
    return out.parent / "scratch"


def merge_rows(src: Path, folder: Path, out: Path, python: list[str], first: list[str]) -> dict[str, list[str]]:
    """Layout "merge": `unshard merge` of a TIES recipe against mergekit-yaml, with cp for the floor."""
    recipe = str(folder / "recipe.yml")
    merge = ["-m", "unshard", "merge", recipe, str(out), "--no-progress"]
    return {
        "cp": ["cp", "-r", str(src), str(out)],
        "unshard merge" + FIRST_RUN: [*first, *merge],
        "unshard merge": [*python, *merge],
        "mergekit-yaml": [str(peer_python("mergekit").parent / "mergekit-yaml"), recipe, str(out)],
    }


def slices_rows(src: Path, folder: Path, out: Path, python: list[str], first: list[str]) -> dict[str, list[str]]:
    """Layout "slices": a passthrough frankenmerge (the base's first half of layers, ft0's second half twice) against
    mergekit-yaml."""
    layers = json.loads((folder / "base" / "config.json").read_text())["num_hidden_layers"]
    recipe = folder / "slices.yml"
    recipe.write_text(
        json.dumps(
            {
                "merge_method": "passthrough",
                "dtype": "float32",
                "slices": [
                    {"sources": [{"model": str(folder / "base"), "layer_range": [0, layers // 2]}]},
                    {"sources": [{"model": str(folder / "ft0"), "layer_range": [layers // 2, layers]}]},
                    {"sources": [{"model": str(folder / "ft0"), "layer_range": [layers // 2, layers]}]},
                ],
            }
        )
    )  # (YAML reads JSON)
    merge = ["-m", "unshard", "merge", str(recipe), str(out), "--no-progress"]
    return {
        "cp": ["cp", "-r", str(folder / "base"), str(out)],
        "unshard merge": [*python, *merge],
        "mergekit-yaml": [str(peer_python("mergekit").parent / "mergekit-yaml"), str(recipe), str(out)],
    }


def moe_rows(src: Path, folder: Path, out: Path, python: list[str], first: list[str]) -> dict[str, list[str]]:
    """Layout "moe": a Mixtral of ft0 and ft1 on the base, gate_mode hidden: `unshard merge-moe` against
    mergekit-moe."""
    recipe = folder / "moe.yml"
    recipe.write_text(
        json.dumps(
            {
                "base_model": str(folder / "base"),
                "gate_mode": "hidden",
                "experts": [
                    {
                        "source_model": str(folder / "ft0"),
                        "positive_prompts": ["the cat sat on the mat", "hello world"],
                    },
                    {"source_model": str(folder / "ft1"), "positive_prompts": ["one two three", "a b c"]},
                ],
            }
        )
    )
    return {
        "cp": ["cp", "-r", str(folder / "base"), str(out)],
        "unshard merge-moe": [*python, "-m", "unshard", "merge-moe", str(recipe), str(out), "--no-progress"],
        "mergekit-moe": [str(peer_python("mergekit").parent / "mergekit-moe"), str(recipe), str(out)],
    }


def search_rows(src: Path, folder: Path, out: Path, python: list[str], first: list[str]) -> dict[str, list[str]]:
    """Layout "search": 5 trials of `unshard merge-search` against 5 trials by hand (search_by_hand.py)."""
    space, eval_file, study = folder / "space.yml", folder / "eval.txt", folder / "bench-study.db"
    space.write_text(
        json.dumps(
            {
                "merge_method": "task_arithmetic",
                "base_model": str(folder / "base"),
                "dtype": "float32",
                "models": [
                    {"model": str(folder / f"ft{i}"), "parameters": {"weight": {"min": 0.0, "max": 1.0}}}
                    for i in range(2)
                ],
            }
        )
    )
    eval_file.write_text(
        "hello world\nthe quick brown fox jumps over a dog\nunshard turns sharded checkpoints into models\n" * 4
    )
    search = " ".join(
        [
            *python,
            "-m",
            "unshard",
            "merge-search",
            str(space),
            str(out),
            "--eval",
            str(eval_file),
            "--trials",
            "5",
            "--study",
            str(study),
            "--no-progress",
        ]
    )
    return {
        "unshard merge-search (5 trials)": ["sh", "-c", f"rm -f {study} && exec {search}"],
        "unshard merge + transformers, by hand (5 trials)": [
            sys.executable,
            str(HERE / "search_by_hand.py"),
            str(folder),
            str(eval_file),
            "5",
            str(work_of(out)),
        ],
    }


def extract_lora_rows(src: Path, folder: Path, out: Path, python: list[str], first: list[str]) -> dict[str, list[str]]:
    """Layout "extract-lora": `unshard extract-lora ft0 base --rank 32` against mergekit-extract-lora --max-rank 32."""
    pair = [str(folder / "ft0"), str(folder / "base")]
    return {
        "unshard extract-lora": [
            *python,
            "-m",
            "unshard",
            "extract-lora",
            *pair,
            str(out),
            "--rank",
            "32",
            "--no-progress",
        ],
        "mergekit-extract-lora": [
            str(peer_python("mergekit").parent / "mergekit-extract-lora"),
            "--model",
            pair[0],
            "--base-model",
            pair[1],
            "--out-path",
            str(out),
            "--max-rank",
            "32",
        ],
    }


def gguf_rows(src: Path, folder: Path, out: Path, python: list[str], first: list[str]) -> dict[str, list[str]]:
    """Layout "gguf": one GGUF file (f16, q8_0, q4_k_m) from the verl rank files against llama.cpp's converter (then
    llama-quantize) on the same model's folder, and against verl's merger then the converter."""
    # (a GGUF output is a file: each tool writes OUT/model.gguf)
    made, converter = f"mkdir -p {out} && exec ", llama_cpp_converter()
    client = peer_python("llamacpp-client")  # (llama.cpp compiled: llama-quantize's code, and the K-quants' library)
    (ggml,) = client.parent.parent.glob("lib/python3*/site-packages/llama_cpp/lib/libggml-base.so")
    # (on every core, as llama-quantize: the tests' client takes one unless told)
    quantize = f"env QUANTIZE_THREADS=0 {client} {ROOT / 'tests' / 'llama_cpp_client.py'} quantize"
    unshard = " ".join([*python, "-m", "unshard", "convert", str(src), f"{out}/model.gguf", "--no-progress"])
    convert = " ".join([*converter, "{}", "--outfile", f"{out}/model.gguf", "--outtype"])
    merger = " ".join(verl_merger(src, f"{out}/hf"))
    return {
        "cp": ["cp", "-r", str(src), str(out)],
        "unshard (f16)": ["sh", "-c", made + unshard],
        "unshard --gguf-type q8_0": ["sh", "-c", made + unshard + " --gguf-type q8_0"],
        "convert_hf_to_gguf.py (f16)": ["sh", "-c", made + convert.format(folder / "hf-model") + " f16"],
        "convert_hf_to_gguf.py q8_0": ["sh", "-c", made + convert.format(folder / "hf-model") + " q8_0"],
        "unshard --gguf-type q4_k_m": [
            "sh",
            "-c",
            f"{made}env UNSHARD_GGML_LIBRARY={ggml} {unshard} --gguf-type q4_k_m",
        ],
        "convert_hf_to_gguf.py (f16) then llama-quantize q4_k_m": [
            "sh",
            "-c",
            f"mkdir -p {out} && {convert.format(folder / 'hf-model')} f16 && {quantize} {out}/model.gguf "
            f"{out}/q4_k_m.gguf q4_k_m && exec mv {out}/q4_k_m.gguf {out}/model.gguf",
        ],
        "verl model_merger, then convert_hf_to_gguf.py (f16)": [
            "sh",
            "-c",
            f"{merger} && exec {convert.format(f'{out}/hf')} f16",
        ],
    }


def way_back_rows(src: Path, folder: Path, out: Path, python: list[str], first: list[str]) -> dict[str, list[str]]:
    """Layout "way-back": a Hugging Face folder into training checkpoints, against torch's own writers as a script
    uses them."""
    to_dcp = [*python, "-m", "unshard", "convert", str(src), str(out), "--no-progress", "--to", "dcp"]
    return {
        "cp": ["cp", "-r", str(src), str(out)],
        "cp -r && sync": ["sh", "-c", f"cp -r {src} {out} && sync"],
        "unshard --to dcp": to_dcp,
        "unshard --to dcp --names torchtitan": [*to_dcp, "--names", "torchtitan"],
        # (no converter into Megatron runs on a CPU-only machine: Megatron-Bridge needs Transformer Engine)
        "unshard --to megatron --tp 2 --pp 2": [*to_dcp[:-1], "megatron", "--tp", "2", "--pp", "2"],
        "unshard --to fsdp --world-size 8": [*to_dcp[:-1], "fsdp", "--world-size", "8"],
        # rank files as a script writes them without a process group to make DTensors with: the whole state
        # dict loaded, then each rank's rows of every tensor cloned and saved as plain tensors
        "load_file then torch.save per rank": [
            sys.executable,
            "-c",
            "import sys, glob, os, torch; from safetensors.torch import load_file; state = {}; "
            "[state.update(load_file(f)) for f in sorted(glob.glob(sys.argv[1] + '/*.safetensors'))]; "
            "os.makedirs(sys.argv[2]); rows = lambda v: -(-v.shape[0] // 8); "
            "[torch.save({k: v[r * rows(v) : (r + 1) * rows(v)].clone() for k, v in state.items()}, "
            "f'{sys.argv[2]}/model_world_size_8_rank_{r}.pt') for r in range(8)]; os.sync()",
            str(src),
            str(out),
        ],
        # torch's own writer, as a script would use it: the whole state dict loaded, then saved
        "load_file, then dcp.save": [
            sys.executable,
            "-c",
            "import sys, glob, os; import torch.distributed.checkpoint as dcp; "
            "from safetensors.torch import load_file; state = {}; "
            "[state.update(load_file(f)) for f in sorted(glob.glob(sys.argv[1] + '/*.safetensors'))]; "
            "dcp.save(state, checkpoint_id=sys.argv[2], no_dist=True); os.sync()",
            str(src),
            str(out),
        ],
    }


def quantize_rows(src: Path, folder: Path, out: Path, python: list[str], first: list[str]) -> dict[str, list[str]]:
    """Layout "quantize": `--quantize` from the verl rank files against llm-compressor's data-free path, in fp32 and
    bf16."""
    convert = [*python, "-m", "unshard", "convert", str(src), str(out), "--no-progress"]
    # --verify checks the CRC-32 of every torch.save record read; this row times that check alone.
    crc = (
        "import sys; import unshard; from unshard.plan import pieces_read; plan = unshard.plan(sys.argv[1]); "
        "plan.checkpoint.check_records(pieces_read(plan.groups))"
    )
    found = {
        "cp": ["cp", "-r", str(src), str(out)],
        "unshard": convert,
        "unshard --verify": [*convert, "--verify"],
        "CRC-32 of the records read": [*python, "-c", crc, str(src)],
        # (then out without Python's teardown, which torch makes 0.4 s long, as unshard's command exits)
        "import torch alone": [*python, "-c", "import os, torch; os._exit(0)"],
    }
    oracle = ROOT / "tests" / "fixtures" / "llmcompressor_oracle.py"
    for scheme, bf16 in itertools.product(("W4A16", "FP8_DYNAMIC"), (False, True)):
        # (bf16: both from the bf16 Hugging Face folder, which unshard reads as it reads a checkpoint)
        found[f"unshard --quantize {scheme}{' bf16' * bf16}"] = (
            [
                *python,
                "-m",
                "unshard",
                "convert",
                str(folder / "hf-model-bf16"),
                str(out),
                "--no-progress",
                "--quantize",
                scheme,
            ]
            if bf16
            else [*convert, "--quantize", scheme]
        )
        jobs = folder / f"llmcompressor-{scheme}{'-bf16' * bf16}.json"
        jobs.write_text(
            json.dumps(
                [
                    {
                        "src": str(folder / f"hf-model{'-bf16' * bf16}"),
                        "out": str(out),
                        "scheme": scheme,
                        "ignore": ["lm_head"],
                    }
                ]
            )
        )
        found[f"llm-compressor {scheme}{' bf16' * bf16}"] = [
            str(peer_python("llmcompressor")),
            str(oracle),
            "quantize",
            str(jobs),
        ]
    return found


def convert_rows(
    layout: str, src: Path, folder: Path, out: Path, python: list[str], first: list[str]
) -> dict[str, list[str]]:
    """Every checkpoint layout's conversion to a Hugging Face folder: unshard's rows (first run, transformers asked,
    --verify, --workers, bf16...) against cp, cp && sync and the layout's own tool (verl's merger, zero_to_fp32.py,
    DCP's and accelerate's)."""
    # DeepSpeed's and Megatron's checkpoints carry their config (Megatron's as its `args`).
    config = [] if layout.startswith(("zero", "megatron")) else ["--config-from", str(folder / "hf")]
    unshard = ["-m", "unshard", "convert", str(src), str(out), *config, "--no-progress", "--dtype"]
    # The bench's models are Llamas, which the families' tensor tables list; this row forgets the list, as for any
    # other model, whose first conversion asks transformers.
    without_table = [
        "-c",
        "from unshard import families; families.TENSOR_TABLES.clear(); "
        "import sys; from unshard.cli import main; sys.exit(main(sys.argv[1:]))",
        *unshard[2:],
    ]
    # DCP's chunks are checked to be whole archives before they are read (both ends of each, and every record's header
    # where torch's loader reads it: torch_archives.is_archive, records); this row checks the first signature only,
    # as before the check, to measure what the check costs.
    unchecked = [
        "-c",
        "from unshard.sources import torch_archives as t; "
        "t.is_archive = lambda f, start, length: length >= 22 and (f.seek(start), f.read(4))[1] == b'PK\\x03\\x04'; "
        "import sys; from unshard.cli import main; sys.exit(main(sys.argv[1:]))",
        *unshard[2:],
    ]
    found = {
        "cp": ["cp", "-r", str(src), str(out)],
        # (what a durable copy costs: every byte on the disk before the command ends, as unshard puts OUT in place)
        "cp -r && sync": ["sh", "-c", f"cp -r {src} {out} && sync"],
        "unshard" + FIRST_RUN: [*first, *unshard, "float32"],
        "unshard, transformers asked" + FIRST_RUN: [*first, *without_table, "float32"],
        "unshard": [*python, *unshard, "float32"],
        "unshard --no-sync": [*python, *unshard, "float32", "--no-sync"],
        "unshard --verify": [*python, *unshard, "float32", "--verify"],
        "unshard --workers 2": [*python, *unshard, "float32", "--workers", "2", "--max-shard-size", "1GB"],
        "unshard --dtype bfloat16": [*python, *unshard, "bfloat16"],
    }
    if layout == "verl":
        found["verl model_merger"] = verl_merger(src, str(out))
    if layout.startswith("zero"):
        found["zero_to_fp32.py"] = [
            str(peer_python("deepspeed")),
            str(src / "zero_to_fp32.py"),
            str(src),
            str(out),
            "--safe_serialization",
        ]
    if layout == "dcp":
        found["unshard (chunk headers unchecked)"] = [*python, *unchecked, "float32"]
        found["dcp_to_torch_save"] = [
            sys.executable,
            "-m",
            "torch.distributed.checkpoint.format_utils",
            "dcp_to_torch",
            str(src),
            str(out),
        ]
        found["accelerate merge-weights"] = [
            str(peer_python("accelerate")),
            "-m",
            "accelerate.commands.accelerate_cli",
            "merge-weights",
            str(src),
            str(out),
        ]
    return found


ROWS = {
    "merge": merge_rows,
    "slices": slices_rows,
    "moe": moe_rows,
    "search": search_rows,
    "extract-lora": extract_lora_rows,
    "gguf": gguf_rows,
    "way-back": way_back_rows,
    "quantize": quantize_rows,
}
