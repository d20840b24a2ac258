"""GPTBigCode (BigCode's StarCoder and SantaCoder): GPT-2's layout with Linear layers, multi-query attention (one key
and value head, q, k and v in one tensor), learned positions, the head tied to the embedding; llama.cpp's starcoder,
whose converter writes a header of its own (one key-value head, four times the width as the MLP's)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .llama import TEXT_ONLY
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model


def starcoder_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's StarCoderModel's, in its order."""
    writer.add_context_length(hparams["n_positions"])
    writer.add_embedding_length(hparams["n_embd"])
    writer.add_feed_forward_length(4 * hparams["n_embd"])
    writer.add_block_count(blocks)
    writer.add_head_count(hparams["n_head"])
    writer.add_head_count_kv(1)
    writer.add_layer_norm_eps(hparams["layer_norm_epsilon"])
    writer.add_file_type(ftype)


def starcoder_checked(hparams: dict, where: Path) -> None:
    """What the converter's header would say otherwise than the model: a key-value head per head, an MLP other than
    four times the width."""
    width = hparams["n_embd"]
    if not hparams.get("multi_query", True):
        raise ConfigMismatchError(
            f"{where}: multi_query is false, and llama.cpp's starcoder takes one key-value head; serve this model with "
            "transformers or vLLM"
        )
    if (hparams.get("n_inner") or 4 * width) != 4 * width:
        raise ConfigMismatchError(
            f"{where}: n_inner is {hparams['n_inner']}, and llama.cpp's starcoder takes 4 x {width}"
        )


FAMILIES = (
    Family(
        "GPTBigCode (StarCoder)",
        "gpt_bigcode",
        "GPTBigCodeForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported(
            "Megatron's StarCoder layout (multi-query attention, learned positions) is not mapped yet"
        ),
        **no_trainer_model("StarCoder"),
        fused_siblings=(),  # (q, k and v are one layer already)
        gguf=GGUFPart(
            "STARCODER", hyperparameters=starcoder_hyperparameters, check_config=starcoder_checked, vocabulary="bpe"
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)
