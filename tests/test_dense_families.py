"""The families' tensor tables give transformers' own answer (the tensors a config's model holds, which are
tied, what save_pretrained writes) for every family it covers, and hands every config it does not
cover, or a checkpoint that does not fit it, back to transformers. A model of these families is then
converted the first time without importing torch or transformers."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import SHIPPED, convert_in_subprocess

import unshard
from unshard import families
from unshard.names import dense_tables, hf_names, known, model_facts
from unshard.sinks import hf_folder

# Configs as transformers' config classes save them: sizes that make every product distinct, each
# flag both ways, tied and untied heads, a head_dim other than hidden_size / heads.
SIZES = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
)
SAVED_CONFIGS = [
    ("llama", {}),
    ("llama", dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
    ("llama", dict(head_dim=20, attention_bias=True)),
    ("mistral", dict(head_dim=20)),
    ("mistral", dict(tie_word_embeddings=True, sliding_window=None)),
    ("qwen2", dict(tie_word_embeddings=True, use_sliding_window=True)),
    ("qwen2", {}),
    ("qwen3", dict(head_dim=20)),
    ("qwen3", dict(head_dim=16, attention_bias=True, tie_word_embeddings=True)),
    ("gemma", {}),
    ("gemma", dict(head_dim=20, attention_bias=True, tie_word_embeddings=False)),
    ("gemma2", dict(head_dim=16)),
    ("gemma2", dict(attention_bias=True, tie_word_embeddings=False)),
    ("gemma3_text", dict(head_dim=16)),
    ("gemma3_text", dict(attention_bias=True, tie_word_embeddings=False)),
    ("phi3", dict(pad_token_id=5, eos_token_id=6)),  # (its defaults, 32000, lie outside this vocabulary)
    ("phi3", dict(pad_token_id=None, eos_token_id=None, tie_word_embeddings=True, partial_rotary_factor=0.75)),
]
# Configs written by hand, leaving out what the config class fills in (defaults, nulls it derives).
REQUIRED = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4)
SPARSE_CONFIGS = [
    ("llama", {}),
    ("llama", dict(num_key_value_heads=None, head_dim=None)),
    ("mistral", {}),
    ("mistral", dict(head_dim=None)),
    ("qwen2", dict(num_attention_heads=2, num_key_value_heads=None)),
    ("qwen3", dict(hidden_size=256, num_attention_heads=2)),
    ("gemma", {}),
    ("gemma2", dict(num_key_value_heads=2)),
    ("gemma3_text", dict(head_dim=8)),
    ("phi3", dict(num_key_value_heads=None, vocab_size=32064)),  # (Phi3Config's pad_token_id is 32000)
]


def table_tensors(config):
    """What the config's family's table says the model holds, or None (transformers is asked)."""
    table = families.tensor_table(config.get("model_type"))
    return None if table is None else dense_tables.tensors(table, config)


def transformers_facts(folder):
    """What the long way round says: the config's model built on the meta device, asked."""
    config = json.loads((folder / "config.json").read_text())
    return model_facts.ModelFacts.of(model_facts.meta_model(folder, config))


def save_config(model_type, fields, folder):
    import transformers

    config = transformers.AutoConfig.for_model(model_type, **SIZES, **fields)
    config.architectures = [families.by_model_type(model_type).architecture]
    config.save_pretrained(folder)
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize(
    "model_type, fields",
    SAVED_CONFIGS + [(m, {"sparse": f}) for m, f in SPARSE_CONFIGS],
    ids=lambda v: v if isinstance(v, str) else json.dumps(v, sort_keys=True),
)
def test_table_answers_as_transformers_does(tmp_path, model_type, fields):
    if "sparse" in fields:
        config = {"model_type": model_type, **REQUIRED, **fields["sparse"]}
        (tmp_path / "config.json").write_text(json.dumps(config))
    else:
        config = save_config(model_type, fields, tmp_path)
    in_memory, tied = table_tensors(config)
    facts = transformers_facts(tmp_path)
    assert in_memory == facts.in_memory  # names and shapes, all of them
    assert tied == facts.tied
    assert facts.saved == facts.in_memory  # (what lets the table name the output tensors as held)
    assert (
        dense_tables.linear(in_memory) == facts.linear.weights and not facts.linear.held_as
    )  # what --quantize targets, in the model's order


