"""Phi-2 (Microsoft's Phi-1, 1.5 and 2, `PhiForCausalLM`): attention and MLP in parallel behind one LayerNorm, q, k and
v with biases, rope over part of each head, a two-layer GELU MLP four times the width, a head with a bias; llama.cpp's
phi2, whose converter writes a header of its own (the start token turned off; no rope base: llama.cpp takes 10000)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import first_of, rope_parameters, turned_at_llama_cpp_base
from .llama import TEXT_ONLY
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model


def phi2_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Phi2Model's, in its order."""
    width, heads = hparams["hidden_size"], hparams["num_attention_heads"]
    writer.add_context_length(first_of(hparams, "n_positions", "max_position_embeddings"))
    writer.add_embedding_length(width)
    writer.add_feed_forward_length(4 * width)
    writer.add_block_count(blocks)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_layer_norm_eps(first_of(hparams, "layer_norm_epsilon", "layer_norm_eps"))
    writer.add_rope_dimension_count(int(rope_parameters(hparams)[1]["partial_rotary_factor"] * width) // heads)
    writer.add_file_type(ftype)
    writer.add_add_bos_token(False)


def phi2_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's phi2 would compute otherwise, or not load: key-value heads fewer than heads, an MLP other than
    four times the width, q and k norms, a rope base other than its own."""
    width, heads = hparams["hidden_size"], hparams["num_attention_heads"]
    for refused, what in (
        (
            (hparams.get("num_key_value_heads") or heads) != heads,
            f"num_key_value_heads is {hparams.get('num_key_value_heads')}, and llama.cpp's phi2 gives each of the "
            f"{heads} heads its own keys",
        ),
        (
            (hparams.get("intermediate_size") or 4 * width) != 4 * width,
            f"intermediate_size is {hparams.get('intermediate_size')}, and llama.cpp's phi2 takes 4 x {width}",
        ),
        (hparams.get("qk_layernorm"), "qk_layernorm is set, and llama.cpp's phi2 has no q and k norms"),
        (
            "partial_rotary_factor" not in rope_parameters(hparams)[1],
            "no partial_rotary_factor, which llama.cpp's phi2 needs; add it",
        ),
    ):
        if refused:
            raise ConfigMismatchError(f"{where}: {what}")
    turned_at_llama_cpp_base(hparams, where, "phi2")


FAMILIES = (
    Family(
        "Phi-2",
        "phi",
        "PhiForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Phi-2 layout (parallel attention and MLP, LayerNorms) is not mapped yet"),
        **no_trainer_model("Phi-2"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"),),
        gguf=GGUFPart("PHI2", hyperparameters=phi2_hyperparameters, check_config=phi2_checked, vocabulary="bpe"),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)
