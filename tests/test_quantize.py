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
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

import generate
import unshard
from conftest import SHIPPED
from test_cli_and_errors import run_cli

SCHEMES = ["W8A16", "W4A16", "W4A16_ASYM", "W8A8", "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16", "MXFP4A16", "MXFP4", "MXFP8A16",
           "MXFP8"]
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


def load_job(plain: Path, quantized: Path, scheme: str, dtype: str = "auto", **extra) -> dict:
    """A job of the oracle's `load` (compressed-tensors decompresses MX and NVFP4 weights to bf16 whatever the model's
    dtype, so those folders run in bf16)."""
    bf16 = scheme.startswith(("MX", "NVFP4"))
    return {"plain": str(plain), "quantized": str(quantized), "dtype": "bfloat16" if bf16 else dtype,
            **extra}


def assert_loaded_within(loaded: list[dict], schemes: list[str], bound: dict[str, float]) -> None:
    """Every tensor in place, and the logits' largest distance from the unquantized model's, relative to their
    largest magnitude, within each scheme's bound."""
    for scheme, result in zip(schemes, loaded):
        assert result["missing"] == [] and result["unexpected"] == [], result
        assert result["max_abs"] / result["scale"] < bound[scheme], (scheme, result)


def ignore_for(scheme: str, wide: bool) -> list[str]:
    return [] if wide or scheme not in GROUPED else ["re:.*down_proj$"]


@pytest.mark.parametrize("case, wide", [("llama-fsdp2-q128-bf16", True), ("llama-fsdp2-tp-q320", False)])
def test_every_scheme_as_llm_compressor_writes_it(case, wide, oracle, tmp_path):
    """bf16 FSDP2 rank files whose Linear layers are multiples of 128 columns, and fp32 FSDP2 x TP ones
    (assembled in bands) with a 320-column down_proj, left unquantized where the scheme groups columns."""
    src = SHIPPED / case / "global_step_1"
    unshard.convert(src, tmp_path / "plain", progress=False)
    jobs, loads = [], []
    for scheme in SCHEMES:
        ignore = ignore_for(scheme, wide)
        result = unshard.convert(src, tmp_path / scheme, quantize=scheme, quantize_ignore=ignore, progress=False,
                                 verify=True)
        assert result.bytes < (tmp_path / "plain" / "model.safetensors").stat().st_size
        jobs.append({"src": str(tmp_path / "plain"), "out": str(tmp_path / f"oracle-{scheme}"), "scheme": scheme,
                     "ignore": ["lm_head", *ignore]})
        loads.append(load_job(tmp_path / "plain", tmp_path / scheme, scheme))
        card = (tmp_path / scheme / "README.md").read_text()
        assert f"quantized: {scheme} (compressed-tensors" in card
    oracle("quantize", jobs, tmp_path)
    for scheme in SCHEMES:
        assert_same_files(tmp_path / scheme, tmp_path / f"oracle-{scheme}")

    # transformers loads each through compressed-tensors, every tensor in place. The logits' largest distance from
    # the unquantized model's, on a prompt, relative to their largest magnitude (random tiny models; measured:
    # W8A16 0.017, W8A8 0.025, FP8_DYNAMIC 0.09, FP8_BLOCK 0.09, W4A16 0.28, W4A16_ASYM 0.22 on the bf16 case; run in bf16,
    # MXFP8A16 0.04-0.08, MXFP8 0.09-0.11, MXFP4A16 0.23-0.24, MXFP4 0.30-0.49, its inputs quantized to FP4 too;
    # NVFP4A16 0.19-0.26).
    bound = {"W8A16": 0.05, "W8A8": 0.05, "FP8_DYNAMIC": 0.2, "FP8_BLOCK": 0.2, "W4A16": 0.5, "W4A16_ASYM": 0.5,
             "NVFP4A16": 0.5, "MXFP8A16": 0.15, "MXFP8": 0.2, "MXFP4A16": 0.5, "MXFP4": 0.65}
    assert_loaded_within(oracle("load", loads, tmp_path), SCHEMES, bound)


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
    # W8A8 and FP8_DYNAMIC take any column count; NVFP4A16's global scale, shared by q, k and v (and by gate and up),
    # is surveyed from Megatron's fused QKV split three ways and from a merge (its 90-column down_proj left out).
    quantized = [(name, scheme, []) for name in [*sources, "merge"] for scheme in ("W8A8", "FP8_DYNAMIC")]
    quantized += [("megatron", "NVFP4A16", []), ("merge", "NVFP4A16", ["re:.*down_proj$"])]
    for name, scheme, ignore in quantized:
        out = tmp_path / f"{name}-{scheme}"
        if name == "merge":
            unshard.merge(recipe, out, quantize=scheme, quantize_ignore=ignore, progress=False, verify=True)
        else:
            unshard.convert(sources[name][0], out, quantize=scheme, quantize_ignore=ignore, progress=False, verify=True,
                            **sources[name][1])
        jobs.append({"src": str(tmp_path / f"{name}-plain"), "out": str(tmp_path / f"oracle-{name}-{scheme}"),
                     "scheme": scheme, "ignore": ["lm_head", *ignore]})
    oracle("quantize", jobs, tmp_path)
    for job in jobs:
        assert_same_files(Path(job["out"].replace("oracle-", "")), Path(job["out"]))


