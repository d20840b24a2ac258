"""InternLM (Shanghai AI Lab's models).

InternLM2 (`InternLM2ForCausalLM`, custom code: transformers has no class of it; xtuner, InternLM's trainer, ships the
Hub's model): Llama's computation under names of its own, q, k and v in one tensor `wqkv` group by group (each
key-value group's query heads, then its key, then its value). GGUF: llama.cpp's internlm2, the converter's
InternLM2Model's file: wqkv cut into q, k and v, q and k reordered per head as Llama's, InternLM2's vocabulary
(sinks/gguf/internlm2_vocabulary.py).

InternLM3 (`InternLM3ForCausalLM`, which transformers 5 builds as a Llama): Llama's layout, as llama.cpp's llama, the
converter's InternLM3Model's file: q and k reordered per head as Llama's, the vocabulary's size and the rotary width in
the header, its SentencePiece vocabulary with the tokenizer's space prefix before the special ids and its chat's end as
the end of a sequence (sinks/gguf/vocabulary.py)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import rope_parameters, text_hyperparameters
from .llama import TEXT_ONLY
from .parts import (
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    Rearrangement,
    Unsupported,
    no_trainer_model,
    pairs_from_halves,
)


def internlm2_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The TextModel's, without InternLM2's dynamic NTK scaling, which the converter writes nothing of."""
    if rope_parameters(hparams)[1].get("rope_type") == "dynamic":
        hparams = {**hparams, "rope_scaling": None, "rope_parameters": None}
    text_hyperparameters(writer, hparams, ftype, blocks, folder)


def internlm2_checked(hparams: dict, where: Path) -> list[str]:
    """Refuses biases (the converter cuts wqkv's weight alone, and llama.cpp's internlm2 has none); notes the dynamic
    NTK scaling of InternLM2.5's rope, which llama.cpp does not compute: the same model up to the trained context."""
    if hparams.get("bias"):
        raise ConfigMismatchError(
            f"{where}: bias is set, and llama.cpp's internlm2 has no biases (InternLM2's releases have none); serve "
            "this model with transformers or vLLM"
        )
    rope = rope_parameters(hparams)[1]
    if rope.get("rope_type") == "dynamic":
        return [
            f"llama.cpp turns rope without InternLM2's dynamic NTK scaling (factor {rope.get('factor')}), which "
            f"changes nothing up to the trained context of {hparams.get('max_position_embeddings')} tokens: past it, "
            "llama.cpp computes otherwise"
        ]
    return []


def wqkv_cut(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """wqkv as the converter writes it: each group's query heads into q, its key into k, its value into v, q's and k's
    rows of each head from halves into pairs (llama.cpp's rope). A band is whole groups."""
    if not name.endswith(".attention.wqkv.weight"):
        return None
    heads, groups = hparams["num_attention_heads"], hparams.get("num_key_value_heads") or hparams["num_attention_heads"]
    head = hparams["hidden_size"] // heads
    if heads % groups or shape[0] != (heads + 2 * groups) * head:
        raise ConfigMismatchError(
            f"{where}: {name} has {shape[0]} rows, not {heads} query and {groups} key and value heads of {head}; "
            "pass --config-from the model's own folder"
        )
    attention = name.removesuffix("wqkv.weight")
    per_group = heads // groups
    cut = {
        attention + "wq.weight": (heads * head, shape[1]),
        attention + "wk.weight": (groups * head, shape[1]),
        attention + "wv.weight": (groups * head, shape[1]),
    }
    order = pairs_from_halves(head, head, 0)
    return Rearrangement(cut, partial(groups_cut, per_group=per_group, order=order), (per_group + 2) * head)


def groups_cut(band, per_group: int, order: tuple[int, ...]) -> tuple:
    """Whole groups' rows (per_group query heads, a key, a value, each of len(order) rows) as q, k and v, q's and k's
    heads' rows in `order` (llama.cpp's pairs)."""
    columns = band.shape[-1]
    rows = band.reshape(-1, per_group + 2, len(order), columns)
    paired = rows[:, :, list(order)]
    return (
        paired[:, :per_group].reshape(-1, columns),
        paired[:, per_group].reshape(-1, columns),
        rows[:, per_group + 1].reshape(-1, columns),
    )


def internlm3_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The TextModel's, then the vocabulary's size and the rotary width (a head's), as the converter writes them."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_vocab_size(hparams["vocab_size"])
    writer.add_rope_dimension_count(hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"])


FAMILIES = (
    Family(
        "InternLM2",
        "internlm2",
        "InternLM2ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's InternLM2 layout is not mapped yet"),
        **no_trainer_model("InternLM2"),
        fused_siblings=Unsupported(
            "llm-compressor, the oracle of --quantize, quantizes transformers' models, and InternLM2's is custom code"
        ),
        gguf=GGUFPart(
            "INTERNLM2",
            check_config=internlm2_checked,
            hyperparameters=internlm2_hyperparameters,
            vocabulary="internlm2",
            rearranged=wqkv_cut,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
        notes={"gguf": "llama.cpp's internlm2, with InternLM2's SentencePiece vocabulary"},
    ),
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
