"""Drafters as SGLang's SpecForge trains and exports them (its export_to_hf's folder: a flat Llama or Qwen3 config, the
EAGLE-3 layer under `midlayer.`, DFlash's settings under `dflash_config`), to GGUF beside the target model they draft
for: EAGLE-3's as llama.cpp's eagle3, DFlash's and DSpark's as its dflash (with llama.cpp's own gguf-py: PyPI's lacks
both). Each file is the converter's (given --target-model-dir) and llama-quantize's, and llama.cpp computes what
SpecForge's own modules compute of an EAGLE-3 drafting step and of a DFlash drafted block (the oracles run in the
`drafters` peer venv)."""

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
from test_gguf import contents, converter, ggml_library  # noqa: F401  (converter, ggml_library: fixtures, by name)
from test_gguf_newer_architectures import unshard_files, unshard_with_llama_cpp_gguf_py
from test_gguf_speculators import (
    assert_the_converter_s,
    drafts_a_block_as_its_trainer,
    drafts_as_its_trainer,
    export_as_the_converter_writes_it,
    target_of,
)

EAGLE3, DFLASH, DSPARK = "specforge-eagle3-export", "specforge-dflash-export", "specforge-dspark-export"


@pytest.mark.parametrize("case", [EAGLE3, DFLASH, DSPARK])
def test_specforge_drafter_as_the_converter_and_llama_quantize_write_it(case, converter, ggml_library, tmp_path):
    """unshard's GGUF file of SpecForge's exported drafter, given the target's folder, is the converter's given it as
    --target-model-dir in f32, f16, bf16 and q8_0 and llama-quantize's in q4_k_m. EAGLE-3's: the target layers the
    converter takes where the config names none (2, n/2, n-3: SpecForge's default ones, counted past the embedding),
    the target's vocabulary, d2t last as int64 target ids. DFlash's and DSpark's: the block and the target layers from
    dflash_config (counted past the embedding), the target's vocabulary, then the mask token; DSpark's anchor sampled
    and its confidence head."""
    src, header, tensors = export_as_the_converter_writes_it(case, converter, ggml_library, tmp_path)
    names = [t[0] for t in tensors]
    assert len(header["tokenizer.ggml.tokens"]) == 128
    if case == EAGLE3:
        assert header["general.architecture"] == "eagle3" and header["eagle3.target_layers"] == [2, 3, 3]
        assert names[-1] == "d2t" and "t2d" not in names and "blk.0.attn_norm_2.weight" in names
        return
    assert header["general.architecture"] == "dflash" and header["dflash.block_size"] == 4
    assert header["dflash.target_layers"] == [2, 4] and header["tokenizer.ggml.mask_token_id"] == 63
    assert ("dflash.sample_from_anchor" in header) == (case == DSPARK)
    if case == DSPARK:
        assert header["dflash.sample_from_anchor"] and header["dflash.has_confidence_head"]
        assert {"markov_w1.weight", "markov_w2.weight", "conf_proj.weight"} <= set(names)


def test_specforge_eagle3_drafter_runs_in_llama_cpp_as_in_specforge(tmp_path):
    """llama.cpp runs unshard's file as its draft-eagle3 decoding does (the target's three hidden states of each token
    through fc, then each token beside its projection through the layer) and computes what SpecForge's own
    LlamaForCausalLMEagle3 computes of that first drafting step: fc's projections, and the draft vocabulary's logits
    placed at their target ids by d2t (-inf at the target's other ids)."""
    target = target_of(EAGLE3, tmp_path)
    src = generate.HERE / "checkpoints" / EAGLE3 / "export"
    for kind in ("f32", "q8_0"):
        done = unshard_with_llama_cpp_gguf_py(
            "convert", src, tmp_path / f"{kind}.gguf", "--gguf-type", kind, "--target-from", target
        )
        assert done.returncode == 0, done.stderr
    # (measured: fc's projections 2.6e-7 in f32, 7.2e-3 in q8_0; the logits 3.4e-5, 0.010)
    drafts_as_its_trainer(src, "specforge_oracle.py", tmp_path)


