"""GGUF output of the families llama.cpp's converter writes with more than a header hook: DeepSeek-V3's latent
attention, GLM-4.5's MoE with its MTP block, gpt-oss's fused experts, OLMo's and SmolLM3's layouts, and the
pre-tokenizers of the models people fine-tune. The oracles are test_gguf.py's: the converter's file, llama-quantize's,
llama.cpp's logits and tokens against transformers'. (A file of its own, so that CI's two workers share the GGUF
tests.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from conftest import SHIPPED
from make_fsdp import PIXTRAL_TOWER
from safetensors import safe_open
from test_cli_and_errors import run_cli
from test_gguf import (  # noqa: F401  (converter, llama_cpp and ggml_library: the fixtures, used by name)
    LLAMA_CPP_TOLERANCE,
    assert_refused_in_one_line,
    assert_same_file,
    contents,
    converter,
    for_the_converter,
    ggml_library,
    llama_cpp,
    llama_cpp_client,
)

import unshard
from unshard import families
from unshard.families.qwen_next import deltanet_tensors
from unshard.sinks.gguf import kquants


@pytest.mark.parametrize("case", ["olmo2-fsdp2", "olmo3-fsdp2", "smollm3-fsdp2", "seedoss-fsdp2", "ernie45-fsdp2-spm"])
def test_olmo_smollm3_and_seed_oss_as_the_converter_writes_them(case, converter, tmp_path):
    """OLMo 2 (norms after attention and after the MLP, q and k normed over all heads: llama.cpp's olmo2), OLMo 3
    (the same, with a sliding window on three layers in four and rope per kind of layer), SmolLM3 (Llama's
    layout, tied embeddings, every fourth layer without rotary embeddings: llama.cpp's smollm3, q and k reordered
    as for a llama), Seed-OSS (biases on q, k and v, wide heads: seed_oss), their byte-level BPE vocabularies, and
    ERNIE 4.5 (rotary over interleaved pairs, tied embeddings, a SentencePiece vocabulary: ernie4_5): the converter's
    file in f32 and q8_0."""
    src = SHIPPED / case / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    pre = for_the_converter(tmp_path / "hf")
    for kind in ("f32", "q8_0"):
        ours = tmp_path / f"{kind}.gguf"
        unshard.convert(src, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        assert_same_file(ours, converter(tmp_path / "hf", kind, tmp_path / f"oracle-{kind}.gguf", pre=pre))
    fields, tensors = contents(tmp_path / "f32.gguf")
    arch = {"olmo3": "olmo2", "seedoss": "seed_oss", "ernie45": "ernie4_5"}.get(case.split("-")[0], case.split("-")[0])
    assert fields["general.architecture"] == arch
    names = {t[0] for t in tensors}
    if arch == "olmo2":
        assert {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight"} <= names
        assert "blk.0.attn_norm.weight" not in names
    if case.startswith("olmo3"):
        assert fields["olmo2.attention.sliding_window_pattern"] == [True, True, True, False]
    if arch == "smollm3":
        assert "output.weight" not in names  # (tied)


# The pre-tokenizers of models people fine-tune, as their tokenizer.json hold them, by llama.cpp's name for each
REAL_PRE_TOKENIZERS = {
    name: described
    for name, described in json.loads((Path(__file__).parent / "fixtures" / "pre_tokenizers.json").read_text()).items()
    if not name.startswith("_")
}
# Text where the splits differ: numbers of many digits, contractions, case changes, punctuation runs, lines, marks,
# Chinese and Japanese; the corpus the tokenizers are trained on, and the texts they tokenize
CORPUS = [
    "In 2024 we shipped 1234567 checkpoints; don't stop, we'll convert them ALL.",
    "HelloWorld and camelCaseNames: x+=1; y//=2 (ok?)\n\n  indented line\r\nnext",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9, cafe\u0301 and e\u0301te\u0301: marks that combine",
    "\u4e2d\u6587\u5b57\u7b26 and \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8, \u30ab\u30bf\u30ab\u30ca: 12",
    "https://example.com/a/b?c=1 -- e-mail: me@example.com!!!",
]
TEXTS = [
    "Year 19999 had 42 runs; I'm sure they'd say it's FINE.",
    "fooBar BAZqux\n\n\tTabs\r\nand  spaces   here",
    "cre\u0300me bru\u0302le\u0301e at the caf\u00e9",
    "\u4eca\u65e5\u306f\u4e2d\u6587\u6d4b\u8bd5 with 7777 tokens, \u30ab\u30ca",
    "path/to/file.txt /// ??? !!! ...",
]


@pytest.mark.parametrize("pre", list(REAL_PRE_TOKENIZERS))
def test_llama_cpp_tokenizes_as_transformers_with_each_pre_tokenizer(pre, tmp_path):
    """A byte-level BPE trained here over each of those pre-tokenizers, and a Qwen2 model of its vocabulary as
    transformers writes it: unshard names the pre-tokenizer as llama.cpp knows it, and llama.cpp tokenizes texts new
    to it (numbers, contractions, case, marks, CJK, lines) into transformers' own token ids."""
    import unicodedata

    from tokenizers import Tokenizer, trainers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    described = REAL_PRE_TOKENIZERS[pre]
    model = {"type": "BPE", "vocab": {}, "merges": [], "ignore_merges": described["ignore_merges"]}
    decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    tokenizer = Tokenizer.from_str(
        json.dumps({"version": "1.0", "pre_tokenizer": described["pre_tokenizer"], "decoder": decoder, "model": model})
    )
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]
    )
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>").save_pretrained(tmp_path / "hf")
    fast = AutoTokenizer.from_pretrained(tmp_path / "hf")  # (as a user of the folder has it)
    config = Qwen2Config(
        vocab_size=max(fast.get_vocab().values()) + 1,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        architectures=["Qwen2ForCausalLM"],
    )
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "hf")
    unshard.convert(tmp_path / "hf", tmp_path / "m.gguf", output=unshard.OutputOptions(gguf="f32"), progress=False)
    assert contents(tmp_path / "m.gguf")[0]["tokenizer.ggml.pre"] == pre
    # (llama.cpp's gpt-4o split, its own rewrite of o200k's regex, takes a combining mark apart from its letter: so
    # it does for the converter's gpt-oss files too, and that text is left out for it)
    texts = [t for t in TEXTS if pre != "gpt-4o" or not any(unicodedata.combining(c) for c in t)]
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    llama_cpp_client("tokenize", tmp_path / "m.gguf", tmp_path / "texts.json", tmp_path / "ids.json")
    assert json.loads((tmp_path / "ids.json").read_text()) == [fast.encode(t, add_special_tokens=False) for t in texts]


# A small dense model whose rows fill the K-quants' blocks of 256, with the fixtures' tokenizer's vocabulary
ROWS_OF_256 = dict(
    vocab_size=63,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def saved_with_tokenizer(model, tmp_path: Path, special: tuple[str, ...] = ()) -> Path:
    """The model as transformers' save_pretrained writes it, with the fixtures' byte-level BPE tokenizer (and
    these special tokens added): the folder."""
    from tokenizers import AddedToken, Tokenizer

    tokenizer_folder = SHIPPED / "qwen3moe-fsdp2" / "global_step_1" / "actor" / "huggingface"
    tokenizer = Tokenizer.from_file(str(tokenizer_folder / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in special])
    assert tokenizer.get_vocab_size() == model.config.vocab_size
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    shutil.copy(tokenizer_folder / "tokenizer_config.json", folder)
    return folder


def random_norms_and_biases(model) -> None:
    """Norms and biases away from their initial ones and zeros (a sigmoid router's expert bias too), as training
    leaves them: a mistake in any of them shows in the logits."""
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith(("bias", "norm.weight")):
                tensor.normal_(0.0 if name.endswith("bias") else 1.0, 0.1)


def as_the_converter_writes_it(folder: Path, converter, tmp_path: Path, more: tuple = ()) -> tuple[dict, list]:
    """The folder in f32, bf16 and q8_0, each read back (--verify) and equal to the converter's (its byte-level BPE
    tokenizer named gpt-2 for it; `more`: the converter's other arguments); the f32 file's contents."""
    pre = for_the_converter(folder)
    for kind in ("f32", "bf16", "q8_0"):
        out = tmp_path / f"{kind}.gguf"
        ours = unshard.convert(folder, out, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        assert ours.files[0] == "model.gguf" and ours.files[1:] in ([], ["mmproj.gguf"])  # (a vision model's too)
        oracle = converter(folder, kind, tmp_path / f"oracle-{kind}.gguf", pre=pre, more=more)
        assert_same_file(tmp_path / f"{kind}.gguf", oracle)
    return contents(tmp_path / "f32.gguf")


def assert_llama_cpp_runs_it_and_llama_quantize_mixes_it(
    folder, model, llama_cpp, ggml_library, monkeypatch, tmp_path, kv_cache="f16", tolerance=LLAMA_CPP_TOLERANCE["f32"]
):
    """llama.cpp computes the model's logits from unshard's f32 file (within the tolerance, its keys and values cached
    in kv_cache's type), and every K-quant mix unshard writes is llama-quantize's of the converter's f32 file
    (as_the_converter_writes_it's)."""
    prompt = [1, 5, 20, 33, 41, 50, 60, 2]
    expected = model(torch.tensor([prompt])).logits[0].detach()
    logits, _ = llama_cpp(tmp_path / "f32.gguf", prompt, 0, kv_cache=kv_cache)
    distance = ((logits - expected).norm() / expected.norm()).item()
    assert distance <= tolerance, distance
    assert_llama_quantize_mixes_it(folder, ggml_library, monkeypatch, tmp_path)


def assert_llama_quantize_mixes_it(folder, ggml_library, monkeypatch, tmp_path):
    """Every K-quant mix unshard writes of the folder is llama-quantize's of the converter's f32 file."""
    (tmp_path / "llama-quantize").mkdir()
    llama_cpp_client("quantize", tmp_path / "oracle-f32.gguf", tmp_path / "llama-quantize", ",".join(kquants.MIXES))
    monkeypatch.setenv(kquants.LIBRARY_VARIABLE, ggml_library)
    for kind in kquants.MIXES:
        unshard.convert(folder, tmp_path / f"{kind}.gguf", output=unshard.OutputOptions(gguf=kind), progress=False)
        assert_same_file(tmp_path / f"{kind}.gguf", tmp_path / "llama-quantize" / f"{kind}.gguf")


# Granite 4.0's sizes at rows of 256 (K-quants' blocks), its multipliers away from 1
GRANITE4_SIZES = dict(
    hidden_size=256,
    intermediate_size=256,  # (llama.cpp's width of the MLP where there are no experts, as the Hub's H-Micro has it)
    shared_intermediate_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    embedding_multiplier=3.0,
    attention_multiplier=0.1,
    residual_multiplier=0.5,
    logits_scaling=2.0,
    max_position_embeddings=256,
    architectures=["GraniteMoeHybridForCausalLM"],
)


def granite4_folder(tmp_path: Path, layer_types: list[str], special: tuple[str, ...] = (), **config) -> Path:
    """Granite 4.0 (GraniteMoeHybridForCausalLM) as transformers writes it, with the fixtures' tokenizer, its layer
    types in config.json as the Hub spells them (mamba, attention), which transformers 5 saves renamed."""
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    hparams = {**GRANITE4_SIZES, **config, "num_hidden_layers": len(layer_types), "layer_types": layer_types}
    torch.manual_seed(0)
    model = GraniteMoeHybridForCausalLM(GraniteMoeHybridConfig(**hparams)).to(torch.bfloat16)
    random_norms_and_biases(model)
    folder = saved_with_tokenizer(model, tmp_path, special)
    saved = json.loads((folder / "config.json").read_text())
    saved_as = {"mamba": "linear_attention", "attention": "full_attention"}
    assert saved["layer_types"] == [saved_as[kind] for kind in layer_types]
    (folder / "config.json").write_text(json.dumps({**saved, "layer_types": layer_types}))
    return folder


def test_granite_hybrid_without_experts_as_the_converter_and_llama_quantize_write_it(
    converter, llama_cpp, ggml_library, monkeypatch, tmp_path
):
    """Granite 4.0 H-Micro's layout as transformers writes it, rows of 256 (K-quants' blocks): Mamba-2 layers around
    an attention layer, no experts (the shared expert is each layer's MLP, llama.cpp's ffn_gate, ffn_up and ffn_down),
    its layer types as the Hub spells them (mamba, attention). The file is the converter's in f32, bf16 and q8_0 and
    llama-quantize's in the K-quant mixes; llama.cpp computes transformers' logits from it."""
    from transformers import GraniteMoeHybridForCausalLM

    folder = granite4_folder(
        tmp_path,
        ["mamba", "attention", "mamba"],
        ("<|end_of_text|>",),  # (the fixtures' tokenizer and one special token: a multiple of 8, as the converter pads)
        vocab_size=64,
        num_local_experts=0,
        num_experts_per_tok=0,
        position_embedding_type="nope",
        mamba_n_heads=8,
        mamba_d_state=16,
        mamba_chunk_size=16,
    )
    fields, tensors = as_the_converter_writes_it(folder, converter, tmp_path)
    assert fields["general.architecture"] == "granitehybrid"
    assert fields["granitehybrid.attention.head_count_kv"] == [0, 2, 0]
    shapes = {t[0]: t[2] for t in tensors}
    assert shapes["blk.0.ssm_a"] == [1, 8] and shapes["blk.0.ssm_norm.weight"] == [512, 1]
    assert shapes["blk.1.ffn_down.weight"] == [256, 256] and "blk.1.ffn_down_shexp.weight" not in shapes
    model = GraniteMoeHybridForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert_llama_cpp_runs_it_and_llama_quantize_mixes_it(folder, model, llama_cpp, ggml_library, monkeypatch, tmp_path)


@pytest.mark.parametrize("experts", [0, 4], ids=["micro", "with-experts"])
def test_granite_4_of_attention_layers_alone_as_the_converter_writes_it(
    experts, converter, llama_cpp, ggml_library, monkeypatch, tmp_path
):
    """Granite 4.0 Micro's layout (GraniteMoeHybridForCausalLM without Mamba-2 layers: attention with rope, the shared
    expert as each layer's MLP), rows of 256, which the converter writes as llama.cpp's granite (granitemoe with
    experts): Granite's header with Mamba-2's sizes after it, every layer's key-value heads, rope on; q and k rows
    reordered as for Llama; no vocabulary padding. The file is the converter's in f32, bf16 and q8_0 and
    llama-quantize's in the K-quant mixes; llama.cpp computes transformers' logits from it."""
    from transformers import GraniteMoeHybridForCausalLM

    folder = granite4_folder(
        tmp_path,
        ["attention", "attention"],
        vocab_size=63,  # (the fixtures' tokenizer: the converter pads no vocabulary without Mamba-2 layers)
        num_local_experts=experts,
        num_experts_per_tok=2 if experts else 0,
        position_embedding_type="rope",
    )
    fields, tensors = as_the_converter_writes_it(folder, converter, tmp_path)
    arch = "granitemoe" if experts else "granite"
    assert fields["general.architecture"] == arch and fields[f"{arch}.attention.head_count_kv"] == [2, 2]
    assert fields[f"{arch}.rope.scaling.finetuned"] is True and fields[f"{arch}.context_length"] == 256
    shapes = {t[0]: t[2] for t in tensors}
    assert ("blk.0.ffn_up_exps.weight" in shapes) == bool(experts) and "blk.0.ssm_a" not in shapes
    model = GraniteMoeHybridForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert_llama_cpp_runs_it_and_llama_quantize_mixes_it(folder, model, llama_cpp, ggml_library, monkeypatch, tmp_path)


def test_lfm2_s_short_convolution_is_f32_in_every_type_as_the_converter_writes_it(converter, tmp_path):
    """LFM2's short convolution kernel, which llama.cpp keeps in f32 whatever the type (the converter and
    llama-quantize), and which unshard wrote in the file's type until this test: the file is the converter's in f32,
    bf16 and q8_0."""
    folder = tmp_path / "hf"
    unshard.convert(SHIPPED / "lfm2-fsdp2" / "global_step_1", folder, progress=False)
    as_the_converter_writes_it(folder, converter, tmp_path)
    tensors = {t[0]: t[1] for t in contents(tmp_path / "bf16.gguf")[1]}
    assert tensors["blk.0.shortconv.conv.weight"] == "F32" and tensors["blk.0.shortconv.in_proj.weight"] == "BF16"


def test_apertus_as_the_converter_and_llama_quantize_write_it(
    converter, llama_cpp, ggml_library, monkeypatch, tmp_path
):
    """Apertus as transformers writes it, rows of 256, its xIELU parameters trained apart in each layer: the header
    carries them, read while planning, first, as the converter writes them, and they are left out of the tensors.
    The file is the converter's in f32, bf16 and q8_0 and llama-quantize's in the K-quant mixes; llama.cpp computes
    transformers' logits from it. A layer without its parameters (llama.cpp reads one of each per layer): one line."""
    from transformers import ApertusConfig, ApertusForCausalLM

    from unshard.families.apertus import xielu_keys

    rope = dict(rope_type="llama3", rope_theta=12e6, factor=8.0, original_max_position_embeddings=32)
    config = ApertusConfig(
        **ROWS_OF_256,
        rope_parameters={**rope, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
        max_position_embeddings=128,
        architectures=["ApertusForCausalLM"],
    )
    torch.manual_seed(0)
    model = ApertusForCausalLM(config).to(torch.bfloat16)
    random_norms_and_biases(model)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".act_fn." in name:  # (each layer's own, as training leaves them)
                parameter.add_(torch.randn_like(parameter) * 0.3)
    folder = saved_with_tokenizer(model, tmp_path)
    fields, tensors = as_the_converter_writes_it(folder, converter, tmp_path)
    assert list(fields)[1:5] == [f"xielu.{kind}" for kind in ("alpha_n", "alpha_p", "beta", "eps")]
    assert fields["xielu.alpha_p"] == [model.model.layers[i].mlp.act_fn.alpha_p.float().item() for i in range(2)]
    assert not any("act_fn" in t[0] or "xielu" in t[0] for t in tensors)
    model = ApertusForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert_llama_cpp_runs_it_and_llama_quantize_mixes_it(folder, model, llama_cpp, ggml_library, monkeypatch, tmp_path)
    values = {f"model.layers.{i}.mlp.act_fn.{kind}": [0.5] for i in (0, 2) for kind in ("alpha_n", "alpha_p")}
    with pytest.raises(unshard.ConfigMismatchError, match="one xIELU alpha_n for each of the 3 layers, and the che"):
        xielu_keys(None, values, {"num_hidden_layers": 3}, "config.json")


def test_mistral_small_3_s_text_model_as_the_converter_and_llama_quantize_write_it(
    converter, llama_cpp, ggml_library, monkeypatch, tmp_path
):
    """Mistral Small 3.1's layout (Mistral3ForConditionalGeneration: a Mistral text model beside a Pixtral tower) as
    transformers writes it, rows of 256: the text model as llama.cpp's mistral3 (Llama's header and q and k reordered),
    the tower and its projector in the mmproj file beside it (test_gguf_pixtral.py). The text model's file is the
    converter's in f32, bf16 and q8_0 and llama-quantize's in the K-quant mixes; llama.cpp computes transformers'
    logits from it (the text alone). A sliding window, which llama.cpp's mistral3 does not compute, is one line."""
    from make_fsdp import PIXTRAL_TOKENS
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, PixtralImageProcessorPil

    text = dict(
        model_type="mistral",
        vocab_size=66,  # (the fixtures' tokenizer, with Mistral 3's image tokens)
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        sliding_window=None,
        rms_norm_eps=1e-5,  # (Mistral Small 3.1's: its patch merger's norm takes it, as llama.cpp's the tower's)
    )
    config = Mistral3Config(
        text_config=text,
        vision_config=PIXTRAL_TOWER,
        image_token_index=63,
        tie_word_embeddings=False,  # (as Mistral Small 3.1's config: its own head)
        architectures=["Mistral3ForConditionalGeneration"],
    )
    torch.manual_seed(0)
    model = Mistral3ForConditionalGeneration(config).to(torch.bfloat16)
    random_norms_and_biases(model)
    model.config.vocab_size = 66  # (saved_with_tokenizer's check of the tokenizer's size)
    folder = saved_with_tokenizer(model, tmp_path, special=tuple(PIXTRAL_TOKENS))
    PixtralImageProcessorPil(patch_size=16, size={"longest_edge": 128}).save_pretrained(folder)
    plan = unshard.plan(folder, output=unshard.OutputOptions(gguf="f32"))
    assert plan.summary()["gguf"]["mmproj"]["tensor_types"] == {"F32": 34}
    fields, tensors = as_the_converter_writes_it(folder, converter, tmp_path)
    assert fields["general.architecture"] == "mistral3" and not any(t[0].startswith(("v.", "mm.")) for t in tensors)
    model = Mistral3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    assert_llama_cpp_runs_it_and_llama_quantize_mixes_it(folder, model, llama_cpp, ggml_library, monkeypatch, tmp_path)
    saved = json.loads((folder / "config.json").read_text())
    saved["text_config"]["sliding_window"] = 4  # (transformers' Mistral slides its attention; llama.cpp's does not)
    (folder / "config.json").write_text(json.dumps(saved))
    with pytest.raises(unshard.ConfigMismatchError, match="sliding_window is 4, and llama.cpp's mistral3 has no"):
        unshard.convert(folder, tmp_path / "m.gguf", output=unshard.OutputOptions(gguf="f32"), progress=False)


def test_ministral_3_as_the_converter_and_llama_quantize_write_it(
    converter, llama_cpp, ggml_library, monkeypatch, tmp_path
):
    """Ministral 3 (Ministral3ForCausalLM) as transformers writes it, rows of 256, with its YaRN (over a short original
    context, so that it turns every position here) and its attention's temperature scale by position: llama.cpp's
    mistral3, the header with YaRN's log multiplier and the temperature's beta as the converter writes them. The file
    is the converter's in f32, bf16 and q8_0 and llama-quantize's in the K-quant mixes; llama.cpp computes
    transformers' logits from it. Rope other than YaRN with those keys is one line."""
    from transformers import Ministral3Config, Ministral3ForCausalLM

    rope = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 64}
    rope.update(beta_fast=32.0, beta_slow=1.0, mscale_all_dim=1.0, mscale=1.0, llama_4_scaling_beta=0.1)
    config = Ministral3Config(
        **ROWS_OF_256,
        head_dim=64,
        max_position_embeddings=1024,
        rope_parameters=rope,
        architectures=["Ministral3ForCausalLM"],
    )
    torch.manual_seed(0)
    model = Ministral3ForCausalLM(config).to(torch.bfloat16)
    random_norms_and_biases(model)
    folder = saved_with_tokenizer(model, tmp_path)
    fields, tensors = as_the_converter_writes_it(folder, converter, tmp_path)
    assert fields["general.architecture"] == "mistral3" and fields["mistral3.rope.scaling.type"] == "yarn"
    assert fields["mistral3.attention.temperature_scale"] == pytest.approx(0.1)
    model = Ministral3ForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert_llama_cpp_runs_it_and_llama_quantize_mixes_it(folder, model, llama_cpp, ggml_library, monkeypatch, tmp_path)
    saved = json.loads((folder / "config.json").read_text())
    del saved["rope_parameters"]["llama_4_scaling_beta"]
    (folder / "config.json").write_text(json.dumps(saved))
    with pytest.raises(unshard.ConfigMismatchError, match="YaRN with mscale_all_dim and llama_4_scaling_beta"):
        unshard.convert(folder, tmp_path / "m.gguf", output=unshard.OutputOptions(gguf="f32"), progress=False)


# Gemma 4's layouts at rows of 256 (K-quants' blocks): E2B's and E4B's (per-layer embeddings, the last two layers
# reusing the keys and values of the two before them, their MLPs twice as wide) and 26B-A4B's (fused experts beside
# each MLP, the global layers with one key head and keys as values)
GEMMA4_LAYOUTS = {
    "e2b": dict(
        hidden_size_per_layer_input=16, vocab_size_per_layer_input=100, num_kv_shared_layers=2, use_double_wide_mlp=True
    ),
    "26b-a4b": dict(
        enable_moe_block=True,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=256,
        attention_k_eq_v=True,
        num_global_key_value_heads=1,
        hidden_size_per_layer_input=0,
    ),
}


@pytest.mark.parametrize("layout", GEMMA4_LAYOUTS)
def test_gemma4_as_the_converter_and_llama_quantize_write_it(
    layout, converter, llama_cpp, ggml_library, monkeypatch, tmp_path
):
    """Gemma 4's text model as transformers writes it, with its tokenizer (a BPE with byte fallback, llama.cpp's
    gemma4 tokenizer): sliding layers with heads of 128, global ones with heads of 256 (rope on a quarter: the
    converter's rope_freqs), in llama.cpp's gemma4 the file equal to the converter's in f32, bf16 and q8_0 and to
    llama-quantize's in the K-quant mixes (Gemma 4's projection into the per-layer embeddings left in f32); llama.cpp
    computes transformers' logits from it (keys and values cached in f32: GEMMA4_F32_TOLERANCE says why)."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    config = Gemma4TextConfig(
        vocab_size=100,
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=128,
        global_head_dim=256,
        layer_types=["sliding_attention", "full_attention"] * 2,
        sliding_window=4,
        final_logit_softcapping=30.0,
        max_position_embeddings=256,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
        architectures=["Gemma4ForCausalLM"],
        **GEMMA4_LAYOUTS[layout],
    )
    torch.manual_seed(0)
    model = Gemma4ForCausalLM(config).to(torch.bfloat16)
    random_norms_and_biases(model)
    with torch.no_grad():  # (each layer's output scale, and the router's, away from their initial ones)
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith(("layer_scalar", "router.scale", "per_expert_scale")):
                tensor.normal_(1.0, 0.1)
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SHIPPED / "gemma4-fsdp2" / "global_step_1" / "actor" / "huggingface" / name, folder)
    fields, tensors = as_the_converter_writes_it(folder, converter, tmp_path)
    assert fields["general.architecture"] == "gemma4" and fields["tokenizer.ggml.model"] == "gemma4"
    assert fields["gemma4.attention.key_length"] == 256 and fields["gemma4.attention.key_length_swa"] == 128
    shapes = {t[0]: t[2] for t in tensors}
    assert shapes["rope_freqs.weight"] == [128]
    if layout == "e2b":
        assert fields["gemma4.feed_forward_length"] == [256, 256, 512, 512]
        assert "blk.2.attn_k.weight" not in shapes and shapes["per_layer_token_embd.weight"] == [64, 100]
    else:
        assert fields["gemma4.attention.head_count_kv"] == [2, 1, 2, 1] and "blk.1.attn_v.weight" not in shapes
        assert shapes["blk.0.ffn_gate_up_exps.weight"] == [256, 512, 4] and shapes["blk.0.ffn_down_exps.scale"] == [4]
    # (the model as the folder has it: the bf16 model's buffers of constants, rounded to bf16, are not saved)
    model = Gemma4ForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert_llama_cpp_runs_it_and_llama_quantize_mixes_it(
        folder, model, llama_cpp, ggml_library, monkeypatch, tmp_path, "f32", GEMMA4_F32_TOLERANCE
    )


def test_nemotron_3_nano_from_its_folder_as_the_converter_and_llama_quantize_write_it(
    converter, llama_cpp, ggml_library, monkeypatch, tmp_path
):
    """Nemotron 3 Nano's layout (nemotronhmoe-fsdp2: Mamba-2, attention and MoE layers, ReLU² experts behind a sigmoid
    router, a shared expert), read from the folder unshard writes of its FSDP2 rank files, whose routers transformers
    keeps in float32 (saved as backbone.*, held as model.*: read so, not rounded to bf16): llama.cpp's nemotron_h_moe,
    the file equal to the converter's in f32, bf16 and q8_0 and to llama-quantize's in the K-quant mixes; llama.cpp
    computes transformers' logits from it."""
    import transformers

    unshard.convert(SHIPPED / "nemotronhmoe-fsdp2" / "global_step_1", tmp_path / "hf", progress=False)
    fields, tensors = as_the_converter_writes_it(tmp_path / "hf", converter, tmp_path)
    assert fields["general.architecture"] == "nemotron_h_moe" and fields["nemotron_h_moe.expert_count"] == 4
    assert fields["nemotron_h_moe.attention.head_count_kv"] == [0, 0, 2, 0]
    shapes = {t[0]: t[2] for t in tensors}
    assert shapes["blk.1.ffn_up_exps.weight"] == [64, 32, 4] and shapes["blk.1.exp_probs_b.bias"] == [4]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        SHIPPED / "nemotronhmoe-fsdp2" / "reference", dtype=torch.float32
    )
    assert_llama_cpp_runs_it_and_llama_quantize_mixes_it(
        tmp_path / "hf", model, llama_cpp, ggml_library, monkeypatch, tmp_path
    )


