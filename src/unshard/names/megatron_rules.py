"""Megatron parameter names -> Hugging Face names: one table per architecture, and config.json from args.

Both Megatron readers first describe a checkpoint as whole Megatron tensors: global layer and expert
numbers, no tensor-parallel split, the gated MLP's fc1 as [gate; up]
(`decoder.layers.7.mlp.experts.5.linear_fc1.weight`). The tables below say which Hugging Face tensor
each becomes. The splits (fused QKV per query group, gate/up, the padded vocabulary) are boxes of
the Megatron tensor, composed with the boxes the readers found, so every Hugging Face tensor is still
read straight from the checkpoint's files, one at a time, with no Megatron import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import CheckpointError
from ..sources.base import Piece, SourceTensor
from ..sources.placements import Block, compose

PLAIN, QKV, GATE_UP, VOCAB = "plain", "qkv", "gate_up", "vocab"

# Tensor-parallel split of each Megatron parameter in the per-rank files, by its last two name parts:
# 0 for column- (and vocabulary-) parallel, 1 for row-parallel; every other parameter is replicated.
TP_DIM = {"linear_qkv.weight": 0, "linear_qkv.bias": 0, "linear_fc1.weight": 0, "linear_fc1.bias": 0,
          "word_embeddings.weight": 0, "output_layer.weight": 0, "linear_proj.weight": 1, "linear_fc2.weight": 1}


def tp_dim(name: str) -> int | None:
    return TP_DIM.get(".".join(name.split(".")[-2:]))


L = "model.layers.{i}."
COMMON = {
    "embedding.word_embeddings.weight": (VOCAB, "model.embed_tokens.weight"),
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": (VOCAB, "lm_head.weight"),
    # Transformer Engine fuses the layer norms into the next linear layer; the local spec keeps them apart.
    "decoder.layers.{i}.input_layernorm.weight": L + "input_layernorm.weight",
    "decoder.layers.{i}.self_attention.linear_qkv.layer_norm_weight": L + "input_layernorm.weight",
    "decoder.layers.{i}.self_attention.linear_qkv.weight": (QKV, *(L + f"self_attn.{p}_proj.weight" for p in "qkv")),
    "decoder.layers.{i}.self_attention.linear_qkv.bias": (QKV, *(L + f"self_attn.{p}_proj.bias" for p in "qkv")),
    "decoder.layers.{i}.self_attention.linear_proj.weight": L + "self_attn.o_proj.weight",
    "decoder.layers.{i}.self_attention.q_layernorm.weight": L + "self_attn.q_norm.weight",
    "decoder.layers.{i}.self_attention.k_layernorm.weight": L + "self_attn.k_norm.weight",
    "decoder.layers.{i}.pre_mlp_layernorm.weight": L + "post_attention_layernorm.weight",
    "decoder.layers.{i}.mlp.linear_fc1.layer_norm_weight": L + "post_attention_layernorm.weight",
}
DENSE_MLP = {
    "decoder.layers.{i}.mlp.linear_fc1.weight": (GATE_UP, L + "mlp.gate_proj.weight", L + "mlp.up_proj.weight"),
    "decoder.layers.{i}.mlp.linear_fc2.weight": L + "mlp.down_proj.weight",
}
QWEN_MOE = {
    "decoder.layers.{i}.mlp.router.weight": L + "mlp.gate.weight",
    "decoder.layers.{i}.mlp.experts.{e}.linear_fc1.weight":
        (GATE_UP, L + "mlp.experts.{e}.gate_proj.weight", L + "mlp.experts.{e}.up_proj.weight"),
    "decoder.layers.{i}.mlp.experts.{e}.linear_fc2.weight": L + "mlp.experts.{e}.down_proj.weight",
    "decoder.layers.{i}.mlp.shared_experts.linear_fc1.weight":
        (GATE_UP, L + "mlp.shared_expert.gate_proj.weight", L + "mlp.shared_expert.up_proj.weight"),
    "decoder.layers.{i}.mlp.shared_experts.linear_fc2.weight": L + "mlp.shared_expert.down_proj.weight",
    "decoder.layers.{i}.mlp.shared_experts.gate_weight": L + "mlp.shared_expert_gate.weight",
}
MIXTRAL_MOE = {
    "decoder.layers.{i}.mlp.router.weight": L + "block_sparse_moe.gate.weight",
    "decoder.layers.{i}.mlp.experts.{e}.linear_fc1.weight":
        (GATE_UP, L + "block_sparse_moe.experts.{e}.w1.weight", L + "block_sparse_moe.experts.{e}.w3.weight"),
    "decoder.layers.{i}.mlp.experts.{e}.linear_fc2.weight": L + "block_sparse_moe.experts.{e}.w2.weight",
}
# Hugging Face model_type -> its table. Mistral and Llama share names; so do the Qwen generations.
ARCHITECTURES = {
    "llama": {**COMMON, **DENSE_MLP},
    "mistral": {**COMMON, **DENSE_MLP},
    "qwen2": {**COMMON, **DENSE_MLP},
    "qwen3": {**COMMON, **DENSE_MLP},
    "mixtral": {**COMMON, **MIXTRAL_MOE},
    "qwen2_moe": {**COMMON, **QWEN_MOE},
    "qwen3_moe": {**COMMON, **QWEN_MOE},
}


@dataclass(frozen=True)
class Shapes:
    """The sizes the splits need, from Megatron's args."""

    heads: int
    groups: int
    head_dim: int
    vocab: int