@pytest.mark.parametrize("case", [DFLASH, DSPARK])
def test_specforge_dflash_drafter_drafts_in_llama_cpp_as_in_specforge(case, tmp_path):
    """llama.cpp runs unshard's DFlash or DSpark file beside its target's (whose embedding and head it reads) as its
    draft-dflash decoding does (six context tokens' hidden states of its two target layers injected, then the anchor
    and three mask tokens as one block) and computes what SpecForge's own DFlashDraftModel or DSparkDraftModel
    computes of that block: the logits at each position (DSpark's, each biased by its Markov head's greedy walk from
    the anchor, as SpecForge's sample_block_tokens walks it), and DSpark's confidence."""
    fixture = generate.HERE / "checkpoints" / case
    # (measured: DFlash's logits 2.2e-4 apart in f32, 5.4e-3 in q8_0; DSpark's 3.2e-4, 6.4e-3 (1.1e-2 in f32 without
    # its Markov bias), its confidence 3.2e-5)
    oracle, runs, _ = drafts_a_block_as_its_trainer(fixture / "export", fixture / "target", 2, 63, tmp_path)
    if case == DSPARK:
        assert np.abs(runs["f32"]["nextn"][:, 0] - oracle["confidence"]).max() <= 1e-3


@pytest.mark.parametrize(
    "case, change, message",
    [
        (
            EAGLE3,
            {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}},
            'under eagle_config alone \\(\\[1, 2, 3\\]\\).* add "eagle_aux_hidden_state_layer_ids": \\[2, 3, 4\\] to',
        ),
        (DSPARK, {"markov_head_type": "gated"}, "markov_head_type is 'gated', and llama.cpp's dflash runs the vanilla"),
        (DSPARK, {"confidence_head_with_markov": False}, "the confidence head reads the layers' states alone"),
        (DFLASH, {"conv_kernel_size": 2, "selector_rank": 8}, "it has DFlash2's local convolutions"),
    ],
)
def test_specforge_drafter_llama_cpp_would_not_run_is_one_line(case, change, message, tmp_path):
    """A SpecForge drafter the converter would write otherwise than it was trained (target layers it does not read),
    or llama.cpp would compute otherwise (a DSpark head it does not run, DFlash2's layers under DFlash's name): one
    line naming the file and the fix, nothing written. DFlash's and DSpark's settings are SpecForge's, in
    dflash_config."""
    refused_in_one_line(
        case, (lambda c: c) if case == EAGLE3 else (lambda c: c["dflash_config"]), change, message, tmp_path
    )


def refused_in_one_line(case: str, settings, change: dict, message: str, tmp_path: Path) -> None:
    """The shipped export `case` (a fixture's export/ beside its target/), `change` made to the part of its config
    `settings` picks, converted to GGUF beside its target: one line matching `message`, naming config.json, nothing
    written."""
    src = tmp_path / "export"
    shutil.copytree(generate.HERE / "checkpoints" / case / "export", src)
    config = json.loads((src / "config.json").read_text())
    settings(config).update(change)
    (src / "config.json").write_text(json.dumps(config))
    target = generate.HERE / "checkpoints" / case / "target"
    done = unshard_with_llama_cpp_gguf_py("convert", src, tmp_path / "m.gguf", "--target-from", target)
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert re.search(message, done.stderr) and "config.json: " in done.stderr, done.stderr
    assert not (tmp_path / "m.gguf").exists()


def test_inspect_names_a_specforge_drafter_s_family():
    """SpecForge saves a drafter under its target's model type (llama, qwen3): `unshard inspect` names the drafter's
    family by its class, not the target's."""
    for case, name in (
        (EAGLE3, "EAGLE-3 drafter"),
        (DFLASH, "DFlash/DSpark drafter"),
        (DSPARK, "DFlash/DSpark drafter"),
    ):
        src = generate.HERE / "checkpoints" / case / "export"
        done = subprocess.run(
            [sys.executable, "-m", "unshard", "inspect", "--json", str(src)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["family"]["name"] == name
