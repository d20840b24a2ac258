"""GGUF of the models people embed with: sentence-transformers folders whose Dense modules project the model's output
(EmbeddingGemma's after pooling, LFM2 ColBERT's per token), written by sentence-transformers itself around a model
transformers saved from a fixture's; and the classes of a family without its head (BloomModel, Qwen2VLModel). Each file
is the converter's; llama.cpp embeds as sentence-transformers does."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SHIPPED
from test_cli_and_errors import run_cli
from test_gguf import (  # noqa: F401  (converter and ggml_library: the fixtures, used by name)
    LLAMA_CPP_TOLERANCE,
    assert_same_file,
    contents,
    converter,
    for_the_converter,
    ggml_library,
    llama_cpp_client,
)
from test_gguf_mmproj import assert_same_tensors

import unshard
from unshard.sinks.gguf import kquants

# (the converter writes EmbeddingGemma's Dense modules only when asked)
DENSE_FLAG = ("--sentence-transformers-dense-modules",)


def layers_alone(case: str, model_class: str, tmp_path: Path, **config) -> Path:
    """The fixture's model as transformers saves it as `model_class` (the family's layers without its head), with the
    tokenizer's files of unshard's folder, its config changed by `config`."""
    import transformers

    unshard.convert(SHIPPED / case / "global_step_1", tmp_path / "hf", progress=False)
    model_config = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    for key, value in {**config, "architectures": [model_class]}.items():
        setattr(model_config, key, value)
    folder = tmp_path / model_class
    model = getattr(transformers, model_class).from_pretrained(
        tmp_path / "hf", config=model_config, dtype=torch.float32
    )
    model.save_pretrained(folder)
    for path in (tmp_path / "hf").iterdir():
        if path.name not in ("config.json", "model.safetensors", "README.md"):
            shutil.copy(path, folder / path.name)
    return folder


def sentence_transformer(layers: Path, folder: Path, *after):
    """sentence-transformers' model of the layers and the modules after them, saved by it in `folder` (with the
    layers' SentencePiece model, which a release's folder holds and sentence-transformers does not save)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Transformer

    torch.manual_seed(0)
    model = SentenceTransformer(
        modules=[Transformer(str(layers), model_kwargs={"dtype": torch.float32}), *after], device="cpu"
    )
    model.save(str(folder))
    if (layers / "tokenizer.model").is_file():
        shutil.copy(layers / "tokenizer.model", folder)
    return model


def projection(width: int, features: int, per_token: bool = False, **options):
    """sentence-transformers' Dense module as EmbeddingGemma's and LFM2 ColBERT's are: no bias, no activation (over
    each token's embedding where per_token, as ColBERT's)."""
    from sentence_transformers.sentence_transformer.modules import Dense

    names = {"module_input_name": "token_embeddings", "module_output_name": "token_embeddings"} if per_token else {}
    return Dense(width, features, **{"bias": False, "activation_function": torch.nn.Identity(), **names, **options})


def embedding_gemma(tmp_path: Path, *dense):
    """EmbeddingGemma's layout from the Gemma 3 fixture's: its layers attending both ways, mean pooling, the Dense
    modules given (each a function of the model's width), normalized; (its folder, the model)."""
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    layers = layers_alone("gemma3-fsdp2-spm", "Gemma3TextModel", tmp_path, use_bidirectional_attention=True)
    width = json.loads((layers / "config.json").read_text())["hidden_size"]
    folder = tmp_path / "embeddinggemma"
    model = sentence_transformer(
        layers, folder, Pooling(width, "mean"), *(module(width) for module in dense), Normalize()
    )
    return folder, model


