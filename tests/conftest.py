from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(FIXTURES))

import generate  # noqa: E402  (tests/fixtures/generate.py)

SHIPPED = FIXTURES / "checkpoints"

CONVERT_AND_SAY_IMPORTS = """
import sys
if sys.argv.pop() == "without-table":
    from unshard import families
    families.TENSOR_TABLES.clear()
from unshard.cli import main
code = main(["convert", sys.argv[1], sys.argv[2], "--no-progress"])
print("IMPORTED", "transformers" in sys.modules, "torch" in sys.modules)
sys.exit(code)
"""


def convert_in_subprocess(src, out, cache, table=True) -> tuple[bool, bool]:
    """Convert in a fresh process with this cache of transformers' answers (or "off"), with or without
    the families' tensor tables: whether it imported (transformers, torch)."""
    done = subprocess.run(
        [sys.executable, "-c", CONVERT_AND_SAY_IMPORTS, str(src), str(out), "with-table" if table else "without-table"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, UNSHARD_CACHE=str(cache)),
    )
    assert done.returncode == 0, done.stderr
    line = next(li for li in done.stdout.splitlines() if li.startswith("IMPORTED"))
    return line.split()[1] == "True", line.split()[2] == "True"


def tied_qwen2(folder: Path):
    """A tiny Qwen2 whose head is tied to its embedding, as transformers saves it into `folder`: the model."""
    import torch
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    model.save_pretrained(folder)
    return model


# The test files in the order they run, by the peer venv each needs first: CI makes the peer venvs in the background
# (generate.py --peers: mergekit's in a minute, llama.cpp compiled by about 7, torchtitan's and torchtune's by 11,
# llm-compressor's by 10, verl's by 13, torchvision's by 15, on 2 cores of an AMD EPYC beside the tests), and a test
# that needs one before it is made waits with its worker idle. So the files that need none run first (about 8 minutes
# of both workers), then each group after its venv is made (from scratch on that machine: 48:15 in alphabetical
# order, 43:26 in this one). A file not listed runs first.
ORDER = (
    # none
    ("test_fsdp_convert.py", "test_fuzz.py", "test_megatron.py", "test_scale_out.py", "test_cli_and_errors.py"),
    ("test_merge_search.py", "test_fast_paths.py", "test_deepspeed.py", "test_docs.py", "test_dense_families.py"),
    ("test_remote_sources.py", "test_hf_pickles.py", "test_durability.py", "test_fp8_sources.py", "test_families.py"),
    ("test_colossalai.py", "test_vlm.py", "test_lora.py"),
    ("test_extract_lora.py", "test_merge.py", "test_merge_vocabulary.py"),  # mergekit
    ("test_gguf_families.py", "test_gguf.py", "test_gguf_newer_architectures.py", "test_gguf_qwen_vl.py"),  # llama.cpp
    ("test_gguf_kimi_k25.py", "test_gguf_embeddings.py", "test_gguf_lora.py", "test_gguf_split.py"),
    ("test_gguf_not_written.py", "test_gguf_granite_vision.py"),
    ("test_gguf_gemma4_unified.py",),
    ("test_way_back.py", "test_meta_llama.py"),  # torchtitan, torchtune
    ("test_quantize.py", "test_moe.py", "test_compressed_sources.py"),  # llm-compressor
    ("test_to_fsdp.py", "test_verl_and_hub.py"),  # verl
    ("test_gguf_mmproj.py", "test_gguf_muse_glimmer.py", "test_gguf_gemma3n.py"),  # torchvision
)
RANK = {name: rank for rank, name in enumerate(name for group in ORDER for name in group)}
# Within a file, its tests that need no peer venv first: the first of a group's files otherwise waits for its venv with
# its worker idle (from scratch on that machine: 228 s for llama.cpp's converter) while tests of it that need none wait
# behind. A test needs one by these fixtures, or by calling these functions itself (only the order depends on it)
PEER_FIXTURES = {"converter", "llama_cpp", "ggml_library", "oracle", "mergekit", "models", "lora_adapter", "compressed"}
PEER_CALLS = {
    "llama_cpp_client",
    "peer_python",
    "llama_cpp_source",
    "torchvision_image_features",
    "unshard_in_the_torchvision_venv",
    "unshard_files",
    "unshard_with_llama_cpp_gguf_py",
    "unshard_commands_with_llama_cpp_gguf_py",
    "assert_llama_quantize_mixes_it",
}


def _needs_a_peer(item) -> bool:
    code = getattr(getattr(item, "function", None), "__code__", None)
    return bool(PEER_FIXTURES & set(getattr(item, "fixturenames", ()))) or bool(
        code is not None and PEER_CALLS & set(code.co_names)
    )


def pytest_collection_modifyitems(items):
    """The test files in ORDER (pytest-xdist's --dist loadfile hands them out in the order collected), and within
    each, the tests that need no peer venv first (stable: otherwise each file's tests stay in their order)."""
    items.sort(key=lambda item: (RANK.get(item.path.name, -1), _needs_a_peer(item)))


@pytest.fixture(scope="session", autouse=True)
def transformers_answers_cache(tmp_path_factory):
    """unshard keeps what transformers said about configs (known.py); the tests keep theirs apart
    from the user's, and start empty so both the asking and the remembering paths run."""
    import os

    os.environ["UNSHARD_CACHE"] = str(tmp_path_factory.mktemp("unshard-cache"))
    yield
    os.environ.pop("UNSHARD_CACHE", None)


@pytest.fixture(scope="session")
def fresh_fixtures(tmp_path_factory):
    """Fixtures generated now with the installed torch / transformers, once per case per run: pytest-xdist's
    workers share them (the first to need a case makes it while a file lock keeps the other waiting)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "fresh"
    root.mkdir(exist_ok=True)

    def get(case: str) -> Path:
        with open(root / f".{case}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            made = root / f".{case}.made"
            if not made.exists():
                generate.generate(case, root)
                made.touch()
        return root / case

    return get


@pytest.fixture(params=["shipped", "fresh"])
def fixture_case(request, fresh_fixtures):
    """A function case -> fixture folder, for the shipped copy and for a freshly generated one.

    Cases marked `fresh=False` in generate.py vary the writer path, dtype, file format, widths, tokenizer or mesh
    of a case that is regenerated (a few representative writers); they run on their shipped copy only, to keep the
    suite's time in bounds. The output formats'
    tests (test_gguf, test_quantize) take the shipped copies alone: what they test is the sink, and what feeds
    it, the planned tensors, is tested on every fresh copy (test_fsdp_convert, test_megatron).
    """
    if request.param == "shipped":
        return lambda case: SHIPPED / case

    def get(case: str) -> Path:
        if not generate.CASES[case].fresh:
            pytest.skip(f"{case}: shipped copy only (a variant of a regenerated case)")
        return fresh_fixtures(case)

    return get