def test_nemotron_3_super_s_latent_experts_as_the_converter_and_llama_quantize_write_them(
    converter, llama_cpp, ggml_library, monkeypatch, tmp_path
):
    """Nemotron 3 Super's latent experts (moe_latent_size): nemotronhmoe-fsdp2's layout made by transformers with its
    experts in a space of 32 (the model's is 64), projected into it and out of it by each MoE layer
    (fc1_latent_proj, fc2_latent_proj: llama.cpp's ffn_latent_down and ffn_latent_up); llama.cpp's nemotron_h_moe with
    the latent size in its header, the file equal to the converter's and to llama-quantize's; llama.cpp computes
    transformers' logits from it."""
    import transformers

    hub = SHIPPED / "nemotronhmoe-fsdp2" / "global_step_1" / "actor" / "huggingface"
    config = transformers.AutoConfig.from_pretrained(hub)
    config.moe_latent_size = 32
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    random_norms_and_biases(model)
    model.save_pretrained(tmp_path / "hf")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hub / name, tmp_path / "hf")
    fields, tensors = as_the_converter_writes_it(tmp_path / "hf", converter, tmp_path)
    assert fields["nemotron_h_moe.moe_latent_size"] == 32
    shapes = {t[0]: t[2] for t in tensors}
    assert shapes["blk.1.ffn_up_exps.weight"] == [32, 32, 4] and shapes["blk.1.ffn_latent_down.weight"] == [64, 32]
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert_llama_cpp_runs_it_and_llama_quantize_mixes_it(
        tmp_path / "hf", model, llama_cpp, ggml_library, monkeypatch, tmp_path
    )


def test_gpt_oss_as_the_converter_and_llama_quantize_write_it(converter, ggml_library, monkeypatch, tmp_path):
    """gpt-oss (FSDP2 rank files; test_llama_cpp_runs_the_file_... runs it): its fused experts transposed into
    llama.cpp's stacks, gate and up apart (their columns interleaved in transformers' gate_up_proj), their biases
    likewise; the attention sinks; the file equal to the converter's in f32, bf16 and q8_0 and to llama-quantize's in
    the K-quant mixes."""
    unshard.convert(SHIPPED / "gptoss-fsdp2" / "global_step_1", tmp_path / "hf", progress=False)
    fields, tensors = as_the_converter_writes_it(tmp_path / "hf", converter, tmp_path)
    shapes = {t[0]: t[2] for t in tensors}
    assert shapes["blk.0.ffn_gate_exps.weight"] == shapes["blk.0.ffn_up_exps.weight"] == [64, 64, 4]
    assert shapes["blk.0.ffn_down_exps.weight"] == [64, 64, 4] and shapes["blk.0.ffn_gate_exps.bias"] == [64, 4]
    assert shapes["blk.0.attn_sinks.weight"] == [4] and fields["general.size_label"].startswith("4x")
    assert_llama_quantize_mixes_it(tmp_path / "hf", ggml_library, monkeypatch, tmp_path)


@pytest.mark.parametrize("case", ["qwen3next-fsdp2", "qwen35-fsdp2", "qwen35moe-fsdp2"])
def test_qwen3_next_and_qwen35_as_the_converter_and_llama_quantize_write_them(
    case, converter, llama_cpp, ggml_library, monkeypatch, tmp_path
):
    """Qwen3-Next and Qwen3.5's and Qwen3.5-MoE's text models (FSDP2 rank files): llama.cpp's qwen3next, qwen35 and
    qwen35moe, the file equal to the converter's in f32, bf16 and q8_0 (with its `--no-mtp`: a trained model's folder
    has no MTP layer, as transformers drops it) and to llama-quantize's in the K-quant mixes: Qwen3-Next's in_proj_qkvz
    as qkv and the output gate, A = -exp(A_log), the convolution's kernel 2-D and in F32 whatever the type, the norms
    shifted by one but the DeltaNet's own, which layers are recurrent; Qwen3.5's value heads reordered as llama.cpp
    broadcasts them (two per key head here), its M-RoPE sections. llama.cpp computes transformers' logits from it
    (measured 1.8e-4 and 1.5e-4), the recurrent state included."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "hf"
    unshard.convert(SHIPPED / case / "global_step_1", folder, progress=False)
    fields, tensors = as_the_converter_writes_it(folder, converter, tmp_path, more=("--no-mtp",))
    arch = fields["general.architecture"]
    assert arch == {"qwen3next-fsdp2": "qwen3next", "qwen35-fsdp2": "qwen35", "qwen35moe-fsdp2": "qwen35moe"}[case]
    assert fields[f"{arch}.attention.recurrent_layers"] == [True, True, True, False]
    assert fields[f"{arch}.ssm.group_count"] == 2 and fields[f"{arch}.ssm.time_step_rank"] == 4
    stored = {t[0]: t for t in tensors}
    assert stored["blk.0.attn_qkv.weight"][2] == [64, 128] and stored["blk.0.attn_gate.weight"][2] == [64, 64]
    a_log = load_file(folder / "model.safetensors")["model.layers.0.linear_attn.A_log"]
    order = [0, 1, 2, 3] if arch == "qwen3next" else [0, 2, 1, 3]  # (value heads by key head -> by their rank in it)
    assert torch.frombuffer(bytearray(stored["blk.0.ssm_a"][3]), dtype=torch.float32).equal(-torch.exp(a_log)[order])
    assert {t[0]: t[1] for t in contents(tmp_path / "q8_0.gguf")[1]}["blk.0.ssm_conv1d.weight"] == "F32"
    if arch != "qwen3next":
        assert fields[f"{arch}.rope.dimension_sections"] == [2, 1, 1, 0]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert_llama_cpp_runs_it_and_llama_quantize_mixes_it(folder, model, llama_cpp, ggml_library, monkeypatch, tmp_path)
    if arch == "qwen3next":
        config = json.loads((folder / "config.json").read_text())
        with pytest.raises(unshard.ConfigMismatchError, match="not 2 key heads of q, k"):
            deltanet_tensors("model.layers.0.linear_attn.in_proj_qkvz.weight", (160, 64), config, "config.json")


def test_kimi_linear_as_the_converter_and_llama_quantize_write_it(
    converter, llama_cpp, ggml_library, monkeypatch, tmp_path
):
    """Kimi Linear (FSDP2 rank files of transformers' model): the folder in the Hub's names (the dense layer's MLP as
    `mlp.`, where transformers' save_pretrained writes `block_sparse_moe.`, which the converter cannot map); llama.cpp's
    kimi-linear, the file equal to the converter's in f32, bf16 and q8_0, written from the folder or straight from the
    shards, and to llama-quantize's in the K-quant mixes: which layers are recurrent (0 key-value heads), the latent
    attention as MQA (kv_b_proj as k_b and v_b), the convolutions' kernels 4-D and F32 in every type, A = -exp(A_log),
    dt_bias as dt_proj's bias, the sigmoid routing. llama.cpp computes transformers' logits from it, the recurrent
    state included."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    src = SHIPPED / "kimilinear-fsdp2" / "global_step_1"
    folder = tmp_path / "hf"
    unshard.convert(src, folder, progress=False)
    weights = load_file(folder / "model.safetensors")
    assert "model.layers.0.mlp.gate_proj.weight" in weights and not any(".0.block_sparse_moe." in n for n in weights)
    fields, tensors = as_the_converter_writes_it(folder, converter, tmp_path)
    assert fields["general.architecture"] == "kimi-linear"
    assert fields["kimi-linear.attention.head_count_kv"] == [0, 1, 0, 1]
    assert fields["kimi-linear.expert_gating_func"] == gguf.ExpertGatingFuncType.SIGMOID
    stored = {t[0]: t for t in tensors}
    assert stored["blk.0.ssm_conv1d_q.weight"][2] == [4, 1, 64, 1] and "blk.0.attn_kv_b.weight" not in stored
    assert stored["blk.1.attn_k_b.weight"][2] == [16, 32, 2] and stored["blk.1.attn_v_b.weight"][2] == [32, 32, 2]
    a = torch.frombuffer(bytearray(stored["blk.0.ssm_a"][3]), dtype=torch.float32)
    assert a.equal(-torch.exp(weights["model.layers.0.self_attn.A_log"]).flatten())
    assert {t[0]: t[1] for t in contents(tmp_path / "q8_0.gguf")[1]}["blk.0.ssm_conv1d_k.weight"] == "F32"
    unshard.convert(src, tmp_path / "shards.gguf", output=unshard.OutputOptions(gguf="f32"), progress=False)
    assert contents(tmp_path / "shards.gguf") == (fields, tensors)
    assert_llama_quantize_mixes_it(folder, ggml_library, monkeypatch, tmp_path)
    # llama.cpp normalises the delta attention's q and k and the latent at rms_norm_eps (the Hub's 1e-5), transformers
    # at 1e-6: noted, and 3.2e-3 apart here, where the weights' init leaves q and k short; at 1e-6 both compute alike
    info = unshard.inspect(src, output=unshard.OutputOptions(gguf="f32"))
    assert "kimi-linear normalises the delta attention's q and k and the latent at rms_norm_eps 1e-05" in " ".join(
        info["output"]["notes"]
    )
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-6}))
    unshard.convert(folder, tmp_path / "eps.gguf", output=unshard.OutputOptions(gguf="f32"), progress=False)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    prompt = [1, 5, 20, 33, 41, 50, 60, 2]
    expected = model(torch.tensor([prompt])).logits[0].detach()
    logits, _ = llama_cpp(tmp_path / "eps.gguf", prompt, 0)
    assert ((logits - expected).norm() / expected.norm()).item() <= LLAMA_CPP_TOLERANCE["f32"]


