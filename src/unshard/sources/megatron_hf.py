"""Megatron's whole tensors as Hugging Face's, by the family's rules (families/<family>.py, MegatronRules); which
family Megatron-LM's args describe, and the config.json they make.

Each rule names a Hugging Face tensor, or a split of the Megatron tensor into several: each output is a box of
the Megatron tensor, composed with the boxes the readers found, so every Hugging Face tensor is still read
straight from the checkpoint's files, one at a time, with no Megatron import.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from .. import families
from ..errors import CheckpointError
from ..families.parts import Family
from ..names.megatron_rules import (
    GATE_UP,
    PLAIN,
    VALUE_HEAD,
    VOCAB,
    Shapes,
    Signature,
    has_mtp_layers,
    shapes_from_args,
    template,
)
from ..names.mtp_layers import with_shared_copies
from ..names.stacked import Stacked
from .base import Piece, SourceTensor, Stack
from .placements import Block, compose


def family_of(model_type: str | None, where: str) -> Family:
    """The family of this model_type, if unshard has its Megatron rules; a one-line error naming it otherwise."""
    family = families.by_model_type(model_type)
    if family is None:
        raise CheckpointError(
            f"{where}: no Megatron name table for model_type {model_type!r}; unshard knows "
            f"{', '.join(sorted(f.model_type for f in families.with_part('megatron')))}"
        )
    if not families.supports(family, "megatron"):
        raise CheckpointError(f"{where}: {family.name} from Megatron is not supported: {family.megatron.reason}")
    return family


def _boxes(kind: str, names: tuple[str, ...], shape: tuple[int, ...], dims: Shapes, source: str):
    """(output name, output shape, block from the Megatron tensor into it) for each output."""
    rest = tuple(shape[1:])
    zeros = (0,) * len(rest)
    if kind == PLAIN:
        return [(names[0], shape, Block.whole(shape))]
    if kind == VOCAB:
        if dims.vocab > shape[0]:
            raise CheckpointError(
                f"{source} has {shape[0]} vocabulary rows, fewer than the vocab_size {dims.vocab} "
                "of the config; pass the config the model was trained with (--config-from)"
            )
        out = (dims.vocab, *rest)
        return [(names[0], out, Block.whole(out))]
    if kind == GATE_UP:
        half = shape[0] // 2
        out = (half, *rest)
        return [
            (names[0], out, Block((0, *zeros), (0, *zeros), out)),
            (names[1], out, Block((half, *zeros), (0, *zeros), out)),
        ]
    # QKV: per query group, its query heads, then one key head, then one value head.
    per_group = dims.heads // dims.groups
    stride = (per_group + 2) * dims.head_dim
    if shape[0] != dims.groups * stride:
        raise CheckpointError(
            f"{source} has {shape[0]} rows, not the {dims.groups * stride} that {dims.heads} heads "
            f"in {dims.groups} query groups of size {dims.head_dim} make; the args do not match"
        )
    q_rows, kv_rows = per_group * dims.head_dim, dims.head_dim
    q, k, v = [], [], []
    for g in range(dims.groups):
        start = g * stride
        q.append(Block((start, *zeros), (g * q_rows, *zeros), (q_rows, *rest)))
        k.append(Block((start + q_rows, *zeros), (g * kv_rows, *zeros), (kv_rows, *rest)))
        v.append(Block((start + q_rows + kv_rows, *zeros), (g * kv_rows, *zeros), (kv_rows, *rest)))
    shapes = [(dims.heads * dims.head_dim, *rest), (dims.groups * kv_rows, *rest), (dims.groups * kv_rows, *rest)]
    return [(name, out, block) for name, out, blocks in zip(names, shapes, (q, k, v)) for block in blocks]


def to_hf(
    tensors: dict[str, SourceTensor], model_type: str, dims: Shapes, where: str
) -> tuple[dict[str, SourceTensor], dict[str, Stack]]:
    """Hugging Face tensors, each with pieces straight from the checkpoint files; and those that stack several
    Megatron tensors (a layer's experts, for a family that keeps them in one tensor), by what they stack."""
    table = family_of(model_type, where).megatron.rules
    head = tensors.get("output_layer.weight")
    if head is not None and head.shape[0] == 1:  # (one output, not a vocabulary: a critic's value head)
        table = {**table, **VALUE_HEAD}
    unknown = []
    out: dict[str, SourceTensor] = {}
    made_by: dict[str, str] = {}  # Hugging Face name -> the Megatron tensor it is read from
    experts: dict[tuple[str, Stacked], dict[int, SourceTensor]] = defaultdict(dict)
    for name, source in tensors.items():
        key, numbers = template(name)
        rule = table.get(key)
        if rule is None:
            unknown.append(name)
            continue
        if isinstance(rule, Stacked):
            experts[(rule.name.format(**numbers), rule)][int(numbers["e"])] = source
            continue
        kind, names = (PLAIN, (rule,)) if isinstance(rule, str) else (rule[0], rule[1:])
        for hf_template, shape, box in _boxes(kind, names, source.shape, dims, name):
            hf_name = hf_template.format(**numbers)
            if made_by.setdefault(hf_name, name) != name and kind == PLAIN:
                continue  # (a norm under each layer spec's name, as the way back writes it: SPEC_NAMES)
            target = out.setdefault(hf_name, SourceTensor(hf_name, shape, source.dtype, []))
            for piece in source.pieces:
                block = compose(piece.block, box)
                if block is not None:
                    target.pieces.append(Piece(piece.file, piece.key, block, piece.part))
    if unknown:
        raise CheckpointError(
            f"{where}: {len(unknown)} Megatron tensors have no {model_type} rule (e.g. {unknown[0]}); "
            "this architecture or layer spec is not supported yet, please report it"
        )
    stacks = {}
    for (hf_name, rule), found in experts.items():
        members = tuple(found[e] for e in sorted(found))
        if sorted(found) != list(range(len(found))) or len({(m.shape, m.dtype) for m in members}) > 1:
            raise CheckpointError(
                f"{where}: the experts {hf_name} stacks are not experts 0 to {len(found) - 1}, alike: "
                f"{', '.join(m.name for m in members[:3])}...; an expert rank's files are missing"
            )
        pieces = [piece for member in members for piece in member.pieces]
        out[hf_name] = SourceTensor(hf_name, rule.shape(len(members), members[0].shape), members[0].dtype, pieces)
        stacks[hf_name] = Stack(members, rule.band)
    out = with_shared_copies(out)  # (an MTP layer's copies of the embedding and head, as the Hub's hold them)
    # In the order save_pretrained's files have them (safetensors sorts a file's tensors by name), not Megatron's
    # (each fused tensor's layers first): a model written into Megatron and read back is the same file.
    return dict(sorted(out.items())), stacks


ROTARY = ("rope", "yarn")


def model_type_from_args(args: dict[str, Any], where: str) -> str:
    """The Hugging Face model family the args describe; an error for what no table covers."""
    unsupported = [
        what
        for what, bad in (
            ("a normalization other than RMSNorm", args.get("normalization", "RMSNorm") != "RMSNorm"),
            ("a non-gated MLP (no --swiglu)", not (args.get("swiglu") or args.get("quick_geglu"))),
            ("position embeddings other than rope", args.get("position_embedding_type", "rope") not in ROTARY),
            ("interleaved rotary embeddings", args.get("rotary_interleaved")),
        )
        if bad
    ]
    if unsupported:
        known = ", ".join(f.name for f in families.with_part("megatron"))
        raise CheckpointError(
            f"{where}: the args describe {unsupported[0]}, which no supported Hugging Face "
            f"architecture has; unshard converts {known} (unshard families)"
        )
    found = Signature.of_args(args)
    for family in families.with_part("megatron"):
        if family.megatron.signature is not None and family.megatron.signature.admits(found):
            return family.model_type
    said = ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in dataclasses.asdict(found).items())
    raise CheckpointError(
        f"{where}: no Hugging Face architecture unshard knows has this combination ({said}); "
        "pass --config-from DIR with its config"
    )


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
        **yarn_config(args),
        "hidden_act": "silu",
        "tie_word_embeddings": not args.get("untie_embeddings_and_output_weights", False),
        "torch_dtype": dtype,
    }
    family = family_of(model_type, "the args")
    config.update(family.megatron.config(args))
    if args.get("mtp_num_layers") and has_mtp_layers(family.megatron.rules):
        config["num_nextn_predict_layers"] = args["mtp_num_layers"]
    config["architectures"] = [family.architecture]
    return config


def yarn_config(args: dict[str, Any]) -> dict[str, Any]:
    """config.json's rope_scaling for YaRN (--position-embedding-type yarn), from the settings megatron-core's GPTModel
    reads (its yarn_* names). transformers' attention factor is megatron-core's: from mscale and mscale_all_dim where
    both are given, else from the factor alone."""
    if args.get("position_embedding_type") != "yarn":
        return {}
    scaling = {
        "rope_type": "yarn",
        "factor": args["yarn_rotary_scaling_factor"],
        "original_max_position_embeddings": args["yarn_original_max_position_embeddings"],
        "beta_fast": args.get("yarn_beta_fast", 32.0),
        "beta_slow": args.get("yarn_beta_slow", 1.0),
        "truncate": bool(args.get("yarn_correction_range_round_to_int", True)),
    }
    if args.get("yarn_mscale") is not None and args.get("yarn_mscale_all_dim") is not None:
        scaling.update(mscale=args["yarn_mscale"], mscale_all_dim=args["yarn_mscale_all_dim"])
    return {"rope_scaling": scaling}
