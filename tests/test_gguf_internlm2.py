"""InternLM2 (InternLM's own InternLM2ForCausalLM, here as xtuner ships it: custom code, which transformers has no class
of) from FSDP2's DCP checkpoint: to a Hugging Face folder, the model trained; to GGUF, llama.cpp's internlm2 as the
converter writes it (wqkv cut into q, k and v group by group, q and k turned per head, InternLM2's SentencePiece
vocabulary with its chat's end as the end token), and llama.cpp computes what InternLM2's own model computes (the oracle
runs in the `internlm2` peer venv)."""

from __future__ import annotations

import json
import re
import shutil

import generate
import pytest
from custom_code_models import (
    folder_is_the_model_it_trained,
    llama_cpp_logits_apart,
    refused_with_its_files_changed,
    the_trained_folder,
)
from test_gguf import LLAMA_CPP_TOLERANCE, assert_same_file, contents, converter, ggml_library, llama_cpp_client  # noqa: F401
from test_gguf_newer_architectures import unshard_files

CASE = "internlm2-fsdp2-dcp"
FIXTURE = generate.HERE / "checkpoints" / CASE
SRC, HF = FIXTURE / "dcp", FIXTURE / "hf"
PROMPT = [1, 3, 290, 300, 17, 350, 4, 2]


def test_internlm2_dcp_to_a_folder_is_the_model_it_trained(tmp_path):
    """Every tensor as the run gathered it, under the names it saved (no transformers class to check them against),
    with the run's config (its auto_map naming the model's code) and its tokenizer's files beside them."""
    said = folder_is_the_model_it_trained(
        FIXTURE, tmp_path, ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json")
    )
    assert "tensor names kept as saved" in said, said


def test_internlm2_as_the_converter_and_llama_quantize_write_it(converter, ggml_library, tmp_path):
    """unshard's GGUF file of the DCP checkpoint is the converter's of the trained model's folder in f32, f16, bf16
    and q8_0, and llama-quantize's in q4_k_m: wqkv's two groups cut into q, k and v, q and k turned per head, the
    SentencePiece pieces with the `[UNUSED...` one unused, the chat's tokens as control tokens and its end as the end
    token."""
    kinds = ("f32", "f16", "bf16", "q8_0", "q4_k_m")
    unshard_files(SRC, tmp_path, kinds, ggml_library, "--config-from", HF)
    folder = the_trained_folder(FIXTURE, tmp_path)
    for kind in ("f32", "f16", "bf16", "q8_0"):
        assert_same_file(tmp_path / f"{kind}.gguf", converter(folder, kind, tmp_path / f"oracle-{kind}.gguf"))
    llama_cpp_client("quantize", tmp_path / "oracle-f32.gguf", tmp_path / "llama-quantize.gguf", "q4_k_m")
    assert_same_file(tmp_path / "q4_k_m.gguf", tmp_path / "llama-quantize.gguf")
    header, tensors = contents(tmp_path / "f16.gguf")
    assert header["general.architecture"] == "internlm2" and header["tokenizer.ggml.model"] == "llama"
    tokens, kinds = header["tokenizer.ggml.tokens"], header["tokenizer.ggml.token_type"]
    unused, end = tokens.index("[UNUSED_TOKEN_145]"), tokens.index("<|im_end|>")
    assert kinds[unused] == 5 and kinds[end] == 3 and header["tokenizer.ggml.eos_token_id"] == end
    shapes = {t[0]: list(t[2]) for t in tensors}
    assert shapes["blk.0.attn_q.weight"] == [64, 64] and shapes["blk.0.attn_k.weight"] == [64, 32]
    assert shapes["blk.1.attn_v.weight"] == [64, 32] and not any("qkv" in name for name in shapes)


def test_internlm2_5_dynamic_rope_as_the_converter_writes_it_with_a_note(converter, ggml_library, tmp_path):
    """InternLM2.5's dynamic NTK rope (scaled past the trained context alone): no scaling in the file, as the converter
    writes it, and a note of what llama.cpp computes otherwise past that context."""
    dynamic = {"rope_scaling": {"type": "dynamic", "factor": 2.0}}
    hf = tmp_path / "hf"
    shutil.copytree(HF, hf)
    (hf / "config.json").write_text(json.dumps({**json.loads((HF / "config.json").read_text()), **dynamic}))
    said = unshard_files(SRC, tmp_path, ("f32",), ggml_library, "--config-from", hf)
    folder = the_trained_folder(FIXTURE, tmp_path)
    (folder / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()), **dynamic}))
    assert_same_file(tmp_path / "f32.gguf", converter(folder, "f32", tmp_path / "oracle.gguf"))
    assert "without InternLM2's dynamic NTK scaling (factor 2.0)" in said and "2048 tokens" in said, said
    assert not any(key.startswith("internlm2.rope.scaling") for key in contents(tmp_path / "f32.gguf")[0])


def test_internlm2_runs_in_llama_cpp_as_in_its_own_model(tmp_path):
    """llama.cpp runs unshard's f32 and q8_0 files of the DCP checkpoint and computes the logits InternLM2's own
    InternLM2ForCausalLM computes of the trained model, within the type's tolerance."""
    apart = llama_cpp_logits_apart(FIXTURE, "internlm2", "internlm2_oracle.py", PROMPT, tmp_path)
    # (measured: 1.8e-4 in f32, as llama.cpp caches keys and values in f16; 1.2e-2 in q8_0)
    assert all(apart[kind] <= LLAMA_CPP_TOLERANCE[kind] for kind in apart), apart


@pytest.mark.parametrize(
    "file, change, message",
    [
        ("config.json", {"bias": True}, "bias is set, and llama.cpp's internlm2 has no biases"),
        ("config.json", {"vocab_size": 400}, "384 pieces for a vocabulary of 400"),
        ("added_tokens.json", {"<|plugin|>": 384}, "1 tokens added past the model's pieces"),
        (
            "tokenizer_config.json",
            {"added_tokens_decoder": {"384": {"content": "<|plugin|>", "special": True}}},
            "the added token '<|plugin|>' has id 384, past the vocabulary's 384 tokens",
        ),
    ],
)
def test_internlm2_llama_cpp_would_not_run_is_one_line(file, change, message, tmp_path):
    """A config llama.cpp's internlm2 would not compute, a vocabulary the converter would not write or llama.cpp would
    not load: one line naming the file and the fix, nothing written."""
    refused_with_its_files_changed(FIXTURE, file, change, re.escape(message), tmp_path)