# The layers that reuse earlier layers' keys and values in the Gemma 3n fixtures (20 of their own, then 2): their keys,
# values and keys' norm, which llama.cpp loads for every layer, transformers 5 builds none of, unshard writes as zeros
GEMMA3N_UNUSED = {f"blk.{layer}.{kind}.weight" for layer in (20, 21) for kind in ("attn_k", "attn_v", "attn_k_norm")}


def gemma3n_as_the_converter_has_it(path: Path) -> tuple[dict, list]:
    """unshard's Gemma 3n file but the zeros the converter's lacks (GEMMA3N_UNUSED), asserted zero."""
    fields, tensors = contents(path)
    assert {t[0] for t in tensors} >= GEMMA3N_UNUSED and not any(any(t[3]) for t in tensors if t[0] in GEMMA3N_UNUSED)
    return fields, [t for t in tensors if t[0] not in GEMMA3N_UNUSED]


def gemma3n_cut_as_llama_cpp(self, inputs):
    """Gemma 3n's sparse layers' cut as llama.cpp makes it: at a standard deviation over n - 1 (transformers': n)."""
    quantile = torch.distributions.normal.Normal(0, 1).icdf(torch.tensor(self.activation_sparsity))
    cutoff = inputs.mean(-1, keepdim=True) + inputs.std(-1, keepdim=True, unbiased=True) * quantile
    return torch.nn.functional.relu(inputs - cutoff)


def test_gemma3n_as_the_converter_and_llama_quantize_write_it(
    converter, llama_cpp, ggml_library, monkeypatch, tmp_path
):
    """Gemma 3n's text model (FSDP2 rank files, bf16): llama.cpp's gemma3n, the file the converter's in f32, bf16 and
    q8_0, from the folder or straight from the shards, and llama-quantize's in the K-quant mixes: the 3 AltUp
    projections in and out each stacked into one tensor, the per-layer embedding padded with zero rows to the
    vocabulary's size, the norms as they are, AltUp's and the shared layers' keys, the sparsity as the normal's
    quantiles. But for one difference, on purpose: transformers 5 builds no keys, values or keys' norm for the layers
    that reuse earlier ones', which llama.cpp loads for every layer (the Hub's checkpoints hold them); the converter's
    file lacks them and llama.cpp refuses it, unshard's holds them as zeros. llama.cpp computes transformers' logits
    from it, the shared layers' keys and values included, once transformers cuts the sparse layers' activations as
    llama.cpp does (noted)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    as_the_converter_has_it = gemma3n_as_the_converter_has_it
    src = SHIPPED / "gemma3n-fsdp2-spm" / "global_step_1"
    folder = tmp_path / "hf"
    unshard.convert(src, folder, progress=False)
    for kind in ("f32", "bf16", "q8_0"):
        unshard.convert(folder, tmp_path / f"{kind}.gguf", output=unshard.OutputOptions(gguf=kind), verify=True)
        oracle = converter(folder, kind, tmp_path / f"oracle-{kind}.gguf", pre=None)
        assert as_the_converter_has_it(tmp_path / f"{kind}.gguf") == contents(oracle)
    fields, tensors = contents(tmp_path / "f32.gguf")
    assert fields["general.architecture"] == "gemma3n" and fields["gemma3n.attention.shared_kv_layers"] == 2
    assert fields["gemma3n.activation_sparsity_scale"][9:11] == [pytest.approx(1.6448536), -float("inf")]
    stored = {t[0]: t for t in tensors}
    assert stored["altup_proj.weight"][2] == [32, 32, 3] and stored["altup_unembd_proj.weight"][2] == [32, 32, 3]
    per_layer = torch.frombuffer(bytearray(stored["per_layer_token_embd.weight"][3]), dtype=torch.float32)
    own = load_file(folder / "model.safetensors")["model.embed_tokens_per_layer.weight"].float()
    assert own.shape[0] == 80 and per_layer.view(103, -1)[:80].equal(own) and not per_layer.view(103, -1)[80:].any()
    unshard.convert(src, tmp_path / "shards.gguf", output=unshard.OutputOptions(gguf="f32"), progress=False)
    assert contents(tmp_path / "shards.gguf") == (fields, tensors)
    # llama.cpp's sparse layers cut their activations at a standard deviation over n - 1, transformers' over n: at the
    # fixture's 64-wide MLP a factor of 1.0079 (noted), which makes the logits 3.5e-2 apart; at E2B's 8192, 1.00006.
    # With transformers cutting as llama.cpp, llama.cpp computes its logits.
    info = unshard.inspect(src, output=unshard.OutputOptions(gguf="f32"))
    assert "over n - 1, transformers over n: 1.007905 times" in " ".join(info["output"]["notes"])
    from transformers.models.gemma3n import modeling_gemma3n

    monkeypatch.setattr(modeling_gemma3n.Gemma3nTextMLP, "_gaussian_topk", gemma3n_cut_as_llama_cpp)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    prompt = [1, 5, 20, 33, 41, 50, 60, 2]
    expected = model(torch.tensor([prompt])).logits[0].detach()
    logits, _ = llama_cpp(tmp_path / "f32.gguf", prompt, 0, kv_cache="f32")
    assert ((logits - expected).norm() / expected.norm()).item() <= LLAMA_CPP_TOLERANCE["f32"]
    (tmp_path / "llama-quantize").mkdir()
    llama_cpp_client("quantize", tmp_path / "oracle-f32.gguf", tmp_path / "llama-quantize", ",".join(kquants.MIXES))
    monkeypatch.setenv(kquants.LIBRARY_VARIABLE, ggml_library)
    for kind in kquants.MIXES:
        unshard.convert(folder, tmp_path / f"{kind}.gguf", output=unshard.OutputOptions(gguf=kind), progress=False)
        assert as_the_converter_has_it(tmp_path / f"{kind}.gguf") == contents(
            tmp_path / "llama-quantize" / f"{kind}.gguf"
        )


def glm45_folder(tmp_path: Path) -> tuple[Path, torch.nn.Module]:
    """A GLM-4.5 as transformers writes it, rows of 256 (K-quants' blocks): a dense first layer, then 4 routed
    experts behind a sigmoid router with its expert bias and a shared expert; q, k and v biases, q and k norms,
    rotary embeddings on half of each head; one MTP layer the config counts and the checkpoint lacks, as every
    trained one (transformers drops it). Its tokenizer has GLM's special tokens, which llama.cpp's GLM vocabulary
    names."""
    import json

    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    special = ("[gMASK]", "<|user|>", "<|endoftext|>", "<|observation|>")
    config = Glm4MoeConfig(
        vocab_size=63 + len(special),  # (the fixtures' tokenizer and these)
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        use_qk_norm=True,
        attention_bias=True,
        max_position_embeddings=256,
        architectures=["Glm4MoeForCausalLM"],
    )
    torch.manual_seed(0)
    model = Glm4MoeForCausalLM(config).to(torch.bfloat16)
    random_norms_and_biases(model)
    folder = saved_with_tokenizer(model, tmp_path, special)
    assert json.loads((folder / "config.json").read_text())["num_nextn_predict_layers"] == 1
    return folder, model.float()


def test_glm45_as_the_converter_and_llama_quantize_write_it(converter, llama_cpp, ggml_library, monkeypatch, tmp_path):
    """GLM-4.5 (glm45_folder): llama.cpp's glm4moe, the file equal to the converter's in f32, bf16 and q8_0 (a
    block for the MTP layer the config counts, the experts' groups, sigmoid gating, the routing's scale, GLM's
    special tokens) and to llama-quantize's in the K-quant mixes; llama.cpp computes transformers' logits from it."""
    folder, model = glm45_folder(tmp_path)
    fields, tensors = as_the_converter_writes_it(folder, converter, tmp_path)
    assert fields["general.architecture"] == "glm4moe" and fields["glm4moe.block_count"] == 4
    assert fields["glm4moe.nextn_predict_layers"] == 1 and fields["glm4moe.rope.dimension_count"] == 32
    tokens = fields["tokenizer.ggml.tokens"]  # (those tokenizer_config.json names none of: end of turn, of message)
    assert [tokens.index(t) for t in ("<|user|>", "<|observation|>")] == [
        fields["tokenizer.ggml.eot_token_id"],
        fields["tokenizer.ggml.eom_token_id"],
    ]
    names = {t[0] for t in tensors}
    assert {"blk.0.ffn_down.weight", "blk.1.ffn_down_exps.weight", "blk.1.ffn_down_shexp.weight"} <= names
    assert "blk.1.exp_probs_b.bias" in names and not any(n.startswith("blk.3.") for n in names)
    assert_llama_cpp_runs_it_and_llama_quantize_mixes_it(folder, model, llama_cpp, ggml_library, monkeypatch, tmp_path)


def test_deepseek_v3_as_the_converter_and_llama_quantize_write_it(
    converter, llama_cpp, ggml_library, monkeypatch, tmp_path
):
    """DeepSeek-V3 as transformers writes it (multi-latent attention with a query down projection, a dense first
    layer, 8 routed experts in 4 groups of which 2 are chosen from, a sigmoid router with its expert bias, a shared
    expert, YaRN): llama.cpp's deepseek2, each kv_b_proj split per head into k_b (transposed) and v_b, one key-value
    head (MQA) in the header; the file equal to the converter's in f32, bf16 and q8_0 and to llama-quantize's in the
    K-quant mixes; llama.cpp computes transformers' logits from it."""
    import json

    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(
        vocab_size=63,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=2,  # (as DeepSeek's config.json says: the converter splits kv_b_proj by it)
        q_lora_rank=256,
        kv_lora_rank=256,
        qk_nope_head_dim=64,
        qk_rope_head_dim=32,
        v_head_dim=128,
        n_routed_experts=8,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        max_position_embeddings=256,
        rope_parameters={  # (DeepSeek-V3's YaRN, over a shorter original context)
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        architectures=["DeepseekV3ForCausalLM"],
    )
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(config).to(torch.bfloat16)
    random_norms_and_biases(model)
    folder = saved_with_tokenizer(model, tmp_path)
    model = model.float()
    config = json.loads((folder / "config.json").read_text())
    unshard.convert(folder, tmp_path / "as-saved.gguf", output=unshard.OutputOptions(gguf="f32"), progress=False)
    (folder / "config.json").write_text(json.dumps({**config, "scoring_func": "sigmoid"}))  # (the Hub's config says it)
    fields, tensors = as_the_converter_writes_it(folder, converter, tmp_path)
    assert fields["general.architecture"] == "deepseek2" and fields["deepseek2.attention.head_count_kv"] == 1
    shapes = {t[0]: t[2] for t in tensors}
    assert shapes["blk.1.attn_k_b.weight"] == [64, 256, 2] and shapes["blk.1.attn_v_b.weight"] == [256, 128, 2]
    assert "blk.1.attn_kv_b.weight" not in shapes and shapes["blk.1.ffn_gate_exps.weight"] == [256, 256, 8]
    # transformers' own config.json does not name the gating function, which llama.cpp would take for softmax (the
    # converter's file of it would compute another model): unshard writes sigmoid, the same file
    assert fields["deepseek2.expert_gating_func"] == gguf.ExpertGatingFuncType.SIGMOID
    assert contents(tmp_path / "as-saved.gguf") == (fields, tensors)
    assert_llama_cpp_runs_it_and_llama_quantize_mixes_it(folder, model, llama_cpp, ggml_library, monkeypatch, tmp_path)


def test_kimi_k2_5_s_text_model_from_torchtitan_as_the_converter_writes_it(converter, llama_cpp, tmp_path):
    """Kimi K2.5 (DeepSeek-V3's text model beside MoonViT) straight from torchtitan's checkpoint (kimi_k2_7; its
    folder's config, with a byte-level BPE tokenizer beside): the text model as llama.cpp's deepseek2, the converter's
    file of unshard's folder (its text config naming the sigmoid router, as the Hub's does) in f32 and q8_0; MoonViT
    and its projector left out of it, as the converter's text model leaves them (their mmproj file:
    test_gguf_kimi_k25.py); llama.cpp computes the logits transformers computes from that folder."""
    import transformers

    fixture = SHIPPED / "torchtitan-kimik25-fsdp2"
    config = tmp_path / "config"
    shutil.copytree(fixture / "hf", config)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SHIPPED / "deepseekv32-fsdp2" / "global_step_1" / "actor" / "huggingface" / name, config / name)
    src, folder = fixture / "checkpoint" / "step-1", tmp_path / "hf"
    unshard.convert(src, folder, config_from=config, progress=False)
    for kind in ("f32", "q8_0"):
        out = tmp_path / f"{kind}.gguf"
        unshard.convert(src, out, config_from=config, output=unshard.OutputOptions(gguf=kind), progress=False)
    pre = for_the_converter(folder)
    hub = json.loads((folder / "config.json").read_text())
    hub["text_config"]["scoring_func"] = "sigmoid"  # (the Hub's config says it; transformers 5 saves no word of it)
    (folder / "config.json").write_text(json.dumps(hub))
    for kind in ("f32", "q8_0"):
        assert_same_file(tmp_path / f"{kind}.gguf", converter(folder, kind, tmp_path / f"oracle-{kind}.gguf", pre=pre))
    fields, tensors = contents(tmp_path / "f32.gguf")
    assert fields["general.architecture"] == "deepseek2" and not any(t[0].startswith(("v.", "mm.")) for t in tensors)
    model = transformers.AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    prompt = [1, 5, 20, 33, 41, 50, 60, 2]
    expected = model(torch.tensor([prompt])).logits[0].detach()
    logits, _ = llama_cpp(tmp_path / "f32.gguf", prompt, 0, kv_cache="f32")
    assert ((logits - expected).norm() / expected.norm()).item() <= LLAMA_CPP_TOLERANCE["f32"]


def test_a_latent_attention_without_a_query_down_projection_is_taken_as_llama_cpp_loads_it():
    """llama.cpp's deepseek2 loads a model without q_lora_rank only as DeepSeek-V2-Lite, by its 26 or 27 layers
    (deepseekv2-fsdp2 has 27): another is one line, before anything is written."""
    from unshard.families.deepseek import latent_query_checked

    latent_query_checked({"q_lora_rank": None, "num_hidden_layers": 27}, "config.json")
    latent_query_checked({"q_lora_rank": 64, "num_hidden_layers": 3}, "config.json")
    with pytest.raises(unshard.ConfigMismatchError, match="q_lora_rank is null .no query down projection. in 3 lay"):
        latent_query_checked({"q_lora_rank": None, "num_hidden_layers": 3}, "config.json")


def test_a_rotary_part_turned_by_halves_is_one_line(tmp_path):
    """llama.cpp's deepseek2 turns the latent attention's rotary part by interleaved pairs, as DeepSeek's and Youtu's
    weights keep them: a config turning it by halves (rope_interleave false) is one line, before anything is written."""
    src = SHIPPED / "youtu-fsdp2" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "rope_interleave": False}))
    with pytest.raises(unshard.ConfigMismatchError, match="rope_interleave is false .the rotary part turned by halves"):
        unshard.plan(tmp_path / "hf", output=unshard.OutputOptions(gguf="f32"))


def test_deepseek_v3_s_multi_token_prediction_layer_kept_in_folders_and_left_out_of_gguf(converter, tmp_path):
    """A DeepSeek-V3 folder as the Hub's holds one: a layer past num_hidden_layers that num_nextn_predict_layers
    counts (the multi-token prediction layer; here a layer of a 4-layer model saved by transformers, its config then
    saying 3 and 1). A folder keeps it as saved, with a note (transformers loads the folder, leaving it; vLLM runs
    it); GGUF leaves it out as the converter does, the file equal to the converter's."""
    import json

    from transformers import AutoModelForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(
        vocab_size=63,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        n_routed_experts=4,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        scoring_func="sigmoid",
        architectures=["DeepseekV3ForCausalLM"],
    )
    torch.manual_seed(0)
    folder = saved_with_tokenizer(DeepseekV3ForCausalLM(config).to(torch.bfloat16), tmp_path)
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**saved, "num_hidden_layers": 3, "num_nextn_predict_layers": 1}))
    code, _, err = run_cli("convert", folder, tmp_path / "out", "--no-progress")
    assert code == 0 and "26 tensors of the multi-token prediction layer(s) config.json counts" in err, err
    with safe_open(tmp_path / "out" / "model.safetensors", "pt") as written:
        assert "model.layers.3.self_attn.kv_b_proj.weight" in written.keys()
    AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    code, _, err = run_cli("convert", folder, tmp_path / "m.gguf", "--gguf-type", "f32", "--no-progress")
    assert code == 0 and "26 tensors of layers past the 3 llama.cpp's deepseek2 runs" in err, err
    pre = for_the_converter(folder)
    assert_same_file(tmp_path / "m.gguf", converter(folder, "f32", tmp_path / "oracle.gguf", pre=pre))