# A Mixtral checkpoint names its experts' projections w1 (gate), w3 (up), w2 (down), as vLLM's Mixtral loader reads
# them; llm-compressor, which quantizes each expert as a Linear layer, saves them as gate_proj, up_proj, down_proj.
MIXTRAL_EXPERTS = {".w1.": ".gate_proj.", ".w3.": ".up_proj.", ".w2.": ".down_proj."}


def as_llm_compressor_names(folder: Path) -> Path:
    """A Mixtral folder with its experts renamed as llm-compressor names them (other folders as they are)."""
    tensors = tensors_of(folder)
    if not any(".w1." in name for name in tensors):
        return folder
    renamed = folder.with_name(folder.name + "-renamed")
    renamed.mkdir()
    for old, new in MIXTRAL_EXPERTS.items():
        tensors = {name.replace(old, new): tensor for name, tensor in tensors.items()}
    from safetensors.torch import save_file

    save_file(tensors, renamed / "model.safetensors")
    (renamed / "config.json").write_text((folder / "config.json").read_text())
    return renamed


@pytest.mark.parametrize("case, schemes", [
    ("qwen3moe-fsdp2-q128", SCHEMES),  # experts fused per projection in the rank files (transformers 5), 128 wide
    ("qwen2moe-fsdp2", ["W8A8", "FP8_DYNAMIC"]),  # a shared expert behind a one-row gate
    ("mixtral-fsdp2", ["W8A8"]),
    ("megatron-mixtral-tp2-pp2-ep2", ["FP8_DYNAMIC"]),  # experts over expert parallelism, in Megatron's names
    ("megatron-qwen3moe-pp2-ep2-dp2", ["W8A8"]),
])
def test_mixture_of_experts_as_llm_compressor_writes_it(case, schemes, oracle, tmp_path):
    """llm-compressor quantizes each expert as a Linear layer and leaves the routers (listed in the config's
    ignore list whatever the patterns, as compressed-tensors counts them as Linear layers); unshard writes
    the same tensors bit for bit, each expert a band at a time, from every layout that holds experts.
    Mixtral's keep their checkpoint's names (w1, w2, w3): compared under llm-compressor's."""
    from unshard.sinks.compressed_tensors import DEFAULT_IGNORE

    src = SHIPPED / case / ("torch" if case.startswith("megatron") else "global_step_1")
    unshard.convert(src, tmp_path / "plain", progress=False)
    jobs, loads = [], []
    for scheme in schemes:
        unshard.convert(src, tmp_path / scheme, quantize=scheme, progress=False, verify=True)
        jobs.append({"src": str(tmp_path / "plain"), "out": str(tmp_path / f"oracle-{scheme}"), "scheme": scheme,
                     "ignore": list(DEFAULT_IGNORE)})
        loads.append(load_job(tmp_path / "plain", tmp_path / scheme, scheme, "float32", moe=True))
    oracle("quantize", jobs, tmp_path)
    layers = json.loads((tmp_path / "plain" / "config.json").read_text())["num_hidden_layers"]
    for scheme in schemes:
        ignored = json.loads((tmp_path / scheme / "config.json").read_text())["quantization_config"]["ignore"]
        assert ignored[-1] == "lm_head" and [m.rsplit(".", 1)[-1] for m in ignored].count("gate") == layers
        assert_same_files(as_llm_compressor_names(tmp_path / scheme), tmp_path / f"oracle-{scheme}")

    # compressed-tensors decompresses each file into the model as llm-compressor quantizes it, each expert a
    # Linear layer (transformers cannot load a quantized MoE folder, llm-compressor's own neither). Distance of the
    # logits from the unquantized model's, relative to their largest magnitude: farther than a dense model's where
    # a token's choice of experts changes (measured: W8A16 0.094, W8A8 0.016-0.018, FP8 0.11-0.12, 4-bit 0.19-0.20).
    bound = {"W8A16": 0.15, "W8A8": 0.15, "FP8_DYNAMIC": 0.2, "FP8_BLOCK": 0.2, "W4A16": 0.5, "W4A16_ASYM": 0.5,
             "NVFP4A16": 0.5, "MXFP8A16": 0.2, "MXFP8": 0.2, "MXFP4A16": 0.5, "MXFP4": 0.65}
    assert_loaded_within(oracle("load", loads, tmp_path), schemes, bound)


