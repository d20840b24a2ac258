"""Multi-token prediction layers as the Hub's checkpoints hold them (DeepSeek-V3's and GLM-4.5's; config.json's
num_nextn_predict_layers counts them): the layers after the model's own, `model.layers.{N+k}.`, each a decoder layer
under the usual names, plus its own norms and projection and copies of the model's embedding and head (SHARED),
which the trainers' MTP layers (megatron-core's, torchtitan's) share with the model. transformers loads none of them
(names.hf_names keeps them as saved); vLLM and SGLang run them, reading the copies as the MTP layer's own."""

from __future__ import annotations

import dataclasses
import re
from typing import TypeVar

SHARED = {"embed_tokens.weight": "model.embed_tokens.weight", "shared_head.head.weight": "lm_head.weight"}
LAYER = re.compile(r"^model\.layers\.(\d+)\.")

T = TypeVar("T")


def names_past(names, layers: int) -> set[str]:
    """Those of these Hugging Face names that are of the layers past the model's `layers`."""
    return {name for name in names if (m := LAYER.match(name)) and int(m.group(1)) >= layers}


def layers_past(names, layers: int) -> set[int]:
    """The numbers of the layers past the model's `layers` among these Hugging Face names."""
    return {int(LAYER.match(name).group(1)) for name in names_past(names, layers)}


def shared_copies(names, layers: int) -> set[str]:
    """The names of the MTP layers' copies of the embedding and head among these (which a trainer does not keep)."""
    return {f"model.layers.{k}.{own}" for k in layers_past(names, layers) for own in SHARED} & set(names)


def drop_shared_copies(groups: dict, layers: int) -> None:
    """Leave the MTP layers' copies of the embedding and head out of a plan's groups (types.Group, by source tensor),
    unread: a trainer's MTP layers share the model's."""
    copies = shared_copies({o.name for group in groups.values() for o in group.outputs}, layers)
    for name, group in list(groups.items()):
        if {o.name for o in group.outputs} <= copies:
            del groups[name]


def with_shared_copies(tensors: dict[str, T]) -> dict[str, T]:
    """The tensors (dataclasses with a `name`) with each MTP layer's copies of the model's embedding and head (of the
    embedding where the head is tied), as the Hub's checkpoints hold them; an MTP layer is told by its projection."""
    copies = {}
    for name in tensors:
        if LAYER.match(name) and name.endswith(".eh_proj.weight"):
            layer = name.removesuffix("eh_proj.weight")
            for own, model in SHARED.items():
                found = tensors.get(model, tensors["model.embed_tokens.weight"])
                copies[layer + own] = dataclasses.replace(found, name=layer + own)
    return {**tensors, **copies}
