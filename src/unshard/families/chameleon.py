"""Chameleon (`ChameleonForConditionalGeneration`): a Llama whose q and k are LayerNormed per head, beside a VQ-VAE
that turns images into tokens of the same vocabulary. To GGUF as llama.cpp's chameleon: the text model as the
converter writes it (q's and k's rows and their norms reordered for llama.cpp's rotary by pairs), the image tokenizer
left out, as the converter leaves it (llama.cpp reads no images of Chameleon). Where the converter writes head 0's
norm for every head (Meta's release has one norm shared by all, which transformers' conversion repeated), unshard
writes each head's own: the norms a model trained in transformers has, which llama.cpp takes per head."""

from __future__ import annotations

from pathlib import Path

from .gguf_hooks import text_hyperparameters
from .parts import GGUFPart, Rearrangement, Unsupported, multimodal_family


def chameleon_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The TextModel's, then whether the norms come after attention and the MLP (Chameleon-30B's swin norm)."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_swin_norm(bool(hparams.get("swin_norm", False)))


def head_norms_by_pairs(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """q's and k's norms [heads, head_dim], each head's reordered from transformers' halves to llama.cpp's pairs, as
    q's and k's rows are (the converter reorders head 0's alone and repeats it)."""
    if name.endswith(("q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias")):
        return Rearrangement({name: shape}, halves_to_pairs, shape[0])
    return None


def halves_to_pairs(band) -> tuple:
    """Each row's first and second halves interleaved: (a0, b0, a1, b1, ...)."""
    heads, width = band.shape
    return (band.reshape(heads, 2, width // 2).swapaxes(1, 2).reshape(heads, width),)


FAMILIES = (
    multimodal_family(
        "Chameleon",
        "chameleon",
        "ChameleonForConditionalGeneration",
        GGUFPart(
            "CHAMELEON",
            hyperparameters=chameleon_hyperparameters,
            permute_qk=True,
            rearranged=head_norms_by_pairs,
            towers=r"^model\.vqmodel\.",
        ),
        Unsupported("llama.cpp reads no images of Chameleon: its image tokenizer (a VQ-VAE) is left out"),
        "its VQ-VAE image tokenizer",
    ),
)
