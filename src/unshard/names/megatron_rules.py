"""Megatron parameter names -> Hugging Face names: the kinds of rule a family's table is made of, the rules
every family shares, and the sizes the splits need.

Both Megatron readers first describe a checkpoint as whole Megatron tensors: global layer and expert
numbers, no tensor-parallel split, the gated MLP's fc1 as [gate; up]
(`decoder.layers.7.mlp.experts.5.linear_fc1.weight`). A family's table (families/<family>.py, its
MegatronRules) says which Hugging Face tensor each becomes: a name, or a kind of split and names. The splits
(fused QKV per query group, gate/up, the padded vocabulary) are boxes of the Megatron tensor
(sources/megatron_hf.py), so every Hugging Face tensor is still read straight from the checkpoint's files.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from .stacked import Stacked

PLAIN, QKV, GATE_UP, VOCAB = "plain", "qkv", "gate_up", "vocab"

# Tensor-parallel split of each Megatron parameter in the per-rank files, by its last two name parts:
# 0 for column- (and vocabulary-) parallel, 1 for row-parallel; every other parameter is replicated.
TP_DIM = {
    "linear_qkv.weight": 0,
    "linear_qkv.bias": 0,
    "linear_fc1.weight": 0,
    "linear_fc1.bias": 0,
    "word_embeddings.weight": 0,
    "output_layer.weight": 0,
    "linear_proj.weight": 1,
    "linear_fc2.weight": 1,
    # multi-latent attention: every projection is column-parallel in megatron-core's local spec (Transformer
    # Engine's keeps the two down projections whole on every rank: see DUPLICABLE)
    "linear_q_proj.weight": 0,
    "linear_q_down_proj.weight": 0,
    "linear_q_up_proj.weight": 0,
    "linear_kv_down_proj.weight": 0,
    "linear_kv_up_proj.weight": 0,
    "core_attention.softmax_offset": 0,  # (a learned attention sink per head: gpt-oss's)
    "eh_proj.weight": 0,  # (a multi-token prediction layer's projection: column-parallel)
}
# Split over the tensor-parallel ranks, or whole on each: these rows (as the args give them) when whole.
DUPLICABLE = {
    "output_layer.weight": lambda args: 1,  # (a critic's value head: one output, on every rank)
    "linear_q_down_proj.weight": lambda args: args.get("q_lora_rank"),
    "linear_kv_down_proj.weight": lambda args: (args.get("kv_lora_rank") or 0) + (args.get("qk_pos_emb_head_dim") or 0),
}


def tp_dim(name: str, local_rows: int | None = None, args: dict[str, Any] | None = None) -> int | None:
    """The dimension a rank file's slice of `name` is split on; None when each rank holds it whole."""
    last = ".".join(name.split(".")[-2:])
    whole_rows = DUPLICABLE.get(last, lambda args: None)(args or {})
    if whole_rows and local_rows == whole_rows:
        return None
    return TP_DIM.get(last)