def test_vision_language_models_as_llm_compressor_writes_them(oracle, tmp_path):
    """The language model quantized, the vision tower and projector left as they are, the config's ignore list
    naming them as the checkpoint does (Qwen2-VL's `visual.*` where transformers 5 holds `model.visual.*`,
    Mllama's `language_model.lm_head`), bit for bit as llm-compressor writes them."""
    cases = {"qwen2vl": SHIPPED / "qwen2vl-fsdp2", "qwen25vl": SHIPPED / "qwen25vl-fsdp2", "mllama": SHIPPED / "mllama-fsdp2"}
    from unshard.sinks.compressed_tensors import DEFAULT_IGNORE

    jobs, loads = [], []
    for name, case in cases.items():
        src = case / "global_step_1"
        unshard.convert(src, tmp_path / f"{name}-plain", progress=False)
        unshard.convert(src, tmp_path / name, quantize="W8A8", progress=False, verify=True)
        jobs.append({"src": str(tmp_path / f"{name}-plain"), "out": str(tmp_path / f"oracle-{name}"), "scheme": "W8A8",
                     "ignore": list(DEFAULT_IGNORE)})
        loads += [load_job(tmp_path / f"{name}-plain", tmp_path / folder, "W8A8") for folder in (name, f"oracle-{name}")]
    oracle("quantize", jobs, tmp_path)
    for name in cases:
        assert_same_files(tmp_path / name, tmp_path / f"oracle-{name}")
        ignored = json.loads((tmp_path / name / "config.json").read_text())["quantization_config"]["ignore"]
        assert ignored and all(m.startswith(("visual.", "vision_model.", "multi_modal_projector"))
                               for m in ignored if "lm_head" not in m)
    # transformers 5 cannot load either tool's folder whole: compressed-tensors matches the ignore list (the
    # checkpoint's names, as vLLM reads them) against the names transformers holds, so it expects scales for the
    # vision tower (and for Mllama's head, left uninitialised). It loads unshard's as it loads llm-compressor's, and
    # the Qwen models' logits (a text prompt) are the same.
    loaded = oracle("load", loads, tmp_path)
    for ours, theirs in zip(loaded[::2], loaded[1::2]):
        assert (ours["missing"], ours["unexpected"]) == (theirs["missing"], theirs["unexpected"]) and ours["missing"]
        if "lm_head.weight_scale" not in ours["missing"]:
            assert ours["max_abs"] == theirs["max_abs"] and ours["max_abs"] / ours["scale"] < 0.05


