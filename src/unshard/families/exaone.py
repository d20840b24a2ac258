"""EXAONE 4 (LG AI Research's): q and k normed per head, norms after attention and after the MLP, three sliding-window
layers to each global one; llama.cpp's exaone4, whose converter writes the TextModel's header, the vocabulary's size
and the sliding window's pattern."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import text_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY, llama_computed
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model


def sliding_pattern(hparams: dict) -> list[bool] | None:
    """Which layers have the sliding window, as the converter reads it: the config's layer types, else its pattern
    (a string such as LLLG, or every Nth layer global)."""
    if "layer_types" in hparams:
        return [kind == "sliding_attention" for kind in hparams["layer_types"]]
    pattern, layers = hparams.get("sliding_window_pattern"), hparams["num_hidden_layers"]
    if isinstance(pattern, str) and pattern:
        return [pattern[i % len(pattern)] == "L" for i in range(layers)]
    if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern:
        return [(i + 1) % pattern != 0 for i in range(layers)]
    return None


def exaone4_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Exaone4Model's: the TextModel's, the vocabulary's size, the sliding window and its layers."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_vocab_size(hparams["vocab_size"])
    if hparams.get("sliding_window") is not None:
        writer.add_sliding_window(hparams["sliding_window"])
        pattern = sliding_pattern(hparams)
        if pattern is not None and len(pattern) == hparams["num_hidden_layers"]:
            writer.add_sliding_window_pattern(pattern)


def exaone4_checked(hparams: dict, where: Path) -> None:
    """llama.cpp's exaone4 has sliding windows for the 32B model's 64 layers alone (every fourth layer global, without
    rope); for any other depth it runs every layer global with rope, where transformers would not."""
    pattern = sliding_pattern(hparams) if hparams.get("sliding_window") is not None else None
    if pattern and any(pattern) and hparams["num_hidden_layers"] != 64:
        raise ConfigMismatchError(
            f"{where}: a sliding window on {hparams['num_hidden_layers']} layers, which llama.cpp's exaone4 runs as "
            "global layers with rope (it has sliding windows for 64 layers alone): it would compute another model; "
            "serve this one with transformers or vLLM"
        )


FAMILIES = (
    Family(
        "EXAONE 4",
        "exaone4",
        "Exaone4ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's EXAONE 4 layout (norms after attention and the MLP) is not mapped yet"),
        **no_trainer_model("EXAONE 4"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "EXAONE4",
            hyperparameters=exaone4_hyperparameters,
            computed=llama_computed,
            check_config=exaone4_checked,
            vocabulary="bpe",
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)
