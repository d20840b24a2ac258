"""Jais 2 (Inception's `Jais2ForCausalLM`): LayerNorms with biases, q, k, v and output with biases, rotary over whole
heads, a two-layer ReLU² MLP with biases (up and down, no gate); llama.cpp's jais2, the converter's TextModel header
with the rotated width."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import rope_parameters, text_hyperparameters
from .llama import TEXT_ONLY
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model


def jais2_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Jais2Model's: the TextModel's, then a whole head as the rotated width."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_rope_dimension_count(hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"])


def jais2_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's jais2 computes whatever the config says: biases everywhere, ReLU², rope over whole heads."""
    said = None
    for key in ("attention_bias", "mlp_bias"):
        if hparams.get(key) is False:
            said = f"{key} is false, and llama.cpp's jais2 takes biases there"
    if hparams.get("hidden_act", "relu2") != "relu2":
        said = f"hidden_act is {hparams['hidden_act']!r}, and llama.cpp's jais2 computes ReLU²"
    if rope_parameters(hparams)[1].get("partial_rotary_factor", 1.0) != 1.0:
        said = "partial_rotary_factor is set, and llama.cpp's jais2 turns whole heads"
    if said:
        raise ConfigMismatchError(f"{where}: {said}; serve this model with transformers or vLLM")


FAMILIES = (
    Family(
        "Jais 2",
        "jais2",
        "Jais2ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Jais 2 layout is not mapped yet"),
        **no_trainer_model("Jais 2"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"),),
        gguf=GGUFPart("JAIS2", hyperparameters=jais2_hyperparameters, check_config=jais2_checked),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)