def test_bands_give_the_whole_tensor_s_encoding(tmp_path, monkeypatch):
    """A weight larger than a band is encoded band by band (memory: a band, not the weight); the file is
    the same bit for bit as when each weight is one band: zero points packed 8 rows to an int32 across
    bands, FP8 blocks of 128 rows, the last band short."""
    from unshard.write import assemble

    src = SHIPPED / "llama-fsdp2-tp-q320" / "global_step_1"
    for scheme in ("W4A16_ASYM", "FP8_BLOCK", "FP8_DYNAMIC", "MXFP4A16", "NVFP4A16"):
        ignore = ignore_for(scheme, False)
        unshard.convert(src, tmp_path / f"whole-{scheme}", quantize=scheme, quantize_ignore=ignore, progress=False)
        monkeypatch.setattr(assemble, "ENCODING_BAND_BYTES", 8 * 256 * 4)  # 8 rows of 256 fp32 columns: 40 bands of gate_proj
        unshard.convert(src, tmp_path / f"banded-{scheme}", quantize=scheme, quantize_ignore=ignore, progress=False,
                        verify=True)
        monkeypatch.undo()
        whole, banded = tensors_of(tmp_path / f"whole-{scheme}"), tensors_of(tmp_path / f"banded-{scheme}")
        assert sorted(whole) == sorted(banded)
        assert all(whole[n].reshape(-1).view(torch.uint8).equal(banded[n].reshape(-1).view(torch.uint8)) for n in whole)


def test_threads_share_torch_s_cores_and_write_what_one_thread_writes(tmp_path, monkeypatch):
    """Two threads encoding at once each run torch's operations on half of torch's threads (each on every core
    would leave OpenMP threads spinning on one another), and torch's count is as it was after the run. The groups
    that need no torch go first: the files are still one thread's, byte for byte."""
    from unshard.sinks import compressed_tensors

    src = SHIPPED / "llama-fsdp2-tp-q320" / "global_step_1"
    seen, real = set(), compressed_tensors.QuantizedWeight.encode

    def encode(self, band, start):
        seen.add(torch.get_num_threads())
        return real(self, band, start)

    monkeypatch.setattr(compressed_tensors.QuantizedWeight, "encode", encode)
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        unshard.convert(src, tmp_path / "one", quantize="FP8_DYNAMIC", threads=1, progress=False)
        assert seen == {4}
        seen.clear()
        unshard.convert(src, tmp_path / "two", quantize="FP8_DYNAMIC", threads=2, progress=False)
        assert seen == {2} and torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(before)
    assert {p.name: p.read_bytes() for p in (tmp_path / "one").iterdir()} == \
        {p.name: p.read_bytes() for p in (tmp_path / "two").iterdir()}


TORCH_ASIDE = """
import gc, json, sys, threading
import unshard
from unshard.write import execute

src, out, fail = sys.argv[1], sys.argv[2], sys.argv[3]
passes = []  # the collector's, while torch is being imported


def importing():
    return getattr(getattr(sys.modules.get("torch"), "__spec__", None), "_initializing", False)


gc.callbacks.append(lambda phase, info: phase == "start" and importing() and passes.append(1))
if fail == "at once":  # before torch is imported: the import goes on after the run has failed
    def write_files(*args):
        raise RuntimeError("failed at once")
    execute.write_files = write_files
error = None
try:
    unshard.convert(src, out, quantize="FP8_DYNAMIC", threads=2, progress=False)
except RuntimeError as e:
    error = str(e)
for thread in threading.enumerate():
    if thread.name == "unshard: import torch":
        thread.join()
print(json.dumps({"error": error, "torch": "torch" in sys.modules, "collecting": gc.isenabled(),
                  "frozen": gc.get_freeze_count(), "passes while importing": len(passes)}))
"""