def test_embedding_gemma_s_projections_after_pooling_as_the_converter_writes_them(
    converter, ggml_library, monkeypatch, tmp_path
):
    """EmbeddingGemma with its two Dense modules (2_Dense to four times the width, 3_Dense back): in f32, f16, q8_0
    and each K-quant mix, the converter's file with --sentence-transformers-dense-modules (then llama-quantize's), the
    projections first and their widths in the header; llama.cpp's pooled embedding is sentence-transformers' (and
    without the projections, another)."""
    folder, model = embedding_gemma(tmp_path, lambda w: projection(w, 4 * w), lambda w: projection(4 * w, w))
    for kind in ("f32", "f16", "q8_0"):
        ours = tmp_path / f"{kind}.gguf"
        unshard.convert(folder, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        assert_same_file(ours, converter(folder, kind, tmp_path / f"oracle-{kind}.gguf", more=DENSE_FLAG))
    fields, tensors = contents(tmp_path / "f32.gguf")
    width = fields["gemma-embedding.embedding_length"]
    assert [t[0] for t in tensors[:2]] == ["dense_2.weight", "dense_3.weight"]
    assert (fields["gemma-embedding.dense_2_feat_out"], fields["gemma-embedding.dense_3_feat_in"]) == (4 * width,) * 2
    (tmp_path / "llama-quantize").mkdir()
    llama_cpp_client("quantize", tmp_path / "oracle-f32.gguf", tmp_path / "llama-quantize", "q4_k_m,q6_k")
    monkeypatch.setenv(kquants.LIBRARY_VARIABLE, ggml_library)
    for kind in ("q4_k_m", "q6_k"):
        unshard.convert(folder, tmp_path / f"{kind}.gguf", output=unshard.OutputOptions(gguf=kind), progress=False)
        assert_same_file(tmp_path / f"{kind}.gguf", tmp_path / "llama-quantize" / f"{kind}.gguf")
    window = json.loads((folder / "config.json").read_text())["sliding_window"]
    prompt = [2] + [(7 * i) % 90 + 5 for i in range(window // 2 + 14)]  # (past the window either side)
    llama_cpp_client("pool", tmp_path / "f32.gguf", ",".join(map(str, prompt)), tmp_path / "pooled.npy")
    got = torch.from_numpy(np.load(tmp_path / "pooled.npy"))
    from sentence_transformers import SentenceTransformer

    ids = torch.tensor([prompt])
    features = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    expected = model(dict(features))["sentence_embedding"][0].detach()
    assert (got / got.norm() - expected).norm().item() <= LLAMA_CPP_TOLERANCE["f32"]  # (measured 1.2e-4)
    unprojected = SentenceTransformer(modules=[model[0], model[1], model[4]], device="cpu")(dict(features))
    assert (unprojected["sentence_embedding"][0].detach() - expected).norm().item() > 0.1


def test_lfm2_s_layers_alone_with_a_projection_per_token_as_the_converter_writes_them(converter, tmp_path):
    """LFM2's layers alone (`Lfm2Model`: LFM2.5's ColBERT and embedding models) with a Dense module over each token
    (1_Dense, as ColBERT's): the converter's file in f32 and q8_0, the projection first as dense_2 and its width first
    in the header; llama.cpp embeds each token as sentence-transformers does."""
    layers = layers_alone("lfm2-fsdp2", "Lfm2Model", tmp_path)
    folder = tmp_path / "colbert"
    model = sentence_transformer(layers, folder, projection(64, 32, per_token=True))
    pre = for_the_converter(folder)
    for kind in ("f32", "q8_0"):
        ours = tmp_path / f"{kind}.gguf"
        unshard.convert(folder, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        assert_same_file(ours, converter(folder, kind, tmp_path / f"oracle-{kind}.gguf", pre=pre))
    fields, tensors = contents(tmp_path / "f32.gguf")
    assert (
        list(fields)[:2] == ["general.architecture", "lfm2.embedding_length_out"] and tensors[0][0] == "dense_2.weight"
    )
    prompt = [1, 5, 20, 33, 41, 50, 60, 2]
    llama_cpp_client("embed", tmp_path / "f32.gguf", ",".join(map(str, prompt)), tmp_path / "tokens.npy")
    got = torch.from_numpy(np.load(tmp_path / "tokens.npy"))
    ids = torch.tensor([prompt])
    expected = model({"input_ids": ids, "attention_mask": torch.ones_like(ids)})["token_embeddings"][0].detach()
    assert got.shape == expected.shape == (len(prompt), 32)
    assert ((got - expected).norm() / expected.norm()).item() <= LLAMA_CPP_TOLERANCE["f32"]  # (measured 2.6e-4)


def test_lfm2_s_layers_attending_both_ways_as_the_converter_writes_them(converter, tmp_path):
    """LFM2.5's embedding models' layout (`Lfm2BidirectionalModel`, Liquid's class: LFM2's layers alone, attending to
    every token), saved by transformers as Lfm2Model under the class its config names: the converter's file, the
    attention marked non-causal in the header (from which llama.cpp also centres the short convolutions' window, as
    Liquid's code does). No embeddings are compared: transformers has no class of Liquid's centred convolutions, and
    its Lfm2Model given a mask of every token computes another model (measured 1.8e-2 from llama.cpp's)."""
    folder = layers_alone("lfm2-fsdp2", "Lfm2Model", tmp_path)
    config = json.loads((folder / "config.json").read_text())  # (save_pretrained names the class it saves)
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["Lfm2BidirectionalModel"]}))
    pre = for_the_converter(folder)
    for kind in ("f32", "q8_0"):
        ours = tmp_path / f"{kind}.gguf"
        unshard.convert(folder, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        assert_same_file(ours, converter(folder, kind, tmp_path / f"oracle-{kind}.gguf", pre=pre))
    assert contents(tmp_path / "f32.gguf")[0]["lfm2.attention.causal"] is False


@pytest.mark.parametrize("case, model_class", [("bloom-fsdp2", "BloomModel"), ("qwen2vl-fsdp2", "Qwen2VLModel")])
def test_a_family_s_class_without_its_head_is_the_converter_s(case, model_class, converter, tmp_path):
    """BLOOM's and Qwen2-VL's classes without a head, as transformers saves them (no `transformer.` or `model.` before
    the names): the converter's file in f32 and q8_0, and Qwen2-VL's mmproj file the converter's too."""
    folder = layers_alone(case, model_class, tmp_path)
    pre = for_the_converter(folder)
    for kind in ("f32", "q8_0"):
        ours = tmp_path / f"{kind}.gguf"
        unshard.convert(folder, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        assert_same_file(ours, converter(folder, kind, tmp_path / f"oracle-{kind}.gguf", pre=pre))
    if model_class == "Qwen2VLModel":
        ours, theirs = (
            contents(tmp_path / "mmproj-f32.gguf"),
            contents(converter(folder, "f32", tmp_path / "m.gguf", mmproj=True)),
        )
        assert list(ours[0].items()) == list(theirs[0].items())
        assert_same_tensors(ours[1], theirs[1])


def test_dense_modules_llama_cpp_would_not_run_as_sentence_transformers_are_one_line(tmp_path):
    """A Dense module with a bias (which the converter drops) or an activation (which llama.cpp does not apply), a
    third Dense module, a projection not from the model's width: one line naming the file, nothing written."""
    from sentence_transformers.sentence_transformer.modules import Dense

    folder, _ = embedding_gemma(tmp_path, lambda w: projection(w, 2 * w), lambda w: projection(2 * w, w))
    dense = folder / "2_Dense"
    kept = tmp_path / "kept"
    shutil.copytree(dense, kept)

    def module(**options):
        shutil.rmtree(dense)
        dense.mkdir()
        Dense(64, 128, **{"bias": False, "activation_function": torch.nn.Identity(), **options}).save(str(dense))

    def third_module():
        modules = json.loads((folder / "modules.json").read_text())
        modules.insert(3, {"idx": 9, "name": "9", "path": "9_Dense", "type": modules[2]["type"]})
        (folder / "modules.json").write_text(json.dumps(modules))
        shutil.copytree(kept, folder / "9_Dense")

    for change, message in (
        (lambda: module(bias=True), "2_Dense/model.safetensors: has a bias, which llama.cpp's converter drops"),
        (lambda: module(activation_function=torch.nn.Tanh()), "2_Dense/config.json: activation_function torch.nn"),
        (
            lambda: (shutil.rmtree(dense), shutil.copytree(folder / "3_Dense", dense)),
            "its dense_2 projection takes 128",
        ),
        (third_module, "modules.json: Dense modules \\['2_Dense', '9_Dense', '3_Dense'\\], and llama.cpp's"),
    ):
        change()
        code, _, err = run_cli("convert", folder, tmp_path / "m.gguf", "--no-progress")
        assert code != 0 and len(err.strip().splitlines()) == 1, err
        assert re.search(message, err), err
        assert not (tmp_path / "m.gguf").exists()
        shutil.rmtree(dense)
        shutil.copytree(kept, dense)
