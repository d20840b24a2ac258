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
import shutil
import subprocess
import sys
from pathlib import Path

import generate
import pytest
import torch
import yaml
from conftest import SHIPPED
from generate import CASES
from safetensors import safe_open
from test_cli_and_errors import run_cli

import unshard

SCHEMES = [
    "W8A16",
    "W4A16",
    "W4A16_ASYM",
    "W8A8",
    "FP8_DYNAMIC",
    "FP8_BLOCK",
    "NVFP4A16",
    "MXFP4A16",
    "MXFP4",
    "MXFP8A16",
    "MXFP8",
]
# Columns in groups of 128 (FP8_BLOCK: the inputs'), so a 320-column down_proj is refused: left unquantized here.
GROUPED = {"W8A16", "W4A16", "W4A16_ASYM", "FP8_BLOCK"}
ORACLE = Path(generate.HERE) / "llmcompressor_oracle.py"


@pytest.fixture(scope="session")
def oracle():
    """Runs llmcompressor_oracle.py's task on a list of jobs in llm-compressor's venv; its JSON lines."""
    python = generate.peer_python("llmcompressor")

    def run(task: str, jobs: list[dict], tmp_path: Path) -> list[dict]:
        (tmp_path / f"{task}.json").write_text(json.dumps(jobs))
        done = subprocess.run(
            [str(python), str(ORACLE), task, str(tmp_path / f"{task}.json")],
            capture_output=True,
            text=True,
            timeout=900,
            env=dict(os.environ, HF_HUB_OFFLINE="1"),
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    return run


def tensors_of(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for path in folder.glob("*.safetensors"):
        with safe_open(path, "pt") as f:
            out.update({name: f.get_tensor(name) for name in f.keys()})
    return out


def assert_same_files(ours: Path, theirs: Path, listed: dict[str, str] | None = None) -> None:
    """Every tensor bit for bit (fp8 compared as bytes), and the same quantization_config (listed: names in our
    ignore list and what the oracle's transformers lists them as)."""
    mine, expected = tensors_of(ours), tensors_of(theirs)
    assert sorted(mine) == sorted(expected)
    for name, tensor in expected.items():
        assert (mine[name].dtype, mine[name].shape) == (tensor.dtype, tensor.shape), name
        assert mine[name].reshape(-1).view(torch.uint8).equal(tensor.reshape(-1).view(torch.uint8)), name
    config = lambda folder: json.loads((folder / "config.json").read_text())["quantization_config"]  # noqa: E731
    mine = config(ours)
    if listed:
        assert set(listed) <= set(mine["ignore"])
        mine["ignore"] = [listed.get(name, name) for name in mine["ignore"]]
    assert mine == config(theirs)


def load_job(plain: Path, quantized: Path, scheme: str, dtype: str = "auto", **extra) -> dict:
    """A job of the oracle's `load` (compressed-tensors decompresses MX and NVFP4 weights to bf16 whatever the model's
    dtype, so those folders run in bf16)."""
    bf16 = scheme.startswith(("MX", "NVFP4"))
    return {"plain": str(plain), "quantized": str(quantized), "dtype": "bfloat16" if bf16 else dtype, **extra}


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
        result = unshard.convert(
            src, tmp_path / scheme, quantize=scheme, quantize_ignore=ignore, progress=False, verify=True
        )
        assert result.bytes < (tmp_path / "plain" / "model.safetensors").stat().st_size
        jobs.append(
            {
                "src": str(tmp_path / "plain"),
                "out": str(tmp_path / f"oracle-{scheme}"),
                "scheme": scheme,
                "ignore": ["lm_head", *ignore],
            }
        )
        loads.append(load_job(tmp_path / "plain", tmp_path / scheme, scheme))
        card = (tmp_path / scheme / "README.md").read_text()
        assert f"quantized: {scheme} (compressed-tensors" in card
    oracle("quantize", jobs, tmp_path)
    for scheme in SCHEMES:
        assert_same_files(tmp_path / scheme, tmp_path / f"oracle-{scheme}")

    # transformers loads each through compressed-tensors, every tensor in place. The logits' largest distance from
    # the unquantized model's, on a prompt, relative to their largest magnitude (random tiny models; measured:
    # W8A16 0.017, W8A8 0.025, FP8_DYNAMIC 0.09, FP8_BLOCK 0.09, W4A16 0.28, W4A16_ASYM 0.22 on the bf16 case;
    # run in bf16,
    # MXFP8A16 0.04-0.08, MXFP8 0.09-0.11, MXFP4A16 0.23-0.24, MXFP4 0.30-0.49, its inputs quantized to FP4 too;
    # NVFP4A16 0.19-0.26).
    bound = {
        "W8A16": 0.05,
        "W8A8": 0.05,
        "FP8_DYNAMIC": 0.2,
        "FP8_BLOCK": 0.2,
        "W4A16": 0.5,
        "W4A16_ASYM": 0.5,
        "NVFP4A16": 0.5,
        "MXFP8A16": 0.15,
        "MXFP8": 0.2,
        "MXFP4A16": 0.5,
        "MXFP4": 0.65,
    }
    assert_loaded_within(oracle("load", loads, tmp_path), SCHEMES, bound)


def test_from_other_layouts_and_merges(oracle, tmp_path):
    """Quantizing happens after the tensors are whole: DCP, DeepSpeed ZeRO-3, Megatron's fused QKV over
    TP, a LoRA folded in, Qwen2, and a merge all give what llm-compressor gives on their unquantized output."""
    recipe = tmp_path / "recipe.yml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "merge_method": "linear",
                "dtype": "float32",
                "models": [
                    {"model": str(SHIPPED / "llama-fsdp2" / "global_step_1"), "parameters": {"weight": 0.7}},
                    {"model": str(SHIPPED / "llama-fsdp2-tp" / "global_step_1"), "parameters": {"weight": 0.3}},
                ],
            }
        )
    )
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
            unshard.convert(
                sources[name][0],
                out,
                quantize=scheme,
                quantize_ignore=ignore,
                progress=False,
                verify=True,
                **sources[name][1],
            )
        jobs.append(
            {
                "src": str(tmp_path / f"{name}-plain"),
                "out": str(tmp_path / f"oracle-{name}-{scheme}"),
                "scheme": scheme,
                "ignore": ["lm_head", *ignore],
            }
        )
    oracle("quantize", jobs, tmp_path)
    for job in jobs:
        assert_same_files(Path(job["out"].replace("oracle-", "")), Path(job["out"]))


