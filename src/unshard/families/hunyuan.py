"""Hunyuan dense (Tencent's `HunYuanDenseV1ForCausalLM`): Llama's layout with q and k normed per head after rotary,
whose rope the checkpoints label "dynamic" with a fixed NTK `alpha` that stretches the base (transformers turns it
as ntk_alpha); llama.cpp's hunyuan-dense, the converter writing the stretched base with rope unscaled, the context
it takes the model to reach with it (256k), and the first of generation_config.json's ends as the end of turn."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import gguf_py, gguf_quiet, rope_parameters, text_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model

NTK_ALPHA = ("dynamic", "xdrope")  # (the rope types the converter takes as a fixed alpha's stretched base)
LONG_CONTEXT = 256 * 1024


def hunyuan_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's HunYuanModel's: the TextModel's (the rope type it passes over), then, for the NTK alpha rope,
    the base stretched by alpha^(d / (d - 2)) as transformers stretches it, rope unscaled, and for "dynamic" the
    256k context."""
    _, rope = rope_parameters(hparams)
    kind = rope.get("rope_type")
    plain = {k: v for k, v in rope.items() if k != "rope_type"}
    text_hyperparameters(writer, {**hparams, "rope_parameters": plain}, ftype, blocks, folder)
    if kind in NTK_ALPHA:
        dim = hparams["head_dim"]
        base = rope.get("rope_theta", 10000.0)
        with gguf_quiet():  # (the base and context written again, as the converter does: the second value counts)
            writer.add_rope_freq_base(base * rope.get("alpha", 50) ** (dim / (dim - 2)))
            writer.add_rope_scaling_type(gguf_py().RopeScalingType.NONE)
            writer.add_rope_scaling_factor(1)
            if kind == "dynamic":
                writer.add_rope_scaling_orig_ctx_len(LONG_CONTEXT)
                writer.add_context_length(LONG_CONTEXT)


def hunyuan_checked(hparams: dict, where: Path) -> None:
    """The rope llama.cpp computes as transformers does: none, or the fixed alpha, from the base and context the
    converter assumes for "dynamic" (10000, 32k or 256k; it stops on any other)."""
    _, rope = rope_parameters(hparams)
    kind = rope.get("rope_type")
    if kind not in (None, "default", *NTK_ALPHA):
        raise ConfigMismatchError(
            f"{where}: rope type {kind!r}, which llama.cpp's hunyuan-dense does not compute; serve this model with "
            "transformers or vLLM"
        )
    if kind == "dynamic" and (
        rope.get("rope_theta", 10000.0) != 10000.0 or hparams["max_position_embeddings"] not in (32768, LONG_CONTEXT)
    ):
        raise ConfigMismatchError(
            f"{where}: a dynamic (NTK alpha) rope over rope_theta {rope.get('rope_theta')} and "
            f"max_position_embeddings {hparams['max_position_embeddings']}; llama.cpp's converter takes it for a "
            "256k context from 10000 and 32k or 256k only; serve this model with transformers or vLLM"
        )
    if hparams.get("head_dim") is None:
        raise ConfigMismatchError(f"{where}: no head_dim, which llama.cpp's converter stretches the rope base by")


def hunyuan_end_tokens(writer, hparams: dict, folder: Path) -> None:
    """The converter's fix of the end tokens: the first of generation_config.json's ends (where it lists two or more)
    as the end of turn. (It would also take the config's eod_token_id for the end of text, but the transformers it
    pins, 4.57, drops that key of a Hunyuan config: its files keep the config's end of text, and so do unshard's.)"""
    generation = folder / "generation_config.json"
    if generation.is_file():
        try:
            ends = json.loads(generation.read_text()).get("eos_token_id")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigMismatchError(f"{generation}: not valid JSON ({e}); fix or remove it") from None
        if isinstance(ends, list) and len(ends) >= 2:
            writer.add_eot_token_id(ends[0])


FAMILIES = (
    Family(
        "Hunyuan (dense)",
        "hunyuan_v1_dense",
        "HunYuanDenseV1ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Hunyuan layout is not mapped yet"),
        **no_trainer_model("Hunyuan"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "HUNYUAN_DENSE",
            hyperparameters=hunyuan_hyperparameters,
            check_config=hunyuan_checked,
            vocabulary="bpe",
            after_vocabulary=hunyuan_end_tokens,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)
