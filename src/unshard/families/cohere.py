"""Command R and Aya (Cohere's first Command R layout): attention and MLP in parallel behind one LayerNorm, rotary over
interleaved pairs, tied embeddings whose logits are scaled; llama.cpp's command-r, the converter's TextModel header
with the context the tokenizer says (model_max_length), the logit scale and no rope scaling."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import first_of, gguf_py, rope_parameters, text_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model


def cohere_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's CommandR2Model's: the TextModel's over the longest context the config gives, the logit scale,
    rope unscaled."""
    context = first_of(hparams, "model_max_length", "max_position_embeddings")
    text_hyperparameters(writer, {**hparams, "max_position_embeddings": context}, ftype, blocks, folder)
    writer.add_logit_scale(hparams["logit_scale"])
    writer.add_rope_scaling_type(gguf_py().RopeScalingType.NONE)


def cohere_checked(hparams: dict, where: Path) -> None:
    """llama.cpp's command-r turns rope unscaled, whatever scaling the config gives."""
    rope_type = rope_parameters(hparams)[1].get("rope_type")
    if rope_type not in (None, "default"):
        raise ConfigMismatchError(
            f"{where}: rope type {rope_type!r}, and llama.cpp's command-r turns rope unscaled: it would compute "
            "another model; serve this one with transformers or vLLM"
        )


FAMILIES = (
    Family(
        "Command R",
        "cohere",
        "CohereForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Command R layout (attention and MLP in parallel) is not mapped yet"),
        **no_trainer_model("Command R"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "COMMAND_R", hyperparameters=cohere_hyperparameters, check_config=cohere_checked, vocabulary="bpe"
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)