# A Mixtral checkpoint names its experts' projections w1 (gate), w3 (up), w2 (down), as vLLM's Mixtral loader reads
# them; llm-compressor, which quantizes each expert as a Linear layer, saves them as gate_proj, up_proj, down_proj.
MIXTRAL_EXPERTS = {".w1.": ".gate_proj.", ".w3.": ".up_proj.", ".w2.": ".down_proj."}


# transformers' save_pretrained (llm-compressor's) names Kimi Linear's dense layer's MLP as the experts' block, where
# unshard's folder keeps the Hub's name (Family.hub_renames)
SAVED_AS = {"kimi_linear": (r"^model\.layers\.(\d+)\.mlp\.", r"model.layers.\1.block_sparse_moe.")}


def as_llm_compressor_names(folder: Path) -> Path:
    """A folder of Mixtral's expert names (MiniMax-M2's too) with its experts renamed as llm-compressor names them,
    and Kimi Linear's dense MLP as its save_pretrained names it (other folders as they are)."""
    import re

    tensors = tensors_of(folder)
    saved_as = SAVED_AS.get(json.loads((folder / "config.json").read_text()).get("model_type"))
    mixtral = any(".experts." in name and ".w1." in name for name in tensors)  # (LFM2's MLP has w1, w2, w3 too)
    if not mixtral and not saved_as:
        return folder
    renamed = folder.with_name(folder.name + "-renamed")
    renamed.mkdir()
    for old, new in MIXTRAL_EXPERTS.items() if mixtral else ():
        tensors = {name.replace(old, new) if ".experts." in name else name: t for name, t in tensors.items()}
    if saved_as:
        tensors = {re.sub(*saved_as, name): t for name, t in tensors.items()}
    from safetensors.torch import save_file

    save_file(tensors, renamed / "model.safetensors")
    (renamed / "config.json").write_text((folder / "config.json").read_text())
    return renamed


@pytest.mark.parametrize(
    "case, schemes",
    [
        ("qwen3moe-fsdp2-q128", SCHEMES),  # experts fused per projection in the rank files (transformers 5), 128 wide
        ("qwen2moe-fsdp2", ["W8A8", "FP8_DYNAMIC"]),  # a shared expert behind a one-row gate
        ("mixtral-fsdp2", ["W8A8"]),
        ("megatron-mixtral-tp2-pp2-ep2", ["FP8_DYNAMIC"]),  # experts over expert parallelism, in Megatron's names
        ("megatron-qwen3moe-pp2-ep2-dp2", ["W8A8"]),
    ],
)
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
        jobs.append(
            {
                "src": str(tmp_path / "plain"),
                "out": str(tmp_path / f"oracle-{scheme}"),
                "scheme": scheme,
                "ignore": list(DEFAULT_IGNORE),
            }
        )
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
    bound = {
        "W8A16": 0.15,
        "W8A8": 0.15,
        "FP8_DYNAMIC": 0.2,
        "FP8_BLOCK": 0.2,
        "W4A16": 0.5,
        "W4A16_ASYM": 0.5,
        "NVFP4A16": 0.5,
        "MXFP8A16": 0.2,
        "MXFP8": 0.2,
        "MXFP4A16": 0.5,
        "MXFP4": 0.65,
    }
    assert_loaded_within(oracle("load", loads, tmp_path), schemes, bound)