def shapes_from_args(args: dict[str, Any], vocab: int) -> Shapes:
    heads = args["num_attention_heads"]
    groups = args.get("num_query_groups") if args.get("group_query_attention") else None
    head_dim = args.get("kv_channels") or args["hidden_size"] // heads
    return Shapes(heads, groups or heads, head_dim, vocab)


def shapes_from_config(config: dict[str, Any]) -> Shapes:
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return Shapes(heads, config.get("num_key_value_heads") or heads, head_dim, config["vocab_size"])


def _boxes(kind: str, names: tuple[str, ...], shape: tuple[int, ...], dims: Shapes, source: str):
    """(output name, output shape, block from the Megatron tensor into it) for each output."""
    rest = tuple(shape[1:])
    zeros = (0,) * len(rest)
    if kind == PLAIN:
        return [(names[0], shape, Block.whole(shape))]
    if kind == VOCAB:
        if dims.vocab > shape[0]:
            raise CheckpointError(f"{source} has {shape[0]} vocabulary rows, fewer than the vocab_size {dims.vocab} "
                                  "of the config; pass the config the model was trained with (--config-from)")
        out = (dims.vocab, *rest)
        return [(names[0], out, Block.whole(out))]
    if kind == GATE_UP:
        half = shape[0] // 2
        out = (half, *rest)
        return [(names[0], out, Block((0, *zeros), (0, *zeros), out)),
                (names[1], out, Block((half, *zeros), (0, *zeros), out))]
    # QKV: per query group, its query heads, then one key head, then one value head.
    per_group = dims.heads // dims.groups
    stride = (per_group + 2) * dims.head_dim
    if shape[0] != dims.groups * stride:
        raise CheckpointError(f"{source} has {shape[0]} rows, not the {dims.groups * stride} that {dims.heads} heads "
                              f"in {dims.groups} query groups of size {dims.head_dim} make; the args do not match")
    q_rows, kv_rows = per_group * dims.head_dim, dims.head_dim
    q, k, v = [], [], []
    for g in range(dims.groups):
        start = g * stride
        q.append(Block((start, *zeros), (g * q_rows, *zeros), (q_rows, *rest)))
        k.append(Block((start + q_rows, *zeros), (g * kv_rows, *zeros), (kv_rows, *rest)))
        v.append(Block((start + q_rows + kv_rows, *zeros), (g * kv_rows, *zeros), (kv_rows, *rest)))
    shapes = [(dims.heads * dims.head_dim, *rest), (dims.groups * kv_rows, *rest), (dims.groups * kv_rows, *rest)]
    return [(name, out, block) for name, out, blocks in zip(names, shapes, (q, k, v)) for block in blocks]


_NUMBERS = re.compile(r"(?<=\.layers\.)(\d+)|(?<=\.experts\.)(\d+)")


def template(name: str) -> tuple[str, dict[str, str]]:
    """`decoder.layers.7.mlp.experts.5.x` -> (`decoder.layers.{i}.mlp.experts.{e}.x`, {"i": "7", "e": "5"})."""
    found: dict[str, str] = {}

    def replace(match):
        key = "i" if match.group(1) is not None else "e"
        found[key] = match.group(0)
        return "{" + key + "}"

    return _NUMBERS.sub(replace, name), found


