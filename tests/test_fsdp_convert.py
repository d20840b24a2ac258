"""Every FSDP / DCP / DeepSpeed fixture converts to a folder equal to what save_pretrained wrote before sharding."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SHIPPED
from generate import CASES
from safetensors import safe_open
from safetensors.torch import load_file

import unshard

transformers = pytest.importorskip("transformers")
# Cases whose oracle is a `reference/` folder written by save_pretrained (Megatron's is its own forward
# pass, torchtitan's its own adapter: tests/test_megatron.py, tests/test_torchtitan.py).
REFERENCE_CASES = [name for name, case in CASES.items() if not case.oracle and case.venv is None and case.hf]
# (their output the tokens' embeddings: no logits)
ENCODERS = (
    "bert-fsdp2",
    "roberta-fsdp2",
    "xlmroberta-fsdp2",
    "camembert-fsdp2",
    "distilbert-fsdp2",
    "modernbert-fsdp2",
    "eurobert-fsdp2",
    "nomicbert-fsdp2",
)
GEMMA4_DRAFTERS = ("gemma4assistant-fsdp2", "gemma4unifiedassistant-fsdp2")
# (no chat and no generation settings, no template: a WordPiece or SentencePiece model's folder)
WITHOUT_CHAT = ("bert-fsdp2", "distilbert-fsdp2", "nomicbert-fsdp2", "xlmroberta-fsdp2", "camembert-fsdp2", "t5-fsdp2")


def load_folder_tensors(folder):
    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def as_the_hub_names(tensors: dict, folder) -> dict:
    """save_pretrained's tensors by the names the family's folder holds: the Hub's, where transformers writes others
    (Family.hub_renames: Kimi Linear's dense layer)."""
    import re

    from unshard import families

    family = families.by_model_type(json.loads((folder / "config.json").read_text()).get("model_type"))
    for pattern, replacement in getattr(family, "hub_renames", ()):
        tensors = {re.sub(pattern, replacement, name): tensor for name, tensor in tensors.items()}
    return tensors


def drafter_inputs(model, length: int) -> dict:
    """What a Gemma 4 drafter reads from the model it drafts for at each step, at random: the last hidden state beside
    the last token's embedding (twice the target's width), and the keys and values of the target's last layer of each
    kind over the tokens so far (as many heads as the drafter's layers of that kind group their queries into)."""
    seed, shapes, dtype = torch.Generator().manual_seed(0), {}, model.pre_projection.weight.dtype
    for layer in model.model.layers:
        attention = layer.self_attn
        heads = attention.q_proj.out_features // attention.head_dim // attention.num_key_value_groups
        shapes[attention.layer_type] = (1, heads, length, attention.head_dim)
    shared = {kind: tuple(torch.randn(shape, generator=seed).to(dtype) for _ in "kv") for kind, shape in shapes.items()}
    embeds = torch.randn(1, 1, 2 * model.config.backbone_hidden_size, generator=seed).to(dtype)  # (one draft step)
    return {"inputs_embeds": embeds, "shared_kv_states": shared}


def convert_case(name, fixture, out, **options):
    case = CASES[name]
    config_from = fixture / case.config_from if case.config_from else None
    return unshard.convert(fixture / case.src, out, config_from=config_from, progress=False, **options)


def model_files_folder(name, fixture):
    """Where the fixture keeps config and tokenizer: --config-from, verl's huggingface/, SRC or above."""
    case = CASES[name]
    if case.config_from:
        return fixture / case.config_from
    src = fixture / case.src
    # verl actor or critic, HF Trainer, DeepSpeed universal
    for folder in (src / "actor" / "huggingface", src / "critic" / "huggingface", src, src.parent):
        if (folder / "config.json").is_file():
            return folder
    raise AssertionError(f"no config.json for {name}")


@pytest.mark.parametrize("case", REFERENCE_CASES)
def test_output_equals_save_pretrained(case, fixture_case, tmp_path):
    fixture = fixture_case(case)
    out = tmp_path / "out"
    result = convert_case(case, fixture, out)

    reference = as_the_hub_names(load_folder_tensors(fixture / "reference"), fixture / "reference")
    written = load_folder_tensors(out)
    assert sorted(written) == sorted(reference)
    for name, expected in reference.items():
        assert written[name].dtype == expected.dtype, name
        assert torch.equal(written[name], expected), name
    assert result.tensors == len(reference)
    assert result.bytes == sum(t.numel() * t.element_size() for t in reference.values())

    config = json.loads((out / "config.json").read_text())
    reference_config = json.loads((fixture / "reference" / "config.json").read_text())
    assert config["dtype"] == reference_config["dtype"]
    if "critic" in case:  # verl saved the causal LM's config; the weights carry a score head
        assert config["architectures"] == reference_config["architectures"] == ["Qwen2ForTokenClassification"]
        assert config["id2label"] == reference_config["id2label"]
    source = model_files_folder(case, fixture)
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source / name).exists() or name == "tokenizer.json":  # (BERT's folder: no generation, no chat)
            assert (out / name).read_bytes() == (source / name).read_bytes()
        else:
            assert not (out / name).exists()