# The families whose GGUF came last (their fixtures shipped): --quantize as llm-compressor 0.14 writes them
# (by hand, GLM-4, Phi-2, BLOOM, StarCoder, Command R7B and Hunyuan too: plain Linear layers, as Llama's, so left
# out here for CI's time)
FAMILY_CASES = [
    "gptneox-fsdp2",  # (the output head held as lm_head, saved as embed_out: listed as compressed-tensors lists it)
    "jais2-fsdp2",
    "lfm2-fsdp2",
    "olmoe-fsdp2",
    "dots1-fsdp2",
    "ernie45moe-fsdp2-spm",
    "granitemoe-fsdp2",  # (experts fused on disk, made Linear layers; the router module listed by its class's name)
    "granitemoeshared-fsdp2",
    "afmoe-fsdp2",  # (a router module around its Linear gate, listed by its class's name)
    "minimax-m2-fsdp2",  # (Mixtral's expert names: compared under llm-compressor's)
    "exaonemoe-fsdp2",
    "granitehybrid-fsdp2",  # (Granite MoE's experts made Linear layers, and the Mamba-2 layers' projections)
    "gemma4-fsdp2",  # (Gemma 4's per-layer embeddings' projections too)
    "gemma4moe-fsdp2",  # (26B-A4B's fused experts made Linear layers: gate_up_proj's rows apart)
    "gemma4vl-fsdp2",  # (Gemma 4 with its vision tower, left as it is)
    "mpt-fsdp2",
    "apertus-fsdp2",  # (its xIELU parameters left as they are)
    "deepseekv2-fsdp2",
    "youtu-fsdp2",
    "glmocr-fsdp2",  # (its vision tower and projector left as they are)
    "janus-fsdp2",  # (its vision tower, aligner and image generator left as they are)
    "hunyuanocr-fsdp2",
    "paddleocr-fsdp2-spm",
    "internvl-fsdp2",
    "ministral3-fsdp2",
    "lfm2moe-fsdp2",
    "llama4-fsdp2",  # (its fused experts each a Linear layer, its vision tower left as it is)
    "mamba2-fsdp2",
    "mamba-fsdp2",
    "falconmamba-fsdp2",
    "jamba-fsdp2-spm",
    "exaone45-fsdp2",  # (its vision tower left as it is)
    "minicpm3-fsdp2-spm",
    "glm-fsdp2",
    "falconh1-fsdp2",  # (its muP multipliers left to the config, as transformers applies them)
    "mistral4-fsdp2",  # (Mistral Small 4: its experts, fused 3-D parameters, each made Linear layers)
    "torchtitan-museglimmer-fsdp2",  # (torchtitan's checkpoint; its vision tower, adapter, projection left out)
    "kimilinear-fsdp2",  # (its dense MLP compared under save_pretrained's name: SAVED_AS)
    "gemma3n-fsdp2-spm",  # (AltUp's and LAuReL's Linear layers too)
    "smolvlm-fsdp2",  # (its vision tower and connector left as they are)
    "gemma4av-fsdp2",  # (E2B's: its audio tower left as it is too)
    "qwen2audio-fsdp2",  # (its audio tower left as it is)
    "audioflamingo3-fsdp2",
    "qwen3asr-fsdp2",
    "qwen3omni-fsdp2",  # (its thinker's experts each a Linear layer as saved; its towers, talker and decoder too)
    "chameleon-fsdp2",  # (its image tokenizer left as it is)
    "qwen25omni-fsdp2",  # (its thinker's towers left as they are)
    "granitespeech-fsdp2",  # (its encoder and Q-Former left as they are)
    "granitespeechplus-fsdp2",
    "bert-fsdp2",  # (an encoder: its pooler quantized too, as llm-compressor's Linear targets take it)
    "roberta-fsdp2",
    "xlmroberta-fsdp2",
    "distilbert-fsdp2",
    "modernbert-fsdp2",
    "eurobert-fsdp2",
    "voxtral-fsdp2",
    "llava-pixtral-fsdp2",
    "lfm2vl-fsdp2",  # (its vision tower and projector left as they are)
    "lightonocr-fsdp2",  # (its Pixtral tower and projector left as they are)
    "minimax01-fsdp2",  # (its lightning attention's decay tables left as they are)
]
# transformers 5.24 keeps AFMoE's expert bias and EXAONE MoE's and DeepSeek-V2's routers in float32 when loading in
# bf16, as save_pretrained writes them (unshard follows the transformers installed); llm-compressor's pinned 5.17 did
# not yet: compared as bf16. (LFM2-MoE's expert bias both keep: its module makes it in float32.)
# transformers 5.24 makes Jamba's router a router module (JambaTopKRouter), which compressed-tensors and unshard leave
# out; llm-compressor's pinned 5.17 held a plain Linear layer there and quantized it: it is told to leave it out too
NEWER_ROUTERS = {"jamba-fsdp2-spm": (r"re:.*feed_forward\.router$",)}
# compressed-tensors lists a module in the ignore list under its name as saved (transformers' reverted conversion):
# transformers 5.24 reverts InternVL's and Granite Speech's heads to `language_model.lm_head`, llm-compressor's pinned
# 5.17 leaves `lm_head`
NEWER_LISTED = {
    "internvl-fsdp2": {"language_model.lm_head": "lm_head"},
    "granitespeech-fsdp2": {"language_model.lm_head": "lm_head"},
    "granitespeechplus-fsdp2": {"language_model.lm_head": "lm_head"},
}
NEWER_FLOAT32 = {
    "afmoe-fsdp2": "mlp.expert_bias",
    "exaonemoe-fsdp2": "mlp.gate.weight",
    "deepseekv2-fsdp2": "mlp.gate.weight",
}
# llm-compressor turns each 1 + weight norm into a plain one and back (its offset-norm calibration), which gives
# (1 + w) - 1 in float32, where unshard writes w as trained: compared so rounded (Muse Glimmer's four norms a layer)
OFFSET_NORMS = {"torchtitan-museglimmer-fsdp2": "layernorm.weight"}


