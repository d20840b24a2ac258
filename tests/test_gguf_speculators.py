"""EAGLE-3 drafters as vLLM's speculators trains them (FSDP2, saved by its DistributedCheckpointer), to a folder and to
GGUF as llama.cpp's eagle3 (with llama.cpp's own gguf-py: PyPI's lacks it), beside the target model they draft for:
each file is the converter's (given --target-model-dir) and llama-quantize's, and llama.cpp computes what speculators'
own modules compute of a drafting step (the oracle runs in the `drafters` peer venv, generate.py's)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import generate
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_gguf import (  # noqa: F401  (converter and ggml_library: the fixtures, used by name)
    LLAMA_CPP_TOLERANCE,
    assert_same_file,
    contents,
    converter,
    for_the_converter,
    ggml_library,
    llama_cpp_client,
)
from test_gguf_newer_architectures import (
    unshard_commands_with_llama_cpp_gguf_py,
    unshard_files,
    unshard_with_llama_cpp_gguf_py,
)

import unshard

CASE, DSPARK, DFLASH2 = "speculators-eagle3-fsdp2", "speculators-dspark-fsdp2", "speculators-dflash2-fsdp2"


@pytest.mark.parametrize("case", [CASE, DSPARK, DFLASH2])
def test_speculators_drafter_to_a_folder_is_the_one_it_trained(case, fixture_case, tmp_path):
    """unshard's folder of what speculators' checkpointer saved (run/0) holds the drafter's full state dict as rank 0
    gathers it, but what speculators leaves out of its save, tensor for tensor (the maps between the vocabularies
    too), and its config as saved (speculators' own, which vLLM reads; the config class it names is copied, not run)."""
    fixture = fixture_case(case)
    unshard.convert(fixture / "run" / "0", tmp_path / "hf", progress=False)
    written = load_file(tmp_path / "hf" / "model.safetensors")
    reference = load_file(fixture / "reference" / "model.safetensors")
    assert sorted(written) == sorted(reference) and all(torch.equal(written[n], t) for n, t in reference.items())
    assert (tmp_path / "hf" / "config.json").read_bytes() == (fixture / "run" / "0" / "config.json").read_bytes()


def test_a_speculators_run_converts_epoch_by_epoch(tmp_path):
    """speculators' run folder (its epochs as N/, beside its checkpoint_best link) is a run of steps: --all-steps
    writes each epoch as OUT/step_N, the drafter's folder."""
    run = tmp_path / "run"
    shutil.copytree(generate.HERE / "checkpoints" / CASE / "run", run)
    (run / "checkpoint_best").symlink_to("0", target_is_directory=True)
    done = subprocess.run(
        [sys.executable, "-m", "unshard", "convert", str(run), str(tmp_path / "out"), "--all-steps", "--no-progress"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["step_0"]
    written = load_file(tmp_path / "out" / "step_0" / "model.safetensors")
    reference = load_file(generate.HERE / "checkpoints" / CASE / "reference" / "model.safetensors")
    assert sorted(written) == sorted(reference) and all(torch.equal(written[n], t) for n, t in reference.items())


def assert_the_converter_s(converter, folder: Path, target: Path, tmp_path: Path) -> None:
    """unshard's files in tmp_path (f32.gguf ... q8_0.gguf, q4_k_m.gguf) are the converter's of the drafter's folder,
    given the target's as --target-model-dir, and llama-quantize's q4_k_m of the converter's f32 file."""
    for kind in ("f32", "f16", "bf16", "q8_0"):
        oracle = converter(
            folder, kind, tmp_path / f"oracle-{kind}.gguf", pre="gpt-2", more=("--target-model-dir", target)
        )
        assert_same_file(tmp_path / f"{kind}.gguf", oracle)
    llama_cpp_client("quantize", tmp_path / "oracle-f32.gguf", tmp_path / "llama-quantize.gguf", "q4_k_m")
    assert_same_file(tmp_path / "q4_k_m.gguf", tmp_path / "llama-quantize.gguf")


def export_as_the_converter_writes_it(case: str, converter, library: str, tmp_path: Path) -> tuple[Path, dict, list]:
    """A shipped export's (`case`: export/ beside target/) GGUF files by unshard in f32, f16, bf16, q8_0 and q4_k_m,
    each checked against the converter's and llama-quantize's (assert_the_converter_s); the export's folder, and its
    f32 file's header and tensors."""
    target = target_of(case, tmp_path)
    src = generate.HERE / "checkpoints" / case / "export"
    unshard_files(src, tmp_path, ("f32", "f16", "bf16", "q8_0", "q4_k_m"), library, "--target-from", target)
    assert_the_converter_s(converter, src, target, tmp_path)
    return (src, *contents(tmp_path / "f32.gguf"))


def target_of(case: str, tmp_path: Path) -> Path:
    """The fixture's target model's folder, its tokenizer config as the converter's transformers reads it."""
    folder = tmp_path / "target"
    shutil.copytree(generate.HERE / "checkpoints" / case / "target", folder)
    for_the_converter(folder)
    return folder


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """The EAGLE-3 fixture's target model's folder, as the converter reads it (target_of)."""
    return target_of(CASE, tmp_path_factory.mktemp("target"))


def test_eagle3_drafter_as_the_converter_and_llama_quantize_write_it(target, converter, ggml_library, tmp_path):
    """unshard's GGUF file of the drafter, given the target's folder, is the converter's given it as
    --target-model-dir in f32, f16, bf16 and q8_0 (the target layers, the target's width and vocabulary in the
    header; d2t last as int64 target ids; t2d left out, with a note) and llama-quantize's in q4_k_m."""
    src = generate.HERE / "checkpoints" / CASE / "run" / "0"
    kinds = ("f32", "f16", "bf16", "q8_0", "q4_k_m")
    said = unshard_files(src, tmp_path, kinds, ggml_library, "--target-from", target)
    assert "t2d: left out, as llama.cpp's converter leaves it out" in said
    assert "norm_output is on" in said and "keeps a window of 2048 tokens" in said
    assert_the_converter_s(converter, src, target, tmp_path)
    header, tensors = contents(tmp_path / "f32.gguf")
    assert header["general.architecture"] == "eagle3" and header["eagle3.target_layers"] == [1, 3, 4]
    assert header["eagle3.target_hidden_size"] == 64 and len(header["tokenizer.ggml.tokens"]) == 128
    (d2t,) = [t for t in tensors if t[0] == "d2t"]
    assert d2t[1] == "I64" and np.frombuffer(d2t[3], np.int64).tolist() == list(range(0, 128, 2))
    assert tensors[-1][0] == "d2t" and "t2d" not in {t[0] for t in tensors}


def test_eagle3_drafter_runs_in_llama_cpp_as_in_speculators(target, tmp_path):
    """llama.cpp runs unshard's file as its draft-eagle3 decoding does (the target's three hidden states of each
    token through the encoder's fc, then each token beside its projection through the layer) and computes what
    speculators' own Eagle3DraftModel computes of that first drafting step: fc's projections, and the draft
    vocabulary's logits placed at their target ids by d2t (-inf at the target's other ids). The drafter's config names
    its verifier by the path it was trained with: given that folder, unshard finds the target by itself."""
    src = tmp_path / "run" / "0"
    shutil.copytree(generate.HERE / "checkpoints" / CASE / "run" / "0", src)
    config = json.loads((src / "config.json").read_text())
    config["speculators_config"]["verifier"]["name_or_path"] = str(target)
    (src / "config.json").write_text(json.dumps(config))
    for kind in ("f32", "q8_0"):
        done = unshard_with_llama_cpp_gguf_py("convert", src, tmp_path / f"{kind}.gguf", "--gguf-type", kind)
        assert done.returncode == 0, done.stderr
    # (measured: fc's projections 2.6e-7 in f32, 7.2e-3 in q8_0; the logits 3.3e-5, 0.011)
    drafts_as_its_trainer(src, "speculators_oracle.py", tmp_path)


def drafts_as_its_trainer(
    src: Path, oracle_script: str, tmp_path: Path, venv: str = "drafters", target: Path | None = None, logits="logits"
) -> dict:
    """llama.cpp's eagle3 step on tmp_path's f32.gguf and q8_0.gguf (tests/llama_cpp_client.py's `eagle3`: nine
    tokens, each beside three target hidden states; beside the target's file, target.gguf, where `target` is given, the
    target's folder, which the oracle is given too) against the trainer's own modules' (oracle_script, in the `venv`
    peer venv, on the drafter's folder src): fc's projections, and the draft logits (the oracle's `logits`) placed at
    their target ids by d2t (-inf at the target's other ids), within llama.cpp's tolerance of the type. Returns the
    oracle's results, and llama.cpp's logits by type, each at the target's ids of the draft vocabulary."""
    rows = np.random.default_rng(0).standard_normal((9, 3 * 64)).astype(np.float32)
    np.save(tmp_path / "features.npy", rows)
    tokens = "5,20,33,64,70,90,2,7,101"
    done = subprocess.run(
        [str(generate.peer_python(venv)), str(Path(__file__).parent / oracle_script), str(src)]
        + ([str(target)] if target else [])
        + [str(tmp_path / "features.npy"), tokens, str(tmp_path / "oracle.npz")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    oracle, ran_logits = np.load(tmp_path / "oracle.npz"), {}
    expected = np.full((9, 128), -np.inf, np.float32)
    expected[:, oracle["target_ids"]] = oracle[logits]
    drafted = np.isfinite(expected)
    for kind in ("f32", "q8_0"):
        beside = [tmp_path / "target.gguf"] if target else []
        args = (tmp_path / f"{kind}.gguf", tmp_path / "features.npy", tokens, tmp_path / "ll.npz", *beside)
        llama_cpp_client("eagle3", *args)
        ran = np.load(tmp_path / "ll.npz")
        assert distance(ran["g"], oracle["g"]) <= LLAMA_CPP_TOLERANCE[kind]
        assert (np.isfinite(ran["logits"]) == drafted).all()
        assert distance(ran["logits"][drafted], expected[drafted]) <= LLAMA_CPP_TOLERANCE[kind]
        ran_logits[kind] = ran["logits"][:, oracle["target_ids"]]
    return {"oracle": oracle, "logits": ran_logits}


def test_dspark_drafter_as_the_converter_and_llama_quantize_write_it(converter, ggml_library, tmp_path):
    """speculators' DSpark drafter (DFlash's Qwen3 layers, a Markov head, a confidence head, a draft vocabulary), given
    the target's folder: unshard's file is the converter's in f32, f16, bf16 and q8_0 (llama.cpp's dflash: the block,
    the target layers, the window's layers, the anchor sampled, the confidence head in the header; the target's
    vocabulary, written as the target's family writes it, then the mask token; d2t last as int64 target ids) and
    llama-quantize's in q4_k_m. It has no embedding (the target's): llama.cpp runs it beside its target's context
    alone, so no logits are compared here."""
    target = target_of(DSPARK, tmp_path)
    src = generate.HERE / "checkpoints" / DSPARK / "run" / "0"
    kinds = ("f32", "f16", "bf16", "q8_0", "q4_k_m")
    said = unshard_files(src, tmp_path, kinds, ggml_library, "--target-from", target)
    assert "t2d: left out, as llama.cpp's converter leaves it out" in said
    # (its first layer keeps a window, trained causal inside the block: speculators' default for DSpark)
    assert "trained attending causally in its window layers and both ways in the others, and llama.cpp's" in said
    assert_the_converter_s(converter, src, target, tmp_path)
    header, tensors = contents(tmp_path / "f32.gguf")
    assert header["general.architecture"] == "dflash" and header["dflash.block_size"] == 4
    assert header["dflash.target_layers"] == [1, 3, 4] and header["dflash.attention.sliding_window_pattern"] == [
        True,
        False,
    ]
    assert header["dflash.has_confidence_head"] and header["tokenizer.ggml.mask_token_id"] == 127
    names = [t[0] for t in tensors]
    assert {"markov_w1.weight", "markov_w2.weight", "conf_proj.weight"} <= set(names) and names[-1] == "d2t"


def test_dflash2_drafter_as_the_converter_reads_its_makers_form(converter, ggml_library, tmp_path):
    """speculators' DFlash2 drafter (DSpark's Qwen3 layers, each sublayer between local convolutions; a candidate
    selector over the target's vocabulary), given the target's folder: unshard's file is the one the converter writes
    of the same drafter in the form it reads DFlash2 in (its makers': a flat config, the drafter's settings in
    dflash_config; of speculators' own it writes no sizes of the convolutions and selector, and llama.cpp refuses that
    file), in f32, f16, bf16 and q8_0, and llama-quantize's of that in q4_k_m."""
    target = target_of(DFLASH2, tmp_path)
    src = generate.HERE / "checkpoints" / DFLASH2 / "run" / "0"
    kinds = ("f32", "f16", "bf16", "q8_0", "q4_k_m")
    said = unshard_files(src, tmp_path, kinds, ggml_library, "--target-from", target)
    assert "its drafts differ" not in said  # (DFlash2 trains its window layers both ways, as llama.cpp runs them)
    makers = tmp_path / "makers" / "0"  # (named as speculators' folder: the converter names the file's version by it)
    shutil.copytree(src, makers)
    config = json.loads((makers / "config.json").read_text())
    layers = config.pop("transformer_layer_config")
    config["dflash_config"] = {
        "mask_token_id": config.pop("mask_token_id"),
        "target_layer_ids": [i - 1 for i in config.pop("aux_hidden_state_layer_ids")],
        **{key: config.pop(key) for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")},
    }
    (makers / "config.json").write_text(json.dumps({**config, **layers}))
    assert_the_converter_s(converter, makers, target, tmp_path)
    header, tensors = contents(tmp_path / "f32.gguf")
    assert header["general.architecture"] == "dflash" and header["dflash.target_layers"] == [1, 3, 4]
    assert [header[f"dflash.{key}"] for key in ("conv_kernel_size", "conv_group_size")] == [2, 16]
    assert [header[f"dflash.selector_{key}"] for key in ("rank", "top_k")] == [16, 4]
    assert header["tokenizer.ggml.mask_token_id"] == 127 and "dflash.sample_from_anchor" not in header
    names = {t[0] for t in tensors}
    assert {"selector_predecessor.weight", "selector_successor.weight", "blk.1.ffn_conv_base"} <= names, names
    assert "d2t" not in names


def test_dflash2_drafter_drafts_in_llama_cpp_as_in_speculators(tmp_path):
    """llama.cpp runs unshard's DFlash2 file beside its target's (whose embedding and head it reads) as its draft-dflash
    decoding does (tests/llama_cpp_client.py's `dflash`: six context tokens' target hidden states injected, then the
    anchor and three mask tokens as one block) and computes what speculators' own DFlash2DraftModel computes of that
    block (tests/dflash_oracle.py): the logits at each position; and, in f32, its candidate selector's lattice: each
    drafted position's top-k candidates and their scores after the anchor or after each of the previous position's
    candidates."""
    fixture = generate.HERE / "checkpoints" / DFLASH2
    # (measured: the logits 2.6e-4 apart in f32, 7.5e-3 in q8_0)
    oracle, runs, _ = drafts_a_block_as_its_trainer(fixture / "run" / "0", fixture / "target", 3, 127, tmp_path)
    # f32's lattice, read by candidate ids (llama.cpp's top-k are a set, in no order); each score less its candidate's
    # logit: the selector's own part, some 1e-3 of the logits here (measured 1.9e-4 apart)
    lattice, logits, candidates = runs["f32"]["nextn"], runs["f32"]["logits"], oracle["candidates"]
    k, ours, theirs = candidates.shape[1], [], []
    for i in range(1, 4):
        ids = lattice[i, :k].astype(np.int64)
        assert sorted(ids) == sorted(candidates[i])
        before = [5] if i == 1 else list(lattice[i - 1, :k].astype(np.int64))
        expected = oracle["first"] if i == 1 else oracle["scores"][i - 2]
        expected_before = [5] if i == 1 else list(candidates[i - 1])
        scores = lattice[i, k : k + k * k].reshape(k, k)
        for p, predecessor in enumerate(before):
            for c, candidate in enumerate(ids):
                ours.append(scores[p, c] - logits[i, candidate])
                at = expected_before.index(predecessor), list(candidates[i]).index(candidate)
                theirs.append(expected[at] - oracle["logits"][i, candidate])
    assert distance(np.array(ours), np.array(theirs)) <= LLAMA_CPP_TOLERANCE["f32"]


def drafts_a_block_as_its_trainer(
    src: Path,
    target: Path,
    layers: int,
    mask: int,
    tmp_path: Path,
    alike: bool = True,
    oracle_script: str = "dflash_oracle.py",
    venv: str = "drafters",
) -> tuple:
    """A DFlash drafter's block in llama.cpp (tests/llama_cpp_client.py's `dflash`, beside the target's f32 file:
    six context tokens' hidden states of `layers` target layers, then the anchor and three mask tokens) against its
    trainer's own modules' (oracle_script, in the `venv` peer venv): the logits of unshard's f32 and q8_0 files within
    llama.cpp's tolerance of the type (-inf at the same ids), or, not `alike`, f32's ten times past it. Returns the
    oracle's results, llama.cpp's runs by type, and what unshard said."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    done = unshard_commands_with_llama_cpp_gguf_py(
        [
            ("convert", target, tmp_path / "target.gguf", "--gguf-type", "f32"),
            *[
                ("convert", src, tmp_path / f"{kind}.gguf", "--gguf-type", kind, "--target-from", target)
                for kind in ("f32", "q8_0")
            ],
        ]
    )
    assert done.returncode == 0, done.stderr
    features = np.random.default_rng(0).standard_normal((6, layers * 64)).astype(np.float32)
    np.save(tmp_path / "features.npy", features)
    tokens = f"5,{mask},{mask},{mask}"
    oracle_run = subprocess.run(
        [str(generate.peer_python(venv)), str(Path(__file__).parent / oracle_script)]
        + [str(src), str(target), str(tmp_path / "features.npy"), tokens, str(tmp_path / "oracle.npz")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert oracle_run.returncode == 0, oracle_run.stderr[-3000:]
    oracle, runs = np.load(tmp_path / "oracle.npz"), {}
    for kind in ("f32", "q8_0"):
        args = (tmp_path / "target.gguf", tmp_path / f"{kind}.gguf", tmp_path / "features.npy", tokens)
        llama_cpp_client("dflash", *args, tmp_path / f"ll-{kind}.npz")
        runs[kind] = np.load(tmp_path / f"ll-{kind}.npz")
        ran, expected = runs[kind]["logits"], oracle["logits"]
        drafted = np.isfinite(expected)
        assert (np.isfinite(ran) == drafted).all()
        apart = distance(ran[drafted], expected[drafted])
        assert apart <= LLAMA_CPP_TOLERANCE[kind] if alike else kind != "f32" or apart > 10 * LLAMA_CPP_TOLERANCE[kind]
    return oracle, runs, done.stderr


def distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize(
    "change, note",
    [
        ({"sliding_window_non_causal": True}, None),
        ({"layer_types": ["sliding_attention"] * 2, "is_causal": True}, None),
        ({}, "trained attending causally in its window layers and both ways in the others, and llama.cpp's dflash"),
        ({"layer_types": ["sliding_attention"] * 2}, 'add "is_causal": true to its config.json for llama.cpp to'),
    ],
)
def test_dspark_drafter_drafts_in_llama_cpp_as_in_speculators(change, note, tmp_path):
    """llama.cpp runs a DSpark drafter's block (tests/llama_cpp_client.py's `dflash`) attending one way in every layer:
    both ways, or causally where the config says `is_causal`. Where speculators trained the drafter's layers so (its
    window layers are causal inside the block unless sliding_window_non_causal is on; its others, both ways),
    llama.cpp computes what speculators' own DSparkDraftModel computes of the block (tests/dflash_oracle.py): the
    logits over its draft vocabulary at their target ids, each position biased by the Markov head after the token
    before it (the anchor, then the previous position's greedy pick, as llama.cpp chains it), and the confidence
    head's. Otherwise (the fixture's as trained: speculators' default for DSpark) unshard says so in a note, with the
    fix where there is one, and the logits are apart."""
    fixture = generate.HERE / "checkpoints" / DSPARK
    src = tmp_path / "run" / "0"
    shutil.copytree(fixture / "run" / "0", src)
    config = json.loads((src / "config.json").read_text())
    layer = {**config["transformer_layer_config"], **{k: v for k, v in change.items() if k == "layer_types"}}
    config = {**config, **{k: v for k, v in change.items() if k != "layer_types"}, "transformer_layer_config": layer}
    (src / "config.json").write_text(json.dumps(config))
    # (measured, alike: the logits 2.6e-4 apart at most in f32, 1.1e-2 in q8_0, the confidence 8.5e-5; else 0.29, 0.47)
    oracle, runs, said = drafts_a_block_as_its_trainer(src, fixture / "target", 3, 127, tmp_path, alike=not note)
    assert ("its drafts differ from vLLM's" in said) == bool(note) and (note or "") in said
    if not note:
        assert np.abs(runs["f32"]["nextn"][:, 0] - oracle["confidence"]).max() <= 1e-3


@pytest.mark.parametrize(
    "case, change, message",
    [
        (DSPARK, {"markov_head_type": "gated"}, "markov_head_type is 'gated', and llama.cpp's dflash runs the vanilla"),
        (DSPARK, {"confidence_head_with_markov": False}, "the confidence head reads the layers' states alone"),
        (DSPARK, {"draft_vocab_size": 200}, "draft_vocab_size 200 is larger than the vocabulary \\(128\\)"),
        (DFLASH2, {"selector_top_k": 8}, "selector_top_k 8 takes a width of 72 in llama.cpp's selector, and the"),
        (DFLASH2, {"conv_group_size": 24}, "its width 64 is not a whole number of conv_group_size 24 channels"),
        (DFLASH2, {"selector_rank": None}, "it lacks DFlash2's selector_rank, which llama.cpp's dflash needs"),
        (DFLASH2, {"sample_from_anchor": True}, "it samples the anchor's position too, and llama.cpp's DFlash drafts"),
    ],
)
def test_dflash_drafter_llama_cpp_would_not_run_is_one_line(case, change, message, tmp_path):
    """A DSpark or DFlash2 drafter the converter or llama.cpp's dflash does not take, or would draft otherwise: one
    line naming the file, nothing written."""
    src = tmp_path / "run"
    shutil.copytree(generate.HERE / "checkpoints" / case / "run" / "0", src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **change}))
    target = generate.HERE / "checkpoints" / case / "target"
    done = unshard_with_llama_cpp_gguf_py("convert", src, tmp_path / "m.gguf", "--target-from", target)
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert re.search(message, done.stderr) and "config.json: " in done.stderr, done.stderr
    assert not (tmp_path / "m.gguf").exists()


def test_without_llama_cpp_s_gguf_py_a_drafter_is_one_line(tmp_path):
    """PyPI's gguf-py (this venv's) names neither eagle3 nor DSpark's heads: one line saying how to get llama.cpp's,
    nothing written."""
    for case in (CASE, DSPARK, DFLASH2):
        fixture = generate.HERE / "checkpoints" / case
        out = tmp_path / f"{case}.gguf"
        args = ["convert", str(fixture / "run" / "0"), str(out), "--target-from", str(fixture / "target")]
        done = subprocess.run([sys.executable, "-m", "unshard", *args], capture_output=True, text=True)
        assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "which the installed gguf-py (0.19.0) lacks" in done.stderr and not out.exists(), done.stderr


@pytest.mark.parametrize(
    "change, target_change, message",
    [
        ({"transformer_layer_config": {"model_type": "qwen3"}}, {}, "its layer is qwen3's, and llama.cpp's eagle3"),
        ({"transformer_layer_config": {"hidden_act": "gelu"}}, {}, "hidden_act is 'gelu', and llama.cpp's eagle3"),
        ({"fc_norm": True}, {}, "fc_norm is on \\(a norm per target layer\\), which llama.cpp's eagle3 does not"),
        ({"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}, {}, "it reads other than three target layers"),
        ({}, {"vocab_size": 100}, "d2t maps draft tokens outside the target's vocabulary of 100, or two onto one"),
        ({}, None, "its verifier '/nowhere/target' is not a folder here nor a model in the Hugging Face cache: pass"),
    ],
)
def test_eagle3_drafter_llama_cpp_would_not_run_is_one_line(change, target_change, message, target, tmp_path):
    """A drafter llama.cpp's eagle3 would not load or would compute otherwise, a target it does not draft for, or no
    target to be found: one line naming the file and the fix, nothing written."""
    src = tmp_path / "run"
    shutil.copytree(generate.HERE / "checkpoints" / CASE / "run" / "0", src)
    config = json.loads((src / "config.json").read_text())
    for key, value in change.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    config["speculators_config"]["verifier"]["name_or_path"] = "/nowhere/target"
    (src / "config.json").write_text(json.dumps(config))
    given = ()
    if target_change is not None:
        given = ("--target-from", tmp_path / "target")
        shutil.copytree(target, tmp_path / "target")
        target_config = json.loads((target / "config.json").read_text())
        (tmp_path / "target" / "config.json").write_text(json.dumps({**target_config, **target_change}))
    done = unshard_with_llama_cpp_gguf_py("convert", src, tmp_path / "m.gguf", *given, "--no-progress")
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert re.search(message, done.stderr) and "config.json: " in done.stderr, done.stderr
    assert not (tmp_path / "m.gguf").exists()