@dataclass(frozen=True)
class Signature:
    """What Megatron-LM's args say of an architecture, as a family's rules expect it: True, False, or None for
    either (GLM-4.5 with and without q/k norms)."""

    qkv_bias: bool | None = False
    qk_norm: bool | None = False
    experts: bool | None = False
    shared_experts: bool | None = False
    sigmoid_router: bool | None = False  # sigmoid scores plus an expert bias (DeepSeek-V3, GLM-4.5)
    latent_attention: bool | None = False
    partial_rotary: bool | None = False  # rotary embeddings on part of each head (--rotary-percent below 1)
    linear_bias: bool | None = False  # biases on every linear layer (--add-bias-linear)
    attention_sinks: bool | None = False  # a learned sink per attention head (--softmax-type learnable)
    activation: str | None = "swiglu"  # the gated MLP's: swiglu, or quick_geglu (gpt-oss's clamped SwiGLU)

    @classmethod
    def of_args(cls, args: dict[str, Any]) -> Signature:
        experts = bool(args.get("num_experts"))
        return cls(
            qkv_bias=bool(args.get("add_qkv_bias") or args.get("add_bias_linear")),
            qk_norm=bool(args.get("qk_layernorm")),
            experts=experts,
            shared_experts=experts and bool(args.get("moe_shared_expert_intermediate_size")),
            sigmoid_router=experts and args.get("moe_router_score_function") == "sigmoid",
            latent_attention=bool(args.get("multi_latent_attention")),
            partial_rotary=args.get("rotary_percent", 1.0) != 1.0,
            linear_bias=bool(args.get("add_bias_linear")),
            attention_sinks=args.get("softmax_type", "vanilla") == "learnable",
            activation="quick_geglu" if args.get("quick_geglu") else "swiglu",
        )

    def admits(self, found: Signature) -> bool:
        return all(want is None or want == getattr(found, name) for name, want in dataclasses.asdict(self).items())


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
# A critic's or reward model's value head (verl's LinearForLastLayer, one output) in place of the output layer: the
# `score` head of transformers' ...ForTokenClassification, as verl's FSDP critics save it.
VALUE_HEAD = {"output_layer.weight": "score.weight", "output_layer.bias": "score.bias"}
# A multi-token prediction layer's own tensors (DeepSeek-V3's), besides its decoder layer's: megatron-core's
# MultiTokenPredictionLayer (mtp.layers.{k}) read as the layer after the model's (mtp_as_layer), as the Hub's
# checkpoints hold it (names.mtp_layers)
MTP_LAYER = {
    "decoder.layers.{i}.enorm.weight": L + "enorm.weight",
    "decoder.layers.{i}.hnorm.weight": L + "hnorm.weight",
    "decoder.layers.{i}.eh_proj.weight": L + "eh_proj.weight",
    "decoder.layers.{i}.final_layernorm.weight": L + "shared_head.norm.weight",
}
_MTP = re.compile(r"^mtp\.layers\.(\d+)\.(?:transformer_layer\.)?")
_LAYER_KEY = re.compile(r"^decoder\.layers\.(\d+)\.")
_MTP_OWN = tuple(key.removeprefix("decoder.layers.{i}.") for key in MTP_LAYER)


def mtp_as_layer(name: str, layers: int) -> str:
    """A Megatron name of an MTP layer's tensor as the layer after the model's `layers` would have it:
    `mtp.layers.0.transformer_layer.mlp.router.weight` -> `decoder.layers.4.mlp.router.weight`,
    `mtp.layers.0.enorm.weight` -> `decoder.layers.4.enorm.weight`; any other name as it is."""
    return _MTP.sub(lambda m: f"decoder.layers.{layers + int(m.group(1))}.", name)


def has_mtp_layers(rules: dict[str, Any]) -> bool:
    """Whether a family's table maps MTP layers (the Hub's layout of them: MTP_LAYER)."""
    return all(key in rules for key in MTP_LAYER)


def layer_as_mtp(key: str, layers: int) -> str:
    """mtp_as_layer's other way, on a dist key keyed on its own layer: a layer past the model's `layers` is an MTP
    layer's (its own tensors under it, its decoder layer's under `transformer_layer`); any other key as it is."""
    match = _LAYER_KEY.match(key)
    if match is None or int(match.group(1)) < layers:
        return key
    rest = key[match.end() :]
    inner = "" if rest in _MTP_OWN else "transformer_layer."
    return f"mtp.layers.{int(match.group(1)) - layers}.{inner}{rest}"


