"""What the config alone says of a GGUF file, before the model's names are asked of transformers or a weight is read:
llama.cpp's architecture for it, the family's part that writes it, the config as the converter reads it, or the one-line
refusal of a model llama.cpp (or this version of unshard, or the installed gguf-py) does not take."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import families
from ...errors import ConfigMismatchError, UnshardError
from ...families.gguf_hooks import first_of, gguf_py
from ...families.parts import GGUFPart
from . import kquants, vision
from .header import as_the_converter_nests, read_hparams
from .tensors import TYPES

# The sizes under the names the converter also finds them by (find_hparam), as GPT-2's and MPT's configs keep them
SIZE_NAMES = {
    "hidden_size": ("n_embd", "d_model"),
    "num_attention_heads": ("n_head", "n_heads"),
    "num_hidden_layers": ("n_layer", "n_layers", "num_layers"),
}


@dataclass
class GGUFModel:
    """What the config alone says of a GGUF file: llama.cpp's architecture for it and the family's part that writes
    it, the config as the converter reads it, and the file type."""

    hparams: dict[str, Any]  # (the text model's, as the converter reads them)
    config: dict[str, Any]  # (the whole config: a vision-language model's vision_config too)
    where: Path
    architecture: str  # (the config's class)
    family: Any
    part: GGUFPart
    arch: Any  # (gguf-py's MODEL_ARCH)
    file_type: str
    unknown_projector: bool  # (a projector the installed gguf-py lacks: the towers left out, with a note)
    notes: list[str]  # (the family's check_config's)
    vocabulary_folder: Path  # (the folder of the tokenizer the file holds: a drafter's target's, else the model's)
    vocabulary_part: GGUFPart | None  # (the part whose vocabulary the file holds, where a drafter's target's)


def gguf_model(
    requested: str,
    config_folder: Path | None,
    dtype_name: str,
    config_changes: dict[str, Any] | None = None,
    target_from: str | None = None,
) -> GGUFModel:
    """The GGUF file's model as the config alone says it, or the one-line error for a model llama.cpp (or this
    version of unshard, or the installed gguf-py) does not take: made before transformers is asked for the model's
    names, or a weight read. target_from: a drafter's target's folder (--target-from), else the one its config names."""
    gguf = gguf_py()
    if requested.lower().startswith(("q2_k", "q3_k", "iq", "tq", "mxfp4")) and requested not in TYPES:
        raise UnshardError(
            f"--gguf-type {requested}: a llama-quantize type that needs an importance matrix (or that "
            f"unshard does not write yet); write f16 (or f32) here and run `llama-quantize OUT.gguf "
            f"OUT-{requested}.gguf {requested}`, or choose one of {', '.join(TYPES)}"
        )
    if requested not in (*TYPES, "auto"):
        raise UnshardError(
            f"--gguf-type {requested}: not one unshard writes; choose one of {', '.join(TYPES)} (or auto)"
        )
    if config_folder is None or not (config_folder / "config.json").is_file():
        raise UnshardError("GGUF output needs the model's config.json and tokenizer: pass --config-from DIR")
    hparams = {**as_the_converter_nests(read_hparams(config_folder)), **(config_changes or {})}
    where = config_folder / "config.json"
    architecture = (hparams.get("architectures") or [None])[0]
    if architecture is None:
        raise ConfigMismatchError(
            f"{where}: names no architecture (no `architectures`), which a GGUF file's is made from; pass "
            f"--architecture, one of the {len(families.with_part('gguf'))} classes `unshard families --json` lists "
            "with gguf yes"
        )
    family = families.by_architecture(architecture)
    if family is None or not families.supports(family, "gguf"):
        why = family.gguf.reason if family else "not a family unshard knows"
        raise ConfigMismatchError(
            f"{where}: {architecture} is not an architecture unshard writes as GGUF yet ({why}; `unshard families` "
            f"lists the {len(families.with_part('gguf'))} families it writes); write a folder and use llama.cpp's "
            "convert_hf_to_gguf.py"
        )
    part = family.gguf.for_class(architecture)
    config = hparams
    unknown_projector = families.supports(family, "mmproj") and not hasattr(
        gguf.VisionProjectorType, family.mmproj.projector
    )
    # (a vision-language model's text model, as the converter reads it; the vision_config stays, for the mmproj)
    hparams = {**hparams, **(hparams.get("text_config") or {})}
    part = part.for_text_model(hparams.get("model_type"))
    sizes = {key: first_of(hparams, *names) for key, names in SIZE_NAMES.items()}
    hparams = {**{key: size for key, size in sizes.items() if size is not None}, **hparams}
    if part.as_the_converter_reads:
        hparams = part.as_the_converter_reads(hparams, where)
    vocabulary_folder, vocabulary_part = config_folder, None
    if target_from and not part.target:
        raise UnshardError(
            f"--target-from: {architecture} is not a drafter (its file takes no target's vocabulary); leave it out"
        )
    if part.target:  # (a drafter: the vocabulary and sizes of the model it drafts for)
        vocabulary_folder = part.target(hparams, where, Path(target_from).expanduser() if target_from else None)
        target = as_the_converter_nests(read_hparams(vocabulary_folder))
        hparams = {**hparams, "target_config": {**target, **(target.get("text_config") or {})}}
        if part.vocabulary_of_target:
            vocabulary_part = _target_part(target, vocabulary_folder / "config.json")
    # (what llama.cpp would compute otherwise first: no use installing llama.cpp's gguf-py for a model it refuses)
    notes = list((part.check_config and part.check_config(hparams, where)) or ())
    if families.supports(family, "mmproj") and not unknown_projector:  # (and what its towers would compute otherwise)
        vision.tower_sizes(family.mmproj, config, where)
    if requested in kquants.MIXES:  # (a one-line error before anything is written, where no library computes them)
        kquants.library_path(requested)
    arch = _architecture(gguf, (part.arch_by_config and part.arch_by_config(hparams)) or part.arch, architecture, where)
    file_type = requested if requested != "auto" else {"bfloat16": "bf16", "float16": "f16"}.get(dtype_name, "f16")
    return GGUFModel(
        *(hparams, config, where, architecture, family, part, arch, file_type, unknown_projector, notes),
        *(vocabulary_folder, vocabulary_part),
    )


def _target_part(target: dict[str, Any], where: Path) -> GGUFPart:
    """The part of the target's family that writes its vocabulary, as the converter's class of it reads it."""
    architecture = (target.get("architectures") or [None])[0]
    family = families.by_architecture(architecture)
    if family is None or not families.supports(family, "gguf"):
        raise ConfigMismatchError(
            f"{where}: the target model is {architecture}, whose vocabulary unshard does not write as GGUF (`unshard "
            "families` lists those it does); a drafter's file takes its target's"
        )
    return family.gguf.for_class(architecture)


def _architecture(gguf, member: str, architecture: str, where: Path):
    """gguf-py's member for llama.cpp's architecture; where this gguf-py lacks it (PyPI's 0.19 lacks those llama.cpp
    added since: Muse Glimmer's), one line saying how to get llama.cpp's own."""
    arch = getattr(gguf.MODEL_ARCH, member, None)
    if arch is None:
        from importlib.metadata import version

        raise ConfigMismatchError(
            f"{where}: llama.cpp writes {architecture} as gguf-py's MODEL_ARCH.{member}, which the installed gguf-py "
            f"({version('gguf')}) lacks (PyPI's names fewer architectures than llama.cpp's own); install llama.cpp's: "
            "pip install <llama.cpp>/gguf-py (in a llama.cpp checkout, or in llama-cpp-python's source package under "
            "vendor/)"
        )
    return arch
