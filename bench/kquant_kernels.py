"""llama.cpp's K-quant kernels (what `--gguf-type q4_k_m` and llama-quantize spend their time in) as two builds of
llama.cpp compile them: as the tests' client builds llama-cpp-python (-O1, portable: GGML_NATIVE off, for a quick
compile) and as `pip install llama-cpp-python` builds it by default (Release: -O3, GGML_NATIVE on).

    python bench/kquant_kernels.py [--work /tmp/unshard-bench] [--bands 16] [--repeat 3]

Builds libggml-base of the pinned llama.cpp (llama-cpp-python 0.3.36's source package) both ways into WORK, then
times, taking turns, unshard's kquants.quantize (ggml_quantize_chunk on both cores, no importance matrix) of BANDS
bands of 4096 x 4096 float32 values in Q4_K and in Q6_K, q4_k_m's two types, with each library; and checks that both
builds write the same bytes. Prints a markdown table (input: the bf16 bytes of that many values) and appends the rows to
bench/results/results.jsonl.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "fixtures"))
from run import record, short_table, side_by_side  # noqa: E402

BUILDS = {
    "-O1, portable (the tests' client)": ["-DGGML_NATIVE=OFF", "-DCMAKE_C_FLAGS_RELEASE=-O1"],
    "-O3, native (pip's default)": ["-DGGML_NATIVE=ON"],
}
ROWS = 4096
# (run in a process of its own per library: unshard loads one library a process)
QUANTIZE = """
import hashlib, sys, numpy as np
from unshard.sinks.gguf import kquants
band = (np.random.default_rng(0).standard_normal(({rows}, {rows}), dtype=np.float32) * 0.02)
digest = hashlib.sha256()
for _ in range({bands}):
    digest.update(kquants.quantize(band, "{kind}"))
open(sys.argv[1], "w").write(digest.hexdigest())
"""


def llama_cpp_tree(work: Path) -> Path:
    """llama.cpp's whole source as llama-cpp-python's pinned source package vendors it, unpacked once into work."""
    import generate

    root = work / "llama.cpp-source"
    if not (root / "CMakeLists.txt").exists():
        with tempfile.TemporaryDirectory() as tmp:
            fetch = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
            subprocess.run([*fetch, generate.LLAMA_CPP_PYTHON, "-d", tmp], check=True)
            (archive,) = Path(tmp).glob("*.tar.gz")
            with tarfile.open(archive) as tar:
                vendored = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name]
                # (less its .git, a submodule's pointer into the package's own repository, which cmake asks git about)
                vendored = [m for m in vendored if not m.name.endswith("/vendor/llama.cpp/.git")]
                tar.extractall(tmp, members=vendored, filter="data")
            shutil.rmtree(root, ignore_errors=True)
            shutil.move(str(next(Path(tmp).glob("*/vendor/llama.cpp"))), root)
    return root


def build(source: Path, folder: Path, flags: list[str]) -> Path:
    """libggml-base of llama.cpp's source, compiled with these flags (once: kept in folder)."""
    library = folder / "bin" / "libggml-base.so"
    if not library.exists():
        off = [f"-DLLAMA_BUILD_{part}=OFF" for part in ("COMMON", "TESTS", "EXAMPLES", "TOOLS", "SERVER")]
        configure = ["cmake", "-S", str(source), "-B", str(folder), "-DCMAKE_BUILD_TYPE=Release", *flags, *off]
        quiet = dict(check=True, stdout=subprocess.DEVNULL)
        subprocess.run([*configure, "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_CURL=OFF"], **quiet)
        subprocess.run(["cmake", "--build", str(folder), "--target", "ggml-base", "-j2"], **quiet)
    return library


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/unshard-bench")
    ap.add_argument("--bands", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = Path(args.work)
    source = llama_cpp_tree(work)
    libraries = {name: build(source, work / f"ggml-{i}", flags) for i, (name, flags) in enumerate(BUILDS.items())}
    rows = []
    for kind in ("Q4_K", "Q6_K"):
        script = QUANTIZE.format(rows=ROWS, bands=args.bands, kind=kind)
        tools, digests = {}, {}
        for i, (name, library) in enumerate(libraries.items()):
            digests[name] = work / f"kquants-{i}.sha256"
            tools[f"{kind}, {name}"] = [
                "env",
                f"UNSHARD_GGML_LIBRARY={library}",
                sys.executable,
                "-c",
                script,
                str(digests[name]),
            ]
        runs = side_by_side(tools, args.repeat, [])
        written = {path.read_text() for path in digests.values()}
        assert len(written) == 1, f"{kind}: the builds wrote different bytes"
        rows += record("kquant-kernels", ROWS * ROWS * args.bands * 2 / 1e9, runs)
    print(short_table(rows))


if __name__ == "__main__":
    main()