@pytest.mark.parametrize(
    "case", ["megatron-deepseekv3-tp2-pp2-ep2", "megatron-glm45-tp2-ep2-dp2", "megatron-gptoss-tp2-pp2-ep2"]
)
def test_megatron_moe_checkpoints_straight_to_gguf(case, converter, tmp_path):
    """A DeepSeek-V3, a GLM-4.5 and a gpt-oss (its experts stacked from megatron-core's, turned as transformers holds
    them) trained with megatron-core (torch_dist; tensor, pipeline and expert parallel), written as GGUF in one pass
    (the config and tokenizer from --config-from): the converter's file of the folder unshard writes from the same
    checkpoint, whose logits test_megatron checks against megatron-core's."""
    import json

    src = SHIPPED / case / "torch_dist"
    unshard.convert(src, tmp_path / "hf", progress=False)
    tokenizer = SHIPPED / "qwen3moe-fsdp2" / "global_step_1" / "actor" / "huggingface"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    if config["model_type"] == "glm4_moe":  # (GLM's special tokens, which its vocabulary names)
        from tokenizers import AddedToken, Tokenizer

        added = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
        added.add_special_tokens([AddedToken(t, special=True) for t in ("[gMASK]", "<|user|>", "<|endoftext|>")])
        added.add_special_tokens([AddedToken("<|observation|>", special=True)])
        added.save(str(tmp_path / "hf" / "tokenizer.json"))
    elif config["model_type"] == "deepseek_v3":  # (as the Hub's config says: the converter reads its routing from it)
        (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "scoring_func": "sigmoid"}))
    pre = for_the_converter(tmp_path / "hf")
    ours = tmp_path / "m.gguf"
    unshard.convert(src, ours, config_from=tmp_path / "hf", output=unshard.OutputOptions(gguf="bf16"), progress=False)
    assert_same_file(ours, converter(tmp_path / "hf", "bf16", tmp_path / "oracle.gguf", pre=pre))


# Dense families by llama.cpp's architecture: a Llama with scales (granite), a Llama's attention with a gateless ReLU²
# MLP (arcee), q and k norms and post-norms (exaone4), LayerNorms and partial rope with a header of the converter's own
# (stablelm, as StableLM 2 12B: a LayerNorm per head of q and k, stacked), LayerNorms, biases and a GELU MLP through the
# TextModel as it is (starcoder2), attention and MLP in parallel with scaled logits (command-r), LayerNorms without
# parameters and q, k, v clipped (olmo), LayerNorms as 1 + weight with a SentencePiece vocabulary (nemotron), post-
# norms, gate and up fused and special tokens named by their text (glm4)
DENSE = {
    "granite-fsdp2": "granite",
    "arcee-fsdp2": "arcee",
    "exaone4-fsdp2": "exaone4",
    "stablelm-fsdp2": "stablelm",
    "starcoder2-fsdp2": "starcoder2",
    "cohere-fsdp2": "command-r",
    "olmo-fsdp2": "olmo",
    "nemotron-fsdp2-spm": "nemotron",
    "glm4-fsdp2": "glm4",
    "gptneox-fsdp2": "gptneox",
    "falcon-fsdp2": "falcon",
    "phi2-fsdp2": "phi2",
    "gpt2-fsdp2": "gpt2",
    "bloom-fsdp2": "bloom",
    "starcoder-fsdp2": "starcoder",
    "olmoe-fsdp2": "olmoe",
    "granitemoe-fsdp2": "granitemoe",
    "ernie45moe-fsdp2-spm": "ernie4_5-moe",
    "dots1-fsdp2": "dots1",
    "glm47flash-fsdp2": "deepseek2",
    "minimax-m2-fsdp2": "minimax-m2",
    "cohere2-fsdp2": "cohere2",
    "solaropen-fsdp2": "glm4moe",
    "granitemoeshared-fsdp2": "granitemoe",
    "hunyuan-fsdp2": "hunyuan-dense",
    "hunyuanmoe-fsdp2": "hunyuan-moe",
    "afmoe-fsdp2": "afmoe",
    "jais2-fsdp2": "jais2",
    "lfm2-fsdp2": "lfm2",
    "exaonemoe-fsdp2": "exaone-moe",
    "granitehybrid-fsdp2": "granitehybrid",
    "nemotronh-fsdp2": "nemotron_h",
    "gemma4-fsdp2": "gemma4",
    "gemma4moe-fsdp2": "gemma4",
    "gemma4vl-fsdp2": "gemma4",
    "gemma4av-fsdp2": "gemma4",
    "gemma4unified-fsdp2": "gemma4",
    "mpt-fsdp2": "mpt",
    "mistral3-fsdp2": "mistral3",
    "mistral4-fsdp2": "mistral4",
    "glm-fsdp2": "chatglm",
    "falconh1-fsdp2": "falcon-h1",
    "apertus-fsdp2": "apertus",
    "deepseekv2-fsdp2": "deepseek2",
    "youtu-fsdp2": "deepseek2",
    "ministral3-fsdp2": "mistral3",
    "lfm2moe-fsdp2": "lfm2moe",
    "llama4-fsdp2": "llama4",
    "mamba2-fsdp2": "mamba2",
    "mamba-fsdp2": "mamba",
    "falconmamba-fsdp2": "mamba",
    "jamba-fsdp2-spm": "jamba",
    "minicpm3-fsdp2-spm": "minicpm3",
    "glm5-fsdp2": "glm-dsa",
    "exaone45-fsdp2": "exaone4",
    "exaone-fsdp2": "exaone",
    "iquestcoder-fsdp2": "llama",
    "internlm3-fsdp2-spm": "llama",
    "sarvammoe-fsdp2": "bailingmoe2",
    "llama4text-fsdp2": "llama4",
    "dbrx-fsdp2": "dbrx",
    "smolvlm-fsdp2": "llama",
    "qwen2audio-fsdp2": "qwen2",
    "audioflamingo3-fsdp2": "qwen2",
    "qwen3asr-fsdp2": "qwen3vl",
    "qwen3omni-fsdp2": "qwen3vlmoe",
    "granitespeech-fsdp2": "granite",
    "granitespeechplus-fsdp2": "granite",
    "voxtral-fsdp2": "llama",
    "llava-pixtral-fsdp2": "llama",
    "lfm2vl-fsdp2": "lfm2",
    "janus-fsdp2": "llama",
    "hunyuanocr-fsdp2": "hunyuan_vl",
    "paddleocr-fsdp2-spm": "paddleocr",
    "internvl-fsdp2": "qwen2",
    "internvl35-fsdp2": "qwen3",
    "mimov2flash-fsdp2": "mimo2",
}
# What a model's config.json on the Hub has and transformers 5 writes otherwise or not at all, which the converter
# reads: given to its copy of the folder (unshard reads either, or knows what transformers' class does without it);
# DROPPED: a key transformers 5 writes and the Hub's config lacks
DROPPED = object()
QWEN3_ASR_THINKER = ("audio_config", "text_config", "audio_token_id")  # (what Qwen's release keeps in thinker_config)
HUB_KEYS = {
    "gptneox-fsdp2": lambda config: {"rotary_pct": config["rope_parameters"]["partial_rotary_factor"]},
    "gpt2-fsdp2": lambda config: {"n_ctx": config["n_positions"]},
    # (GLM-4.7-Flash's dense first layer, which transformers reads from mlp_layer_types, and its sigmoid router)
    "glm47flash-fsdp2": lambda config: {"first_k_dense_replace": 1, "scoring_func": "sigmoid"},
    "glm5-fsdp2": lambda config: {"first_k_dense_replace": 1},  # (GLM-5's dense first layer, as GLM-4.7-Flash's)
    # (MiniMax-M2's rotated part of a head, which transformers reads into partial_rotary_factor, and its sigmoid router)
    "minimax-m2-fsdp2": lambda config: {"rotary_dim": 8, "scoring_func": "sigmoid"},
    "cohere2-fsdp2": lambda config: {"rotary_pct": 1.0},  # (the Hub's Command R7B has it; transformers' class has none)
    # (Solar Open's rotary over whole heads, which the converter takes for GLM's half where the config says nothing)
    "solaropen-fsdp2": lambda config: {"partial_rotary_factor": 1.0},
    "afmoe-fsdp2": lambda config: {"route_norm": True},  # (AFMoE's routing, which transformers always renormalises)
    # (the experts' width, which the converter's Gemma4Model requires be named and transformers 5.24 does not save for
    # Gemma 4 Unified's text model: named as none, as a model without experts has it)
    "gemma4unified-fsdp2": lambda config: {"text_config": {**config["text_config"], "moe_intermediate_size": None}},
    # (InternVL's text model by its class, which the converter finds it by: transformers 5 writes none)
    "internvl-fsdp2": lambda config: {"text_config": {**config["text_config"], "architectures": ["Qwen2ForCausalLM"]}},
    "internvl35-fsdp2": lambda c: {"text_config": {**c["text_config"], "architectures": ["Qwen3ForCausalLM"]}},
    # (Granite Speech's text model by its class, which the converter finds it by: transformers 5 writes none)
    "granitespeech-fsdp2": lambda c: {"text_config": {**c["text_config"], "architectures": ["GraniteForCausalLM"]}},
    "granitespeechplus-fsdp2": lambda c: {"text_config": {**c["text_config"], "architectures": ["GraniteForCausalLM"]}},
    # (Qwen3-ASR's configs as Qwen's release has them, within thinker_config, which the converter reads them from)
    "qwen3asr-fsdp2": lambda config: {
        "thinker_config": {key: config[key] for key in QWEN3_ASR_THINKER},
        **dict.fromkeys(QWEN3_ASR_THINKER, DROPPED),
    },
    # (EXAONE MoE's sigmoid router, which transformers routes by whatever the config says: without it the converter
    # writes no gating function; and no MTP layers, which the checkpoint lacks: the converter's file would have blocks
    # for them all the same. llama.cpp's exaone-moe loads neither file)
    "exaonemoe-fsdp2": lambda config: {"scoring_func": "sigmoid", "num_nextn_predict_layers": 0},
    # (EXAONE 3.5's activation under LG's key, which the converter asserts is SiLU and transformers 5 saves as
    # hidden_act; LG's other keys, the epsilon's among them, make a file llama.cpp does not load: test_exaone_3_...)
    "exaone-fsdp2": lambda config: {"activation_function": config["hidden_act"]},
    # (Sarvam's experts' counts under its own keys, which the converter reads, and the gating function, without which
    # llama.cpp's bailingmoe2 loads no file: transformers routes by a sigmoid whatever the config says)
    "sarvammoe-fsdp2": lambda config: {
        "num_experts": config["n_routed_experts"],
        "num_shared_experts": config["n_shared_experts"],
        "score_function": "sigmoid",
    },
    # (Granite 4.0's layer types as the Hub writes them, which the converter reads; transformers 5 saves them renamed)
    "granitehybrid-fsdp2": lambda config: {
        "layer_types": [{"linear_attention": "mamba", "full_attention": "attention"}[k] for k in config["layer_types"]]
    },
    # (Nemotron-H's layers as the Hub's pattern, and none of the MoE settings transformers 5 writes for a dense model:
    # the converter's transformers has no nemotron_h, and it takes a config with them for its MoE architecture)
    # (MPT's class as the Hub's config names it, its own code's: the converter knows it by that name alone)
    "mpt-fsdp2": lambda config: {"architectures": ["MPTForCausalLM"]},
    "nemotronh-fsdp2": lambda config: {
        "hybrid_override_pattern": "M-*-",
        **dict.fromkeys(families.nemotron.MOE_SETTINGS, DROPPED),
    },
    "mimov2flash-fsdp2": lambda config: mimo_v2_flash_on_the_hub(config),
}
# Converter classes that read a vocabulary through its makers' code alone, given tokenizer.json as the converter reads
# any byte-level BPE (llama_cpp_converter.py): Hunyuan-A13B's, which the converter reads from Tencent's tiktoken file
OWN_VOCABULARY = {"hunyuanmoe-fsdp2": ("hunyuan.HunYuanMoEModel",)}
# The converter's other arguments: MiMo-V2-Flash's file without the MTP layers the Hub's checkpoints carry and the
# converter otherwise counts (transformers' model, and so unshard's folder, has none)
CONVERTER_FLAGS = {"mimov2flash-fsdp2": ("--no-mtp",)}


def mimo_v2_flash_on_the_hub(config: dict) -> dict:
    """MiMo-V2-Flash's config as Xiaomi's release writes it, which the converter reads: rope by its own keys, the
    windowed layers' attention by theirs, the layers by a pattern, DeepSeek-V3's routing named."""
    full, sliding = config["rope_parameters"]["full_attention"], config["rope_parameters"]["sliding_attention"]
    windowed = [int(kind == "sliding_attention") for kind in config["layer_types"]]
    return {
        "rope_parameters": None,
        "rope_theta": full["rope_theta"],
        "swa_rope_theta": sliding["rope_theta"],
        "partial_rotary_factor": full["partial_rotary_factor"],
        "hybrid_layer_pattern": windowed,
        "swa_head_dim": config["head_dim"],
        "swa_num_attention_heads": config["num_attention_heads"],
        "swa_v_head_dim": config["v_head_dim"],
        "swa_num_key_value_heads": 2 * config["num_key_value_heads"],
        "topk_method": "noaux_tc",
        "layernorm_epsilon": config["rms_norm_eps"],
    }


# The config as the converter's file computes it, where it writes another: GLM-4-9B-chat-hf's norms' epsilon, which it
# takes from ChatGLM's own key alone (else 1e-5; measured on the fixture's small activations: 3.4e-3 from transformers
# at the config's 1.5625e-07, 2.1e-4 at 1e-5; unshard notes it: test_a_glm_s_epsilon_is_noted_and_its_rope_base...)
AS_THE_FILE = {"glm-fsdp2": {"rms_norm_eps": 1e-5}}


# Gemma 4's attention scores are not scaled (its q and k are normed instead), and its logits magnify rounding: the tiny
# models' logits in bf16 are 2e-2 to 1.4e-1 from f32's (f32's 2e-6 from f64's). llama.cpp's keys and values are cached
# in f32 for it (f16's cache alone measures 1.5e-3 on a model f32's puts at 7.8e-4); llama.cpp's own arithmetic leaves
# 1.0e-3 to 1.5e-3 (gemma4moe-fsdp2: 1.09e-3; 2e-4 with transformers' GELU fed and read as f16, as llama.cpp's table).
GEMMA4_F32_TOLERANCE = 2e-3


@pytest.mark.parametrize("case", DENSE)
def test_dense_families_as_the_converter_writes_them_and_llama_cpp_runs_them(case, converter, llama_cpp, tmp_path):
    """Read from verl's FSDP2 rank files, each family's f32 file is the converter's (of the folder unshard writes
    from the same files), field for field and byte for byte, and llama.cpp computes transformers' logits from it."""
    import transformers

    src = SHIPPED / case / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    pre = for_the_converter(tmp_path / "hf")
    ours = tmp_path / "f32.gguf"
    unshard.convert(src, ours, output=unshard.OutputOptions(gguf="f32"), verify=True, progress=False)
    if case in HUB_KEYS:
        config = json.loads((tmp_path / "hf" / "config.json").read_text())
        hub = {key: value for key, value in {**config, **HUB_KEYS[case](config)}.items() if value is not DROPPED}
        (tmp_path / "hf" / "config.json").write_text(json.dumps(hub))
    oracle = converter(
        tmp_path / "hf",
        "f32",
        tmp_path / "oracle-f32.gguf",
        pre=pre,
        more=CONVERTER_FLAGS.get(case, ()),
        gpt2_vocab=OWN_VOCABULARY.get(case, ()),
    )
    assert_same_file(ours, oracle)
    fields, _ = contents(ours)
    assert fields["general.architecture"] == DENSE[case]
    if case == "glm4-fsdp2":  # (the end of turn, which GLM-4's converter names by its text, rope on half a head)
        eot = fields["tokenizer.ggml.tokens"].index("<|user|>")
        assert fields["tokenizer.ggml.eot_token_id"] == eot and fields["glm4.rope.dimension_count"] == 8
    if case == "glm47flash-fsdp2":  # (a block for the MTP layer the config counts; routed by sigmoid as transformers)
        assert fields["deepseek2.block_count"] == 3 and fields["deepseek2.nextn_predict_layers"] == 1
        assert fields["deepseek2.leading_dense_block_count"] == 1
        assert fields["deepseek2.expert_gating_func"] == gguf.ExpertGatingFuncType.SIGMOID
        assert fields["tokenizer.ggml.tokens"][fields["tokenizer.ggml.eom_token_id"]] == "<|observation|>"
    if case == "mimov2flash-fsdp2":  # (more key-value heads on the windowed layers, narrower values, scaled)
        assert fields["mimo2.attention.head_count_kv"] == [1, 2, 2, 1] and fields["mimo2.attention.value_length"] == 16
        assert fields["mimo2.attention.sliding_window_pattern"] == [0, 1, 1, 0]
        assert fields["mimo2.attention.value_scale"] == pytest.approx(0.707)
    if case == "gemma4unified-fsdp2":  # (the media placeholders its generation_config.json suppresses)
        suppressed = json.loads((src / "actor" / "huggingface" / "generation_config.json").read_text())
        assert fields["tokenizer.ggml.suppress_tokens"] == suppressed["suppress_tokens"] != []
    # (a vision-language model transformers has no causal LM class for: its text alone)
    vision = case in ("mistral3-fsdp2", "mistral4-fsdp2", "llama4-fsdp2", "exaone45-fsdp2", "smolvlm-fsdp2")
    vision = vision or case in ("llava-pixtral-fsdp2", "lfm2vl-fsdp2", "janus-fsdp2", "hunyuanocr-fsdp2")
    vision = vision or case in ("paddleocr-fsdp2-spm", "internvl-fsdp2", "internvl35-fsdp2")
    auto = transformers.AutoModelForImageTextToText if vision else transformers.AutoModelForCausalLM
    speech = ("qwen2audio-fsdp2", "voxtral-fsdp2", "qwen3asr-fsdp2", "qwen3omni-fsdp2", "granitespeech-fsdp2")
    speech += ("granitespeechplus-fsdp2",)
    auto = transformers.AutoModelForMultimodalLM if case in speech else auto
    auto = transformers.AutoModelForSeq2SeqLM if case == "audioflamingo3-fsdp2" else auto
    model = auto.from_pretrained(SHIPPED / case / "reference", dtype=torch.float32, **AS_THE_FILE.get(case, {}))
    prompt = [1, 5, 20, 33, 41, 50, 60, 2]
    # (transformers 5.24's Llama 4 runs no text without an image: its causal LM within does)
    forward = model.language_model if case == "llama4-fsdp2" else model
    forward = model.thinker if case == "qwen3omni-fsdp2" else forward  # (Qwen3-Omni's text: its thinker's)
    expected = forward(torch.tensor([prompt])).logits[0].detach()
    logits, _ = llama_cpp(ours, prompt, 0, kv_cache="f32" if DENSE[case] == "gemma4" else "f16")
    distance = ((logits - expected).norm() / expected.norm()).item()
    tolerance = GEMMA4_F32_TOLERANCE if DENSE[case] == "gemma4" else LLAMA_CPP_TOLERANCE["f32"]
    assert distance <= tolerance, distance


