"""Merges of models whose vocabularies differ (`tokenizer_source: union | base | MODEL`, `tokenizer: {source,
tokens, pad_to_multiple_of}`) give mergekit 0.1.5's tokenizer and rows, and transformers runs the result.

The models: the conversion of a shipped FSDP2 Llama checkpoint (SentencePiece tokenizer) and two fine-tunes
whose tokenizers gained tokens (`add_tokens`, `resize_token_embeddings`, then perturbed), made by
transformers. mergekit orders the added tokens of a union by a set of models, which changes with Python's
hash seed from run to run; so rows are compared token by token (the token's row in each output).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import generate
import pytest
import torch
import yaml
from safetensors.torch import load_file
from test_cli_and_errors import run_cli
from test_moe import dense  # noqa: F401  (fixture)

transformers = pytest.importorskip("transformers")

ADDED = {"va": (["<think>", "</think>"], 1), "vb": (["<think>", "<tool>", "zebra"], 2)}


@pytest.fixture(scope="session")
def vocabularies(dense) -> Path:  # noqa: F811
    """dense/llama's base, and `va`, `vb`: fine-tunes with tokens added to their tokenizers and embeddings."""
    root = dense / "llama"
    for name, (tokens, seed) in ADDED.items():
        if (root / name).exists():
            continue
        tokenizer = transformers.AutoTokenizer.from_pretrained(root / "base")
        model = transformers.AutoModelForCausalLM.from_pretrained(root / "base", dtype=torch.float32)
        tokenizer.add_tokens(tokens)
        torch.manual_seed(seed)
        model.resize_token_embeddings(len(tokenizer))
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.02)
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def recipes(m: Path) -> dict[str, dict]:
    three = [
        {"model": str(m / "base"), "parameters": {"weight": 0.4, "density": 0.7}},
        {"model": str(m / "va"), "parameters": {"weight": 0.3, "density": 0.7}},
        {"model": str(m / "vb"), "parameters": {"weight": 0.3, "density": 0.7}},
    ]
    return {
        "union-linear": {
            "merge_method": "linear",
            "base_model": str(m / "base"),
            "models": three,
            "dtype": "float32",
            "tokenizer": {
                "source": "union",
                "pad_to_multiple_of": 8,
                "tokens": {
                    "<tool>": {"source": {"kind": "model_token", "model": str(m / "vb"), "token": "<tool>"}},
                    "</think>": {"source": {"kind": "zero"}, "force": True},
                },
            },
        },
        "base-ties": {
            "merge_method": "ties",
            "base_model": str(m / "base"),
            "models": three[1:],
            "dtype": "float32",
            "tokenizer_source": "base",
        },
        "model-task_arithmetic": {
            "merge_method": "task_arithmetic",
            "base_model": str(m / "base"),
            "models": three[1:],
            "dtype": "float32",
            "tokenizer_source": str(m / "vb"),
        },
    }


@pytest.mark.parametrize("name", list(recipes(Path("."))))
def test_vocabularies_merge_as_mergekit(name, vocabularies, tmp_path):
    recipe = tmp_path / "recipe.yml"
    recipe.write_text(yaml.safe_dump(recipes(vocabularies)[name], sort_keys=False))
    tool = generate.peer_python("mergekit").parent / "mergekit-yaml"
    done = subprocess.run(
        [str(tool), str(recipe), str(tmp_path / "mergekit")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    code, out, err = run_cli("merge", recipe, tmp_path / "ours", "--no-progress")
    assert code == 0, err

    ours, theirs = (load_file(tmp_path / f / "model.safetensors") for f in ("ours", "mergekit"))
    vocab, their_vocab = (
        transformers.AutoTokenizer.from_pretrained(tmp_path / f).get_vocab() for f in ("ours", "mergekit")
    )
    assert set(vocab) == set(their_vocab)
    assert sorted(ours) == sorted(theirs)
    for tensor in ours:
        if tensor in ("model.embed_tokens.weight", "lm_head.weight"):
            assert ours[tensor].shape == theirs[tensor].shape
            assert all(torch.equal(ours[tensor][at], theirs[tensor][their_vocab[token]]) for token, at in vocab.items())
            padding = slice(len(vocab), None)  # (the mean of the rows, summed in either order)
            assert torch.allclose(ours[tensor][padding], theirs[tensor][padding], atol=1e-6)
        else:
            assert torch.equal(ours[tensor], theirs[tensor]), tensor
    config, expected = (json.loads((tmp_path / f / "config.json").read_text()) for f in ("ours", "mergekit"))
    assert config["vocab_size"] == expected["vocab_size"] == ours["lm_head.weight"].shape[0]
    assert not (
        tmp_path / "ours" / "tokenizer.model"
    ).exists()  # (the base's SentencePiece file: not this vocabulary's)

    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", dtype=torch.float32)
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "mergekit", dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "ours")
    text = "hello <think> zebra <tool> x </think>" if name.startswith("union") else "hello x"
    ids = tokenizer(text, return_tensors="pt").input_ids
    their_ids = torch.tensor([[their_vocab[tokenizer.convert_ids_to_tokens(int(i))] for i in ids[0]]])
    with torch.no_grad():
        logits, their_logits = model(ids).logits, reference(their_ids).logits
    order = torch.tensor([their_vocab[token] for token, _ in sorted(vocab.items(), key=lambda item: item[1])])
    assert float((logits[..., : len(vocab)] - their_logits[..., order]).abs().max()) < 1e-5
    if name.startswith("union"):  # every token a fine-tune added is one token of the union
        for token in {t for tokens, _ in ADDED.values() for t in tokens}:
            assert tokenizer(token, add_special_tokens=False).input_ids == [vocab[token]]


def test_vocabulary_recipe_errors(vocabularies, tmp_path):
    base = recipes(vocabularies)["union-linear"]

    def bad(change, expected: str):
        recipe = json.loads(json.dumps(base))
        change(recipe)
        path = tmp_path / "bad.yml"
        path.write_text(yaml.safe_dump(recipe))
        code, out, err = run_cli("merge", path, tmp_path / "out")
        assert code == 1 and expected in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "out").exists()

    bad(lambda r: r.update(tokenizer_source="union"), "give tokenizer_source or tokenizer, not both")
    bad(lambda r: r["tokenizer"].update(pad_to_multiple_of=0), "pad_to_multiple_of must be a whole number")
    bad(lambda r: r["tokenizer"]["tokens"].update({"<x>": {"source": {"kind": "nearest"}}}), "tokenizer.tokens['<x>']")
    bad(
        lambda r: r["tokenizer"]["tokens"].update({"<x>": {"source": "elsewhere/model"}}),
        "which the recipe does not merge",
    )
    bad(lambda r: r["tokenizer"].update(source="other/model"), "tokenizer source 'other/model' is none of")
    # Without a vocabulary setting, different vocabularies are refused, naming the setting.
    bad(lambda r: r.pop("tokenizer"), "set tokenizer_source: union, or base")