@pytest.mark.parametrize(
    "change",
    [
        {"quantization_config": {"quant_method": "fp8"}},  # a field the table does not know
        {"architectures": ["LlamaForSequenceClassification"]},
        {"model_type": "mixtral"},
        {"hidden_size": 50},  # not divisible by the heads: LlamaConfig refuses it
        {"num_hidden_layers": 2.0},
        {"attention_bias": "yes"},
        {"layer_types": ["full_attention"]},  # one per layer, or the config does not load
        {"vocab_size": None},
        {"model_type": "mistral", "num_key_value_heads": None},  # MistralConfig refuses a null here
        {"pad_token_id": 97},  # outside the vocabulary: torch refuses the embedding's padding index
    ],
)
def test_table_leaves_other_configs_to_transformers(tmp_path, change):
    config = save_config("llama", {}, tmp_path)
    assert table_tensors(config) is not None
    assert table_tensors({**config, **change}) is None


def test_table_knows_a_padding_index_the_config_class_fills_in():
    phi3 = {"model_type": "phi3", **REQUIRED}
    assert table_tensors(phi3) is None  # pad_token_id 32000 by default: no such row in 97
    assert table_tensors({**phi3, "pad_token_id": None}) is not None


def test_table_waits_for_a_transformers_release_it_was_not_checked_with(tmp_path, monkeypatch):
    config = save_config("qwen2", {}, tmp_path)
    monkeypatch.setattr(known, "transformers_version", lambda: "6.0.0")
    assert table_tensors(config) is None
    monkeypatch.setattr(known, "transformers_version", lambda: None)  # none installed: the table is all there is
    assert table_tensors(config) is not None


def test_checkpoint_that_does_not_fit_the_table_is_asked_about(tmp_path, monkeypatch):
    """A checkpoint whose tensors are not the ones the table lists (here: a config from another model
    size) goes to transformers, whose answer is the error."""
    src = tmp_path / "ckpt"
    shutil.copytree(SHIPPED / "qwen2-fsdp2" / "global_step_1", src)
    config_path = src / "actor" / "huggingface" / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "intermediate_size": 96}))
    asked = []
    monkeypatch.setattr(hf_names, "_answers", {})
    monkeypatch.setattr(
        hf_names,
        "_ask",
        lambda *args: asked.append(args) or model_facts.ModelFacts.of(model_facts.meta_model(*args[:2])),
    )
    monkeypatch.setenv("UNSHARD_CACHE", "off")
    with pytest.raises(unshard.ConfigMismatchError, match="with other shapes .*mlp"):
        unshard.plan(src)
    assert asked


@pytest.mark.parametrize("case", ["llama-fsdp2", "qwen2-fsdp2"])
def test_first_conversion_of_a_listed_family_imports_neither_torch_nor_transformers(tmp_path, case):
    """With an empty cache, the first conversion is planned from the table and its folder checked
    with the tokenizers library alone; the folder is the one transformers' answer gives."""
    src = SHIPPED / case / "global_step_1"
    assert convert_in_subprocess(src, tmp_path / "table", tmp_path / "cache") == (False, False)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["folders"]  # the folder check; no model asked
    assert convert_in_subprocess(src, tmp_path / "asked", "off", table=False) == (True, True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "asked").iterdir()} == {
        p.name: p.read_bytes() for p in (tmp_path / "table").iterdir()
    }


@pytest.mark.parametrize("damage", ["tokenizer.json", "tokenizer_class"])
def test_tokenizer_the_light_check_cannot_vouch_for_is_loaded_by_transformers(tmp_path, monkeypatch, damage):
    """A tokenizer.json that does not parse (copied with --no-check: otherwise an error), or a tokenizer class
    outside the known few, sends the output folder to transformers, which says whether it loads."""
    src = tmp_path / "ckpt"
    shutil.copytree(SHIPPED / "llama-fsdp2" / "global_step_1", src)
    hf = src / "actor" / "huggingface"
    if damage == "tokenizer.json":
        (hf / "tokenizer.json").write_text("{not json")
    else:
        tokenizer_config = json.loads((hf / "tokenizer_config.json").read_text())
        (hf / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "tokenizer_class": "BertTokenizer"}))
    monkeypatch.setenv("UNSHARD_CACHE", "off")
    assert not hf_folder.loads_without_transformers(hf)
    if damage == "tokenizer.json":
        with pytest.raises(unshard.ConfigMismatchError, match="tokenizer.json: not valid JSON"):
            unshard.convert(src, tmp_path / "out", progress=False)
    result = unshard.convert(src, tmp_path / "out", progress=False, check=damage != "tokenizer.json")
    if damage == "tokenizer.json":
        assert any("the tokenizer does not load here" in w for w in result.warnings)
        assert any("tokenizer.json: not valid JSON" in w for w in result.warnings)
    assert hf_folder.loads_without_transformers(SHIPPED / "llama-fsdp2" / "global_step_1" / "actor" / "huggingface")