def test_exaone_3_s_hub_config_gives_the_converter_a_file_llama_cpp_does_not_load(converter, llama_cpp, tmp_path):
    """EXAONE 3.5's config as LG's release writes it (num_layers, layer_norm_epsilon, activation_function,
    rope_scaling): the converter names the norms' epsilon as a LayerNorm's, which llama.cpp's exaone does not read, so
    llama.cpp loads none of its file; unshard's file is the same but for that key, named as llama.cpp reads it, and
    llama.cpp runs it (test_dense_families_...: its logits are transformers')."""
    src = SHIPPED / "exaone-fsdp2" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    ours = tmp_path / "f32.gguf"
    unshard.convert(src, ours, output=unshard.OutputOptions(gguf="f32"), progress=False)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    rope = config.pop("rope_parameters")
    renamed = {
        "num_hidden_layers": "num_layers",
        "rms_norm_eps": "layer_norm_epsilon",
        "hidden_act": "activation_function",
    }
    hub = {renamed.get(key, key): value for key, value in config.items()}
    hub.update(rope_theta=rope.pop("rope_theta"), rope_scaling=rope)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(hub))
    theirs = converter(tmp_path / "hf", "f32", tmp_path / "oracle.gguf", pre=for_the_converter(tmp_path / "hf"))
    mine, expected = contents(ours), contents(theirs)
    assert mine[1] == expected[1]
    epsilon = {"exaone.attention.layer_norm_rms_epsilon": "exaone.attention.layer_norm_epsilon"}
    assert [epsilon.get(key, key) for key in mine[0]] == list(expected[0])
    with pytest.raises(AssertionError, match="Failed to load model"):
        llama_cpp(theirs, [1, 5, 20], 0)
    logits, _ = llama_cpp(ours, [1, 5, 20], 0)
    assert logits.shape == (3, config["vocab_size"])


def test_sarvam_moe_from_its_hub_config_as_the_converter_and_llama_quantize_write_it(
    converter, ggml_library, monkeypatch, tmp_path
):
    """Sarvam MoE's folder under the Hub's config keys (its experts' counts by its own names, the rope base at the top,
    a gating function): unshard reads them as it reads transformers 5's; the f32 file is the converter's (the experts'
    correction bias less its mean, as Sarvam's loader centres it), and every K-quant mix is llama-quantize's of it."""
    folder = tmp_path / "hf"
    unshard.convert(SHIPPED / "sarvammoe-fsdp2" / "global_step_1", folder, progress=False)
    config = json.loads((folder / "config.json").read_text())
    hub = {**config, **HUB_KEYS["sarvammoe-fsdp2"](config), "rope_theta": config["rope_parameters"]["rope_theta"]}
    for key in ("n_routed_experts", "n_shared_experts", "rope_parameters"):
        hub.pop(key)
    (folder / "config.json").write_text(json.dumps(hub))
    theirs = converter(folder, "f32", tmp_path / "oracle-f32.gguf", pre=for_the_converter(folder))
    unshard.convert(folder, tmp_path / "f32.gguf", output=unshard.OutputOptions(gguf="f32"), progress=False)
    assert_same_file(tmp_path / "f32.gguf", theirs)
    bias = safe_open(folder / "model.safetensors", "pt").get_tensor("model.layers.1.mlp.gate.expert_bias")
    written = {t[0]: t[3] for t in contents(theirs)[1]}["blk.1.exp_probs_b.bias"]
    assert np.frombuffer(written, np.float32).tolist() == (bias - bias.mean()).tolist() and bias.mean() > 0.1
    assert_llama_quantize_mixes_it(folder, ggml_library, monkeypatch, tmp_path)


def test_internlm3_ends_a_sequence_with_its_chat_s_end_as_the_converter_does(converter, tmp_path):
    """InternLM3's tokenizer_config.json as the Hub's release has it (its added tokens, the space prefix off): the
    converter's InternLM3Model ends a sequence with <|im_end|>, which the config lists as special, and writes the
    space prefix before the special ids; unshard's file is the converter's, field for field and byte for byte."""
    src = SHIPPED / "internlm3-fsdp2-spm" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    added = json.loads((tmp_path / "hf" / "tokenizer.json").read_text())["added_tokens"]
    keys = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {str(token["id"]): {key: token[key] for key in keys} for token in added}
    config["add_prefix_space"] = False
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(config))
    ours = tmp_path / "f32.gguf"
    unshard.convert(tmp_path / "hf", ours, output=unshard.OutputOptions(gguf="f32"), progress=False)
    assert_same_file(ours, converter(tmp_path / "hf", "f32", tmp_path / "oracle.gguf"))
    fields, _ = contents(ours)
    assert fields["tokenizer.ggml.tokens"][fields["tokenizer.ggml.eos_token_id"]] == "<|im_end|>"
    assert fields["tokenizer.ggml.add_space_prefix"] is False


def test_qwen3_asr_without_m_rope_sections_is_written_as_llama_cpp_loads_it(llama_cpp, tmp_path):
    """A Qwen3-ASR whose text config names no M-RoPE sections (transformers' Qwen3 turns the rotary by the sequence
    alone, and the converter writes a file llama.cpp's qwen3vl does not load): sections that turn every pair by the
    sequence, with a note, and llama.cpp computes transformers' logits."""
    import transformers

    src = tmp_path / "src"
    shutil.copytree(SHIPPED / "qwen3asr-fsdp2", src)
    config_file = src / "global_step_1" / "actor" / "huggingface" / "config.json"
    config = json.loads(config_file.read_text())
    config["text_config"]["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    config_file.write_text(json.dumps(config))
    ours = tmp_path / "f32.gguf"
    plan = unshard.plan(src / "global_step_1", output=unshard.OutputOptions(gguf="f32"))
    # (a head of 16: 8 pairs, taken in turn by the three axes the sequence's position turns)
    assert any(n.startswith("no M-RoPE sections in the text config: written as [3, 3, 2, 0]") for n in plan.notes)
    unshard.convert(src / "global_step_1", ours, output=unshard.OutputOptions(gguf="f32"), progress=False)
    assert contents(ours)[0]["qwen3vl.rope.dimension_sections"] == [3, 3, 2, 0]
    reference = SHIPPED / "qwen3asr-fsdp2" / "reference"
    model = transformers.AutoModelForMultimodalLM.from_pretrained(reference, dtype=torch.float32)
    prompt = [1, 5, 20, 33, 41, 50, 60, 2]
    expected = model(torch.tensor([prompt])).logits[0].detach()
    logits, _ = llama_cpp(ours, prompt, 0)
    assert ((logits - expected).norm() / expected.norm()).item() <= LLAMA_CPP_TOLERANCE["f32"]


def test_chameleon_as_the_converter_writes_it_with_each_head_s_own_norms(converter, llama_cpp, tmp_path):
    """Chameleon's text model is the converter's file, but for q's and k's norms: the converter writes head 0's for
    every head, unshard each head's own. Where the heads share one norm (Meta's release, repeated by transformers'
    conversion) the two files are the same, field for field and byte for byte; where each head has its own (the
    fixture's, as training leaves them), llama.cpp computes transformers' logits from unshard's file and not from the
    converter's. The image tokenizer is in neither."""
    import transformers
    from safetensors.torch import load_file, save_file

    folder, ours, theirs = tmp_path / "hf", tmp_path / "f32.gguf", tmp_path / "oracle.gguf"
    unshard.convert(SHIPPED / "chameleon-fsdp2" / "global_step_1", folder, progress=False)
    pre = for_the_converter(folder)
    unshard.convert(folder, ours, output=unshard.OutputOptions(gguf="f32"), verify=True, progress=False)
    converter(folder, "f32", theirs, pre=pre)
    mine, expected = contents(ours), contents(theirs)
    norms = {t[0] for t in mine[1] if "_q_norm." in t[0] or "_k_norm." in t[0]}
    assert len(norms) == 8 and mine[0] == expected[0]
    assert [t for t in mine[1] if t[0] not in norms] == [t for t in expected[1] if t[0] not in norms]
    assert not any("vq" in t[0] for t in mine[1])
    model = transformers.AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    prompt = [1, 5, 20, 33, 41, 50, 60, 2]
    text = [*range(4), *range(8196, 8300)]  # (the text tokens' logits: llama.cpp sets the image tokens' to -inf)
    logits = model(torch.tensor([prompt])).logits[0].detach()[:, text]
    got = [llama_cpp(f, prompt, 0)[0][:, text] for f in (ours, theirs)]
    distances = [((g - logits).norm() / logits.norm()).item() for g in got]
    assert distances[0] <= LLAMA_CPP_TOLERANCE["f32"] < distances[1], distances

    shared = tmp_path / "shared"  # (every head's norm head 0's, as in Meta's release)
    shutil.copytree(folder, shared)
    tensors = load_file(folder / "model.safetensors")
    tensors.update({n: t[:1].expand_as(t).contiguous() for n, t in tensors.items() if "_norm." in n and t.ndim == 2})
    save_file(tensors, shared / "model.safetensors", metadata={"format": "pt"})
    unshard.convert(shared, tmp_path / "shared.gguf", output=unshard.OutputOptions(gguf="f32"), progress=False)
    assert_same_file(tmp_path / "shared.gguf", converter(shared, "f32", tmp_path / "oracle-shared.gguf", pre=pre))


# The WordPiece encoders, by their fixtures, with the class that holds them under a masked-LM head and its name for them
WORDPIECE_ENCODERS = {
    "bert-fsdp2": ("BertForMaskedLM", "bert"),
    "distilbert-fsdp2": ("DistilBertForMaskedLM", "distilbert"),
}


def embedded_as_transformers(gguf_file: Path, encoder, tmp_path: Path, prompt=(2, 5, 20, 33, 41, 50, 60, 3)) -> float:
    """llama.cpp's embedding of each of a prompt's tokens (no pooling) against the encoder's last hidden state in
    transformers: their relative distance. (The WordPiece fixtures' [CLS] and [SEP] are 2 and 3; the BPE ones' start
    and end 1 and 2, and RoBERTa's positions skip its padding token's id, 0.)"""
    prompt = list(prompt)
    llama_cpp_client("embed", gguf_file, ",".join(map(str, prompt)), tmp_path / "embeddings.npy")
    got = torch.from_numpy(np.load(tmp_path / "embeddings.npy"))
    expected = encoder(torch.tensor([prompt])).last_hidden_state[0].detach()
    assert got.shape == expected.shape
    return ((got - expected).norm() / expected.norm()).item()


@pytest.mark.parametrize("case", WORDPIECE_ENCODERS)
def test_bert_as_the_converter_writes_it_and_llama_cpp_embeds_as_transformers(case, converter, tmp_path):
    """BERT (BertModel, as embedding models are) and DistilBERT (its sizes under its own names, no segment types) from
    FSDP2's rank files: each file, in f32, f16 and q8_0, is the converter's, field for field and byte for byte:
    attention over every token, the WordPiece vocabulary after llama.cpp's phantom space with the normalizer's
    settings, the pooler left out; llama.cpp embeds each token as transformers does (f32). A sentence-transformers
    folder's pooling and a cased tokenizer are the converter's too (BERT's)."""
    import transformers

    folder = tmp_path / "hf"
    unshard.convert(SHIPPED / case / "global_step_1", folder, progress=False)
    for kind in ("f32", "f16", "q8_0"):
        ours = tmp_path / f"{kind}.gguf"
        unshard.convert(folder, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        assert_same_file(ours, converter(folder, kind, tmp_path / f"oracle-{kind}.gguf", pre="default"))
    fields, tensors = contents(tmp_path / "f32.gguf")
    assert fields["tokenizer.ggml.model"] == "bert" and fields["bert.attention.causal"] is False
    assert fields["tokenizer.ggml.tokens"][5].startswith("\u2581") and not any("pooler" in t[0] for t in tensors)
    model = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32)
    assert embedded_as_transformers(tmp_path / "f32.gguf", model, tmp_path) <= 1e-4
    if case != "bert-fsdp2":
        return

    pooled = tmp_path / "sentence-transformers"  # (mean pooling named by its modules; a cased tokenizer)
    shutil.copytree(folder, pooled)
    (pooled / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            ]
        )
    )
    (pooled / "1_Pooling").mkdir()
    (pooled / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    tokenizer = json.loads((pooled / "tokenizer.json").read_text())
    tokenizer["normalizer"]["lowercase"] = False
    (pooled / "tokenizer.json").write_text(json.dumps(tokenizer))
    unshard.convert(pooled, tmp_path / "pooled.gguf", output=unshard.OutputOptions(gguf="f32"), progress=False)
    assert_same_file(tmp_path / "pooled.gguf", converter(pooled, "f32", tmp_path / "oracle-pooled.gguf", pre="default"))
    fields, _ = contents(tmp_path / "pooled.gguf")
    assert (
        fields["bert.pooling_type"] == gguf.PoolingType.MEAN and fields["tokenizer.ggml.normalizer.lowercase"] is False
    )


def under_its_masked_lm_head(case: str, head_class, tmp_path: Path) -> tuple:
    """The fixture's encoder saved under its masked-LM head (`mlm`, with unshard's tokenizer files), and unshard's
    f32 file of that folder, whose plan notes the head left out: (the model, the file)."""
    unshard.convert(SHIPPED / case / "global_step_1", tmp_path / "hf", progress=False)
    torch.manual_seed(0)  # (the head's weights, made anew)
    model = head_class.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    model.save_pretrained(tmp_path / "mlm")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tmp_path / "hf" / name, tmp_path / "mlm" / name)
    ours = tmp_path / "f32.gguf"
    plan = unshard.plan(tmp_path / "mlm", output=unshard.OutputOptions(gguf="f32"))
    assert any("masked-LM head's" in note for note in plan.notes)
    unshard.convert(tmp_path / "mlm", ours, output=unshard.OutputOptions(gguf="f32"), verify=True, progress=False)
    return model, ours


@pytest.mark.parametrize("case", WORDPIECE_ENCODERS)
def test_bert_for_masked_lm_s_encoder_as_the_converter_writes_it(case, converter, tmp_path):
    """A BERT (or DistilBERT) saved with its masked-LM head (as bert-base and distilbert-base and their fine-tunes
    are): the file holds the encoder alone, the converter's, and llama.cpp embeds each token as the encoder does."""
    import transformers

    head_class, encoder = WORDPIECE_ENCODERS[case]
    model, ours = under_its_masked_lm_head(case, getattr(transformers, head_class), tmp_path)
    assert_same_file(ours, converter(tmp_path / "mlm", "f32", tmp_path / "oracle.gguf", pre="default"))
    assert embedded_as_transformers(ours, getattr(model, encoder), tmp_path) <= 1e-4


# The byte-level BPE encoders, by their fixtures: the pre-tokenizer the converter's table names their tokenizers by
# (given to it: a tokenizer trained anew is in no table), the key unshard's file holds more than the converter's (None:
# none) and fields that say what the file is
BPE_ENCODERS = {
    # (RoBERTa's positions from the padding token's id + 1 on: a context of that many fewer)
    "roberta-fsdp2": ("roberta-bpe", None, {"tokenizer.ggml.pre": "roberta-bpe", "bert.context_length": 128}),
    # (ModernBERT's norms' epsilon as a LayerNorm's, without which llama.cpp loads neither file)
    "modernbert-fsdp2": (
        "gpt-2",
        "modern-bert.attention.layer_norm_epsilon",
        {"modern-bert.attention.sliding_window": 8, "modern-bert.rope.freq_base_swa": 10000.0},
    ),
    "eurobert-fsdp2": ("gpt-2", None, {"eurobert.attention.causal": False, "eurobert.classifier.pooling_type": 1}),
}


@pytest.mark.parametrize("case", BPE_ENCODERS)
def test_bpe_encoders_as_the_converter_writes_them_and_llama_cpp_embeds_as_transformers(case, converter, tmp_path):
    """RoBERTa (its position table from the padding token's id + 1 on, its BPE named `roberta-bpe` as the converter's
    table names RoBERTa's, by which llama.cpp ends a sequence with its separator, the segment types' count after the
    vocabulary), ModernBERT (llama.cpp's modern-bert: rotary bases for the global and the windowed layers, the window
    and which layers attend globally, the GeGLU's activation, a start, an end and a separator around each sequence)
    and EuroBERT (llama.cpp's eurobert: a Llama's layers attending both ways, no start token added) from FSDP2's rank
    files: in f32, f16 and q8_0, the converter's file (ModernBERT's with one key more, without which llama.cpp does
    not load the converter's); llama.cpp embeds each token as transformers does."""
    import transformers

    pre, more, says = BPE_ENCODERS[case]
    folder = tmp_path / "hf"
    unshard.convert(SHIPPED / case / "global_step_1", folder, progress=False)
    theirs = tmp_path / "for-the-converter"
    shutil.copytree(folder, theirs)
    for_the_converter(theirs)
    for kind in ("f32", "f16", "q8_0"):
        ours = tmp_path / f"{kind}.gguf"
        unshard.convert(folder, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        mine, expected = contents(ours), contents(converter(theirs, kind, tmp_path / f"oracle-{kind}.gguf", pre=pre))
        if more:
            assert mine[0].pop(more) == pytest.approx(1e-5)
        assert mine[0] == expected[0] and list(mine[0]) == list(expected[0]) and mine[1] == expected[1]
    fields, _ = contents(tmp_path / "f32.gguf")
    assert {key: fields[key] for key in says} == says
    if more:
        with pytest.raises(AssertionError, match="Failed to load model from file"):  # (the converter's own)
            llama_cpp_client("embed", tmp_path / "oracle-f32.gguf", "1,2", tmp_path / "theirs.npy")
    model = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32)
    assert (
        embedded_as_transformers(tmp_path / "f32.gguf", model, tmp_path, prompt=[1, 5, 20, 33, 41, 50, 60, 2]) <= 1e-4
    )


def nomic_embed_on_the_hub(config: dict) -> dict:
    """Nomic BERT's config as nomic-embed-text-v1.5's own code writes it, which the converter reads (and stops
    without): GPT-2's names for the sizes, v1.5's context (8192 positions, trained on 2048), the rotary's settings."""
    return {
        "architectures": ["NomicBertModel"],
        "model_type": "nomic_bert",
        "activation_function": "swiglu",
        "causal": False,
        "n_embd": config["hidden_size"],
        "n_head": config["num_attention_heads"],
        "n_inner": config["intermediate_size"],
        "n_layer": config["num_hidden_layers"],
        "n_positions": 8192,
        "max_trained_positions": 2048,
        "layer_norm_epsilon": config["layer_norm_eps"],
        "mlp_fc1_bias": False,
        "mlp_fc2_bias": False,
        "qkv_proj_bias": False,
        "prenorm": False,
        "rotary_emb_base": config["rope_parameters"]["rope_theta"],
        "rotary_emb_fraction": 1.0,
        "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None,
        "type_vocab_size": config["type_vocab_size"],
        "vocab_size": config["vocab_size"],
        "pad_token_id": config["pad_token_id"],
    }