@pytest.mark.parametrize("fail", ["no", "at once"])
def test_torch_is_imported_aside_and_the_collector_is_as_it_was_after(fail, tmp_path):
    """In a process without torch, a quantizing run imports it on a thread of its own while the tensors that need
    no torch are copied, with the cycle collector paused, and freezes what the import made until the run ends:
    after the run, failed or not, the collector runs and nothing is left frozen. The files are those written by
    a process that had torch already (this one)."""
    src = SHIPPED / "llama-fsdp2-tp-q320" / "global_step_1"
    done = subprocess.run([sys.executable, "-c", TORCH_ASIDE, str(src), str(tmp_path / "aside"), fail],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout)
    assert state == {"error": "failed at once" if fail == "at once" else None, "torch": True, "collecting": True,
                     "frozen": 0, "passes while importing": 0}
    if fail == "no":
        unshard.convert(src, tmp_path / "here", quantize="FP8_DYNAMIC", threads=2, progress=False)
        assert {p.name: p.read_bytes() for p in (tmp_path / "aside").iterdir()} == \
            {p.name: p.read_bytes() for p in (tmp_path / "here").iterdir()}


def test_nvfp4_siblings_share_a_global_scale_whoever_writes_them(tmp_path):
    """NVFP4's tensor-wide scale is found by a first pass over the weights, before any is written, and is the same
    for q, k and v and for gate and up (vLLM runs each set as one layer): so processes writing different files
    write what one process writes. Leaving out some of a set but not all is refused, as llm-compressor refuses it."""
    src = SHIPPED / "llama-fsdp2-tp-q320" / "global_step_1"
    one = unshard.convert(src, tmp_path / "one", quantize="NVFP4A16", max_shard_size="100KB", progress=False)
    two = unshard.convert(src, tmp_path / "two", quantize="NVFP4A16", max_shard_size="100KB", progress=False, workers=2,
                          verify=True)
    assert len(one.files) > 2 and two.writers == 2
    assert {p.name: p.read_bytes() for p in (tmp_path / "one").iterdir()} == \
        {p.name: p.read_bytes() for p in (tmp_path / "two").iterdir()}
    scales = {name.removesuffix(".weight_global_scale"): t.item() for name, t in tensors_of(tmp_path / "one").items()
              if name.endswith("global_scale")}
    for layer in (0, 1):
        at = f"model.layers.{layer}."
        assert scales[f"{at}self_attn.q_proj"] == scales[f"{at}self_attn.k_proj"] == scales[f"{at}self_attn.v_proj"]
        assert scales[f"{at}mlp.gate_proj"] == scales[f"{at}mlp.up_proj"] != scales[f"{at}mlp.down_proj"]

    code, _, err = run_cli("convert", src, tmp_path / "out", "--quantize", "NVFP4A16", "--quantize-ignore", "re:.*k_proj$")
    assert code == 1 and len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    assert "model.layers.0.self_attn.q_proj, model.layers.0.self_attn.k_proj, model.layers.0.self_attn.v_proj share " \
           "one global scale" in err and "leave out all of them or none" in err


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
    assert "read twice" not in out
    code, out, _ = run_cli("convert", src, tmp_path / "out", "--quantize", "nvfp4a16", "--dry-run")
    assert code == 0 and "NVFP4A16 (compressed-tensors nvfp4-pack-quantized): 14 Linear weights" in out
    assert "read twice: a first pass finds each weight's largest magnitude" in out


def test_bad_requests_are_one_line_and_leave_nothing(tmp_path):
    src = str(SHIPPED / "llama-fsdp2-tp-q320" / "global_step_1")
    code, _, err = run_cli("convert", src, tmp_path / "out", "--quantize", "Q4_K")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "--quantize Q4_K: unknown scheme; known: W8A16, W4A16, W4A16_ASYM, W8A8, FP8_DYNAMIC, FP8_BLOCK" in err
    code, _, err = run_cli("convert", src, tmp_path / "out", "--quantize", "W4A16")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "model.layers.0.mlp.down_proj (320 columns)" in err and "--quantize-ignore" in err
    assert list(tmp_path.iterdir()) == []
