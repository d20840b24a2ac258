"""Benchmark unshard against the alternatives on the same checkpoints, in one run.

    python bench/run.py [--sizes 0.5,2,6]
        [--layouts verl,verl-tp,dcp,zero2,zero3,megatron,megatron-dist,megatron-moe,merge,slices,extract-lora,moe,
                   search,quantize,gguf,way-back]
                        [--repeat 3] [--cache warm|cold] [--work /tmp/unshard-bench] [--tools cp,unshard,...]

For each layout and size: make a real checkpoint (FSDP2, or tensor parallelism for verl-tp, by
bench/make_checkpoint.py; DeepSpeed by
tests/fixtures/make_deepspeed.py; Megatron-LM's legacy and torch_dist formats by megatron-core in
tests/fixtures/make_megatron.py, a Llama or, for megatron-moe, a DeepSeek-V3 in torch_dist; all under torchrun),
then time every tool on it, reading from a warm page cache (or, with --cache cold, from the disk: the
input's pages are dropped from the cache before each run), with no earlier output left to write back:
  cp                      copying the input bytes: the floor
  unshard (first run)     unshard convert (this checkout), its cache of transformers' answers emptied
  unshard, transformers asked (first run)  the same, as for a model the families' tables do not list
                          (the bench's Llamas are listed): transformers imported and asked
  unshard                 the same again: the next checkpoint of a model converted before
  unshard --verify        the same, then every written byte read back and compared with the source
  unshard --no-sync       the same, OUT put in place without its files synced to the disk first (scratch outputs)
  cp -r && sync           copying the input bytes, then syncing them: the floor of a durable copy
  unshard --workers 2     the same, 1 GB output files shared by two processes
  unshard --dtype bfloat16  the same, cast to bf16 (what a bf16 config asks for by default)
  verl model_merger       verl's own merger, `pip install --no-deps verl` and what its merger imports,
                          in its own venv (verl's FSDP rank files; it refuses a tensor-parallel mesh)
  dcp_to_torch_save       torch.distributed.checkpoint.format_utils dcp_to_torch (DCP only)
  accelerate merge-weights  from PyPI, in its own venv (DCP only)
  zero_to_fp32.py         DeepSpeed's own script, DeepSpeed from PyPI in its own venv (zero2 / zero3)
  (Megatron: no converter of Megatron checkpoints runs on a CPU-only machine, so unshard and cp only.)
  load_file, then dcp.save  layout "way-back" (the way back, from the verl layout's Hugging Face folder): torch's own
                          DCP writer on the whole state dict, against `unshard convert --to dcp` (and
                          `--to megatron`, against cp: no converter into Megatron runs without a GPU)
  load_file then torch.save per rank  layout "way-back": 8 rank files as a script writes them (the whole state
                          dict, each rank's rows cloned and saved), against `unshard convert --to fsdp --world-size 8`
  mergekit-yaml           the same TIES recipe as `unshard merge`, mergekit from PyPI in its own venv
                          (layout "merge": a base and two fine-tunes of the given size each; layout "slices":
                          a passthrough frankenmerge of the base's first half of layers and ft0's second
                          half twice, from the same folders)
  mergekit-extract-lora   layout "extract-lora": `unshard extract-lora ft0 base --rank 32` against mergekit's
                          extraction at --max-rank 32, on the same folders
  mergekit-moe            layout "moe": a Mixtral of ft0 and ft1 on the base, gate_mode hidden (the base run
                          on each expert's prompts; the test fixtures' tokenizer copied beside it), from the
                          same folders, `unshard merge-moe` against mergekit-moe
  merge-search            layout "search": 5 trials of `unshard merge-search` (task-arithmetic weights of ft0 and
                          ft1, scored on a short text file) against 5 trials by hand (bench/search_by_hand.py:
                          `unshard merge` to disk, transformers' from_pretrained, the same scoring); mergekit-evolve
                          needs vLLM or lm-eval on a GPU and does not run here
  convert_hf_to_gguf.py   layout "gguf": unshard convert to one GGUF file (f16, q8_0, q4_k_m) from the verl rank files,
                          against llama.cpp's converter (llama-cpp-python's source package, in its venv, as the tests
                          get it) on the same model's Hugging Face folder (converted untimed), the converter then
                          llama-quantize (q4_k_m: llama_model_quantize in llama-cpp-python's compiled llama.cpp, the
                          library unshard's K-quants call too), and against what users run today: verl's merger, then
                          the converter; the tokenizer is a SentencePiece model
  llm-compressor SCHEME   layout "quantize": unshard convert --quantize SCHEME from the verl rank files, against
                          llm-compressor's data-free path (load, oneshot, save_pretrained(save_compressed=True)),
                          from PyPI in its own venv, on the same model's Hugging Face folder (converted untimed);
                          in fp32, and in bf16 (both from the model's Hugging Face folder in bf16);
                          beside them, a plain conversion, one with --verify, --verify's CRC-32 check alone, and
                          `import torch` alone: the start-up any quantizer built on torch pays
Each tool runs --repeat times, the tools taking turns (this VM's disk varies over minutes). Reports
the median wall time and the range, peak RSS of the process tree, throughput and the ratio to `cp`
as a markdown table, appends every measurement with the machine and versions to
bench/results/results.jsonl, and plots time and peak memory against checkpoint size, one line per
tool, to docs/images/bench/<layout>.png (<layout>-cold.png for --cache cold), which the performance page shows.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import rows
from rows import FIRST_RUN, HERE, ROOT, peer_python


def sh(cmd: list[str], **kw) -> None:
    subprocess.run(cmd, check=True, **kw)


def make_checkpoint(work: Path, layout: str, gb: float) -> Path:
    """The layout's input of about `gb`, made once under `work` (kept, with a `done` mark, for the next run)."""
    if layout in ("quantize", "gguf", "way-back"):  # verl's rank files, and their conversion for other tools
        return _verl_and_its_folders(work, layout, gb)
    if layout in ("slices", "extract-lora", "moe", "search"):  # the merge benchmark's folders
        folder = make_checkpoint(work, "merge", gb)
        if layout in ("moe", "search"):  # prompts need a tokenizer: the test fixtures', as make_checkpoint.py uses
            from make_checkpoint import TOKENIZER

            for path in TOKENIZER.glob("tokenizer*"):
                shutil.copy(path, folder / "base" / path.name)
        return folder
    # (Both Megatron layouts come from one run of make_megatron.py, which writes both formats.)
    folder = work / f"{'megatron' if layout in ('megatron', 'megatron-dist') else layout}-{gb}gb"
    if (folder / "done").exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    if layout == "merge":  # three Hugging Face folders and a TIES recipe, written by transformers
        sh(
            [sys.executable, str(HERE / "make_models.py"), "--gb", str(gb), "--out", str(folder)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=HERE,
        )
        (folder / "done").write_text("")
        return folder
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", DS_BUILD_OPS="0")
    python, script = _training_run(layout, gb)
    run = [str(python), "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    sh(
        [*run, *script, "--out", str(folder)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT / "tests" / "fixtures",
    )
    (folder / "done").write_text("")
    return folder


def _training_run(layout: str, gb: float) -> tuple[Path, list[str]]:
    """The Python and the script (with its options) whose two ranks, under torchrun, train and save the layout's
    checkpoint of about `gb`."""
    fixtures = ROOT / "tests" / "fixtures"
    if layout.startswith("zero"):
        # DeepSpeed itself trains a step and saves; layers chosen so the fp32 weights are about `gb`.
        from make_checkpoint import FFN, HIDDEN, VOCAB, layers_for

        size = [str(HIDDEN), str(layers_for(gb)), str(VOCAB), str(FFN)]
        return peer_python("deepspeed"), [str(fixtures / "make_deepspeed.py"), "--stage", layout[-1], "--size", *size]
    if layout == "megatron-moe":
        # megatron-core itself, a DeepSeek-V3 (multi-latent attention, 8 experts and a shared one, a dense first
        # layer, an MTP layer) over TP2 x EP2, 32 layers widened until the weights are about `gb` (width 8 makes
        # 0.6 GB; the size grows with the square of the width).
        width = max(1, round(8 * (gb / 0.6) ** 0.5))
        script = [str(fixtures / "make_megatron.py"), "--model", "deepseek_v3"]
        return Path(sys.executable), [
            *script,
            "--tp",
            "2",
            "--pp",
            "1",
            "--ep",
            "2",
            "--width",
            str(width),
            "--layers",
            "32",
        ]
    if layout.startswith("megatron"):
        # megatron-core itself, TP2, 32 Llama-shaped layers widened until the weights are about `gb`
        # (width 16 makes 0.96 GB; the size grows with the square of the width).
        width = max(1, round(16 * (gb / 0.96) ** 0.5))
        script = [str(fixtures / "make_megatron.py"), "--tp", "2", "--pp", "1", "--width", str(width), "--layers", "32"]
        return Path(sys.executable), script
    return Path(sys.executable), [str(HERE / "make_checkpoint.py"), "--gb", str(gb), "--writer", layout]


def _verl_and_its_folders(work: Path, layout: str, gb: float) -> Path:
    """verl's rank files, and their Hugging Face folder (the converter's and llm-compressor's input; the gguf
    layout's with a SentencePiece tokenizer, which the converter takes without knowing its hash; a bf16 one beside
    for the quantize layout, as most models are)."""
    folder = make_checkpoint(work, "verl", gb)
    hf = folder / "ckpt" / "actor" / "huggingface"
    if layout == "gguf" and not (hf / "tokenizer.model").exists():
        spm = (
            ROOT / "tests" / "fixtures" / "checkpoints" / "llama-fsdp2-spm" / "global_step_1" / "actor" / "huggingface"
        )
        (hf / "tokenizer.json").unlink(missing_ok=True)
        for name in ("tokenizer.model", "tokenizer_config.json"):
            shutil.copyfile(spm / name, hf / name)
        shutil.rmtree(folder / "hf-model", ignore_errors=True)
    convert = [sys.executable, "-m", "unshard", "convert", str(folder / "ckpt")]
    if not (folder / "hf-model" / "config.json").exists():
        sh([*convert, str(folder / "hf-model"), "--overwrite", "--no-progress"], stderr=subprocess.DEVNULL)
    if layout == "quantize" and not (folder / "hf-model-bf16" / "config.json").exists():
        bf16 = [str(folder / "hf-model-bf16"), "--overwrite", "--no-progress", "--dtype", "bfloat16"]
        sh([*convert, *bf16], stderr=subprocess.DEVNULL)
    return folder


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def source(layout: str, folder: Path) -> Path:
    if layout == "way-back":  # (the way back: a Hugging Face folder into a training checkpoint)
        return folder / "hf-model"
    if layout in ("merge", "slices", "moe", "search"):
        return folder
    if layout == "extract-lora":
        return folder / "ft0"
    if layout.startswith("megatron"):
        return folder / ("torch" if layout == "megatron" else "torch_dist")
    return folder / "checkpoint-1" if layout.startswith("zero") else folder / "ckpt"


def first_run_cache(cache: Path) -> Path:
    """The first-run row's own cache, emptied before each of its runs (the other rows keep theirs)."""
    return cache.with_name(cache.name + "-first-run")


def tools(layout: str, folder: Path, out: Path, cache: Path) -> dict[str, list[str]]:
    """The commands to time, in order (rows.py). unshard remembers what transformers said about a model
    (known.py): its first-run row starts from an empty cache of its own (a model converted for the
    first time); the other unshard rows find their answers in theirs, filled by an untimed run (the
    next checkpoint of the same run)."""
    src = source(layout, folder)
    python, first = (["env", f"UNSHARD_CACHE={c}", sys.executable] for c in (cache, first_run_cache(cache)))
    if layout in rows.ROWS:
        return rows.ROWS[layout](src, folder, out, python, first)
    return rows.convert_rows(layout, src, folder, out, python, first)


def measure(cmd: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, str(HERE / "timed.py"), "--", *cmd], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def summarise(runs: list[dict]) -> dict:
    """Several runs of one tool: the median time (this VM's disk varies run to run), every run's
    time, the highest peak memory; a failed run is reported as the result."""
    failed = [r for r in runs if r["returncode"]]
    times = sorted(r["seconds"] for r in runs)
    return {
        **(failed[0] if failed else runs[0]),
        "seconds": times[len(times) // 2],
        "runs": [r["seconds"] for r in runs],
        "peak_rss": max(r["peak_rss"] for r in runs),
    }


def spread(row: dict) -> str:
    runs = row.get("runs") or [row["seconds"]]
    return f"({min(runs):.1f}–{max(runs):.1f})" if len(runs) > 1 else ""


def versions() -> dict:
    import torch

    import unshard

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "unshard": unshard.__version__,
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "host": platform.node(),
        "cpu": cpu_model(),
    }


def side_by_side(tools: dict[str, list[str]], repeat: int, outputs: list[Path]) -> dict[str, list[dict]]:
    """Each tool `repeat` times, the tools taking turns (this VM's disk has slow spells), the `outputs` of the run
    before removed and synced away first; every run's measurement."""
    runs: dict[str, list[dict]] = {name: [] for name in tools}
    for _ in range(repeat):
        for name, cmd in tools.items():
            for output in outputs:
                shutil.rmtree(output, ignore_errors=True)
            subprocess.run(["sync"], check=True)
            runs[name].append(measure(cmd))
    return runs


def record(layout: str, gb: float, runs: dict[str, list[dict]]) -> list[dict]:
    """The rows of one input (median of each tool's runs, the machine and versions), appended to results.jsonl."""
    rows = [{"layout": layout, "gb": gb, "tool": name, **summarise(each), **versions()} for name, each in runs.items()]
    with open(HERE / "results" / "results.jsonl", "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return rows


def short_table(rows: list[dict]) -> str:
    """Input, tool, median wall time with its range, peak RSS: a markdown table."""
    lines = ["| input | tool | wall s, median (range) | peak RSS |", "|---|---|---|---|"]
    for row in rows:
        took = f"{row['seconds']:.1f} {spread(row)}"
        lines.append(f"| {row['gb']:.2f} GB | {row['tool']} | {took} | {row['peak_rss'] / 1e9:.2f} GB |")
    return "\n".join(lines)


def cpu_model() -> str:
    """The CPU's model name: each session's machine may be another (the plots keep one machine's rows)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="0.5,2,6")
    ap.add_argument("--layouts", default="verl,dcp")
    ap.add_argument("--work", default="/tmp/unshard-bench")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each tool; the median time is reported")
    ap.add_argument("--tools", help="only the tools whose names are in this comma-separated list")
    ap.add_argument(
        "--cache",
        choices=("warm", "cold"),
        default="warm",
        help="input read from memory (warm) or from the disk (cold) by every tool",
    )
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    # unshard's modules compiled to bytecode, as `pip install` compiles them and as the peers' venvs have theirs:
    # this checkout is an editable install, and where PYTHONDONTWRITEBYTECODE is set (as on this project's
    # machines) every run would compile them again (0.1 s).
    compileall.compile_dir(str(ROOT / "src" / "unshard"), quiet=1)
    rows, stamp = [], time.strftime("%Y-%m-%dT%H:%M:%S")
    for layout in args.layouts.split(","):
        for gb in [float(s) for s in args.sizes.split(",")]:
            folder = make_checkpoint(work, layout, gb)
            nbytes = size_of(source(layout, folder))
            shutil.rmtree(work / "out", ignore_errors=True)
            (work / "out.pt").unlink(missing_ok=True)
            free = shutil.disk_usage(work).free
            if free < nbytes * 1.05:  # `cp` writes a copy of the input, the largest output of any tool
                sys.exit(
                    f"{work}: {free / 1e9:.1f} GB free, and copying the {layout} {gb} GB input needs "
                    f"{nbytes / 1e9:.1f} GB: free some space or pass --work on a larger disk"
                )
            commands = tools(layout, folder, work / "out", work / "unshard-cache")
            if args.tools:
                commands = {name: cmd for name, cmd in commands.items() if name in args.tools.split(",")}
            if "dcp_to_torch_save" in commands:
                commands["dcp_to_torch_save"][-1] = str(work / "out.pt")
            shutil.rmtree(work / "unshard-cache", ignore_errors=True)
            for name, cmd in commands.items():  # untimed: the answers a model's next checkpoints find
                if name.startswith("unshard") and not name.endswith(FIRST_RUN):
                    shutil.rmtree(work / "out", ignore_errors=True)
                    subprocess.run(cmd, capture_output=True)
            runs: dict[str, list[dict]] = {name: [] for name in commands}
            # Round robin: every tool once, then every tool again. This VM's disk speeds up and slows
            # down over minutes; taking turns gives each tool the same mix of fast and slow periods,
            # where running one tool's repeats back to back can hand it all of a slow one.
            for _ in range(args.repeat):
                for name, cmd in commands.items():
                    if any(r["returncode"] for r in runs[name]):
                        continue  # failed once: reported as failed, not run again
                    shutil.rmtree(work / "out", ignore_errors=True)
                    (work / "out.pt").unlink(missing_ok=True)
                    if name.endswith(FIRST_RUN):
                        shutil.rmtree(first_run_cache(work / "unshard-cache"), ignore_errors=True)
                    sh(["sync"])  # every tool starts with nothing of the previous one's output left to write back
                    start_cache(args.cache, [p for p in source(layout, folder).rglob("*") if p.is_file()])
                    runs[name].append(measure(cmd))
            for name in commands:
                result = summarise(runs[name])
                rows.append(
                    {
                        "when": stamp,
                        "layout": layout,
                        "cache": args.cache,
                        "gb": gb,
                        "input_bytes": nbytes,
                        "tool": name,
                        **result,
                    }
                )
                print(
                    f"{layout} {gb} GB {name}: {result['seconds']:.1f}s {spread(result)}, "
                    f"peak {result['peak_rss'] / 1e9:.2f} GB"
                    + (f" FAILED: {result['stderr'][-300:]}" if result["returncode"] else ""),
                    flush=True,
                )
    shutil.rmtree(work / "out", ignore_errors=True)
    (work / "out.pt").unlink(missing_ok=True)
    meta = versions()
    (HERE / "results").mkdir(exist_ok=True)
    with open(HERE / "results" / "results.jsonl", "a") as f:
        for row in rows:
            f.write(json.dumps({**row, **meta}) + "\n")
    print(table(rows))
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # the numbers are saved; the plots can wait
        print("no plots: matplotlib is missing (pip install -e '.[bench]')", file=sys.stderr)
        return
    for layout in {r["layout"] for r in rows}:
        name = layout if args.cache == "warm" else f"{layout}-{args.cache}"
        print("plot:", plot(latest(layout, args.cache), ROOT / "docs" / "images" / "bench" / f"{name}.png"))


def start_cache(state: str, files: list[Path]) -> None:
    """Warm: read every input file, so every tool reads from memory. Cold: drop the files' pages
    from the page cache (clean pages of files we can read; no root needed), so every tool reads the disk."""
    if state == "warm":
        sh(["cat", *map(str, files)], stdout=subprocess.DEVNULL)
        return
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def latest(layout: str, cache: str) -> list[dict]:
    """The newest measurement of each (size, tool) in results.jsonl, so a run of some sizes does
    not drop the others from the plot; of the machine that made the newest (times from two machines
    are not one curve)."""
    newest: dict[tuple, dict] = {}
    rows = [json.loads(line) for line in (HERE / "results" / "results.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["layout"] == layout and r.get("cache", "warm") == cache]
    machine = (rows[-1].get("cpu"), rows[-1]["machine"]) if rows else None
    for row in rows:
        if (row.get("cpu"), row["machine"]) == machine:
            newest[(row["gb"], row["tool"])] = row  # the file is in time order
    return list(newest.values())


def plot(rows: list[dict], path: Path) -> Path:
    """Wall time and peak memory against input size, one line per tool."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import psutil

    memory = psutil.virtual_memory().total
    fig, (time_ax, mem_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    tools = list(dict.fromkeys(r["tool"] for r in rows))
    if len(tools) > 10:  # (tab10's colours would repeat)
        time_ax.set_prop_cycle(color=plt.cm.tab20.colors)
    for tool in tools:
        mine = sorted((r for r in rows if r["tool"] == tool and r["returncode"] == 0), key=lambda r: r["input_bytes"])
        size = [r["input_bytes"] / 1e9 for r in mine]
        line = time_ax.plot(size, [r["seconds"] for r in mine], marker="o", label=tool)[0]
        mem_ax.plot(size, [r["peak_rss"] / 1e9 for r in mine], marker="o", label=tool, color=line.get_color())
        # A failed run is a cross where it stopped, and why: a tool the machine could not hold is a result.
        for r in (r for r in rows if r["tool"] == tool and r["returncode"] != 0):
            out_of_memory = r["returncode"] == -9 and r["peak_rss"] > 0.8 * memory  # (the kernel's SIGKILL)
            why = "killed: out of memory" if out_of_memory else "failed"
            for ax, y in ((time_ax, r["seconds"]), (mem_ax, r["peak_rss"] / 1e9)):
                ax.plot(r["input_bytes"] / 1e9, y, marker="x", markersize=10, color=line.get_color())
                ax.annotate(
                    why,
                    (r["input_bytes"] / 1e9, y),
                    textcoords="offset points",
                    xytext=(-8, -4),
                    ha="right",
                    va="top",
                    fontsize=8,
                    color=line.get_color(),
                )
    if any(r["returncode"] for r in rows):  # what a run that failed for memory ran into
        mem_ax.axhline(memory / 1e9, color="grey", linestyle="--", linewidth=1)
        mem_ax.annotate(
            "this machine's memory",
            (0, memory / 1e9),
            xycoords=("axes fraction", "data"),
            textcoords="offset points",
            xytext=(4, -4),
            va="top",
            fontsize=8,
            color="grey",
        )
    for ax, what in ((time_ax, "wall time (s)"), (mem_ax, "peak RSS of the process tree (GB)")):
        ax.set_xlabel("checkpoint size (GB)")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
    time_ax.legend(fontsize=8 if len(tools) > 8 else None)
    fig.suptitle(f"{rows[0]['layout']} checkpoints, {versions()['machine']}, {rows[0].get('cache', 'warm')} page cache")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ratio(row: dict, floor: dict) -> str:
    """The row's time over `cp`'s on the same input ("-" where no copy was timed: extract-lora, search)."""
    copied = floor.get((row["layout"], row["gb"]))
    return f"{row['seconds'] / copied:.1f}" if copied else "-"


def table(rows: list[dict]) -> str:
    floor = {(r["layout"], r["gb"]): r["seconds"] for r in rows if r["tool"] == "cp"}
    lines = [
        "| layout | size | tool | wall s, median (range) | × cp | peak RSS GB | GB/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ok = r["returncode"] == 0
        lines.append(
            f"| {r['layout']} | {r['input_bytes'] / 1e9:.2f} GB | {r['tool']} | "
            f"{r['seconds']:.1f} {spread(r)}{'' if ok else ' (failed)'} | {ratio(r, floor)} | "
            f"{r['peak_rss'] / 1e9:.2f} | {r['input_bytes'] / 1e9 / r['seconds']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