def test_nomic_bert_as_the_converter_writes_it_and_llama_cpp_embeds_as_transformers(converter, tmp_path):
    """Nomic BERT (nomic-embed-text's NomicBertModel: rotary positions, a SwiGLU MLP, q, k and v one tensor in its
    checkpoints) from FSDP2's rank files: in f32, f16 and q8_0, the converter's file (of the folder with the config
    nomic-embed-text's own code writes, which the converter reads), field for field and byte for byte; llama.cpp
    embeds each token as transformers does."""
    import transformers

    folder, hub = tmp_path / "hf", tmp_path / "hub"
    unshard.convert(SHIPPED / "nomicbert-fsdp2" / "global_step_1", folder, progress=False)
    shutil.copytree(folder, hub)
    config = json.loads((folder / "config.json").read_text())
    (hub / "config.json").write_text(json.dumps(nomic_embed_on_the_hub(config)))
    for kind in ("f32", "f16", "q8_0"):
        ours = tmp_path / f"{kind}.gguf"
        unshard.convert(folder, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        assert_same_file(ours, converter(hub, kind, tmp_path / f"oracle-{kind}.gguf", pre="default"))
    fields, tensors = contents(tmp_path / "f32.gguf")
    assert fields["general.architecture"] == "nomic-bert" and fields["nomic-bert.context_length"] == 2048
    assert fields["nomic-bert.rope.freq_base"] == 1000.0 and "blk.0.attn_qkv.weight" in [t[0] for t in tensors]
    model = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32)
    assert embedded_as_transformers(tmp_path / "f32.gguf", model, tmp_path) <= 1e-4


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_act": "gelu"}, "hidden_act is 'gelu', and llama.cpp's nomic-bert runs SiLU's SwiGLU"),
        ({"rotary_emb_interleaved": True}, "rotary_emb_interleaved is True, and llama.cpp's nomic-bert turns a head"),
        ({"moe_every_n_layers": 2}, "it has experts (nomic-embed-text-v2-moe's)"),
    ],
)
def test_what_llama_cpp_s_nomic_bert_computes_otherwise_is_one_line(change, message, tmp_path):
    """A Nomic BERT llama.cpp's nomic-bert would compute otherwise (another activation, rope by pairs), or with experts
    unshard does not write: refused while planning, in one line naming the file, nothing written."""
    assert_refused_in_one_line("nomicbert-fsdp2", lambda config: config.update(change), message, tmp_path)


def test_modernbert_for_masked_lm_s_encoder_is_the_converter_s_file_of_the_encoder(converter, tmp_path):
    """A ModernBERT saved with its masked-LM head (ModernBERT-base's class, and its fine-tunes'), which the converter
    stops on: the file holds the encoder alone, the converter's file of the same encoder saved without the head (with
    the one key more of every ModernBERT file), and llama.cpp embeds each token as the encoder does."""
    import transformers

    model, ours = under_its_masked_lm_head("modernbert-fsdp2", transformers.ModernBertForMaskedLM, tmp_path)
    pre = for_the_converter(tmp_path / "mlm")
    with pytest.raises(AssertionError, match="decoder"):  # (the converter's own, of the folder with the head)
        converter(tmp_path / "mlm", "f32", tmp_path / "oracle-mlm.gguf", pre=pre)
    encoder = tmp_path / "encoder"
    model.model.save_pretrained(encoder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tmp_path / "mlm" / name, encoder / name)
    mine, expected = contents(ours), contents(converter(encoder, "f32", tmp_path / "oracle.gguf", pre=pre))
    assert mine[0].pop("modern-bert.attention.layer_norm_epsilon") == pytest.approx(1e-5)
    assert mine[0] == expected[0] and list(mine[0]) == list(expected[0]) and mine[1] == expected[1]
    distance = embedded_as_transformers(ours, model.model, tmp_path, prompt=[1, 5, 20, 33, 41, 50, 60, 2])
    assert distance <= 1e-4


# Text llama.cpp's unigram tokenizer normalizes by the file's character map as SentencePiece does: accents, German's ß,
# full-width letters and digits, runs of spaces, and words the tokenizer never saw
XLM_ROBERTA_TEXTS = [
    "hello world",
    "Grüße aus Köln, ¡hola señor!",
    "１２３ full-width ｄｉｇｉｔｓ",
    "naïve  café   façade",
    "Sylter Deich: zwölf Boxkämpfer",
    "never seen: 東京 Ωμέγα",
]


@pytest.mark.parametrize("tokenizer", ["sentencepiece.bpe.model", "tokenizer.json"])
def test_xlm_roberta_as_the_converter_writes_it_and_llama_cpp_tokenizes_and_embeds_as_transformers(
    tokenizer, converter, tmp_path
):
    """XLM-RoBERTa (bge-m3's, multilingual-e5's layout) from FSDP2's rank files, its vocabulary from the release's
    SentencePiece model (a Hub download's, fairseq's four ids first) or from tokenizer.json alone (what transformers 5
    saves): in f32, f16 and q8_0 the converter's file, field for field and byte for byte (llama.cpp's t5 tokenizer,
    the normalizer's character map, the position table from the padding token's id + 1 on); llama.cpp splits text
    into transformers' tokens and embeds each token as transformers does. From tokenizer.json, one field differs:
    runs of spaces read as one, as transformers' tokenizer reads them (the converter writes the tokenizer's
    clean_up_tokenization_spaces there, and llama.cpp splits its file's runs of spaces otherwise)."""
    import transformers

    folder = tmp_path / "hf"
    unshard.convert(SHIPPED / "xlmroberta-fsdp2" / "global_step_1", folder, progress=False)
    json_alone = tokenizer == "tokenizer.json"
    if json_alone:
        (folder / "sentencepiece.bpe.model").unlink()
    for kind in ("f32", "f16", "q8_0"):
        ours = tmp_path / f"{kind}.gguf"
        unshard.convert(folder, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        mine, expected = (
            contents(ours),
            contents(converter(folder, kind, tmp_path / f"oracle-{kind}.gguf", pre="default")),
        )
        whitespace = "tokenizer.ggml.remove_extra_whitespaces"
        assert mine[0][whitespace] is True and expected[0][whitespace] is not json_alone
        expected[0][whitespace] = True
        assert mine[0] == expected[0] and list(mine[0]) == list(expected[0]) and mine[1] == expected[1]
    fields, _ = contents(tmp_path / "f32.gguf")
    assert fields["tokenizer.ggml.model"] == "t5" and len(fields["tokenizer.ggml.precompiled_charsmap"]) > 1000
    (tmp_path / "texts.json").write_text(json.dumps(XLM_ROBERTA_TEXTS))
    fast = transformers.AutoTokenizer.from_pretrained(folder)
    expected = [fast.encode(t, add_special_tokens=False) for t in XLM_ROBERTA_TEXTS]
    for name in ("f32", "oracle-f32"):
        llama_cpp_client("tokenize", tmp_path / f"{name}.gguf", tmp_path / "texts.json", tmp_path / f"{name}.json")
    assert json.loads((tmp_path / "f32.json").read_text()) == expected and 3 in expected[-1]  # (<unk>)
    # (the converter's file of tokenizer.json alone: a run of spaces is pieces of its own)
    assert (json.loads((tmp_path / "oracle-f32.json").read_text()) == expected) is not json_alone
    model = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32)
    assert (
        embedded_as_transformers(tmp_path / "f32.gguf", model, tmp_path, prompt=[0, 5, 20, 33, 41, 50, 60, 2]) <= 1e-4
    )


def test_camembert_as_the_converter_writes_xlm_roberta_and_llama_cpp_tokenizes_and_embeds_as_transformers(
    converter, tmp_path
):
    """CamemBERT (sentence-camembert's layout) from FSDP2's rank files: the converter writes CamembertModel as BERT's
    (positions from 0, a WordPiece vocabulary of its unigram pieces), which computes another model; unshard writes it
    as the converter writes XLM-RoBERTa, whose layers and vocabulary it has: in f32 and q8_0 the converter's file of the
    folder named XLMRobertaModel (its SentencePiece model left out: CamemBERT's ids around its pieces are not
    XLM-RoBERTa's, by which the converter realigns them), but for the runs of spaces read as one, as transformers'
    tokenizer reads them. llama.cpp splits text into transformers' tokens and embeds each token as transformers does;
    the converter's own file of the folder does not."""
    import transformers

    folder, oracle, as_bert = tmp_path / "hf", tmp_path / "as-xlm-roberta", tmp_path / "as-bert"
    unshard.convert(SHIPPED / "camembert-fsdp2" / "global_step_1", folder, progress=False)
    for copy in (oracle, as_bert):
        shutil.copytree(folder, copy)
        # (CamemBERT's unused ids as the converter's transformers 4 reads them: additional_special_tokens)
        said = json.loads((copy / "tokenizer_config.json").read_text())
        said["additional_special_tokens"] = said.pop("extra_special_tokens")
        (copy / "tokenizer_config.json").write_text(json.dumps(said))
    (oracle / "sentencepiece.bpe.model").unlink()
    config = json.loads((oracle / "config.json").read_text())
    (oracle / "config.json").write_text(json.dumps({**config, "architectures": ["XLMRobertaModel"]}))
    for kind in ("f32", "q8_0"):
        ours = tmp_path / f"{kind}.gguf"
        unshard.convert(folder, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        mine, expected = contents(ours), contents(converter(oracle, kind, tmp_path / f"oracle-{kind}.gguf", pre=None))
        whitespace = "tokenizer.ggml.remove_extra_whitespaces"
        assert mine[0][whitespace] is True and expected[0][whitespace] is False
        expected[0][whitespace] = True
        assert mine[0] == expected[0] and list(mine[0]) == list(expected[0]) and mine[1] == expected[1]
    fields, _ = contents(tmp_path / "f32.gguf")
    assert fields["tokenizer.ggml.model"] == "t5" and fields["tokenizer.ggml.tokens"][5:7] == ["<s>", "</s>"]
    (tmp_path / "texts.json").write_text(json.dumps(XLM_ROBERTA_TEXTS))
    fast = transformers.AutoTokenizer.from_pretrained(folder)
    expected = [fast.encode(t, add_special_tokens=False) for t in XLM_ROBERTA_TEXTS]
    llama_cpp_client("tokenize", tmp_path / "f32.gguf", tmp_path / "texts.json", tmp_path / "f32.json")
    assert json.loads((tmp_path / "f32.json").read_text()) == expected and 3 in expected[-1]  # (<unk>)
    model = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32)
    prompt = [5, 8, 20, 33, 41, 50, 60, 6]
    assert embedded_as_transformers(tmp_path / "f32.gguf", model, tmp_path, prompt=prompt) <= 1e-4
    theirs = converter(as_bert, "f32", tmp_path / "camembert-as-bert.gguf", pre="default")
    assert embedded_as_transformers(theirs, model, tmp_path, prompt=prompt) > 1e-2


# The rerankers: an encoder of RoBERTa's under a sequence classifier's head (a dense layer, tanh, a projection, on the
# first token), by their fixtures: the head's class, the pre-tokenizer the converter is given, and a query and a passage
# as the tokenizer joins a pair (XLM-RoBERTa's start and end 0 and 2, the RoBERTa fixture's 1 and 2)
RERANKERS = {
    "xlmroberta-fsdp2": ("XLMRobertaForSequenceClassification", "default", [0, 5, 20, 33, 2, 2, 41, 50, 60, 2]),
    "roberta-fsdp2": ("RobertaForSequenceClassification", "roberta-bpe", [1, 5, 20, 33, 2, 2, 41, 50, 60, 2]),
    # (its head a dense layer, a GELU and a LayerNorm before the projection, on the first token)
    "modernbert-fsdp2": ("ModernBertForSequenceClassification", "gpt-2", [1, 5, 20, 33, 2, 41, 50, 60, 2]),
    # (a cross-encoder's, ms-marco-MiniLM's: the pooler, a dense layer and tanh, then the projection; [CLS] and [SEP]
    # the WordPiece fixture's 2 and 3)
    "bert-fsdp2": ("BertForSequenceClassification", "default", [2, 5, 20, 33, 3, 41, 50, 60, 3]),
}


@pytest.mark.parametrize("case", RERANKERS)
def test_a_reranker_as_the_converter_writes_it_and_llama_cpp_scores_as_transformers(case, converter, tmp_path):
    """An XLM-RoBERTa, a RoBERTa, a ModernBERT or a BERT under a classifier's head of one score (a reranker:
    bge-reranker-v2-m3's, gte-reranker-modernbert's, ms-marco-MiniLM's layout), saved by transformers from the
    fixture's encoder: the file is the converter's (the head as llama.cpp's cls, ModernBERT's cls.norm, and cls.output,
    its one label; ModernBERT's with its one key more; BERT's with its pooler as cls, which the converter leaves out, so
    that llama.cpp scores its file otherwise), and llama.cpp's rank pooling scores a pair as transformers does."""
    import transformers

    head_class, pre, pair = RERANKERS[case]
    unshard.convert(SHIPPED / case / "global_step_1", tmp_path / "hf", progress=False)
    torch.manual_seed(0)
    model = getattr(transformers, head_class).from_pretrained(tmp_path / "hf", num_labels=1, dtype=torch.float32)
    with torch.no_grad():  # (the head as after training: its score of the order of 1, not transformers' 1e-3)
        for name, parameter in model.named_parameters():
            if not name.startswith(model.base_model_prefix + "."):
                parameter.normal_(std=0.3)
    model.save_pretrained(tmp_path / "reranker")
    for path in (tmp_path / "hf").iterdir():
        if path.name not in ("config.json", "model.safetensors", "README.md"):
            shutil.copy(path, tmp_path / "reranker" / path.name)
    ours = tmp_path / "f32.gguf"
    unshard.convert(tmp_path / "reranker", ours, output=unshard.OutputOptions(gguf="f32"), verify=True, progress=False)
    theirs = tmp_path / "for-the-converter"
    shutil.copytree(tmp_path / "reranker", theirs)
    if case not in ("xlmroberta-fsdp2", "bert-fsdp2"):
        for_the_converter(theirs)
    fields, tensors = contents(ours)
    mine, expected = (fields, tensors), contents(converter(theirs, "f32", tmp_path / "oracle.gguf", pre=pre))
    arch = mine[0]["general.architecture"]
    if case == "modernbert-fsdp2":  # (the key without which llama.cpp loads no ModernBERT: see the encoders' test)
        assert mine[0].pop(f"{arch}.attention.layer_norm_epsilon") == pytest.approx(1e-5)
    if case == "bert-fsdp2":  # (the pooler, which the converter leaves out, and the size it counts)
        assert mine[0].pop("general.size_label") != expected[0].pop("general.size_label")
        mine = (mine[0], [t for t in mine[1] if t[0] not in ("cls.weight", "cls.bias")])
    assert mine[0] == expected[0] and list(mine[0]) == list(expected[0]) and mine[1] == expected[1]
    assert fields[f"{arch}.classifier.output_labels"] == ["LABEL_0"]
    assert {"cls.weight", "cls.output.weight"} <= {t[0] for t in tensors}
    llama_cpp_client("rank", ours, ",".join(map(str, pair)), tmp_path / "score.npy")
    expected = model(torch.tensor([pair])).logits[0].detach()
    got = torch.from_numpy(np.load(tmp_path / "score.npy"))
    assert got.shape == expected.shape and expected.abs().item() > 0.1
    # (ModernBERT's head: llama.cpp's GELU is tanh's approximation, transformers' the exact one: f32's tolerance)
    tolerance = LLAMA_CPP_TOLERANCE["f32"] if case == "modernbert-fsdp2" else 1e-4
    assert ((got - expected).abs() / expected.abs()).item() <= tolerance, (got, expected)
    if case == "bert-fsdp2":  # (the converter's file, without the pooler, scores otherwise)
        llama_cpp_client("rank", tmp_path / "oracle.gguf", ",".join(map(str, pair)), tmp_path / "theirs.npy")
        theirs = torch.from_numpy(np.load(tmp_path / "theirs.npy"))
        assert ((theirs - expected).abs() / expected.abs()).item() > 0.01, (theirs, expected)


def test_a_distilbert_classifier_llama_cpp_would_score_otherwise_is_one_line(tmp_path):
    """DistilBERT's classifier (ReLU after its first layer, where llama.cpp's bert applies tanh), saved by transformers
    from the fixture's encoder: one line naming config.json, nothing written."""
    import transformers

    unshard.convert(SHIPPED / "distilbert-fsdp2" / "global_step_1", tmp_path / "hf", progress=False)
    model = transformers.DistilBertForSequenceClassification.from_pretrained(tmp_path / "hf", num_labels=1)
    model.save_pretrained(tmp_path / "classifier")
    shutil.copy(tmp_path / "hf" / "tokenizer.json", tmp_path / "classifier")
    code, _, err = run_cli("convert", tmp_path / "classifier", tmp_path / "c.gguf", "--no-progress")
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert "config.json: DistilBertForSequenceClassification applies ReLU" in err
    assert not (tmp_path / "c.gguf").exists()


def test_a_classifier_s_labels_are_the_converter_s_and_damaged_ones_one_line(tmp_path):
    """A classifier's labels in their ids' order; transformers' two placeholders, or none, written as none; labels not
    by their ids: one line naming config.json."""
    labels = families.bert.classifier_labels
    assert labels({"id2label": {"1": "relevant", "0": "irrelevant"}}, tmp_path) == ["irrelevant", "relevant"]
    assert labels({"id2label": {"0": "LABEL_0", "1": "LABEL_1"}}, tmp_path) == labels({}, tmp_path) == []
    with pytest.raises(unshard.ConfigMismatchError, match="config.json: id2label is not labels by their ids"):
        labels({"id2label": {"first": "LABEL_0"}}, tmp_path)


# The decoders' layers alone, as embedding models have them, by their fixtures: the class, and the pooling their
# sentence-transformers folder names (Qwen3-Embedding's last token, gte-Qwen2's mean) with llama.cpp's number for it
DECODER_EMBEDDINGS = {
    "qwen3-fsdp2-spm": ("Qwen3Model", "pooling_mode_lasttoken", gguf.PoolingType.LAST),
    "qwen2-fsdp2-spm": ("Qwen2Model", "pooling_mode_mean_tokens", gguf.PoolingType.MEAN),
    "llama-fsdp2-spm": ("LlamaModel", "pooling_mode_mean_tokens", None),  # (the converter's Llama writes no pooling)
}