@pytest.mark.parametrize("case", REFERENCE_CASES)
def test_transformers_loads_it_and_logits_match(case, tmp_path):
    from transformers import AutoTokenizer, GenerationConfig

    src = SHIPPED / case
    out = tmp_path / "out"
    convert_case(case, src, out)

    # The class config.json names: a causal LM, or (verl critic) a token-classification model.
    model_class = getattr(transformers, json.loads((src / "reference" / "config.json").read_text())["architectures"][0])
    omni = case in ("qwen25omni-fsdp2", "qwen3omni-fsdp2")
    if case == "qwen25omni-fsdp2":  # (transformers 5.24's Qwen2.5-Omni loads its voices into the tuple loading info
        # makes: loaded without it, a missing tensor shows in the logits)
        model = model_class.from_pretrained(out)
    else:
        model, info = model_class.from_pretrained(out, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    original = model_class.from_pretrained(src / "reference")
    ids = torch.tensor([[1, 5, 17, 42, 99, 3, 7, 2]])
    if case == "llama4-fsdp2":  # (transformers 5.24's Llama 4 runs no text without an image: its causal LM within does)
        model, original = model.language_model, original.language_model
    if omni:  # (the thinker writes the text; the model around it only generates)
        model, original = model.thinker, original.thinker
    with torch.no_grad():
        if case in ENCODERS:  # (an encoder: its output the tokens' embeddings)
            ours, theirs = model(ids).last_hidden_state, original(ids).last_hidden_state
        elif case == "t5-fsdp2":  # (an encoder-decoder: the decoder's logits over the encoded prompt)
            ours, theirs = (m(ids, decoder_input_ids=ids[:, :3]).logits for m in (model, original))
        elif case == "museglimmerassistant-fsdp2":  # (a drafter without embedding or head: its hidden states over a
            # made-up block of embeddings and target's hidden states)
            seed, config = torch.Generator().manual_seed(0), model.config
            noise = torch.randn(1, config.block_size, config.hidden_size, generator=seed).to(model.dtype)
            context = torch.randn(1, 6, len(config.target_layer_ids) * config.hidden_size, generator=seed)
            # (no masks: every query sees the context and the block, as the drafter's own masks let it but for the
            # window, which they would build from a cache of the target's)
            masks = dict.fromkeys(("full_attention", "sliding_attention"))
            inputs = {"context_hidden_states": context.to(model.dtype), "attention_mask": masks}
            ours, theirs = (m(noise, **inputs).last_hidden_state for m in (model, original))
        elif case in GEMMA4_DRAFTERS:  # (a drafter: its logits and the state it hands back, over made-up hidden states
            # and keys and values of a target)
            inputs = drafter_inputs(model, len(ids[0]))
            ours, theirs = (
                torch.cat([o.logits.flatten(), o.last_hidden_state.flatten()])
                for o in (model(**inputs), original(**inputs))
            )
        else:
            ours, theirs = model(ids).logits, original(ids).logits
    if case == "dbrx-fsdp2":  # (DBRX's experts run as views of the loaded tensors, whose alignment in memory follows
        # each file's offsets: the same bytes at other offsets change its sums in the last bit, 6e-8 here)
        assert (ours - theirs).abs().max() <= 1e-6
    else:
        assert torch.equal(ours, theirs)

    if case in WITHOUT_CHAT:
        return
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|assistant|>")
    generation = GenerationConfig.from_pretrained(out)
    assert generation.eos_token_id == [2, 0] and generation.temperature == 0.7


def test_tied_embeddings_written_once(tmp_path):
    out = tmp_path / "out"
    unshard.convert(SHIPPED / "qwen2-fsdp2" / "global_step_1", out, progress=False)
    with safe_open(out / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    assert "model.layers.0.self_attn.q_proj.bias" in names


def test_moe_experts_use_save_pretrained_names(tmp_path):
    out = tmp_path / "out"
    unshard.convert(SHIPPED / "mixtral-fsdp2" / "global_step_1", out, progress=False)
    with safe_open(out / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
    assert "model.layers.1.block_sparse_moe.experts.2.w3.weight" in names
    assert not any("gate_up_proj" in n for n in names)


def test_sharded_output_and_index(tmp_path):
    out = tmp_path / "out"
    result = unshard.convert(
        SHIPPED / "llama-fsdp2" / "global_step_1", out, max_shard_size="60KB", progress=False, verify=True
    )
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert (
        index["metadata"]["total_size"]
        == result.bytes
        == sum(t.numel() * t.element_size() for t in load_folder_tensors(out).values())
    )
    assert set(index["weight_map"].values()) == set(files)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dtype_cast_matches_torch_cast(dtype, tmp_path):
    src = SHIPPED / "llama-fsdp2"
    out = tmp_path / "out"
    unshard.convert(src / "global_step_1", out, dtype=dtype, progress=False)
    want = getattr(torch, dtype)
    written = load_folder_tensors(out)
    for name, tensor in load_folder_tensors(src / "reference").items():
        assert torch.equal(written[name], tensor.to(want)), name
    assert json.loads((out / "config.json").read_text())["dtype"] == dtype


@pytest.mark.parametrize("case", ["dots1-fsdp2", "ernie45moe-fsdp2-spm"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_routers_stay_float32_in_a_16_bit_folder_as_save_pretrained_writes_them(case, dtype, fixture_case, tmp_path):
    """transformers loads these MoE routers in float32 whatever the dtype (`_keep_in_fp32_modules_strict`), and
    save_pretrained writes them so: the folder in bf16 or fp16 is byte for byte the one transformers saves."""
    fixture = fixture_case(case)
    convert_case(case, fixture, tmp_path / "out", dtype=dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(fixture / "reference", dtype=getattr(torch, dtype))
    model.save_pretrained(tmp_path / "saved")
    written, saved = load_folder_tensors(tmp_path / "out"), load_folder_tensors(tmp_path / "saved")
    assert sorted(written) == sorted(saved)
    assert any(t.dtype == torch.float32 for t in saved.values())  # (the case has such routers)
    for name, expected in saved.items():
        assert written[name].dtype == expected.dtype, name
        assert torch.equal(written[name], expected), name


def test_open_checkpoint_reads_one_tensor(tmp_path):
    ckpt = unshard.open_checkpoint(SHIPPED / "llama-fsdp2-tp" / "global_step_1")
    assert ckpt.facts["world_size"] == 4
    gate = ckpt.tensors["model.layers.0.mlp.gate_proj.weight"]
    assert gate.shape == (90, 64) and gate.dtype.torch == torch.float32
    reference = load_file(SHIPPED / "llama-fsdp2-tp" / "reference" / "model.safetensors")
    assert torch.equal(ckpt.read(gate.name), reference[gate.name])


def test_shard_that_does_not_fit_its_placement_is_reported():
    from unshard.errors import CheckpointError
    from unshard.sources import safe_torch_load
    from unshard.sources.fsdp_rank_files import _pieces

    path = SHIPPED / "llama-fsdp2" / "global_step_1" / "actor" / "model_world_size_4_rank_1.pt"
    state = safe_torch_load.load(path)
    value = state["model.embed_tokens.weight"]
    _pieces(path, "model.embed_tokens.weight", value)  # the real shard fits
    value._local_tensor = value._local_tensor[:-1]  # as if the file held a row too few
    with pytest.raises(
        CheckpointError, match=r"rank_1.pt: model.embed_tokens.weight holds a shard of shape \(25, 64\)"
    ):
        _pieces(path, "model.embed_tokens.weight", value)


def test_pages_dropped_after_reading_read_back_unchanged():
    """Reading unmaps the rank files' pages it copied (so RSS does not grow with the model); the
    data must come back intact when touched again."""
    ckpt = unshard.open_checkpoint(SHIPPED / "llama-fsdp2" / "global_step_1")
    name = "model.embed_tokens.weight"
    before = torch.cat([ckpt.local_tensor(p).flatten() for p in ckpt.tensors[name].pieces])
    ckpt.read(name)
    after = torch.cat([ckpt.local_tensor(p).flatten() for p in ckpt.tensors[name].pieces])
    assert torch.equal(before, after)
    assert torch.equal(ckpt.read(name), before.reshape(-1)[: before.numel()].view(103, 64))


def test_dcp_skips_optimizer_and_reports_it():
    info = unshard.inspect(SHIPPED / "llama-fsdp1-dcp" / "dcp", config_from=SHIPPED / "llama-fsdp1-dcp" / "hf")
    assert info["layout"] == "torch-dcp" and info["tensors"] == 21
    assert info["skipped"]["optimizer entries"] > 0 and info["base_model"] == "tiny/base-model"


def test_accelerate_save_state_folder_and_whole_file(tmp_path):
    fixture = SHIPPED / "accelerate-fsdp2-full"
    whole = fixture / "state" / "pytorch_model_fsdp.bin"
    assert unshard.open_checkpoint(fixture / "state").path == whole
    # llama-recipes' FULL_STATE_DICT is the same kind of file under another name: SRC may be a file.
    renamed = tmp_path / "llama-recipes-0.pt"
    renamed.write_bytes(whole.read_bytes())
    unshard.convert(renamed, tmp_path / "out", config_from=fixture / "hf", progress=False)
    reference = load_folder_tensors(fixture / "reference")
    written = load_folder_tensors(tmp_path / "out")
    assert all(torch.equal(written[n], t) for n, t in reference.items()) and len(written) == len(reference)
    assert unshard.open_checkpoint(SHIPPED / "accelerate-fsdp2-dcp" / "state").layout == "torch-dcp"


def test_wrapper_prefixes_are_removed(tmp_path):
    """torch.compile saves every name under `_orig_mod.`; DDP under `module.`."""
    from transformers import AutoModelForCausalLM

    reference = SHIPPED / "llama-fsdp2" / "reference"
    model = AutoModelForCausalLM.from_pretrained(reference)
    compiled = torch.compile(model)
    state = compiled.state_dict()
    assert all(name.startswith("_orig_mod.") for name in state)
    torch.save(state, tmp_path / "compiled.pt")
    unshard.convert(tmp_path / "compiled.pt", tmp_path / "out", config_from=reference, progress=False)
    written = load_folder_tensors(tmp_path / "out")
    assert sorted(written) == sorted(load_folder_tensors(reference))


def test_row_shards_are_streamed_without_assembling():
    """FSDP's Shard(0) rows and ZeRO's flat ranges are written piece by piece; pieces that interleave
    (tensor-parallel column shards, strided shards) are assembled first. Both give the same bytes."""
    rows = unshard.open_checkpoint(SHIPPED / "llama-fsdp2" / "global_step_1")
    name = "model.layers.0.mlp.down_proj.weight"
    pieces = rows.flat_pieces(name)
    assert pieces is not None and len(pieces) > 1
    assert torch.equal(torch.cat([rows.read_piece(p) for p in pieces]), rows.read(name).reshape(-1))

    zero = unshard.open_checkpoint(SHIPPED / "deepspeed-zero3" / "checkpoint-1")
    name = "model.layers.0.self_attn.q_proj.weight"
    pieces = zero.flat_pieces(name)
    assert pieces is not None and all(len(p.block.sizes) == 1 for p in pieces)
    assert torch.equal(torch.cat([zero.read_piece(p) for p in pieces]), zero.read(name).reshape(-1))

    tp = unshard.open_checkpoint(SHIPPED / "llama-fsdp2-tp" / "global_step_1")
    assert tp.flat_pieces("model.layers.0.mlp.down_proj.weight") is None  # row-parallel: split along columns