# A router and its experts, as transformers' Qwen MoE, DeepSeek-V3 and GLM-4.5 name them
ROUTED_EXPERTS = {
    "decoder.layers.{i}.mlp.router.weight": L + "mlp.gate.weight",
    "decoder.layers.{i}.mlp.experts.{e}.linear_fc1.weight": (
        GATE_UP,
        L + "mlp.experts.{e}.gate_proj.weight",
        L + "mlp.experts.{e}.up_proj.weight",
    ),
    "decoder.layers.{i}.mlp.experts.{e}.linear_fc2.weight": L + "mlp.experts.{e}.down_proj.weight",
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


_NUMBERS = re.compile(r"(?<=\.layers\.)(\d+)|(?<=\.experts\.)(\d+)")


def template(name: str) -> tuple[str, dict[str, str]]:
    """`decoder.layers.7.mlp.experts.5.x` -> (`decoder.layers.{i}.mlp.experts.{e}.x`, {"i": "7", "e": "5"})."""
    found: dict[str, str] = {}

    def replace(match):
        key = "i" if match.group(1) is not None else "e"
        found[key] = match.group(0)
        return "{" + key + "}"

    return _NUMBERS.sub(replace, name), found


def moe_config(args: dict[str, Any], **own: Any) -> dict[str, Any]:
    """config.json's MoE keys from Megatron-LM's args: the experts per token and their weights' normalisation, the
    family's `own` keys (its expert count and width), a shared expert's width."""
    moe = {
        "num_experts_per_tok": args.get("moe_router_topk", 2),
        # Megatron's default top-k then softmax equals softmax, top-k, renormalise.
        "norm_topk_prob": not args.get("moe_router_pre_softmax", False),
        **own,
    }
    if args.get("moe_shared_expert_intermediate_size"):
        moe["shared_expert_intermediate_size"] = args["moe_shared_expert_intermediate_size"]
    return moe


@dataclass(frozen=True)
class Placed:
    """Where a Hugging Face tensor goes in a Megatron dist checkpoint (the way back): the dist key (a layer's
    tensors stacked on a first axis, as megatron-core's sharded state dict has them), its whole shape, and the
    boxes: (first row of the Hugging Face tensor, rows, offsets in the dist tensor), plus boxes of zeros (the
    padded vocabulary's rows: offsets, shape)."""

    key: str
    shape: tuple[int, ...]
    boxes: tuple[tuple[int, int, tuple[int, ...]], ...]
    zeros: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()
    stacked: int = 0  # leading axes that stack layers or experts
    also: tuple[str, ...] = ()  # other dist keys the same boxes are written under (SPEC_NAMES)
    turn: Stacked | None = None  # a tensor of a layer's experts, each turned back into Megatron's (names.stacked)


# megatron-core's layer specs save some norms under different names. Transformer Engine's fuses a norm into the next
# linear layer (`linear_q_up_proj.layer_norm_weight`) where the local spec keeps it apart (`q_layernorm.weight`), yet
# keeps the norm before a MoE block apart (`pre_mlp_layernorm.weight`), which the local spec maps to the fused name
# (`mlp.linear_fc1.layer_norm_weight`); the local spec of latent attention maps none of its norms. So the way back
# writes such a norm under each name a spec loads it by (a few vectors twice): Transformer Engine's name -> the other,
# and whether a layer needs it (MoE layer, latent attention).
SPEC_NAMES = {
    "mlp.linear_fc1.layer_norm_weight": ("pre_mlp_layernorm.weight", lambda moe, latent: moe or latent),
    "self_attention.linear_q_up_proj.layer_norm_weight": ("self_attention.q_layernorm.weight", lambda *_: True),
    "self_attention.linear_kv_up_proj.layer_norm_weight": ("self_attention.kv_layernorm.weight", lambda *_: True),
}


def other_spec_names(dist_key: str, moe_layer: bool, latent: bool) -> tuple[str, ...]:
    """The names other layer specs save this dist tensor under (SPEC_NAMES)."""
    for fused, (apart, needed) in SPEC_NAMES.items():
        if dist_key.endswith(fused) and needed(moe_layer, latent):
            return (dist_key[: -len(fused)] + apart,)
    return ()


def to_megatron(
    table: dict[str, Any],
    shapes: dict[str, tuple[int, ...]],
    dims: Shapes,
    padded: int,
    layers: int | None,
    where: str,
    latent: bool = False,
) -> dict[str, Placed]:
    """The other way (writing Megatron): each Hugging Face tensor (name -> shape) placed by the family's table.
    Where the table has a local and a Transformer Engine name for one tensor (the layer norms), the dist format's
    is Transformer Engine's, which megatron-core's local spec maps its own to. `layers`: how many layers the stacks
    hold; None where the layers are not alike (dense layers before MoE ones), which megatron-core then keys each
    on its own (`decoder.layers.3.mlp.router.weight`), stacking only a layer's experts. `latent`: the attention is
    multi-latent (its norms are named per spec: SPEC_NAMES)."""
    rules: list[tuple[re.Pattern, str, Any, int]] = []  # (HF name pattern, Megatron key, kind, which part)
    for key, rule in sorted(table.items(), key=lambda item: "layer_norm_weight" not in item[0]):
        if isinstance(rule, Stacked):
            kind, names = rule, (rule.name,)
        else:
            kind, names = (PLAIN, (rule,)) if isinstance(rule, str) else (rule[0], rule[1:])
        for part, hf in enumerate(names):
            hf = re.escape(hf).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{e\}", r"(?P<e>\d+)")
            rules.append((re.compile(f"^{hf}$"), key, kind, part))
    found = {}
    for name in shapes:
        found[name] = next(((m, key, kind, part) for p, key, kind, part in rules if (m := p.match(name))), None)
    # (the experts a layer has: every one of them is among the tensors, which stack them)
    experts = 1 + max((int(f[0].group("e")) for f in found.values() if f and "e" in f[0].groupdict()), default=-1)
    moe_layers = {f[0].group("i") for f in found.values() if f and ".mlp.router." in f[1]}
    placed, unknown = {}, []
    for name, shape in shapes.items():
        if found[name] is None:
            unknown.append(name)
            continue
        match, key, kind, part = found[name]
        where = match.groupdict()
        placed[name] = _place(key, kind, part, shape, where.get("i"), where.get("e"), experts, dims, padded, layers)
        also = other_spec_names(placed[name].key, where.get("i") in moe_layers, latent)
        placed[name] = dataclasses.replace(placed[name], also=also)
    if unknown:
        from ..errors import UnshardError

        raise UnshardError(
            f"{where}: {len(unknown)} tensors have no place in a Megatron checkpoint of this family (e.g. "
            f"{unknown[0]}); `unshard families` says what --to megatron writes"
        )
    return placed


def _place(
    key: str, kind: str | Stacked, part: int, shape, layer, expert, experts: int, dims: Shapes, padded: int, layers
):
    """Where one Hugging Face tensor goes: a layer's on the dist tensor's first axis, which stacks the layers, and an
    expert's on the next, which stacks the layer's experts (`decoder.layers.mlp.experts.experts.linear_fc1.weight`,
    [layers, experts, rows, columns], as megatron-core's sharded state dict holds SequentialMLP's experts)."""
    rows, rest = shape[0], tuple(shape[1:])
    lead = (() if layer is None else (int(layer),)) + (() if expert is None else (int(expert),))
    stacked = (() if layer is None else (layers,)) + (() if expert is None else (experts,))
    if layers is None and layer is not None:  # (each layer keyed on its own)
        key, lead, stacked = key.replace(".{i}.", f".{layer}."), lead[1:], stacked[1:]
    dist_key = key.replace(".{i}.", ".").replace(".experts.{e}.", ".experts.experts.")
    if isinstance(kind, Stacked):  # (a row per expert, each turned back, in its place on the experts' axis)
        expert_shape = kind.expert(rest)
        zero = (0,) * len(expert_shape)
        boxes = tuple((e, 1, (*lead, e, *zero)) for e in range(rows))
        return Placed(dist_key, (*stacked, rows, *expert_shape), boxes, stacked=len(stacked) + 1, turn=kind)
    zero = (0,) * len(rest)
    if kind == QKV:
        per_group, head = dims.heads // dims.groups, dims.head_dim
        width = (per_group + 2) * head  # rows of one query group: its queries, its key, its value
        own = per_group * head if part == 0 else head
        at = (0, per_group * head, (per_group + 1) * head)[part]
        boxes = tuple((g * own, own, (*lead, g * width + at, *zero)) for g in range(dims.groups))
        return Placed(dist_key, (*stacked, dims.groups * width, *rest), boxes, stacked=len(stacked))
    if kind == GATE_UP:
        boxes = ((0, rows, (*lead, part * rows, *zero)),)
        return Placed(dist_key, (*stacked, 2 * rows, *rest), boxes, stacked=len(stacked))
    if kind == VOCAB:
        zeros = (((rows, *zero), (padded - rows, *rest)),) if padded > rows else ()
        return Placed(dist_key, (padded, *rest), ((0, rows, (0, *zero)),), zeros)
    return Placed(dist_key, (*stacked, rows, *rest), ((0, rows, (*lead, 0, *zero)),), stacked=len(stacked))
