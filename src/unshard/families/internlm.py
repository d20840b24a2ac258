"""InternLM3 (Shanghai AI Lab's `InternLM3ForCausalLM`, which transformers 5 builds as a Llama): Llama's layout, as
llama.cpp's llama, the converter's InternLM3Model's file: q and k reordered per head as Llama's, the vocabulary's size
and the rotary width in the header, its SentencePiece vocabulary with the tokenizer's space prefix before the special
ids and its chat's end as the end of a sequence (sinks/gguf/vocabulary.py)."""

from __future__ import annotations

from pathlib import Path

from .gguf_hooks import text_hyperparameters
from .llama import TEXT_ONLY
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model


def internlm3_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The TextModel's, then the vocabulary's size and the rotary width (a head's), as the converter writes them."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_vocab_size(hparams["vocab_size"])
    writer.add_rope_dimension_count(hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"])


FAMILIES = (
    Family(
        "InternLM3",
        "internlm3",
        "InternLM3ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's InternLM3 layout is not mapped yet"),
        **no_trainer_model("InternLM3"),
        fused_siblings=Unsupported(
            "not yet compared with what llm-compressor writes for InternLM3 (its pinned transformers has none)"
        ),
        gguf=GGUFPart("LLAMA", hyperparameters=internlm3_hyperparameters, permute_qk=True, vocabulary="internlm3"),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)