@pytest.mark.parametrize("case", DECODER_EMBEDDINGS)
def test_a_decoder_s_layers_alone_embed_as_the_converter_writes_them(case, converter, tmp_path):
    """A Qwen3Model, Qwen2Model or LlamaModel (an embedding model: the layers without the head, no `model.` before
    their names) saved by transformers from the fixture's, in a sentence-transformers folder: the converter's file,
    the pooling its modules name (Qwen's); llama.cpp embeds each token as transformers does."""
    import transformers

    model_class, flag, pooling = DECODER_EMBEDDINGS[case]
    unshard.convert(SHIPPED / case / "global_step_1", tmp_path / "hf", progress=False)
    model = getattr(transformers, model_class).from_pretrained(tmp_path / "hf", dtype=torch.float32)
    folder = embedding_folder(model, tmp_path, flag)
    ours = tmp_path / "f32.gguf"
    unshard.convert(folder, ours, output=unshard.OutputOptions(gguf="f32"), verify=True, progress=False)
    assert_same_file(ours, converter(folder, "f32", tmp_path / "oracle.gguf", pre=None))
    fields, tensors = contents(ours)
    assert fields.get(f"{fields['general.architecture']}.pooling_type") == pooling and "output.weight" not in tensors
    # (within f32's tolerance: llama.cpp caches a decoder's keys and values in f16)
    distance = embedded_as_transformers(ours, model, tmp_path, prompt=[1, 5, 20, 33, 41, 50, 60, 2])
    assert distance <= LLAMA_CPP_TOLERANCE["f32"]


def test_a_llama_attending_both_ways_embeds_as_the_converter_writes_it(converter, tmp_path):
    """NVIDIA's embedding models' layout (llama-embed-nemotron: `LlamaBidirectionalModel`, a LlamaModel whose tokens
    attend to every other), saved by transformers from the Llama fixture's under the class its config names: the
    converter's file, llama.cpp's llama-embed; llama.cpp, told to attend both ways as NVIDIA's model does, embeds each
    token as transformers' LlamaModel given a mask of every token."""
    import transformers

    unshard.convert(SHIPPED / "llama-fsdp2-spm" / "global_step_1", tmp_path / "hf", progress=False)
    model = transformers.LlamaModel.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    folder = embedding_folder(model, tmp_path, "pooling_mode_mean_tokens", named="LlamaBidirectionalModel")
    ours = tmp_path / "f32.gguf"
    unshard.convert(folder, ours, output=unshard.OutputOptions(gguf="f32"), verify=True, progress=False)
    assert_same_file(ours, converter(folder, "f32", tmp_path / "oracle.gguf", pre=None))
    assert contents(ours)[0]["general.architecture"] == "llama-embed"
    prompt = [1, 5, 20, 33, 41, 50, 60, 2]
    llama_cpp_client("embed", ours, ",".join(map(str, prompt)), tmp_path / "embeddings.npy", non_causal=True)
    got = torch.from_numpy(np.load(tmp_path / "embeddings.npy"))
    everyone = torch.ones(1, 1, len(prompt), len(prompt), dtype=torch.bool)
    expected = model(torch.tensor([prompt]), attention_mask=everyone).last_hidden_state[0].detach()
    causal = model(torch.tensor([prompt])).last_hidden_state[0].detach()
    distance = ((got - expected).norm() / expected.norm()).item()
    # (measured 5.5e-7, within f32's tolerance: llama.cpp caches keys and values in f16; from the causal model 0.95)
    assert distance <= LLAMA_CPP_TOLERANCE["f32"] < ((got - causal).norm() / causal.norm()).item(), distance


def embedding_folder(model, tmp_path: Path, flag: str, named: str | None = None) -> Path:
    """The model as transformers saves it (tmp_path/embedding), with unshard's folder's tokenizer files (tmp_path/hf),
    in a sentence-transformers folder pooling by that flag; its config naming the class `named` where given (as its
    makers' own code names it: save_pretrained names the class it saves)."""
    folder = tmp_path / "embedding"
    model.save_pretrained(folder)
    if named:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "architectures": [named]}))
    for path in (tmp_path / "hf").iterdir():
        if path.name not in ("config.json", "model.safetensors", "README.md"):
            shutil.copy(path, folder / path.name)
    sentence_transformers_folder(folder, flag)
    return folder


def sentence_transformers_folder(folder: Path, flag: str) -> None:
    """A sentence-transformers folder's modules beside the model: the model, then pooling by that flag."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, flag: True}))


def test_embedding_gemma_as_the_converter_writes_it_and_llama_cpp_embeds_as_transformers(converter, tmp_path):
    """EmbeddingGemma's layout (Gemma3TextModel: Gemma 3's layers alone, attending both ways, within a window either
    side) saved by transformers from the Gemma 3 fixture's, in a sentence-transformers folder: llama.cpp's
    gemma-embedding, the converter's file (the window as config.json says it, which transformers halves in memory);
    llama.cpp embeds each token of a prompt longer than the window as transformers does."""
    import transformers

    unshard.convert(SHIPPED / "gemma3-fsdp2-spm" / "global_step_1", tmp_path / "hf", progress=False)
    config = transformers.Gemma3TextConfig.from_pretrained(tmp_path / "hf")
    config.use_bidirectional_attention, config.architectures = True, ["Gemma3TextModel"]
    model = transformers.Gemma3TextModel.from_pretrained(tmp_path / "hf", config=config)
    folder = embedding_folder(model, tmp_path, "pooling_mode_mean_tokens")
    ours = tmp_path / "f32.gguf"
    unshard.convert(folder, ours, output=unshard.OutputOptions(gguf="f32"), verify=True, progress=False)
    assert_same_file(ours, converter(folder, "f32", tmp_path / "oracle.gguf", pre=None))
    fields, _ = contents(ours)
    window = json.loads((folder / "config.json").read_text())["sliding_window"]
    assert fields["general.architecture"] == "gemma-embedding" and fields["gemma-embedding.pooling_type"] == 1
    assert fields["gemma-embedding.attention.sliding_window"] == window
    model = transformers.Gemma3TextModel.from_pretrained(folder, dtype=torch.float32)
    prompt = [2] + [(7 * i) % 90 + 5 for i in range(window // 2 + 14)]  # (past the window either side)
    assert embedded_as_transformers(ours, model, tmp_path, prompt=prompt) <= LLAMA_CPP_TOLERANCE["f32"]


def test_an_xlm_roberta_tokenizer_not_a_unigram_is_one_line(tmp_path):
    """A damaged sentencepiece.bpe.model, a BPE one, or (without one) a tokenizer.json that is not a Unigram: one line
    naming the file, nothing written."""
    src = SHIPPED / "xlmroberta-fsdp2" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    model = tmp_path / "hf" / "sentencepiece.bpe.model"
    bpe = SHIPPED / "llama-fsdp2-spm" / "global_step_1" / "actor" / "huggingface" / "tokenizer.model"
    other_json = SHIPPED / "qwen3moe-fsdp2" / "global_step_1" / "actor" / "huggingface" / "tokenizer.json"
    for change, message in (
        (lambda: model.write_bytes(model.read_bytes()[:5000]), "sentencepiece.bpe.model: not a SentencePiece model"),
        (lambda: shutil.copy(bpe, model), "sentencepiece.bpe.model: a BPE SentencePiece model, and this family's"),
        (lambda: (model.unlink(), shutil.copy(other_json, model.parent)), "tokenizer.json: a BPE tokenizer, not the"),
    ):
        change()
        code, _, err = run_cli("convert", src, tmp_path / "m.gguf", "--config-from", tmp_path / "hf", "--no-progress")
        assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "m.gguf").exists()


# Text T5's tokenizer normalizes (the fixture's SentencePiece model is trained on XLM-RoBERTa's text too)
T5_TEXTS = XLM_ROBERTA_TEXTS


def t5_folder(tmp_path: Path, encoder_alone: bool = False) -> Path:
    """The T5 fixture's folder, or (encoder_alone) its encoder as transformers saves a T5EncoderModel of it with the
    tokenizer's files beside."""
    import transformers

    unshard.convert(SHIPPED / "t5-fsdp2" / "global_step_1", tmp_path / "hf", progress=False)
    if not encoder_alone:
        return tmp_path / "hf"
    transformers.T5EncoderModel.from_pretrained(tmp_path / "hf").save_pretrained(tmp_path / "encoder")
    for path in (tmp_path / "hf").iterdir():
        if path.name not in ("config.json", "model.safetensors", "README.md"):
            shutil.copy(path, tmp_path / "encoder" / path.name)
    return tmp_path / "encoder"


def tokenized_as_transformers(gguf_file: Path, folder: Path, texts: list[str], tmp_path: Path) -> list[list[int]]:
    """llama.cpp's tokens of each text, asserted equal to transformers' of the folder's tokenizer."""
    import transformers

    (tmp_path / "texts.json").write_text(json.dumps(texts))
    llama_cpp_client("tokenize", gguf_file, tmp_path / "texts.json", tmp_path / "ids.json")
    fast = transformers.AutoTokenizer.from_pretrained(folder)
    expected = [fast.encode(t, add_special_tokens=False) for t in texts]
    assert json.loads((tmp_path / "ids.json").read_text()) == expected
    return expected


@pytest.mark.parametrize("tokenizer", ["spiece.model", "tokenizer.json"])
def test_t5_as_the_converter_writes_it_and_llama_cpp_runs_it_as_transformers(tokenizer, converter, tmp_path):
    """T5 (Flan-T5's layout: a gated GELU, the head apart) from FSDP2's rank files, its vocabulary from the release's
    spiece.model (T5's sentinels past its pieces padding, as the converter reads them): in f32, f16 and q8_0 the
    converter's file, field for field and byte for byte (llama.cpp's t5, the encoder's and the decoder's blocks, the
    decoder's start token); from tokenizer.json alone (what transformers 5 saves, which the converter does not read),
    the same tensors and the tokenizer's pieces. llama.cpp encodes the prompt and decodes as transformers does, and
    splits text into transformers' tokens."""
    import transformers

    folder = t5_folder(tmp_path)
    json_alone = tokenizer == "tokenizer.json"
    if json_alone:
        (folder / "spiece.model").unlink()
    kinds = ("f32",) if json_alone else ("f32", "f16", "q8_0")
    for kind in kinds:
        ours = tmp_path / f"{kind}.gguf"
        unshard.convert(folder, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        if not json_alone:
            assert_same_file(ours, converter(folder, kind, tmp_path / f"oracle-{kind}.gguf", pre="default"))
    fields, tensors = contents(tmp_path / "f32.gguf")
    assert fields["general.architecture"] == "t5" and fields["t5.decoder_block_count"] == 2
    assert fields["tokenizer.ggml.model"] == "t5" and fields["t5.decoder_start_token_id"] == 0
    assert {"enc.blk.0.attn_rel_b.weight", "dec.blk.0.cross_attn_q.weight", "output.weight"} <= {t[0] for t in tensors}
    # (the sentinels: control tokens of tokenizer.json; padding past spiece.model's pieces, as the converter has them)
    assert (fields["tokenizer.ggml.tokens"][97] == "<extra_id_0>") is json_alone
    tokenized_as_transformers(tmp_path / "f32.gguf", folder, T5_TEXTS, tmp_path)
    model = transformers.T5ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    prompt, decoded = [5, 20, 33, 41, 50, 60, 1], [7, 9, 11]
    llama_cpp_client(
        "seq2seq", tmp_path / "f32.gguf", *(",".join(map(str, t)) for t in (prompt, decoded)), tmp_path / "l.npy"
    )
    got = torch.from_numpy(np.load(tmp_path / "l.npy"))
    expected = model(torch.tensor([prompt]), decoder_input_ids=torch.tensor([[0, *decoded]])).logits[0].detach()
    assert ((got - expected).norm() / expected.norm()).item() <= LLAMA_CPP_TOLERANCE["f32"]


def test_t5_s_encoder_alone_as_the_converter_writes_it_and_llama_cpp_embeds_as_transformers(converter, tmp_path):
    """A T5EncoderModel (an image model's text encoder, sentence-t5's): llama.cpp's t5encoder, the converter's file in
    f32 and q8_0, and llama.cpp (as llama-embedding runs an encoder) embeds each token as transformers does."""
    import transformers

    folder = t5_folder(tmp_path, encoder_alone=True)
    for kind in ("f32", "q8_0"):
        ours = tmp_path / f"{kind}.gguf"
        unshard.convert(folder, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        assert_same_file(ours, converter(folder, kind, tmp_path / f"oracle-{kind}.gguf", pre="default"))
    fields, tensors = contents(tmp_path / "f32.gguf")
    assert fields["general.architecture"] == "t5encoder" and not any(t[0].startswith("dec.") for t in tensors)
    model = transformers.T5EncoderModel.from_pretrained(folder, dtype=torch.float32)
    distance = embedded_as_transformers(tmp_path / "f32.gguf", model, tmp_path, prompt=[5, 20, 33, 41, 50, 60, 1])
    assert distance <= LLAMA_CPP_TOLERANCE["f32"]


@pytest.mark.parametrize("kind", ["MT5", "UMT5", "UMT5Model"])
def test_mt5_and_umt5_as_the_converter_writes_them_and_llama_cpp_runs_them_as_transformers(kind, converter, tmp_path):
    """mT5 (T5 v1.1's layout under its own class) and UMT5 (each layer with buckets' biases of its own; and without
    its head, UMT5Model), saved by transformers with the T5 fixture's weights (UMT5's further biases as transformers
    initialises them) and tokenizer: the converter's file in f32, and llama.cpp decodes as transformers does (the head
    of UMT5Model's file the embedding, as llama.cpp reads it)."""
    import transformers

    folder = t5_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "transformers_version")}
    torch.manual_seed(0)
    family = kind.removesuffix("Model")
    model_class = getattr(transformers, kind if kind.endswith("Model") else f"{kind}ForConditionalGeneration")
    model = model_class(getattr(transformers, f"{family}Config")(**config))
    t5 = transformers.T5ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    missing = model.load_state_dict(t5.state_dict(), strict=False).missing_keys
    assert all("relative_attention_bias" in name for name in missing) and bool(missing) is (family == "UMT5")
    model.save_pretrained(tmp_path / kind)
    for path in folder.iterdir():
        if path.name not in ("config.json", "model.safetensors", "README.md", "generation_config.json"):
            shutil.copy(path, tmp_path / kind / path.name)
    ours = tmp_path / "f32.gguf"
    unshard.convert(tmp_path / kind, ours, output=unshard.OutputOptions(gguf="f32"), verify=True, progress=False)
    assert_same_file(ours, converter(tmp_path / kind, "f32", tmp_path / "oracle.gguf", pre="default"))
    biases = [t[0] for t in contents(ours)[1] if "attn_rel_b" in t[0]]
    assert len(biases) == (4 if family == "UMT5" else 2)  # (each stack's layers' own, or each stack's first layer's)
    assert kind != "UMT5Model" or "output.weight" not in [t[0] for t in contents(ours)[1]]
    prompt, decoded = [5, 20, 33, 41, 50, 60, 1], [7, 9, 11]
    llama_cpp_client("seq2seq", ours, *(",".join(map(str, t)) for t in (prompt, decoded)), tmp_path / "l.npy")
    got = torch.from_numpy(np.load(tmp_path / "l.npy"))
    model = type(model).from_pretrained(tmp_path / kind, dtype=torch.float32)
    out = model(torch.tensor([prompt]), decoder_input_ids=torch.tensor([[0, *decoded]]))
    expected = (out.logits if kind != "UMT5Model" else out.last_hidden_state @ model.shared.weight.T)[0].detach()
    assert ((got - expected).norm() / expected.norm()).item() <= LLAMA_CPP_TOLERANCE["f32"]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"relative_attention_max_distance": 64}, "relative_attention_max_distance 64, and llama.cpp's t5 buckets"),
        ({"feed_forward_proj": "gated-silu"}, "feed_forward_proj 'gated-silu', and llama.cpp's t5 computes a ReLU"),
        ({"decoder_start_token_id": None}, "no decoder_start_token_id, which llama.cpp's t5 starts decoding from"),
    ],
)
def test_what_llama_cpp_s_t5_computes_otherwise_is_one_line(change, message, tmp_path):
    """A T5 whose buckets or MLP llama.cpp computes otherwise than transformers, or without the decoder's start: one
    line naming config.json, nothing written."""
    src = SHIPPED / "t5-fsdp2" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config.update(change)
    (tmp_path / "hf" / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    code, _, err = run_cli("convert", src, tmp_path / "m.gguf", "--config-from", tmp_path / "hf", "--no-progress")
    assert code == 1 and message in err and "config.json" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists()


def test_a_t5_with_its_head_tied_is_noted(tmp_path):
    """T5's own (not Flan-T5's) head is the embedding, which transformers applies after scaling the decoder's output
    and llama.cpp without: the plan says so."""
    src = SHIPPED / "t5-fsdp2" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config.pop("scale_decoder_outputs")  # (a config before transformers 5: T5's own, tied)
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    info = unshard.inspect(src, config_from=tmp_path / "hf", output=unshard.OutputOptions(gguf="f32"))
    assert "llama.cpp's t5 does not scale the decoder's output by d_model ** -0.5" in " ".join(info["output"]["notes"])
    plain = unshard.inspect(src, output=unshard.OutputOptions(gguf="f32"))  # (the fixture's: Flan-T5's, not scaled)
    assert "scale the decoder's output" not in " ".join(plain["output"]["notes"])


def test_a_pooling_llama_cpp_has_none_of_is_one_line(tmp_path):
    """A sentence-transformers pooling llama.cpp has none of (the maximum), or a modules.json that is not a list of
    modules: one line naming the file."""
    (tmp_path / "modules.json").write_text(json.dumps([{"path": "1_Pooling", "type": "x.Pooling"}]))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(unshard.ConfigMismatchError, match="pooling None, and llama.cpp pools by the mean"):
        families.sentence_transformers.pooling_type(tmp_path)
    (tmp_path / "modules.json").write_text(json.dumps({"0": "Transformer"}))
    with pytest.raises(unshard.ConfigMismatchError, match="modules.json: not sentence-transformers' list of modules"):
        families.sentence_transformers.pooling_type(tmp_path)


def test_a_granite_speech_batch_norm_without_its_statistics_is_one_line():
    import torch

    norm = "encoder.layers.0.conv.batch_norm."
    values = {norm + part: torch.ones(4) for part in ("weight", "bias", "running_mean")}
    with pytest.raises(unshard.ConfigMismatchError, match="the checkpoint has no running_var of this batch norm"):
        families.granite_speech.batch_norms_folded(values)


@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_learned_positions_stay_f32_in_every_type_as_the_converter_keeps_them(kind, converter, tmp_path):
    """GPT-2's learned positions (llama.cpp's position_embd) in F32 whatever the file's type, as the converter and
    llama-quantize keep them (and BERT's segment types): the file is the converter's."""
    src = SHIPPED / "gpt2-fsdp2" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    pre = for_the_converter(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **HUB_KEYS["gpt2-fsdp2"](config)}))
    ours = tmp_path / f"{kind}.gguf"
    unshard.convert(src, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
    assert_same_file(ours, converter(tmp_path / "hf", kind, tmp_path / f"oracle-{kind}.gguf", pre=pre))
    assert {t[0]: t[1] for t in contents(ours)[1]}["position_embd.weight"] == "F32"


def test_a_glm_s_epsilon_is_noted_and_its_rope_base_refused_in_one_line(tmp_path):
    """GLM's norms' epsilon, which the converter writes 1e-5 whatever rms_norm_eps says, is noted; a rope base other
    than the converter's (10000 times rope_ratio) is one line, nothing written."""
    src = SHIPPED / "glm-fsdp2" / "global_step_1"
    info = unshard.inspect(src, output=unshard.OutputOptions(gguf="f32"))
    assert "llama.cpp's chatglm norms at epsilon 1e-05, as the converter writes it" in " ".join(info["output"]["notes"])
    unshard.convert(src, tmp_path / "hf", progress=False)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["rope_parameters"]["rope_theta"] = 500000.0
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli("convert", src, tmp_path / "m.gguf", "--config-from", tmp_path / "hf", "--no-progress")
    assert code == 1 and "rope is default at base 500000.0, and llama.cpp's chatglm turns plain rope at 10000" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "m.gguf").exists()