def test_families_as_llm_compressor_writes_them(oracle, tmp_path):
    """W8A8 from each family's FSDP2 rank files, every tensor and the config as llm-compressor 0.14 writes them from
    the plain folder (Granite MoE's experts, fused on disk, each a Linear layer); compressed-tensors loads GPT-NeoX's
    (whose config once named its head as saved, which transformers then took for quantized) near the plain model's
    logits. Falcon's FalconLinear
    layers llm-compressor saves uncompressed (format dense, quantized values in bf16 with zero points, its head listed
    nowhere), which its own transformers loads with the head's scale missing: unshard's int8 folder loads whole."""
    from unshard.sinks.compressed_tensors import DEFAULT_IGNORE

    jobs, loads = [], []
    for case in [*FAMILY_CASES, "falcon-fsdp2"]:
        src, config = SHIPPED / case / CASES[case].src, CASES[case].config_from
        config_from = SHIPPED / case / config if config else None
        unshard.convert(src, tmp_path / case / "plain", config_from=config_from, progress=False)
        unshard.convert(
            src, tmp_path / case / "W8A8", quantize="W8A8", config_from=config_from, progress=False, verify=True
        )
        out = str(tmp_path / case / "oracle")
        ignore = [*DEFAULT_IGNORE, *NEWER_ROUTERS.get(case, ())]
        jobs.append({"src": str(tmp_path / case / "plain"), "out": out, "scheme": "W8A8", "ignore": ignore})
    for case in ("gptneox-fsdp2", "falcon-fsdp2"):
        loads.append(load_job(tmp_path / case / "plain", tmp_path / case / "W8A8", "W8A8", "bfloat16"))
    loads.append(
        load_job(tmp_path / "falcon-fsdp2" / "plain", tmp_path / "falcon-fsdp2" / "oracle", "W8A8", "bfloat16")
    )
    oracle("quantize", jobs, tmp_path)
    for case in FAMILY_CASES:
        ours = as_llm_compressor_names(tmp_path / case / "W8A8")
        if case in NEWER_FLOAT32 or case in OFFSET_NORMS:
            tensors = tensors_of(ours)
            kept = [n for n in tensors if n.endswith(NEWER_FLOAT32.get(case, "-"))]
            assert all(tensors[n].dtype == torch.float32 for n in kept)
            tensors.update({n: tensors[n].to(torch.bfloat16) for n in kept})
            offset = [n for n in tensors if n.endswith(OFFSET_NORMS.get(case, "-"))]
            assert kept or len(offset) == 16  # (four per layer)
            tensors.update({n: (tensors[n] + 1) - 1 for n in offset})
            from safetensors.torch import save_file

            ours = tmp_path / case / "as-theirs"
            ours.mkdir()
            save_file(tensors, ours / "model.safetensors")
            shutil.copy(tmp_path / case / "W8A8" / "config.json", ours)
        assert_same_files(ours, tmp_path / case / "oracle", NEWER_LISTED.get(case))
    ignored = json.loads((tmp_path / "gptneox-fsdp2" / "W8A8" / "config.json").read_text())["quantization_config"]
    assert ignored["ignore"] == ["lm_head"] and "embed_out.weight" in tensors_of(tmp_path / "gptneox-fsdp2" / "W8A8")
    theirs = json.loads((tmp_path / "falcon-fsdp2" / "oracle" / "config.json").read_text())["quantization_config"]
    assert theirs["format"] == "dense"
    gptneox, falcon, falcon_theirs = oracle("load", loads, tmp_path)
    assert_loaded_within([gptneox, falcon], ["W8A8"] * 2, {"W8A8": 0.15})
    assert falcon_theirs["missing"] == ["lm_head.weight_scale"]


GPT_OSS_SCHEMES = ["FP8_DYNAMIC", "W8A8", "MXFP4A16", "NVFP4A16"]  # (the fixture's 64 columns take no groups of 128)