def to_hf(tensors: dict[str, SourceTensor], model_type: str, dims: Shapes, where: str) -> dict[str, SourceTensor]:
    """Hugging Face tensors, each with pieces straight from the checkpoint files."""
    table = ARCHITECTURES.get(model_type)
    if table is None:
        raise CheckpointError(f"{where}: no Megatron name table for model_type {model_type!r}; unshard knows "
                              f"{', '.join(sorted(ARCHITECTURES))}")
    unknown = []
    out: dict[str, SourceTensor] = {}
    for name, source in tensors.items():
        key, numbers = template(name)
        rule = table.get(key)
        if rule is None:
            unknown.append(name)
            continue
        kind, names = (PLAIN, (rule,)) if isinstance(rule, str) else (rule[0], rule[1:])
        for hf_template, shape, box in _boxes(kind, names, source.shape, dims, name):
            hf_name = hf_template.format(**numbers)
            target = out.setdefault(hf_name, SourceTensor(hf_name, shape, source.dtype, []))
            for piece in source.pieces:
                block = compose(piece.block, box)
                if block is not None:
                    target.pieces.append(Piece(piece.file, piece.key, block, piece.part))
    if unknown:
        raise CheckpointError(f"{where}: {len(unknown)} Megatron tensors have no {model_type} rule (e.g. {unknown[0]}); "
                              "this architecture or layer spec is not supported yet, please report it")
    return out


def model_type_from_args(args: dict[str, Any], where: str) -> str:
    """The Hugging Face model family the args describe; an error for what no table covers."""
    unsupported = [what for what, bad in (
        ("a normalization other than RMSNorm", args.get("normalization", "RMSNorm") != "RMSNorm"),
        ("a non-gated MLP (no --swiglu)", not args.get("swiglu")),
        ("biases on linear layers (--add-bias-linear)", args.get("add_bias_linear")),
        ("position embeddings other than rope", args.get("position_embedding_type", "rope") != "rope"),
        ("interleaved rotary embeddings", args.get("rotary_interleaved")),
        ("multi-latent attention", args.get("multi_latent_attention")),
        ("grouped-GEMM experts", args.get("moe_grouped_gemm")),
    ) if bad]
    if unsupported:
        raise CheckpointError(f"{where}: the args describe {unsupported[0]}, which no supported Hugging Face "
                              "architecture has; unshard converts Llama, Mistral, Qwen2/3 and Mixtral, Qwen2/3-MoE")
    bias, qk_norm = bool(args.get("add_qkv_bias")), bool(args.get("qk_layernorm"))
    if args.get("num_experts"):
        if args.get("moe_shared_expert_intermediate_size"):
            if bias and not qk_norm:
                return "qwen2_moe"
        elif qk_norm and not bias:
            return "qwen3_moe"
        elif not bias and not qk_norm:
            return "mixtral"
    elif qk_norm and not bias:
        return "qwen3"
    elif bias and not qk_norm:
        return "qwen2"
    elif not bias:
        return "llama"
    raise CheckpointError(f"{where}: no Hugging Face architecture has this combination (qkv bias {bias}, q/k norm "
                          f"{qk_norm}, experts {args.get('num_experts')}); pass --config-from DIR with its config")


def hf_config(args: dict[str, Any], model_type: str, vocab: int, dtype: str) -> dict[str, Any]:
    """config.json for `model_type`, from Megatron-LM's argument names."""
    heads = args["num_attention_heads"]
    config = {
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": args["hidden_size"],
        "intermediate_size": args["ffn_hidden_size"],
        "num_hidden_layers": args["num_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": shapes_from_args(args, vocab).groups,
        "head_dim": args.get("kv_channels") or args["hidden_size"] // heads,
        "max_position_embeddings": args.get("max_position_embeddings") or args.get("seq_length"),
        "rms_norm_eps": args.get("norm_epsilon", 1e-5),
        "rope_theta": args.get("rotary_base", 10000),
        "hidden_act": "silu",
        "tie_word_embeddings": not args.get("untie_embeddings_and_output_weights", False),
        "torch_dtype": dtype,
    }
    if args.get("num_experts"):
        moe = {
            "num_experts_per_tok": args.get("moe_router_topk", 2),
            # Megatron's default top-k then softmax equals softmax, top-k, renormalise.
            "norm_topk_prob": not args.get("moe_router_pre_softmax", False),
        }
        if model_type == "mixtral":
            moe.update(num_local_experts=args["num_experts"], intermediate_size=args.get("moe_ffn_hidden_size"))
        else:
            moe.update(num_experts=args["num_experts"], moe_intermediate_size=args.get("moe_ffn_hidden_size"),
                       decoder_sparse_step=1, mlp_only_layers=[])
        if args.get("moe_shared_expert_intermediate_size"):
            moe["shared_expert_intermediate_size"] = args["moe_shared_expert_intermediate_size"]
        config.update(moe)
    if model_type in ("llama", "mistral"):
        config.update(attention_bias=False, mlp_bias=False)
    architecture = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                    "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                    "qwen3_moe": "Qwen3MoeForCausalLM"}[model_type]
    config["architectures"] = [architecture]
    return config
