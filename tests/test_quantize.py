"""`--quantize`: compressed-tensors checkpoints written straight from the shards, equal to llm-compressor's.

llm-compressor runs from PyPI in its own venv (generate.PEERS; it pins its own transformers and
compressed-tensors) as the oracle: its data-free path (`oneshot` with a `QuantizationModifier`, then
`save_pretrained(save_compressed=True)`) on the folder unshard writes without --quantize, which the other
tests check bit for bit against the training model. The same venv's transformers then loads unshard's
quantized folders through compressed-tensors.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

import generate
import unshard
from conftest import SHIPPED
from test_cli_and_errors import run_cli

SCHEMES = ["W8A16", "W4A16", "W4A16_ASYM", "W8A8", "FP8_DYNAMIC", "FP8_BLOCK"]
# Columns in groups of 128 (FP8_BLOCK: the inputs'), so a 320-column down_proj is refused: left unquantized here.
GROUPED = {"W8A16", "W4A16", "W4A16_ASYM", "FP8_BLOCK"}
ORACLE = Path(generate.HERE) / "llmcompressor_oracle.py"


@pytest.fixture(scope="session")
def oracle():
    """Runs llmcompressor_oracle.py's task on a list of jobs in llm-compressor's venv; its JSON lines."""
    python = generate.peer_python("llmcompressor")

    def run(task: str, jobs: list[dict], tmp_path: Path) -> list[dict]:
        (tmp_path / f"{task}.json").write_text(json.dumps(jobs))
        done = subprocess.run([str(python), str(ORACLE), task, str(tmp_path / f"{task}.json")], capture_output=True,
                              text=True, timeout=900, env=dict(os.environ, HF_HUB_OFFLINE="1"))
        assert done.returncode == 0, done.stderr[-3000:]
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    return run


def tensors_of(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for path in folder.glob("*.safetensors"):
        with safe_open(path, "pt") as f:
            out.update({name: f.get_tensor(name) for name in f.keys()})
    return out


def assert_same_files(ours: Path, theirs: Path) -> None:
    """Every tensor bit for bit (fp8 compared as bytes), and the same quantization_config."""
    mine, expected = tensors_of(ours), tensors_of(theirs)
    assert sorted(mine) == sorted(expected)
    for name, tensor in expected.items():
        assert (mine[name].dtype, mine[name].shape) == (tensor.dtype, tensor.shape), name
        assert mine[name].reshape(-1).view(torch.uint8).equal(tensor.reshape(-1).view(torch.uint8)), name
    config = lambda folder: json.loads((folder / "config.json").read_text())["quantization_config"]  # noqa: E731
    assert config(ours) == config(theirs)


def ignore_for(scheme: str, wide: bool) -> list[str]:
    return [] if wide or scheme not in GROUPED else ["re:.*down_proj$"]


@pytest.mark.parametrize("case, wide", [("llama-fsdp2-q128-bf16", True), ("llama-fsdp2-tp-q320", False)])
def test_every_scheme_as_llm_compressor_writes_it(case, wide, fixture_case, oracle, tmp_path):
    """bf16 FSDP2 rank files whose Linear layers are multiples of 128 columns, and fp32 FSDP2 x TP ones
    (assembled in bands) with a 320-column down_proj, left unquantized where the scheme groups columns."""
    src = fixture_case(case) / "global_step_1"
    unshard.convert(src, tmp_path / "plain", progress=False)
    jobs, loads = [], []
    for scheme in SCHEMES:
        ignore = ignore_for(scheme, wide)
        result = unshard.convert(src, tmp_path / scheme, quantize=scheme, quantize_ignore=ignore, progress=False,
                                 verify=True)
        assert result.bytes < (tmp_path / "plain" / "model.safetensors").stat().st_size
        jobs.append({"src": str(tmp_path / "plain"), "out": str(tmp_path / f"oracle-{scheme}"), "scheme": scheme,
                     "ignore": ["lm_head", *ignore]})
        loads.append({"plain": str(tmp_path / "plain"), "quantized": str(tmp_path / scheme)})
        card = (tmp_path / scheme / "README.md").read_text()
        assert f"quantized: {scheme} (compressed-tensors" in card
    oracle("quantize", jobs, tmp_path)
    for scheme in SCHEMES:
        assert_same_files(tmp_path / scheme, tmp_path / f"oracle-{scheme}")

    # transformers loads each through compressed-tensors, every tensor in place. The logits' largest distance from
    # the unquantized model's, on a prompt, relative to their largest magnitude (random tiny models; measured:
    # W8A16 0.017, W8A8 0.025, FP8_DYNAMIC 0.09, FP8_BLOCK 0.09, W4A16 0.28, W4A16_ASYM 0.22 on the bf16 case).
    bound = {"W8A16": 0.05, "W8A8": 0.05, "FP8_DYNAMIC": 0.2, "FP8_BLOCK": 0.2, "W4A16": 0.5, "W4A16_ASYM": 0.5}
    for scheme, loaded in zip(SCHEMES, oracle("load", loads, tmp_path)):
        assert loaded["missing"] == [] and loaded["unexpected"] == [], loaded
        assert loaded["max_abs"] / loaded["scale"] < bound[scheme], (scheme, loaded)


def test_from_other_layouts_and_merges(oracle, tmp_path):
    """Quantizing happens after the tensors are whole: DCP, DeepSpeed ZeRO-3, Megatron's fused QKV over
    TP, a LoRA folded in, Qwen2, and a merge all give what llm-compressor gives on their unquantized output."""
    recipe = tmp_path / "recipe.yml"
    recipe.write_text(yaml.safe_dump({"merge_method": "linear", "dtype": "float32", "models": [
        {"model": str(SHIPPED / "llama-fsdp2" / "global_step_1"), "parameters": {"weight": 0.7}},
        {"model": str(SHIPPED / "llama-fsdp2-tp" / "global_step_1"), "parameters": {"weight": 0.3}}]}))
    sources = {
        "dcp": (SHIPPED / "llama-fsdp1-dcp" / "dcp", {"config_from": SHIPPED / "llama-fsdp1-dcp" / "hf"}),
        "zero3": (SHIPPED / "deepspeed-zero3" / "checkpoint-1", {}),
        "megatron": (SHIPPED / "megatron-qwen3-tp2-dp2" / "torch", {}),
        "lora": (SHIPPED / "llama-fsdp2-lora" / "global_step_1", {}),
        "qwen2": (SHIPPED / "qwen2-fsdp2" / "global_step_1", {}),  # a tied head (listed as ignored), q/k/v biases
    }
    jobs = []
    for name, (src, options) in sources.items():
        unshard.convert(src, tmp_path / f"{name}-plain", progress=False, **options)
    unshard.merge(recipe, tmp_path / "merge-plain", progress=False)
    for name in [*sources, "merge"]:
        for scheme in ("W8A8", "FP8_DYNAMIC"):  # (any column count)
            out = tmp_path / f"{name}-{scheme}"
            if name == "merge":
                unshard.merge(recipe, out, quantize=scheme, progress=False, verify=True)
            else:
                unshard.convert(sources[name][0], out, quantize=scheme, progress=False, verify=True, **sources[name][1])
            jobs.append({"src": str(tmp_path / f"{name}-plain"), "out": str(tmp_path / f"oracle-{name}-{scheme}"),
                         "scheme": scheme, "ignore": ["lm_head"]})
    oracle("quantize", jobs, tmp_path)
    for job in jobs:
        assert_same_files(Path(job["out"].replace("oracle-", "")), Path(job["out"]))


def test_bands_give_the_whole_tensor_s_encoding(tmp_path, monkeypatch):
    """A weight larger than a band is encoded band by band (memory: a band, not the weight); the file is
    the same bit for bit as when each weight is one band: zero points packed 8 rows to an int32 across
    bands, FP8 blocks of 128 rows, the last band short."""
    from unshard import execute

    src = SHIPPED / "llama-fsdp2-tp-q320" / "global_step_1"
    for scheme in ("W4A16_ASYM", "FP8_BLOCK", "FP8_DYNAMIC"):
        ignore = ignore_for(scheme, False)
        unshard.convert(src, tmp_path / f"whole-{scheme}", quantize=scheme, quantize_ignore=ignore, progress=False)
        monkeypatch.setattr(execute, "ENCODING_BAND_BYTES", 8 * 256 * 4)  # 8 rows of 256 fp32 columns: 40 bands of gate_proj
        unshard.convert(src, tmp_path / f"banded-{scheme}", quantize=scheme, quantize_ignore=ignore, progress=False,
                        verify=True)
        monkeypatch.undo()
        whole, banded = tensors_of(tmp_path / f"whole-{scheme}"), tensors_of(tmp_path / f"banded-{scheme}")
        assert sorted(whole) == sorted(banded)
        assert all(whole[n].reshape(-1).view(torch.uint8).equal(banded[n].reshape(-1).view(torch.uint8)) for n in whole)


def test_dry_run_and_inspect_say_what_is_quantized(tmp_path):
    src = str(SHIPPED / "llama-fsdp2-tp-q320" / "global_step_1")
    code, out, _ = run_cli("convert", src, tmp_path / "out", "--quantize", "w4a16", "--quantize-ignore", "re:.*down_proj$",
                            "--dry-run")
    assert code == 0 and not (tmp_path / "out").exists()
    assert "quantize     W4A16 (compressed-tensors pack-quantized): 12 Linear weights" in out
    assert "left as they are: 1 Linear layer(s) matching lm_head (e.g. lm_head)" in out
    assert "left as they are: 2 Linear layer(s) matching re:.*down_proj$ (e.g. model.layers.0.mlp.down_proj)" in out
    info = unshard.inspect(src, quantize="W4A16", quantize_ignore=("re:.*down_proj$",))["output"]
    plan = unshard.plan(src, quantize="W4A16", quantize_ignore=("re:.*down_proj$",))
    assert info["bytes"] == plan.total_bytes < unshard.plan(src).total_bytes
    assert info["quantize"]["ignored"]["model.layers.1.mlp.down_proj"] == "re:.*down_proj$"


def test_bad_requests_are_one_line_and_leave_nothing(tmp_path):
    src = str(SHIPPED / "llama-fsdp2-tp-q320" / "global_step_1")
    code, _, err = run_cli("convert", src, tmp_path / "out", "--quantize", "Q4_K")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "--quantize Q4_K: unknown scheme; known: W8A16, W4A16, W4A16_ASYM, W8A8, FP8_DYNAMIC, FP8_BLOCK" in err
    code, _, err = run_cli("convert", src, tmp_path / "out", "--quantize", "W4A16")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "model.layers.0.mlp.down_proj (320 columns)" in err and "--quantize-ignore" in err
    moe = SHIPPED / "megatron-mixtral-tp2-pp2-ep2" / "torch"
    code, _, err = run_cli("convert", moe, tmp_path / "out", "--quantize", "W8A8")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "mixture-of-experts" in err
    assert list(tmp_path.iterdir()) == []