def test_gpt_oss_fused_experts_as_llm_compressor_writes_them(oracle, tmp_path):
    """gpt-oss's experts, fused 3-D parameters on disk (gate and up interleaved), become one Linear layer per expert
    and projection, as llm-compressor makes them (linearize_moe) before quantizing: the same tensors bit for bit,
    biases de-interleaved too, streamed expert by expert (experts a pattern leaves out, all or one, written as they
    are, and listed in the config's ignore list in the model's order); compressed-tensors decompresses the file into
    the model as llm-compressor quantizes it, and its logits are near the unquantized model's. Under NVFP4 an
    expert's gate and up share one global scale, as llm-compressor scales them."""
    from unshard.sinks.compressed_tensors import DEFAULT_IGNORE

    src = SHIPPED / "gptoss-fsdp2" / "global_step_1"
    unshard.convert(src, tmp_path / "plain", progress=False)
    runs = {scheme: (scheme, ()) for scheme in GPT_OSS_SCHEMES}
    runs["down-left"] = ("FP8_DYNAMIC", ("re:.*experts.*down_proj$",))
    runs["one-left"] = ("W8A8", ("model.layers.1.mlp.experts.2.up_proj",))  # (one expert's up, its gate quantized)
    jobs, loads = [], []
    for name, (scheme, ignore) in runs.items():
        options = unshard.OutputOptions(quantize=scheme, quantize_ignore=ignore)
        result = unshard.convert(src, tmp_path / name, output=options, progress=False, verify=True, threads=3)
        assert result.tensors == 71  # (the fused experts, one output each, written as many)
        out, ignore = str(tmp_path / f"oracle-{name}"), [*DEFAULT_IGNORE, *ignore]
        jobs.append({"src": str(tmp_path / "plain"), "out": out, "scheme": scheme, "ignore": ignore})
        loads.append(load_job(tmp_path / "plain", tmp_path / name, scheme, "float32", moe=True))
    oracle("quantize", jobs, tmp_path)
    for name in runs:
        assert_same_files(tmp_path / name, tmp_path / f"oracle-{name}")
    written = tensors_of(tmp_path / "FP8_DYNAMIC")
    assert "model.layers.0.mlp.experts.3.up_proj.weight_scale" in written
    assert not any(name.endswith(("gate_up_proj", "down_proj_bias")) for name in written)
    # (measured: W8A8 0.017, the experts in place; NVFP4A16 0.19; FP8_DYNAMIC 0.38 and MXFP4A16 0.39 on this tiny random
    # model, whose tokens change experts: llm-compressor's own files, the same bytes, are as far)
    bound = {"FP8_DYNAMIC": 0.45, "W8A8": 0.05, "MXFP4A16": 0.5, "NVFP4A16": 0.5}
    assert_loaded_within(oracle("load", loads[: len(GPT_OSS_SCHEMES)], tmp_path), GPT_OSS_SCHEMES, bound)
    attention = ("--quantize-ignore", "re:.*self_attn.*")  # (64 columns too)
    code, _, err = run_cli("convert", src, tmp_path / "w4a16", "--quantize", "W4A16", *attention, "--no-progress")
    assert code == 1 and "not so for the experts' model.layers.0.mlp.experts.0.gate_proj (64 columns)" in err, err
    assert not (tmp_path / "w4a16").exists()
    up = ("--quantize-ignore", "re:.*experts.*up_proj$")
    code, _, err = run_cli("convert", src, tmp_path / "nvfp4", "--quantize", "NVFP4A16", *up, "--no-progress")
    assert code == 1 and "of each expert share one global scale" in err and "leave out all of them or none" in err
    assert not (tmp_path / "nvfp4").exists()


def test_vision_language_models_as_llm_compressor_writes_them(oracle, tmp_path):
    """The language model quantized, the vision tower and projector left as they are, the config's ignore list
    naming them as the checkpoint does (Qwen2-VL's `visual.*` where transformers 5 holds `model.visual.*`,
    Mllama's `language_model.lm_head`), bit for bit as llm-compressor writes them."""
    cases = {
        "qwen2vl": SHIPPED / "qwen2vl-fsdp2",
        "qwen25vl": SHIPPED / "qwen25vl-fsdp2",
        "qwen3vl": SHIPPED / "qwen3vl-fsdp2",  # (saved as `model.visual.*`, `model.language_model.*`)
        "glm4v": SHIPPED / "glm4v-fsdp2",  # (so too)
        "glm4vmoe": SHIPPED / "glm4vmoe-fsdp2",  # (its experts saved one by one, as transformers 5 saves them)
        "mllama": SHIPPED / "mllama-fsdp2",
    }
    from unshard.sinks.compressed_tensors import DEFAULT_IGNORE

    jobs, loads = [], []
    for name, case in cases.items():
        src = case / "global_step_1"
        unshard.convert(src, tmp_path / f"{name}-plain", progress=False)
        unshard.convert(src, tmp_path / name, quantize="W8A8", progress=False, verify=True)
        jobs.append(
            {
                "src": str(tmp_path / f"{name}-plain"),
                "out": str(tmp_path / f"oracle-{name}"),
                "scheme": "W8A8",
                "ignore": list(DEFAULT_IGNORE),
            }
        )
        if name != "glm4vmoe":  # (transformers 5.17 builds experts fused, which compressed-tensors does not take)
            loads += [
                load_job(tmp_path / f"{name}-plain", tmp_path / folder, "W8A8") for folder in (name, f"oracle-{name}")
            ]
    oracle("quantize", jobs, tmp_path)
    for name in cases:
        assert_same_files(tmp_path / name, tmp_path / f"oracle-{name}")
        ignored = json.loads((tmp_path / name / "config.json").read_text())["quantization_config"]["ignore"]
        assert ignored and all(  # (the towers, the head and GLM-4.5V's router)
            m.startswith(("visual.", "model.visual.", "vision_model.", "multi_modal_projector"))
            for m in ignored
            if "lm_head" not in m and not m.endswith(".mlp.gate")
        )
    # transformers 5 cannot load either tool's Qwen2-VL, Qwen2.5-VL or Mllama folder whole: compressed-tensors matches
    # the ignore list (the checkpoint's names, as vLLM reads them) against the names transformers holds, so it expects
    # scales for the vision tower (and for Mllama's head, left uninitialised); Qwen3-VL's and GLM-4.1V's saved names are
    # the ones it holds, and they load whole. It loads unshard's as it loads llm-compressor's, and the Qwen models' and
    # GLM-4.1V's logits (a text prompt) are the same.
    loaded = oracle("load", loads, tmp_path)
    for name, ours, theirs in zip([n for n in cases if n != "glm4vmoe"], loaded[::2], loaded[1::2]):
        assert (ours["missing"], ours["unexpected"]) == (theirs["missing"], theirs["unexpected"])
        assert bool(ours["missing"]) == (name not in ("qwen3vl", "glm4v")), (name, ours["missing"])
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
        monkeypatch.setattr(
            assemble, "ENCODING_BAND_BYTES", 8 * 256 * 4
        )  # 8 rows of 256 fp32 columns: 40 bands of gate_proj
        unshard.convert(
            src, tmp_path / f"banded-{scheme}", quantize=scheme, quantize_ignore=ignore, progress=False, verify=True
        )
        monkeypatch.undo()
        whole, banded = tensors_of(tmp_path / f"whole-{scheme}"), tensors_of(tmp_path / f"banded-{scheme}")
        assert sorted(whole) == sorted(banded)
        assert all(whole[n].reshape(-1).view(torch.uint8).equal(banded[n].reshape(-1).view(torch.uint8)) for n in whole)


