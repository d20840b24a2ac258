"""RWKV-7 (flash-linear-attention's RWKV7ForCausalLM, here as rwkv7-hf's pure-PyTorch model writes it: custom code,
which transformers has no class of) from FSDP2's DCP checkpoint: to a Hugging Face folder, the model trained; to GGUF,
llama.cpp's rwkv7 as the converter writes it (its six token-shift mixes a layer stacked in one tensor, the first
layer's `a` projections written again as its `v` ones, the RWKV world vocabulary), and llama.cpp computes what rwkv7-hf
computes (the oracle runs in the `rwkv7` peer venv)."""

from __future__ import annotations

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
from test_gguf_newer_architectures import unshard_files, unshard_with_llama_cpp_gguf_py

CASE = "rwkv7-fsdp2-dcp"
FIXTURE = generate.HERE / "checkpoints" / CASE
SRC, HF = FIXTURE / "dcp", FIXTURE / "hf"
PROMPT = [5, 20, 33, 64, 70, 90, 2, 7]


def test_rwkv7_dcp_to_a_folder_is_the_model_it_trained(tmp_path):
    """Every tensor as the run gathered it, under the names it saved (no transformers class to check them against),
    with the run's config, the world vocabulary and its tokenizer's files beside them."""
    said = folder_is_the_model_it_trained(
        FIXTURE, tmp_path, ("rwkv_vocab_v20230424.txt", "tokenizer_config.json", "chat_template.jinja")
    )
    assert "tokenizer_config.json names RWKV7Tokenizer, which transformers has no class of" in said


def test_rwkv7_as_the_converter_and_llama_quantize_write_it(converter, ggml_library, tmp_path):
    """unshard's GGUF file of the DCP checkpoint is the converter's of the trained model's folder in f32, f16, bf16
    and q8_0, and llama-quantize's in q4_k_m: rwkv7's header (the head size, the low-rank projections' ranks), each
    layer's token-shift mixes stacked (6 x 1 x 1 x width) where the converter writes them, the decay's low-rank
    projections and the mixes in F32, the first layer's `a` projections twice (as `v` first), r_k flattened, the world
    vocabulary with `<s>` first and padding to the config's 128 tokens, the converter's end of turn and start and end
    tokens."""
    kinds = ("f32", "f16", "bf16", "q8_0", "q4_k_m")
    unshard_files(SRC, tmp_path, kinds, ggml_library, "--config-from", HF)
    folder = the_trained_folder(FIXTURE, tmp_path)
    for kind in ("f32", "f16", "bf16", "q8_0"):
        assert_same_file(tmp_path / f"{kind}.gguf", converter(folder, kind, tmp_path / f"oracle-{kind}.gguf"))
    llama_cpp_client("quantize", tmp_path / "oracle-f32.gguf", tmp_path / "llama-quantize.gguf", "q4_k_m")
    assert_same_file(tmp_path / "q4_k_m.gguf", tmp_path / "llama-quantize.gguf")
    header, tensors = contents(tmp_path / "f16.gguf")
    assert header["general.architecture"] == "rwkv7" and header["rwkv7.wkv.head_size"] == 32
    assert header["tokenizer.ggml.model"] == "rwkv" and len(header["tokenizer.ggml.tokens"]) == 128
    assert header["tokenizer.ggml.tokens"][:2] == ["<s>", "\\x00"] and header["tokenizer.ggml.tokens"][-1] == "[PAD127]"
    assert header["tokenizer.ggml.eot_token_id"] == 261 and header["tokenizer.ggml.bos_token_id"] == 0
    types = {t[0]: t[1] for t in tensors}
    assert types["blk.1.time_mix_lerp_fused.weight"] == "F32" and types["blk.1.time_mix_w1.weight"] == "F32"
    assert types["blk.1.time_mix_receptance.weight"] == "F16" and "blk.0.time_mix_v2.weight" in types
    (lerp,) = [t for t in tensors if t[0] == "blk.0.time_mix_lerp_fused.weight"]
    assert list(lerp[2]) == [64, 1, 1, 6]


