"""SmolVLM and Idefics3 (`SmolVLMForConditionalGeneration`, `Idefics3ForConditionalGeneration`): a Llama beside a
SigLIP tower whose patches the connector shuffles n x n into the image's tokens, one linear layer to the text model's
width. The text model as llama.cpp's llama (the converter finds it by text_config's class, VLlama3ForCausalLM in the
Hub's SmolVLM checkpoints), the tower and the connector as the mmproj file of llama.cpp's idefics3 projector."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import mmproj_model_forced_type
from .llama import GGUF as LLAMA
from .parts import MmprojPart, multimodal_family

# SmolVLM 2's tower config (model_type smolvlm_vision) leaves out sizes transformers defaults: the converter fills them
SMOLVLM_VISION_DEFAULTS = {"hidden_size": 1152, "num_attention_heads": 16, "intermediate_size": 3072}


def idefics3_checked(hparams: dict, where: Path) -> None:
    """The text model llama.cpp's llama runs: a Llama (the converter reads another by its own class, if at all)."""
    found = hparams.get("model_type")
    if found != "llama":
        raise ConfigMismatchError(
            f"{where}: text_config's model_type is {found!r}, and unshard writes SmolVLM's and Idefics3's text model "
            "as a Llama; write a folder and use llama.cpp's convert_hf_to_gguf.py"
        )


def idefics3_vision_sizes(vision: dict, where: Path) -> dict:
    """The tower as the converter reads it, SmolVLM 2's missing sizes defaulted; an activation other than GELU, which
    llama.cpp's siglip graph runs (as tanh's approximation), is refused."""
    if vision.get("model_type") == "smolvlm_vision":
        vision = {**SMOLVLM_VISION_DEFAULTS, **vision}
    act = vision.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu"):
        raise ConfigMismatchError(
            f"{where}: the vision tower's hidden_act is {act!r}, and llama.cpp's idefics3 projector runs GELU; serve "
            "this model with transformers or vLLM"
        )
    return vision


def idefics3_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The tower's norm epsilon, the connector's n (scale_factor), GELU, and the image processor's longest edge, which
    mtmd resizes images to before it cuts them into tiles of the tower's size."""
    writer.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-5))
    writer.add_vision_projector_scale_factor(hparams.get("scale_factor", 2))
    writer.add_vision_use_gelu(True)
    writer.add_vision_preproc_image_size((processor.get("size") or {}).get("longest_edge", vision["image_size"]))


def idefics3_forced_type(gguf, source: str, name: str, shape: tuple[int, ...], qtype, file_type: str):
    """The converter's SmolVLM: the tower's embeddings (patches, positions) in F32 whatever the file's type."""
    if ".embeddings." in source:
        return gguf.GGMLQuantizationType.F32
    return mmproj_model_forced_type(gguf, source, name, shape, qtype, file_type)


IDEFICS3_MMPROJ = MmprojPart(
    "IDEFICS3",
    r"^(?:model\.)?(?:vision_model|connector)\.",
    idefics3_vision_sizes,
    idefics3_projector_keys,
    forced_type=idefics3_forced_type,
)
# (the converter's LlamaModel drops `text_model.` from the names, as it does `language_model.`)
IDEFICS3_TEXT = replace(LLAMA, renames=((r"text_model\.", ""),), check_config=idefics3_checked)


FAMILIES = tuple(
    multimodal_family(name, model_type, architecture, IDEFICS3_TEXT, IDEFICS3_MMPROJ, "its SigLIP tower")
    for name, model_type, architecture in (
        ("SmolVLM", "smolvlm", "SmolVLMForConditionalGeneration"),
        ("Idefics3", "idefics3", "Idefics3ForConditionalGeneration"),
    )
)
