"""Falcon-H1 (TII's, `FalconH1ForCausalLM`): in every layer attention and a Mamba-2 mixer side by side, then a SwiGLU
MLP, each scaled by the muP multipliers of its config; llama.cpp's falcon-h1, whose converter folds the multipliers into
the weights (the embedding, the head, q, k, v and o, the MLP's gate and down, the mixer's in and out projections, the
in projection's parts each by its own) and stores the Mamba-2 tensors as for Mamba-2 (mamba2.py)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import first_of, gguf_quiet, rope_parameters
from .llama import SIBLINGS, TEXT_ONLY
from .mamba2 import mamba2_tensors, state_space_header
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Rearrangement, Unsupported, no_trainer_model


def falcon_h1_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's FalconH1Model's: its Mamba2Model's state-space keys, each found by its find_hparam (Falcon-H1's
    `mamba_` names after the plain ones), then the vocabulary, the blocks, context and feed-forward width again
    (rewritten in their places, as gguf-py's writer does), the attention's heads and widths and its rope base."""
    expand = first_of(hparams, "mamba_expand", "expand") or 2
    inner = first_of(hparams, "mamba_d_ssm", "intermediate_size", "d_inner") or expand * hparams["hidden_size"]
    state = first_of(hparams, "state_size", "d_state", "mamba_state_size", "mamba_d_state") or 128
    head = first_of(hparams, "mamba_d_head", "head_dim") or 64
    conv = first_of(hparams, "conv_kernel", "d_conv", "mamba_conv_kernel", "mamba_d_conv")
    with gguf_quiet():  # (gguf-py warns of each key written again)
        state_space_header(writer, {**hparams, "conv_kernel": conv}, blocks, inner, state, inner // head)
        writer.add_ssm_group_count(first_of(hparams, "n_groups", "mamba_n_groups") or 1)
        writer.add_layer_norm_rms_eps(first_of(hparams, "layer_norm_epsilon", "rms_norm_eps") or 1e-5)
        writer.add_file_type(ftype)
        writer.add_vocab_size(hparams["vocab_size"])
        writer.add_block_count(blocks)
        writer.add_context_length(hparams.get("max_position_embeddings", 0))
        writer.add_feed_forward_length(hparams["intermediate_size"])
        writer.add_head_count(hparams["num_attention_heads"])
        writer.add_head_count_kv(hparams["num_key_value_heads"])
        writer.add_key_length(hparams["head_dim"])
        writer.add_value_length(hparams["head_dim"])
        writer.add_rope_freq_base(rope_parameters(hparams)[0]["rope_theta"])


def falcon_h1_scales(name: str, shape: tuple[int, ...], hparams: dict) -> tuple[tuple[int, int, float], ...]:
    """The muP multipliers the converter folds into this tensor, by the same tests of its name in the same order: the
    MLP's gate and down, k (by the key's and the attention's input multipliers), q and v, o, the mixer's out and in
    projections (then each part of in's rows, z, x, B, C and dt, by its own), the head and the embedding."""
    rows = shape[0]
    for part, keys in (
        ("down_proj", (("mlp_multipliers", 1),)),
        ("gate_proj", (("mlp_multipliers", 0),)),
        ("k_proj", (("key_multiplier", None), ("attention_in_multiplier", None))),
        ("q_proj", (("attention_in_multiplier", None),)),
        ("v_proj", (("attention_in_multiplier", None),)),
        ("o_proj", (("attention_out_multiplier", None),)),
        ("out_proj", (("ssm_out_multiplier", None),)),
        ("in_proj", (("ssm_in_multiplier", None),)),
        ("lm_head", (("lm_head_multiplier", None),)),
        ("embed_tokens", (("embedding_multiplier", None),)),
    ):
        if part not in name:
            continue
        scales = [(0, rows, _multiplier(hparams, key, at)) for key, at in keys]
        if part == "in_proj":  # (its rows z, x, B, C and dt, each part by its own multiplier)
            inner = hparams.get("mamba_d_ssm") or hparams.get("mamba_expand", 2) * hparams["hidden_size"]
            groups = (hparams.get("mamba_n_groups") or 1) * (hparams.get("mamba_d_state") or 128)
            ends = (inner, 2 * inner, 2 * inner + groups, 2 * inner + 2 * groups, rows)
            factors = [_multiplier(hparams, "ssm_multipliers", at) for at in range(5)]
            scales += [(start, end, factor) for start, end, factor in zip((0, *ends), ends, factors)]
        return tuple(scales)
    return ()


def _multiplier(hparams: dict, key: str, at: int | None) -> float:
    """A multiplier of the config (the `at`-th of a list of them); one where the config has none, as transformers."""
    value = hparams.get(key)
    if value is None:
        return 1.0
    return value if at is None else value[at]


def falcon_h1_tensors(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    return mamba2_tensors(name, shape, ".mamba.", hparams.get("mamba_n_groups") or 1)


def falcon_h1_checked(hparams: dict, where: Path) -> None:
    """Falcon-H1 as llama.cpp's falcon-h1 computes it: the mixer's gated norm after its gate (as transformers with
    mamba_norm_before_gate off), no time step clamp, no biases but the convolution's, SiLU."""
    other_model = "; serve this model with transformers or vLLM"
    for wrong, why in (
        (
            hparams.get("mamba_rms_norm") and hparams.get("mamba_norm_before_gate", True),
            "mamba_norm_before_gate is set, and llama.cpp's falcon-h1 norms the mixer's output after its gate",
        ),
        (
            tuple(hparams.get("time_step_limit") or (0.0, float("inf"))) != (0.0, float("inf")),
            f"time_step_limit is {hparams.get('time_step_limit')}, and llama.cpp's falcon-h1 clamps no time step",
        ),
        (
            any(hparams.get(key) for key in ("mamba_proj_bias", "attention_bias", "mlp_bias", "projectors_bias")),
            "a projection has biases, which llama.cpp's falcon-h1 has none of",
        ),
        (hparams.get("hidden_act", "silu") != "silu", f"hidden_act is {hparams.get('hidden_act')}, not SiLU"),
    ):
        if wrong:
            raise ConfigMismatchError(f"{where}: {why}{other_model}")


FAMILIES = (
    Family(
        "Falcon-H1",
        "falcon_h1",
        "FalconH1ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Falcon-H1 layout (attention beside Mamba-2, muP) is not mapped yet"),
        **no_trainer_model("Falcon-H1"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "FALCON_H1",
            hyperparameters=falcon_h1_hyperparameters,
            check_config=falcon_h1_checked,
            vocabulary="bpe",
            rearranged=falcon_h1_tensors,
            scaled=falcon_h1_scales,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)
