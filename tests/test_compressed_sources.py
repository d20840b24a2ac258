"""compressed-tensors checkpoints as sources: every preset scheme llm-compressor writes (int4/int8 packed, W8A8, FP8,
FP8 blocks, NVFP4, MXFP4, MXFP8), read dequantized bit for bit as compressed-tensors' own decompressors give it, a band
of rows at a time, into the full-precision folder; re-quantized or merged in the same pass; bad inputs one line.
The compressed folders are llm-compressor's (its data-free path on the shipped models, in its own venv), and the
oracle is each format's compressor's `decompress` (tests/fixtures/llmcompressor_oracle.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import SHIPPED
from test_cli_and_errors import leftovers, run_cli
from test_quantize import GROUPED, SCHEMES, oracle, tensors_of  # noqa: F401  (oracle: a fixture)

import unshard
from unshard.sources import dequantized

CASES = {"llama-fsdp2-q128-bf16": True, "llama-fsdp2-tp-q320": False}  # case -> every Linear's columns in groups of 128


@pytest.fixture(scope="module")
def compressed(tmp_path_factory, oracle):
    """case -> scheme -> (llm-compressor's folder, its decompressors' tensors)."""
    tmp = tmp_path_factory.mktemp("compressed")
    quantize, decompress = [], []
    for case, wide in CASES.items():
        unshard.convert(SHIPPED / case / "global_step_1", tmp / f"{case}-plain", progress=False)
        for scheme in SCHEMES:
            ignore = ["lm_head"] + ([] if wide or scheme not in GROUPED else ["re:.*down_proj$"])
            out = str(tmp / f"{case}-{scheme}")
            quantize.append({"src": str(tmp / f"{case}-plain"), "out": out, "scheme": scheme, "ignore": ignore})
            decompress.append({"src": out, "out": f"{out}-decompressed", "dtype": "float32"})
    oracle("quantize", quantize, tmp)
    oracle("dequantize", decompress, tmp)
    return {
        case: {
            scheme: (tmp / f"{case}-{scheme}", tensors_of(tmp / f"{case}-{scheme}-decompressed")) for scheme in SCHEMES
        }
        for case in CASES
    }


def assert_same_values(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    """Every tensor bit for bit; one the config's dtype makes wider than the decompressor's (an fp32 model's NVFP4
    and MX weights, which compressed-tensors gives in bf16) is its exact widening."""
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        mine = ours[name]
        assert mine.shape == tensor.shape, name
        if mine.dtype != tensor.dtype:
            assert (tensor.dtype, mine.dtype) == (torch.bfloat16, torch.float32), name
            tensor = tensor.float()
        assert mine.reshape(-1).view(torch.uint8).equal(tensor.reshape(-1).view(torch.uint8)), name


@pytest.mark.parametrize("case", CASES)
def test_every_scheme_reads_as_its_decompressor_gives_it(case, compressed, tmp_path, monkeypatch):
    """The tp-q320 case (fp32, 320-column down_proj) in bands of 5 float32 rows of 320 columns, or of the fewest
    rows a format allows above that: a block of FP8 rows, a word of packed zero points (8 rows, W4A16_ASYM)."""
    if case == "llama-fsdp2-tp-q320":
        monkeypatch.setattr(dequantized.DequantizedFolder, "BAND_BYTES", 5 * 320 * 4)
    for scheme, (folder, theirs) in compressed[case].items():
        result = unshard.convert(folder, tmp_path / scheme, progress=False, verify=True)
        assert_same_values(tensors_of(tmp_path / scheme), theirs)
        config = json.loads((tmp_path / scheme / "config.json").read_text())
        assert "quantization_config" not in config, scheme
        assert result.tensors == len(theirs)


def test_a_compressed_model_loads_and_runs_as_transformers_decompresses_it(compressed, oracle, tmp_path):
    """The dequantized folder is a plain model transformers loads with every tensor in place, and its logits are
    those of the compressed model that transformers loads through compressed-tensors."""
    jobs = []
    for scheme in ("W4A16_ASYM", "NVFP4A16"):
        folder, _ = compressed["llama-fsdp2-q128-bf16"][scheme]
        unshard.convert(folder, tmp_path / scheme, progress=False)
        jobs.append(
            {"plain": str(tmp_path / scheme), "quantized": str(folder), "dtype": "bfloat16", "plain_dtype": "bfloat16"}
        )
    for result in oracle("load", jobs, tmp_path):
        assert result["missing"] == [] and result["unexpected"] == [], result
        assert result["max_abs"] == 0, result


def test_requantized_and_merged_in_one_pass(compressed, tmp_path):
    """From W4A16 to FP8_DYNAMIC in one pass gives what two passes give (dequantize, then quantize); a merge takes a
    compressed model as it takes any."""
    folder, theirs = compressed["llama-fsdp2-q128-bf16"]["W4A16"]
    unshard.convert(folder, tmp_path / "fp8", quantize="FP8_DYNAMIC", quantize_ignore=["lm_head"], progress=False)
    unshard.convert(folder, tmp_path / "plain", progress=False)
    unshard.convert(
        tmp_path / "plain", tmp_path / "fp8-2", quantize="FP8_DYNAMIC", quantize_ignore=["lm_head"], progress=False
    )
    assert_same_values(tensors_of(tmp_path / "fp8"), tensors_of(tmp_path / "fp8-2"))

    recipe = tmp_path / "recipe.yml"
    recipe.write_text(
        json.dumps(
            {
                "merge_method": "linear",
                "dtype": "bfloat16",
                "models": [{"model": str(folder), "parameters": {"weight": 1.0}}],
            }
        )
    )
    code, _, err = run_cli("merge", recipe, tmp_path / "merged", "--no-progress")
    assert code == 0, err
    assert_same_values(tensors_of(tmp_path / "merged"), theirs)


def damaged(folder, tmp_path, change) -> object:
    """A copy of `folder` whose tensors `change` edits (a dict of name -> tensor, in place)."""
    from safetensors.torch import save_file

    copy = tmp_path / f"damaged-{len(list(tmp_path.glob('damaged-*')))}"
    shutil.copytree(folder, copy)
    tensors = tensors_of(copy)
    change(tensors)
    for path in copy.glob("*.safetensors"):
        path.unlink()
    (copy / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file(
        {n: t.contiguous() for n, t in tensors.items()}, str(copy / "model.safetensors"), metadata={"format": "pt"}
    )
    return copy


def test_bad_compressed_checkpoints_are_one_line_and_leave_nothing(compressed, tmp_path):
    w4a16, _ = compressed["llama-fsdp2-q128-bf16"]["W4A16"]
    asym, _ = compressed["llama-fsdp2-q128-bf16"]["W4A16_ASYM"]
    q_proj = "model.layers.0.self_attn.q_proj"
    cases = {
        "weight_scale is missing": damaged(w4a16, tmp_path, lambda t: t.pop(f"{q_proj}.weight_scale")),
        "not the [": damaged(
            w4a16, tmp_path, lambda t: t.__setitem__(f"{q_proj}.weight_scale", t[f"{q_proj}.weight_scale"][:, :1])
        ),
        "weight_zero_point is missing": damaged(asym, tmp_path, lambda t: t.pop(f"{q_proj}.weight_zero_point")),
    }
    rotated = tmp_path / "rotated"
    shutil.copytree(w4a16, rotated)
    config = json.loads((rotated / "config.json").read_text())
    config["quantization_config"]["transform_config"] = {"config_groups": {"u": {"type": "hadamard"}}}
    (rotated / "config.json").write_text(json.dumps(config))
    cases["rotated (transform_config)"] = rotated
    for said, src in cases.items():
        code, out, err = run_cli("convert", src, tmp_path / "out", "--no-progress")
        assert code != 0 and said in err and len(err.strip().splitlines()) == 1, (said, err)
        assert str(src) in err, err
        assert not (tmp_path / "out").exists() and not leftovers(tmp_path)


def test_inspect_says_what_is_dequantized(compressed):
    folder, _ = compressed["llama-fsdp2-q128-bf16"]["NVFP4A16"]
    code, out, err = run_cli("inspect", folder)
    assert code == 0, err
    assert "compressed-tensors nvfp4-pack-quantized" in out, out
