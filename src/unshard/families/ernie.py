"""ERNIE 4.5 (Baidu's dense models): Llama's layout whose rotary turns interleaved pairs, a SentencePiece vocabulary;
llama.cpp's ernie4_5, the converter's TextModel header and the tokenizer's space prefix after the vocabulary."""

from __future__ import annotations

from pathlib import Path

from .gguf_hooks import json_or_empty
from .llama import SIBLINGS, TEXT_ONLY
from .parts import NO_META_NAMES, NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported


def ernie_space_prefix(writer, hparams: dict, folder: Path) -> None:
    """Whether the tokenizer puts a space before the text, where tokenizer_config.json says, as the converter."""
    config = json_or_empty(folder / "tokenizer_config.json")
    if "add_prefix_space" in config:
        writer.add_add_space_prefix(config["add_prefix_space"])


FAMILIES = (
    Family(
        "ERNIE 4.5",
        "ernie4_5",
        "Ernie4_5ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's ERNIE 4.5 layout is not mapped yet"),
        meta_names=NO_META_NAMES,
        fused_siblings=SIBLINGS,
        gguf=GGUFPart("ERNIE4_5", after_vocabulary=ernie_space_prefix),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)