def test_a_gemma4_tokenizer_of_other_tokens_than_the_embedding_s_rows_is_one_line(tmp_path):
    """A Gemma 4 tokenizer of a token more than the embedding has rows, or not a BPE with byte fallback: one line
    before anything is written (llama.cpp refuses the file the converter would write of the first)."""
    from tokenizers import AddedToken, Tokenizer

    src = SHIPPED / "gemma4-fsdp2" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    tokenizer = Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken("<|tool_call>", special=True)])
    tokenizer.save(str(tmp_path / "hf" / "tokenizer.json"))
    gguf_out = unshard.OutputOptions(gguf="f32")
    with pytest.raises(unshard.ConfigMismatchError, match="101 tokens for an embedding of 100 rows, which llama.cpp"):
        unshard.convert(src, tmp_path / "m.gguf", config_from=tmp_path / "hf", output=gguf_out, progress=False)
    shutil.copy(
        SHIPPED / "qwen3moe-fsdp2" / "global_step_1" / "actor" / "huggingface" / "tokenizer.json", tmp_path / "hf"
    )
    with pytest.raises(unshard.ConfigMismatchError, match="a BPE without byte fallback, not a BPE with byte fallback"):
        unshard.convert(src, tmp_path / "m.gguf", config_from=tmp_path / "hf", output=gguf_out, progress=False)
    assert not (tmp_path / "m.gguf").exists()


def test_a_tokenizer_without_the_special_tokens_glm4_names_is_one_line(tmp_path):
    """GLM-4's converter looks its end of turn up by its text among the added tokens (a KeyError where it is not):
    a tokenizer without it is one line naming the file, and nothing is written."""
    src = SHIPPED / "glm4-fsdp2" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    path = tmp_path / "hf" / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["content"] != "<|user|>"]
    path.write_text(json.dumps(tokenizer))
    code, _, err = run_cli("convert", src, tmp_path / "m.gguf", "--config-from", tmp_path / "hf", "--no-progress")
    assert code == 1 and f"{path}: has no added token <|user|>, which llama.cpp's eot token" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize("size", [49152, 32016])
def test_llama_vocabularies_of_the_sizes_the_converter_knows(size, converter, tmp_path):
    """The converter's LlamaModel turns add_bos_token off for a vocabulary of 49152 (SmolLM2's, small Granites'),
    whatever the tokenizer says, and names CodeLlama's infill tokens (prefix, suffix, middle, end of turn) by their
    ids for one of 32016 (the end of turn alone has a key in gguf-py's writer): a Llama of that vocabulary as
    transformers writes it (CodeLlama's with a SentencePiece tokenizer, as it has), unshard's file equal to the
    converter's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=size, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    folder = tmp_path / "hf"
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer = SHIPPED / ("llama-fsdp2" if size == 49152 else "llama-fsdp2-spm") / "global_step_1" / "actor"
    for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"):
        if (tokenizer / "huggingface" / name).is_file() and (name != "tokenizer.json" or size == 49152):
            shutil.copy(tokenizer / "huggingface" / name, folder)
    ours = tmp_path / "m.gguf"
    unshard.convert(folder, ours, output=unshard.OutputOptions(gguf="f32"), progress=False)
    assert_same_file(ours, converter(folder, "f32", tmp_path / "oracle.gguf", pre=for_the_converter(folder)))
    fields = contents(ours)[0]
    if size == 49152:
        assert fields["tokenizer.ggml.add_bos_token"] is False
    else:  # (gguf-py 0.19's writer has no key for the other three kinds: SpecialVocab writes the end of turn alone)
        assert fields["tokenizer.ggml.eot_token_id"] == 32010 and "tokenizer.ggml.eos_token_id" in fields


@pytest.mark.parametrize("case", ["gptneox-fsdp2", "falcon-fsdp2", "bloom-fsdp2"])
def test_fused_attention_in_the_k_quant_mixes_as_llama_quantize_chooses(
    case, converter, ggml_library, monkeypatch, tmp_path
):
    """The families whose q, k and v are one tensor (attn_qkv, which llama-quantize counts with attn_v) and Falcon,
    for which it chooses otherwise: every K-quant mix unshard writes of the folder (written from the FSDP2 rank files)
    is llama-quantize's of the converter's f32 file (rows of 64: the types of 32-value blocks it falls back to);
    GPT-NeoX's header, which the converter writes without a file type, gets llama-quantize's."""
    src = SHIPPED / case / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    if case in HUB_KEYS:
        config = json.loads((tmp_path / "hf" / "config.json").read_text())
        (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **HUB_KEYS[case](config)}))
    converter(tmp_path / "hf", "f32", tmp_path / "oracle-f32.gguf", pre=for_the_converter(tmp_path / "hf"))
    assert_llama_quantize_mixes_it(tmp_path / "hf", ggml_library, monkeypatch, tmp_path)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"no_rope_layers": [1, 1, 1, 1]},
            "no_rope_layers is [1, 1, 1, 1], and llama.cpp's llama4 computes [1, 1, 1, 0]",
        ),
        ({"attention_chunk_size": 4096}, "attention_chunk_size is 4096, and llama.cpp's llama4 computes 8192"),
        ({"use_qk_norm": False}, "use_qk_norm is False, and llama.cpp's llama4 computes True (with 4 experts)"),
        ({"attn_scale": 0.2}, "attn_scale is 0.2, and llama.cpp's llama4 computes 0.1"),
    ],
)
def test_what_llama_cpp_s_llama4_computes_otherwise_is_one_line(change, message, tmp_path):
    """A Llama 4 whose text llama.cpp's llama4 would compute otherwise (it fixes its layout in code, not by the file):
    refused while planning, in one line naming the file, nothing written."""
    assert_refused_in_one_line("llama4-fsdp2", lambda config: config["text_config"].update(change), message, tmp_path)


@pytest.mark.parametrize(
    "case, message",
    [
        # (the converter would read a Jamba's tokenizer.json alone as a Llama vocabulary, which unshard does not write)
        ("jamba-fsdp2-spm", "no tokenizer.model, and llama.cpp's converter reads"),
        ("minicpm3-fsdp2-spm", "no tokenizer.model, the SentencePiece model"),  # (the converter's only source)
    ],
)
def test_a_folder_without_the_sentencepiece_model_the_converter_reads_is_one_line(case, message, tmp_path):
    """A Jamba or MiniCPM3 folder without its tokenizer.model: one line naming the folder, nothing written."""
    src = SHIPPED / case / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    (tmp_path / "hf" / "tokenizer.model").unlink()
    out = unshard.OutputOptions(gguf="f32")
    with pytest.raises(unshard.ConfigMismatchError, match=message) as e:
        unshard.convert(src, tmp_path / "m.gguf", config_from=tmp_path / "hf", output=out, progress=False)
    assert str(tmp_path / "hf") in str(e.value) and not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"mamba_norm_before_gate": True}, "mamba_norm_before_gate is set, and llama.cpp's falcon-h1 norms the mixer"),
        ({"time_step_limit": [0.0, 8.0]}, "time_step_limit is [0.0, 8.0], and llama.cpp's falcon-h1 clamps no time"),
        ({"attention_bias": True}, "a projection has biases, which llama.cpp's falcon-h1 has none of"),
    ],
)
def test_what_llama_cpp_s_falcon_h1_computes_otherwise_is_one_line(change, message, tmp_path):
    """A Falcon-H1 llama.cpp's falcon-h1 would compute otherwise (its mixer's norm before the gate, a time step clamp,
    biases): refused while planning, in one line naming the file, nothing written."""
    assert_refused_in_one_line("falconh1-fsdp2", lambda config: config.update(change), message, tmp_path)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"scale_emb": 10}, "scale_emb is 10, and llama.cpp's minicpm3 takes 12"),
        ({"dim_model_base": 128}, "dim_model_base is 128, and llama.cpp's minicpm3 takes 256"),
        ({"q_lora_rank": None}, "q_lora_rank is null, and llama.cpp's minicpm3 takes a query down projection"),
        ({"max_position_embeddings": 1024}, "LongRoPE past its trained context, whose attention factor the converter"),
    ],
)
def test_what_llama_cpp_s_minicpm3_computes_otherwise_is_one_line(change, message, tmp_path):
    """A MiniCPM3 llama.cpp's minicpm3 would compute otherwise (its muP scales are constants in its code, the rope
    base one the converter does not write, LongRoPE's attention factor unwritten): refused while planning, in one
    line naming the file, nothing written."""
    assert_refused_in_one_line("minicpm3-fsdp2-spm", lambda config: config.update(change), message, tmp_path)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"linear_attn_config": {"kda_layers": [1, 3]}},
            "it has no linear_attn_config.full_attn_layers, which the converter places",
        ),
        ({"num_key_value_heads": 1}, "num_key_value_heads is 1, and the converter splits kv_b_proj by it"),
        ({"num_expert_group": 2}, "its experts are routed in groups, which llama.cpp's kimi-linear does not read"),
        ({"moe_renormalize": False}, "its experts' weights are not renormalised, and llama.cpp's kimi-linear"),
        ({"moe_router_activation_func": "softmax"}, "the experts' gating function is 'softmax', and transformers'"),
    ],
)
def test_what_llama_cpp_s_kimi_linear_computes_otherwise_is_one_line(change, message, tmp_path):
    """A Kimi Linear llama.cpp's kimi-linear would compute otherwise than transformers (experts in groups, weights not
    renormalised, another gating than transformers' sigmoid), or the converter would not read (no layer placement,
    a kv_b_proj it splits by other heads): refused while planning, in one line naming the file, nothing written."""
    assert_refused_in_one_line("kimilinear-fsdp2", lambda config: config.update(change), message, tmp_path)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_kv_shared_layers": 4}, "18 layers have keys and values of their own (num_kv_shared_layers 4 of 22)"),
        ({"laurel_rank": 32}, "laurel_rank is 32, and llama.cpp's gemma3n takes 64"),
        ({"hidden_activation": "silu"}, "hidden_activation is silu, and llama.cpp's gemma3n runs GELU (tanh)"),
        ({"activation_sparsity_pattern": [0.95] * 22}, "activation_sparsity_pattern is not 0.95 in the first 10"),
    ],
)
def test_what_llama_cpp_s_gemma3n_computes_otherwise_is_one_line(change, message, tmp_path):
    """A Gemma 3n llama.cpp's gemma3n would compute otherwise than transformers, as it fixes in its code the layers with
    keys and values of their own (20), LAuReL's rank, the activation and the sparse layers: refused while planning, in
    one line naming the file, nothing written."""
    assert_refused_in_one_line("gemma3n-fsdp2-spm", lambda config: config.update(change), message, tmp_path)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"norm_topk_prob": False}, "norm_topk_prob is off, and llama.cpp's mimo2 always renormalises"),
        ({"routed_scaling_factor": 2.5}, "routed_scaling_factor is not 1, and llama.cpp's mimo2 is given no scale"),
        ({"swa_num_key_value_heads": 4}, "swa_num_key_value_heads is not twice num_key_value_heads"),
        ({"hybrid_layer_pattern": [0, 1, 0, 1]}, "layer_types and hybrid_layer_pattern name different windowed layers"),
        ({"scoring_func": "softmax"}, "the experts' gating function is 'softmax', and both transformers and llama.cpp"),
    ],
)
def test_what_llama_cpp_s_mimo2_computes_otherwise_is_one_line(change, message, tmp_path):
    """A MiMo-V2-Flash llama.cpp's mimo2 would compute otherwise than transformers (the experts' weights not
    renormalised, or scaled, another router), or whose Hub keys say other windowed layers or heads than transformers
    reads: refused while planning, in one line naming the file, nothing written."""
    assert_refused_in_one_line("mimov2flash-fsdp2", lambda config: config.update(change), message, tmp_path)


# Classes a family's makers name in their releases' configs (their own code's), which the converter reads as the class
# transformers names: by the fixture of the family
MAKERS_CLASSES = {
    "ernie45-fsdp2-spm": "Ernie4_5_ForCausalLM",
    "exaonemoe-fsdp2": "ExaoneMoEForCausalLM",
    "lfm2-fsdp2": "LFM2ForCausalLM",
    "llama-fsdp2-spm": "LLaMAForCausalLM",
    "mpt-fsdp2": "MPTForCausalLM",
    "t5-fsdp2": "T5WithLMHeadModel",
}


@pytest.mark.parametrize("case", MAKERS_CLASSES)
def test_a_family_under_its_makers_class_name_is_the_converter_s_file(case, converter, tmp_path):
    """A folder whose config.json names the class as its makers' code does (ERNIE 4.5's Ernie4_5_ForCausalLM, EXAONE
    MoE's ExaoneMoEForCausalLM, MosaicML's MPTForCausalLM, the first T5 releases' T5WithLMHeadModel, ...): the
    family's file, the converter's."""
    folder = tmp_path / "hf"
    unshard.convert(SHIPPED / case / "global_step_1", folder, progress=False)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": [MAKERS_CLASSES[case]]}))
    pre = for_the_converter(folder)
    ours = tmp_path / "f32.gguf"
    unshard.convert(folder, ours, output=unshard.OutputOptions(gguf="f32"), verify=True, progress=False)
    if case in HUB_KEYS:  # (the config as the Hub's release holds it, which the converter reads)
        config = json.loads((folder / "config.json").read_text())
        hub = {key: value for key, value in {**config, **HUB_KEYS[case](config)}.items() if value is not DROPPED}
        (folder / "config.json").write_text(json.dumps(hub))
    assert_same_file(ours, converter(folder, "f32", tmp_path / "oracle-f32.gguf", pre=pre))


def test_glm5_s_indexer_head_weights_are_quantized_as_llama_quantize_quantizes_them(
    converter, ggml_library, monkeypatch, tmp_path
):
    """The sparse attention's indexer's head weights (indexer.proj), which the converter keeps in f32 and llama-quantize
    quantizes as any matrix (but for glm5-next's): GLM-5's q4_k_m file is llama-quantize's of the converter's f32 file
    (unshard kept them in f32 before)."""
    src, folder = SHIPPED / "glm5-fsdp2" / "global_step_1", tmp_path / "hf"
    unshard.convert(src, folder, progress=False)
    pre = for_the_converter(folder)
    monkeypatch.setenv(kquants.LIBRARY_VARIABLE, ggml_library)
    unshard.convert(src, tmp_path / "q4_k_m.gguf", output=unshard.OutputOptions(gguf="q4_k_m"), progress=False)
    config = json.loads((folder / "config.json").read_text())
    hub = {key: value for key, value in {**config, **HUB_KEYS["glm5-fsdp2"](config)}.items() if value is not DROPPED}
    (folder / "config.json").write_text(json.dumps(hub))
    converter(folder, "f32", tmp_path / "oracle-f32.gguf", pre=pre)
    llama_cpp_client("quantize", tmp_path / "oracle-f32.gguf", tmp_path / "llama-quantize.gguf", "q4_k_m")
    assert_same_file(tmp_path / "q4_k_m.gguf", tmp_path / "llama-quantize.gguf")
    types = {t[0]: t[1] for t in contents(tmp_path / "q4_k_m.gguf")[1]}
    assert types["blk.0.indexer.proj.weight"] not in ("F32", "F16")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"moe_topk": [2, 1]}, "moe_topk differs between layers ([2, 1]), and llama.cpp's hunyuan-moe takes one"),
        ({"moe_intermediate_size": [32, 32]}, "moe_intermediate_size 32 is not intermediate_size 48"),
        (
            {"rope_parameters": {"rope_type": "dynamic", "alpha": 500.0, "factor": 1.0, "rope_theta": 10000.0}},
            "a dynamic (NTK alpha) rope of alpha 500.0 over rope_theta 10000.0, heads 16 wide",
        ),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, "rope type 'yarn', which llama.cpp's hunyuan-moe"),
    ],
)
def test_what_llama_cpp_s_hunyuan_moe_computes_otherwise_is_one_line(change, message, tmp_path):
    """A Hunyuan MoE whose experts or rope llama.cpp's hunyuan-moe would compute otherwise than transformers (or the
    converter stops on): refused while planning, in one line naming the file, nothing written."""
    assert_refused_in_one_line("hunyuanmoe-fsdp2", lambda config: config.update(change), message, tmp_path)


def test_hunyuan_moe_s_vocabulary_is_tokenizer_json_s_where_the_converter_runs_tencent_s_code(converter, tmp_path):
    """The converter reads Hunyuan-A13B's vocabulary through Tencent's tokenizer code alone (a tiktoken file's ranks),
    so a folder transformers saved, with tokenizer.json, stops it; unshard writes tokenizer.json's (the file otherwise
    the converter's: test_dense_families_...), says so, and keeps the tokenizer's own start token."""
    src = SHIPPED / "hunyuanmoe-fsdp2" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    with pytest.raises(AssertionError, match="mergeable_ranks"):
        converter(tmp_path / "hf", "f32", tmp_path / "oracle.gguf", pre=for_the_converter(tmp_path / "hf"))
    plan = unshard.plan(src, output=unshard.OutputOptions(gguf="f32"))
    assert any("reads Hunyuan-A13B's only through Tencent's tokenizer code" in note for note in plan.notes)
    unshard.convert(src, tmp_path / "m.gguf", output=unshard.OutputOptions(gguf="f32"), progress=False)
    fields, _ = contents(tmp_path / "m.gguf")
    tokenizer = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert fields["tokenizer.ggml.tokens"][fields["tokenizer.ggml.bos_token_id"]] == tokenizer["bos_token"]
