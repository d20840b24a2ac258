"""Drafters as NVIDIA's Model Optimizer (ModelOpt) trains and exports them (export_speculative_decoding's folder), to
GGUF beside the target model they draft for (with llama.cpp's own gguf-py: PyPI's lacks both architectures):
- EAGLE-3's (a flat Llama config, the layer under `layers.0.`, the target layers it read and its own settings under
  `eagle_config`) as llama.cpp's eagle3;
- DFlash's (its makers' form: a flat Qwen3 config, the settings under `dflash_config`) as llama.cpp's dflash.
Each file is the converter's (given --target-model-dir) and llama-quantize's, and llama.cpp computes what ModelOpt's
own modules compute of a drafting step, but for the one difference the EAGLE-3 note names (the oracle runs in the
`modelopt` peer venv)."""

from __future__ import annotations

import json
import re
import shutil

import generate
import numpy as np
import pytest
from test_gguf import contents, converter, ggml_library  # noqa: F401  (converter, ggml_library: fixtures, by name)
from test_gguf_newer_architectures import unshard_files, unshard_with_llama_cpp_gguf_py
from test_gguf_specforge import refused_in_one_line
from test_gguf_speculators import (
    assert_the_converter_s,
    distance,
    drafts_a_block_as_its_trainer,
    drafts_as_its_trainer,
    export_as_the_converter_writes_it,
    target_of,
)

EAGLE3, DFLASH = "modelopt-eagle3-export", "modelopt-dflash-export"
SRC = generate.HERE / "checkpoints" / EAGLE3 / "export"


@pytest.mark.parametrize("case", [EAGLE3, DFLASH])
def test_modelopt_drafter_as_the_converter_and_llama_quantize_write_it(case, converter, ggml_library, tmp_path):
    """unshard's GGUF file of ModelOpt's exported drafter, given the target's folder, is the converter's given it as
    --target-model-dir in f32, f16, bf16 and q8_0 and llama-quantize's in q4_k_m. EAGLE-3's: the target layers the
    converter takes where the config names none at the top (2, n/2, n-3 of the target's 8), which are the ones ModelOpt
    read (eagle_config's 1, 3, 4: outputs, where llama.cpp counts inputs); ModelOpt's YaRN for serving; the target's
    vocabulary; d2t last as int64 target ids. DFlash's: the block, the target layers one past dflash_config's, its
    attention inside the block (both ways, as ModelOpt says it trained), the mask token."""
    src, header, tensors = export_as_the_converter_writes_it(case, converter, ggml_library, tmp_path)
    config = json.loads((src / "config.json").read_text())
    if case == DFLASH:
        assert header["general.architecture"] == "dflash" and header["dflash.block_size"] == 4
        assert header["dflash.target_layers"] == [2, 6] and header["dflash.attention.causal"] is False
        assert header["tokenizer.ggml.mask_token_id"] == 127
        return
    trained = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert header["general.architecture"] == "eagle3" and header["eagle3.target_layers"] == [i + 1 for i in trained]
    assert header["eagle3.rope.scaling.type"] == "yarn" and header["eagle3.rope.scaling.factor"] == 32.0
    names = [t[0] for t in tensors]
    assert names[-1] == "d2t" and "blk.0.attn_norm_2.weight" in names and "output_norm.weight" in names


