"""GPT-2 (OpenAI's, `GPT2LMHeadModel`): learned positions, LayerNorms with biases, q, k and v in one Conv1D layer, a
two-layer GELU MLP four times the width, the head tied to the embedding; llama.cpp's gpt2, whose converter stores the
Conv1D layers' weights transposed (as Linear layers hold them) and writes a header of its own."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import first_of
from .llama import TEXT_ONLY
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Rearrangement, Unsupported, no_trainer_model, transposed

CONV1D = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")  # (inputs by outputs, where a Linear's are the other way)


def gpt2_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's GPT2Model's, in its order (its context from n_ctx, which transformers 5 calls n_positions)."""
    writer.add_block_count(blocks)
    writer.add_context_length(first_of(hparams, "n_ctx", "n_positions"))
    writer.add_embedding_length(hparams["n_embd"])
    writer.add_feed_forward_length(4 * hparams["n_embd"])
    writer.add_head_count(hparams["n_head"])
    writer.add_layer_norm_eps(hparams["layer_norm_epsilon"])
    writer.add_file_type(ftype)


def gpt2_checked(hparams: dict, where: Path) -> None:
    """An MLP other than four times the width, which the converter's header says whatever the config's n_inner."""
    width = hparams["n_embd"]
    if (hparams.get("n_inner") or 4 * width) != 4 * width:
        raise ConfigMismatchError(f"{where}: n_inner is {hparams['n_inner']}, and llama.cpp's gpt2 takes 4 x {width}")


def conv1d_as_linear(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """A Conv1D layer's weight transposed, as the converter stores it: its rows become columns, so a band is the whole
    tensor."""
    if not name.endswith(CONV1D) or len(shape) != 2:
        return None
    return Rearrangement({name: (shape[1], shape[0])}, transposed, shape[0])


FAMILIES = (
    Family(
        "GPT-2",
        "gpt2",
        "GPT2LMHeadModel",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's GPT-2 layout (learned positions, LayerNorms) is not mapped yet"),
        **no_trainer_model("GPT-2"),
        # (llm-compressor's schemes take Linear layers, and leaves Conv1D ones as they are)
        fused_siblings=Unsupported("GPT-2's layers are Conv1D, whose weights compressed-tensors' schemes do not take"),
        gguf=GGUFPart(
            "GPT2",
            hyperparameters=gpt2_hyperparameters,
            check_config=gpt2_checked,
            vocabulary="bpe",
            rearranged=conv1d_as_linear,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)
