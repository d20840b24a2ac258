"""Meta-style Llama names (torchtitan, torchtune) -> Hugging Face names, and the rotary permutation.

torchtitan and torchtune keep the names of Meta's reference Llama and apply rotary embeddings to
interleaved pairs (complex numbers); Hugging Face's Llama rotates the two halves of each head. The
same weights serve both once the rows of each q and k head are reordered: HF row (head, half, i) is
row (head, 2 i + half) here. The head counts come from the Hugging Face config (--config-from),
which these checkpoints do not carry.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch


L = "model.layers.{i}."
# name (layer number as {i}) -> (Hugging Face name, which rotary permutation: q, k or none)
TORCHTUNE = {
    "norm.scale": ("model.norm.weight", None),
    "layers.{i}.sa_norm.scale": (L + "input_layernorm.weight", None),
    "layers.{i}.mlp_norm.scale": (L + "post_attention_layernorm.weight", None),
    "layers.{i}.attn.q_proj.weight": (L + "self_attn.q_proj.weight", "q"),
    "layers.{i}.attn.k_proj.weight": (L + "self_attn.k_proj.weight", "k"),
    "layers.{i}.attn.v_proj.weight": (L + "self_attn.v_proj.weight", None),
    "layers.{i}.attn.output_proj.weight": (L + "self_attn.o_proj.weight", None),
    "layers.{i}.mlp.w1.weight": (L + "mlp.gate_proj.weight", None),
    "layers.{i}.mlp.w2.weight": (L + "mlp.down_proj.weight", None),
    "layers.{i}.mlp.w3.weight": (L + "mlp.up_proj.weight", None),
}
TORCHTITAN = {
    "tok_embeddings.weight": ("model.embed_tokens.weight", None),
    "norm.weight": ("model.norm.weight", None),
    "output.weight": ("lm_head.weight", None),  # torchtitan before its lm_head rename
    "lm_head.weight": ("lm_head.weight", None),
    "layers.{i}.attention_norm.weight": (L + "input_layernorm.weight", None),
    "layers.{i}.ffn_norm.weight": (L + "post_attention_layernorm.weight", None),
    "layers.{i}.attention.wo.weight": (L + "self_attn.o_proj.weight", None),
    "layers.{i}.feed_forward.w1.weight": (L + "mlp.gate_proj.weight", None),
    "layers.{i}.feed_forward.w2.weight": (L + "mlp.down_proj.weight", None),
    "layers.{i}.feed_forward.w3.weight": (L + "mlp.up_proj.weight", None),
    # Names with and without the fused-QKV module of torchtitan >= 0.3.
    **{f"layers.{{i}}.attention{mid}.w{p}.weight": (L + f"self_attn.{p}_proj.weight", p if p != "v" else None)
       for mid in ("", ".qkv_linear") for p in "qkv"},
}
LLAMA = {**TORCHTITAN, **TORCHTUNE}  # the two name sets do not overlap
LAYER = re.compile(r"^layers\.(\d+)\.")


def trainer(names) -> str | None:
    """"torchtune", "torchtitan", or None for names of neither."""
    if "tok_embeddings.weight" not in names:
        return None
    return "torchtune" if any(".attn." in n for n in names) else "torchtitan"


def interleaved_to_halves(heads: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def permute(w: torch.Tensor) -> torch.Tensor:
        rows, cols = w.shape
        return w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)
    return permute


def rename(names, config: dict[str, Any], where: str) -> tuple[dict[str, str], dict[str, Callable]]:
    """(torchtitan name -> HF name, HF name -> transform) for a Llama-family config."""
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    renamed, transforms, unknown = {}, {}, []
    for name in names:
        match = LAYER.match(name)
        key = LAYER.sub("layers.{i}.", name) if match else name
        if key not in LLAMA:
            unknown.append(name)
            continue
        hf, rotary = LLAMA[key]
        hf = hf.format(i=match.group(1)) if match else hf
        renamed[name] = hf
        if rotary:
            transforms[hf] = interleaved_to_halves(heads if rotary == "q" else kv_heads)
    if unknown:
        from ..errors import CheckpointError

        raise CheckpointError(f"{where}: {len(unknown)} tensors have no Llama rule (e.g. {unknown[0]}); unshard maps "
                              "torchtitan's and torchtune's Llama names, please report this model")
    return renamed, transforms