def test_dummy_first_layer_v_projections_are_left_out_as_the_converter_leaves_them(converter, tmp_path):
    """Some RWKV-7 conversions keep dummy `v` projections in the first layer, which no first layer computes (fla's and
    rwkv7-hf's own leave them out: the trained model here has none, so the second layer's are copied in as them). The
    converter skips them and writes the first layer's `a` projections as its `v` ones; so does unshard, with a note,
    and the file is the converter's."""
    from safetensors.torch import load_file, save_file

    folder = the_trained_folder(FIXTURE, tmp_path)
    (weights,) = folder.glob("*.safetensors")
    state = load_file(weights)
    dummy = {
        k.replace("layers.1.", "layers.0."): v.clone()
        for k, v in state.items()
        if k.startswith("model.layers.1.attn.v_lora.")
    }
    assert len(dummy) == 3 and not any(name in state for name in dummy)
    save_file({**state, **dummy}, weights, metadata={"format": "pt"})
    done = unshard_with_llama_cpp_gguf_py("convert", folder, tmp_path / "m.gguf", "--gguf-type", "f32", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "3 dummy v projections of the first layer left out" in done.stderr
    assert_same_file(tmp_path / "m.gguf", converter(folder, "f32", tmp_path / "oracle.gguf"))


def test_rwkv7_runs_in_llama_cpp_as_in_rwkv7_hf(tmp_path):
    """llama.cpp runs unshard's f32 and q8_0 files of the DCP checkpoint and computes the logits rwkv7-hf's own
    RWKV7ForCausalLM computes of the trained model, within the type's tolerance."""
    apart = llama_cpp_logits_apart(FIXTURE, "rwkv7", "rwkv7_oracle.py", PROMPT, tmp_path)
    # (measured: 2.1e-7 in f32, 9.9e-3 in q8_0)
    assert all(apart[kind] <= LLAMA_CPP_TOLERANCE[kind] for kind in apart), apart


@pytest.mark.parametrize(
    "change, message",
    [
        ({"norm_bias": False}, "norm_bias is off, and llama.cpp's rwkv7 loads each LayerNorm's bias"),
        ({"attention_hidden_size": 128}, "attention_hidden_size 128 is not hidden_size"),
        ({"value_dim": [64, 128]}, "value_dim is \\[64, 128\\], and llama.cpp's rwkv7 takes values as wide"),
        ({"vocab_size": 100}, "121 tokens with the converter's <s>, more than the config's vocab_size 100"),
    ],
)
def test_rwkv7_llama_cpp_would_not_run_is_one_line(change, message, tmp_path):
    """A config llama.cpp's rwkv7 would not load, or a vocabulary larger than the config's: one line naming the file
    and the fix, nothing written."""
    refused_with_its_files_changed(FIXTURE, "config.json", change, message, tmp_path)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda text: text.replace("'\\x05' 1", "__import__('os').system('true') 1"), "line 6: not `<id> <token"),
        (lambda text: text.replace("'\\x05' 1", "'\\x05' 2"), "line 6: not `<id> <token"),
        (None, "no rwkv_vocab_v20230424.txt, RWKV's world vocabulary"),
    ],
)
def test_a_damaged_world_vocabulary_is_one_line(damage, message, tmp_path):
    """The world vocabulary's tokens are read as literals alone (a line that would run code is refused, never run),
    each checked against the length its line gives; a missing file: one line, nothing written."""
    hf = tmp_path / "hf"
    shutil.copytree(HF, hf)
    vocabulary = hf / "rwkv_vocab_v20230424.txt"
    if damage is None:
        vocabulary.unlink()
    else:
        vocabulary.write_text(damage(vocabulary.read_text()))
    done = unshard_with_llama_cpp_gguf_py("convert", SRC, tmp_path / "m.gguf", "--config-from", hf, "--no-progress")
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert message in done.stderr and "rwkv_vocab_v20230424.txt" in done.stderr or str(hf) in done.stderr
    assert not (tmp_path / "m.gguf").exists()