def test_modelopt_eagle3_drafter_runs_in_llama_cpp_as_it_norms_once(tmp_path):
    """llama.cpp runs unshard's file beside its target's (whose embedding it reads: ModelOpt exports none) as its
    draft-eagle3 decoding does, and computes what ModelOpt's own EAGLE-3 module computes of that first drafting step
    (tests/modelopt_oracle.py, with the YaRN its export serves it with) where the projections are normed once before
    the attention, as llama.cpp and EAGLE-3's other trainers norm them: fc's projections, and the draft vocabulary's
    logits placed at their target ids. ModelOpt's Hugging Face trainer norms them twice (its layer's input_layernorm,
    then hidden_norm over that), and llama.cpp's logits are apart from those: unshard says so in a note."""
    target = target_of(EAGLE3, tmp_path)
    done = unshard_with_llama_cpp_gguf_py("convert", target, tmp_path / "target.gguf", "--gguf-type", "f32")
    assert done.returncode == 0, done.stderr
    for kind in ("f32", "q8_0"):
        done = unshard_with_llama_cpp_gguf_py(
            "convert", SRC, tmp_path / f"{kind}.gguf", "--gguf-type", kind, "--target-from", target
        )
        assert done.returncode == 0, done.stderr
        assert "norms the target's projected hidden states twice" in done.stderr, done.stderr
    ran = drafts_as_its_trainer(SRC, "modelopt_oracle.py", tmp_path, "modelopt", target, "logits_normed_once")
    oracle, f32 = ran["oracle"], ran["logits"]["f32"]
    # (measured: fc's projections and the logits normed once within 1.2e-4 in f32, 1.0e-2 in q8_0; ModelOpt's own
    # logits 2.6e-3 from f32's, after one training step: its input_layernorm's weights moved by 0.01 from 1)
    once, twice = distance(f32, oracle["logits_normed_once"]), distance(f32, oracle["logits"])
    assert twice > 10 * once


def test_modelopt_dflash_drafter_drafts_in_llama_cpp_as_in_modelopt(tmp_path):
    """llama.cpp runs unshard's DFlash file beside its target's (whose embedding and head it reads) as its draft-dflash
    decoding does (six context tokens' hidden states of its two target layers injected, then the anchor and three mask
    tokens as one block) and computes what ModelOpt's own DFlash module computes of that block: the logits at each
    position."""
    fixture = generate.HERE / "checkpoints" / DFLASH
    # (measured: the logits 2.4e-4 apart in f32, 6.1e-3 in q8_0)
    _, _, said = drafts_a_block_as_its_trainer(
        fixture / "export", fixture / "target", 2, 127, tmp_path, oracle_script="modelopt_oracle.py", venv="modelopt"
    )
    assert "no tokenizer beside the checkpoint" not in said  # (a drafter's is its target's)


@pytest.mark.parametrize(
    "case, change, message",
    [
        (
            EAGLE3,
            {"eagle_aux_hidden_state_layer_ids": [0, 3, 6]},
            'target layers under eagle_config alone \\(\\[0, 3, 6\\]\\).* add "eagle_aux_hidden_state_layer_ids": '
            "\\[1, 4, 7\\] to config.json",
        ),
        (EAGLE3, {"eagle_aux_hidden_state_layer_ids": [1, 2]}, "it reads other than three target layers"),
        (EAGLE3, {"use_aux_hidden_state": False}, "it is an EAGLE-1 drafter \\(use_aux_hidden_state off: no fc\\)"),
        (EAGLE3, {"use_last_layernorm": False}, "its norms are not EAGLE-3's"),
        (EAGLE3, {"parallel_draft_step": 3}, "it drafts in parallel \\(parallel_draft_step\\)"),
        (DFLASH, {"projector_type": "dspark", "markov_rank": 16}, "projector_type is 'dspark': a head beside DFlash's"),
        (DFLASH, {"projector_type": "domino"}, "projector_type is 'domino'"),
    ],
)
def test_modelopt_drafter_llama_cpp_would_not_run_is_one_line(case, change, message, tmp_path):
    """A ModelOpt drafter the converter would write otherwise than it was trained (EAGLE-3's target layers other than
    its default ones, named under eagle_config alone: the line gives the ids to add, counted as llama.cpp counts them;
    ModelOpt's DSpark and Domino drafters, exported under DFlash's name with their heads), or llama.cpp's eagle3 would
    not run (EAGLE-1's drafter, without fc; other norms; parallel drafting): one line naming the file and the fix,
    nothing written."""
    refused_in_one_line(
        case, lambda c: c["eagle_config" if case == EAGLE3 else "dflash_config"], change, message, tmp_path
    )


def test_inspect_names_a_modelopt_drafter_s_family():
    """ModelOpt saves its EAGLE-3 drafter under Llama's model type: `unshard inspect` names the drafter's family by its
    class."""
    done = unshard_with_llama_cpp_gguf_py("inspect", "--json", SRC)
    assert done.returncode == 0, done.stderr
    assert '"EAGLE-3 drafter"' in done.stdout, done.stdout