NO_TORCH = """
import json, sys
import unshard
src, out, scheme, ignore = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
unshard.convert(src, out, quantize=scheme, quantize_ignore=ignore, threads=2, progress=False)
print(json.dumps({"torch": "torch" in sys.modules}))
"""


@pytest.mark.parametrize("scheme", ["FP8_DYNAMIC", "W4A16_ASYM", "NVFP4A16"])
def test_quantizing_imports_no_torch_and_threads_write_what_one_writes(scheme, tmp_path):
    """The encodings are numpy's: quantizing FSDP2 x TP rank files needs no torch (whose import takes longer than
    encoding a 1 GB model) once what transformers says of the config is remembered, as for any conversion; and two
    threads in that process write, byte for byte, what one thread writes in this process, which has torch."""
    src = SHIPPED / "llama-fsdp2-tp-q320" / "global_step_1"
    ignore = ignore_for(scheme, False)
    unshard.convert(src, tmp_path / "one", quantize=scheme, quantize_ignore=ignore, threads=1, progress=False)
    done = subprocess.run(
        [sys.executable, "-c", NO_TORCH, str(src), str(tmp_path / "two"), scheme, json.dumps(ignore)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"torch": False}
    assert {p.name: p.read_bytes() for p in (tmp_path / "one").iterdir()} == {
        p.name: p.read_bytes() for p in (tmp_path / "two").iterdir()
    }


def rounding_cases(shape: tuple[int, int], rng) -> torch.Tensor:
    """float32 weights that meet every case of the arithmetic: rows whose scales span 1e-4 to 1e2, and in each row a
    group of 32 made special (all zeros, negative zeros, values the weights' dtype holds only as subnormals, values
    near float16's largest: an MX power that overflows), or the whole row exact ties of one rounding (the integer
    grids, FP8's and FP4's), each scaled by a power of two that makes the scale of its groups exact."""
    import numpy as np

    rows, cols = shape
    x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-4, 2, size=(rows, 1))
    fp8 = np.array([0.0] + [(1 + m / 8) * 2.0**e for e in range(-6, 9) for m in range(8)])
    fp8_ties = ((fp8[1:] + fp8[:-1]) / 2)[fp8[1:] <= 448]
    fp4_ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    for row in range(rows):
        start = rng.integers(0, cols // 32) * 32
        group = slice(start, start + 32)
        power = 2.0 ** rng.integers(-12, 4)
        kind = rng.integers(0, 9)
        if kind == 0:
            x[row, group] = 0.0
        elif kind == 1:
            x[row, group] = -0.0
        elif kind == 2:
            x[row, group] = rng.standard_normal(32) * rng.choice([1e-39, 1e-42, 3e-6, 3e-8])
        elif kind == 3:
            x[row, group] = rng.choice([-1, 1], 32) * rng.uniform(50000, 65504, 32)
        elif kind in (4, 5):  # the integer grids
            half = 7.5 if kind == 4 else 127.5
            x[row] = (rng.integers(-int(half), int(half), cols) + 0.5) * power
            x[row, rng.integers(0, cols)] = half * power
        elif kind == 6:
            x[row] = rng.choice(fp8_ties, cols) * rng.choice([-1, 1], cols) * power
            x[row, rng.integers(0, cols)] = 448 * power
        elif kind == 7:
            x[row] = rng.choice(fp4_ties, cols) * rng.choice([-1, 1], cols) * power
            x[row, ::16] = 6 * power
    return torch.from_numpy(x.astype(np.float32))


def test_rounding_cases_as_llm_compressor_writes_them(oracle, tmp_path):
    """Every scheme on weights made to meet every rounding case (rounding_cases), in float32, bfloat16 and float16
    (which no shipped fixture holds), in Llamas written by transformers: bit for bit as llm-compressor writes them.
    The encodings round in numpy as torch rounds in the weights' dtype; these are the cases where that shows."""
    import numpy as np
    import transformers

    rng = np.random.default_rng(25)
    jobs = []
    for dtype in ("float32", "bfloat16", "float16"):
        config = transformers.LlamaConfig(
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=1,
            vocab_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        model = transformers.LlamaForCausalLM(config)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if name.endswith("proj.weight"):
                    parameter.copy_(rounding_cases(tuple(parameter.shape), rng))
        model.to(getattr(torch, dtype)).save_pretrained(tmp_path / dtype)
        for scheme in SCHEMES:
            unshard.convert(tmp_path / dtype, tmp_path / f"{dtype}-{scheme}", quantize=scheme, progress=False)
            jobs.append(
                {
                    "src": str(tmp_path / dtype),
                    "out": str(tmp_path / f"oracle-{dtype}-{scheme}"),
                    "scheme": scheme,
                    "ignore": ["lm_head"],
                }
            )
    oracle("quantize", jobs, tmp_path)
    for job in jobs:
        assert_same_files(Path(job["out"].replace("oracle-", "")), Path(job["out"]))


def test_a_weight_with_nan_is_one_line_naming_it(tmp_path):
    """No scale encodes a NaN or an infinity: such a weight stops the run with one line naming it and the flag that
    leaves it out, and nothing is written; left out, the rest is quantized."""
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=1,
        vocab_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[3, 7] = float("nan")
        model.model.layers[0].self_attn.o_proj.weight[0, 0] = float("inf")
    model.save_pretrained(tmp_path / "model")
    for scheme in ("W4A16", "W4A16_ASYM", "FP8_BLOCK", "MXFP4A16"):
        code, _, err = run_cli("convert", tmp_path / "model", tmp_path / "out", "--quantize", scheme)
        errors = [line for line in err.splitlines() if line.startswith("unshard:")]
        assert code == 1 and len(errors) == 1 and not (tmp_path / "out").exists(), err
        assert (
            str(tmp_path / "model") in errors[0]
            and ": model.layers.0." in errors[0]
            and "holds NaN or infinite" in errors[0]
        )
        assert "--quantize-ignore model.layers.0." in errors[0] and list(tmp_path.iterdir()) == [tmp_path / "model"]
    code, _, err = run_cli(
        "convert",
        tmp_path / "model",
        tmp_path / "out",
        "--quantize",
        "NVFP4A16",
        "--quantize-ignore",
        "re:.*(up|gate)_proj$",
        "--quantize-ignore",
        "re:.*o_proj$",
    )
    assert code == 0, err


def test_nvfp4_siblings_share_a_global_scale_whoever_writes_them(tmp_path):
    """NVFP4's tensor-wide scale is found by a first pass over the weights, before any is written, and is the same
    for q, k and v and for gate and up (vLLM runs each set as one layer): so processes writing different files
    write what one process writes. Leaving out some of a set but not all is refused, as llm-compressor refuses it."""
    src = SHIPPED / "llama-fsdp2-tp-q320" / "global_step_1"
    one = unshard.convert(src, tmp_path / "one", quantize="NVFP4A16", max_shard_size="100KB", progress=False)
    two = unshard.convert(
        src, tmp_path / "two", quantize="NVFP4A16", max_shard_size="100KB", progress=False, workers=2, verify=True
    )
    assert len(one.files) > 2 and two.writers == 2
    assert {p.name: p.read_bytes() for p in (tmp_path / "one").iterdir()} == {
        p.name: p.read_bytes() for p in (tmp_path / "two").iterdir()
    }
    scales = {
        name.removesuffix(".weight_global_scale"): t.item()
        for name, t in tensors_of(tmp_path / "one").items()
        if name.endswith("global_scale")
    }
    for layer in (0, 1):
        at = f"model.layers.{layer}."
        assert scales[f"{at}self_attn.q_proj"] == scales[f"{at}self_attn.k_proj"] == scales[f"{at}self_attn.v_proj"]
        assert scales[f"{at}mlp.gate_proj"] == scales[f"{at}mlp.up_proj"] != scales[f"{at}mlp.down_proj"]

    code, _, err = run_cli(
        "convert", src, tmp_path / "out", "--quantize", "NVFP4A16", "--quantize-ignore", "re:.*k_proj$"
    )
    assert code == 1 and len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    assert (
        "model.layers.0.self_attn.q_proj, model.layers.0.self_attn.k_proj, model.layers.0.self_attn.v_proj share "
        "one global scale"
        in err
        and "leave out all of them or none" in err
    )


def test_dry_run_and_inspect_say_what_is_quantized(tmp_path):
    src = str(SHIPPED / "llama-fsdp2-tp-q320" / "global_step_1")
    code, out, _ = run_cli(
        "convert", src, tmp_path / "out", "--quantize", "w4a16", "--quantize-ignore", "re:.*down_proj$", "--dry-run"
    )
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
    # (GPT-2's Conv1D layers, which llm-compressor's schemes leave as they are: the family's reason, as `unshard
    # families` shows it)
    code, _, err = run_cli("convert", SHIPPED / "gpt2-fsdp2" / "global_step_1", tmp_path / "out", "--quantize", "W8A16")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "--quantize: GPT-2: GPT-2's layers are Conv1D, whose weights compressed-tensors' schemes do not take" in err
    assert list(tmp_path.iterdir()) == []


def test_qwen3_vl_moe_fused_experts_as_llm_compressor_writes_them(oracle, tmp_path):
    """Qwen3-VL-MoE's experts, fused on disk as transformers 5 holds them (gate and up halves of one tensor) or as
    Qwen's release does (each transposed), become one Linear layer per expert and projection as llm-compressor makes
    them, bit for bit, the vision tower left as it is; under NVFP4 each expert's gate and up share a global scale.
    compressed-tensors decompresses unshard's files into the same model, with the same logits, as llm-compressor's."""
    from test_gguf_qwen_vl import as_released

    from unshard.sinks.compressed_tensors import DEFAULT_IGNORE

    src = SHIPPED / "qwen3vlmoe-fsdp2" / "global_step_1"
    unshard.convert(src, tmp_path / "plain", progress=False)
    shutil.copytree(tmp_path / "plain", tmp_path / "released")
    as_released(tmp_path / "released")
    schemes = ["W8A8", "NVFP4A16"]
    jobs, loads = [], []
    for scheme in schemes:
        unshard.convert(src, tmp_path / scheme, quantize=scheme, progress=False, verify=True)
        unshard.convert(tmp_path / "released", tmp_path / f"released-{scheme}", quantize=scheme, progress=False)
        out = tmp_path / f"oracle-{scheme}"
        jobs.append({"src": str(tmp_path / "plain"), "out": str(out), "scheme": scheme, "ignore": list(DEFAULT_IGNORE)})
        loads += [load_job(tmp_path / "plain", f, scheme, "float32", moe=True) for f in (tmp_path / scheme, out)]
    oracle("quantize", jobs, tmp_path)
    for scheme in schemes:
        assert_same_files(tmp_path / scheme, tmp_path / f"oracle-{scheme}")
        assert_same_files(tmp_path / f"released-{scheme}", tmp_path / f"oracle-{scheme}")
    assert "model.language_model.layers.1.mlp.experts.3.down_proj.weight_scale" in tensors_of(tmp_path / "W8A8")
    loaded = oracle("load", loads, tmp_path)
    for ours, theirs in zip(loaded[::2], loaded[1::2]):
        assert ours["missing"] == ours["unexpected"] == [] and ours["max_abs"] == theirs["max_abs"], (ours, theirs)


@pytest.mark.parametrize("case", ["qwen3next-fsdp2", "qwen35-fsdp2", "qwen35moe-fsdp2"])
def test_qwen3_next_and_qwen35_as_llm_compressor_writes_them(case, oracle, tmp_path):
    """Qwen3-Next (Gated DeltaNet and gated attention layers, routed and shared experts) and Qwen3.5's text model (the
    same layers, a dense MLP) and Qwen3.5-MoE's (its experts, saved one by one): every Linear layer of both kinds of
    attention and of the MLP quantized as llm-compressor 0.14 quantizes it, bit for bit, the convolution and the routers
    left as they are. The norms differ only as llm-compressor rounds them: it turns each 1 + weight norm into a plain
    one and back (its offset-norm calibration), which gives (1 + w) - 1 in float32; unshard writes w as trained.
    compressed-tensors loads both folders into the same logits."""
    from safetensors.torch import save_file

    from unshard.sinks.compressed_tensors import DEFAULT_IGNORE

    src = SHIPPED / case / "global_step_1"
    unshard.convert(src, tmp_path / "plain", progress=False)
    schemes, jobs, loads = ["W8A8", "NVFP4A16"], [], []
    for scheme in schemes:
        unshard.convert(src, tmp_path / scheme, quantize=scheme, progress=False, verify=True)
        out = tmp_path / f"oracle-{scheme}"
        jobs.append({"src": str(tmp_path / "plain"), "out": str(out), "scheme": scheme, "ignore": list(DEFAULT_IGNORE)})
        loads += [load_job(tmp_path / "plain", f, scheme, "float32", moe=True) for f in (tmp_path / scheme, out)]
    oracle("quantize", jobs, tmp_path)
    for scheme in schemes:
        ours, theirs = tensors_of(tmp_path / scheme), tensors_of(tmp_path / f"oracle-{scheme}")
        offset = {n for n in theirs if n.endswith("norm.weight") and "linear_attn" not in n}
        assert len(offset) == 11  # (two per layer, q's and k's of the attention layer, the final one)
        for name in offset:
            ours[name] = (ours[name] + 1) - 1
        (tmp_path / f"rounded-{scheme}").mkdir()
        save_file(ours, tmp_path / f"rounded-{scheme}" / "model.safetensors")
        shutil.copy(tmp_path / scheme / "config.json", tmp_path / f"rounded-{scheme}")
        assert_same_files(tmp_path / f"rounded-{scheme}", tmp_path / f"oracle-{scheme}")
        assert "model.layers.0.linear_attn.out_proj.weight_scale" in ours
        assert "model.layers.0.linear_attn.conv1d.weight_scale" not in ours
    loaded = oracle("load", loads, tmp_path)
    for mine, theirs in zip(loaded[::2], loaded[1::2]):
        assert mine["missing"] == mine["unexpected"] == [] and mine["max_abs"] == theirs["max_abs"], (mine, theirs)
