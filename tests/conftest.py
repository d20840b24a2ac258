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


# Test files whose peer venv CI makes in the background (generate.py --peers) while llama.cpp compiles: run where
# their names put them (second, third), they kept the other tests waiting for it. Run last, in this order.
LAST = ("test_compressed_sources.py",)
# And test files run where another name would put them: test_gguf.py and test_gguf_families.py (about a sixth of the
# suite, one file for each worker) need llama.cpp compiled, about 15 minutes into a CI run; where its own name put
# test_gguf.py, on two workers, it waited 586 s for it.
AS_IF_NAMED = {"test_gguf.py": "test_n", "test_gguf_families.py": "test_n"}


def pytest_collection_modifyitems(items):
    """The tests of LAST at the end: the compressed-tensors sources need llm-compressor's peer venv (174 s in setup
    where their name put them)."""

    def place(item) -> tuple[int, str]:
        name = item.path.name
        return (LAST.index(name) + 1 if name in LAST else 0, AS_IF_NAMED.get(name, name))

    items.sort(key=place)  # (stable: each file's tests stay in their order)


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
