"""LFM2 (Liquid's `Lfm2ForCausalLM`): most layers a gated short convolution (in_proj to three widths, a causal depthwise
convolution of a few taps, out_proj), the others grouped-query attention with q and k normed per head, every layer
with a SwiGLU MLP (w1, w3, w2) whose width the config derives; llama.cpp's lfm2, the convolution's kernel 2-D and the
attention's key-value heads per layer (none on the convolution layers), as the converter writes them. LFM2-MoE
(`Lfm2MoeForCausalLM`, llama.cpp's lfm2moe): after its dense first layers, experts behind a sigmoid router with a
bias in place of the MLP. LFM2-VL (`Lfm2VlForConditionalGeneration`): LFM2 beside SigLIP2's NaFlex tower, its patches
shuffled 2 x 2 into a normed MLP: the tower as the mmproj file of llama.cpp's lfm2 projector."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import gguf_py, gguf_quiet, mmproj_model_forced_type, text_hyperparameters
from .llama import TEXT_ONLY
from .parts import (
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    MmprojPart,
    Rearrangement,
    Unsupported,
    middle_axis_dropped,
    no_trainer_model,
    patch_embedding_as_convolution,
)
from .sentence_transformers import dense_weight, pooled


def lfm2_layer_kinds(hparams: dict) -> list[str]:
    """Each layer's kind ("conv" or "full_attention"): layer_types, or as transformers derives them from
    full_attn_idxs."""
    if hparams.get("layer_types"):
        return list(hparams["layer_types"])
    attention = set(hparams.get("full_attn_idxs") or [])
    return ["full_attention" if i in attention else "conv" for i in range(hparams["num_hidden_layers"])]


def lfm2_ffn_width(hparams: dict) -> int:
    """The MLP's width as transformers builds it (and the converter writes it): two thirds of intermediate_size, times
    the multiplier, rounded up to a multiple, where block_auto_adjust_ff_dim says so."""
    width = hparams.get("block_ff_dim") or hparams["intermediate_size"]
    if hparams.get("block_auto_adjust_ff_dim", True):
        width = int(2 * width / 3)
        if hparams.get("block_ffn_dim_multiplier") is not None:
            width = int(hparams["block_ffn_dim_multiplier"] * width)
        multiple = hparams.get("block_multiple_of", 256)
        width = multiple * ((width + multiple - 1) // multiple)
    return width


def lfm2_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's LFM2Model's: the TextModel's with key-value heads on the attention layers alone, then the
    vocabulary's size, the convolution's cache length, the norm epsilon and the MLP's width (both written again, as
    the converter does: the second value counts)."""
    heads = [hparams["num_key_value_heads"] if kind != "conv" else 0 for kind in lfm2_layer_kinds(hparams)]
    text_hyperparameters(writer, {**hparams, "num_key_value_heads": heads}, ftype, blocks, folder)
    writer.add_vocab_size(hparams["vocab_size"])
    writer.add_shortconv_l_cache(hparams["conv_L_cache"])
    with gguf_quiet():
        writer.add_layer_norm_rms_eps(hparams["norm_eps"])
        writer.add_feed_forward_length(lfm2_ffn_width(hparams))
    if lfm2_layers_alone(hparams):
        if (hparams.get("architectures") or [None])[0] == BIDIRECTIONAL:
            writer.add_causal_attention(False)
        pooled(writer, hparams, folder)


# LFM2.5's embedding models' class (Liquid's own code): the layers alone, their attention over every token
BIDIRECTIONAL = "Lfm2BidirectionalModel"


def lfm2_layers_alone(hparams: dict) -> bool:
    """LFM2's layers without the head (`Lfm2Model`, `Lfm2BidirectionalModel`): LFM2.5's embedding and ColBERT
    models'."""
    return (hparams.get("architectures") or [None])[0] in ("Lfm2Model", BIDIRECTIONAL)


def lfm2_dense(writer, hparams: dict, folder: Path) -> dict:
    """The layers-alone model's projection after them, which the converter reads from 1_Dense/model.safetensors
    (whatever modules.json says) as dense_2, its width first in the header."""
    if not lfm2_layers_alone(hparams) or not (folder / "1_Dense" / "model.safetensors").is_file():
        return {}
    weight = dense_weight(folder, "1_Dense")
    writer.add_embedding_length_out(weight.shape[0])
    return {"dense_2.weight": weight}


def lfm2moe_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's LFM2MoeModel's: the TextModel's with key-value heads on the attention layers alone, then the
    experts' width, the dense first layers, the sigmoid gating, the vocabulary's size, the convolution's cache."""
    heads = [hparams["num_key_value_heads"] if kind != "conv" else 0 for kind in lfm2_layer_kinds(hparams)]
    text_hyperparameters(writer, {**hparams, "num_key_value_heads": heads}, ftype, blocks, folder)
    writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
    writer.add_leading_dense_block_count(hparams["num_dense_layers"])
    writer.add_expert_gating_func(gguf_py().ExpertGatingFuncType.SIGMOID)
    writer.add_vocab_size(hparams["vocab_size"])
    writer.add_shortconv_l_cache(hparams["conv_L_cache"])


def lfm2_checked(hparams: dict, where: Path) -> None:
    """llama.cpp's lfm2 convolution has no biases."""
    if hparams.get("conv_bias"):
        raise ConfigMismatchError(
            f"{where}: conv_bias is set, and llama.cpp's lfm2 convolution has no biases; serve this model with "
            "transformers or vLLM"
        )


def lfm2_kernel(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """The depthwise convolution's kernel (channels x 1 x taps) 2-D, as the converter squeezes it."""
    if not name.endswith("conv.conv.weight"):
        return None
    return Rearrangement({name: (shape[0], shape[-1])}, middle_axis_dropped)


def lfm2vl_sizes(vision: dict, where: Path) -> dict:
    """SigLIP2's tower as the converter reads it: the image size it writes, 256, whatever the positions' grid."""
    return {**vision, "image_size": 256}


def lfm2vl_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The tower's norm epsilon, the pixel unshuffle's n (downsample_factor), GELU."""
    writer.add_vision_attention_layernorm_eps(vision["layer_norm_eps"])
    writer.add_vision_projector_scale_factor(hparams.get("downsample_factor", 2))
    writer.add_vision_use_gelu(True)


def lfm2vl_tower_name(name: str) -> str:
    """The Hub's names, as the converter maps them: the tower's under `vision_tower.vision_model.` (transformers 5
    saves them without `vision_model.`), the projector's without `model.`."""
    name = name.removeprefix("model.")
    if name.startswith("vision_tower.") and not name.startswith("vision_tower.vision_model."):
        return "vision_tower.vision_model." + name.removeprefix("vision_tower.")
    return name


def lfm2vl_patch_embedding(name: str, shape: tuple[int, ...], vision: dict) -> Rearrangement | None:
    """SigLIP2's patch embedding, a linear layer over each patch's pixels, as the converter's 2-D convolution."""
    return patch_embedding_as_convolution(name, shape) if name.endswith("embeddings.patch_embedding.weight") else None


def lfm2vl_checked(hparams: dict, where: Path) -> None:
    """LFM2's checks, and the projector as llama.cpp's lfm2 computes it: GELU, over the tower's last layer. (A
    vision_feature_layer other than -1, which transformers ignores, running the whole tower, makes the converter write
    fewer blocks: the two files would compute different models.)"""
    act = hparams.get("projector_hidden_act", "gelu")
    if act != "gelu":
        raise ConfigMismatchError(
            f"{where}: projector_hidden_act is {act!r}, and llama.cpp's lfm2 projector runs GELU: its images would be "
            "another model's; serve this one with transformers or vLLM"
        )
    layer = hparams.get("vision_feature_layer", -1)
    if layer != -1:
        raise ConfigMismatchError(
            f"{where}: vision_feature_layer is {layer}, which transformers ignores (it runs the whole tower) and "
            "llama.cpp's converter follows (it writes fewer blocks); remove it from config.json to write the tower "
            "as transformers runs it"
        )
    lfm2_checked(hparams, where)


LFM2 = GGUFPart(
    "LFM2",
    hyperparameters=lfm2_hyperparameters,
    check_config=lfm2_checked,
    rearranged=lfm2_kernel,
    beside_model=lfm2_dense,
    renames=((r"^(embed_tokens|embedding_norm|layers)\.", r"model.\1."),),  # (Lfm2Model's, as the converter names them)
)
LFM2VL_MMPROJ = MmprojPart(
    "LFM2",
    r"^(?:model\.)?(?:vision_tower|multi_modal_projector)\.",
    lfm2vl_sizes,
    lfm2vl_projector_keys,
    forced_type=mmproj_model_forced_type,
    converter_name=lfm2vl_tower_name,
    rearranged=lfm2vl_patch_embedding,
)

FAMILIES = (
    Family(
        "LFM2",
        "lfm2",
        "Lfm2ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's LFM2 layout (short convolutions) is not mapped yet"),
        **no_trainer_model("LFM2"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"), ("w1", "w3")),
        gguf=LFM2,
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
        # (its layers alone: LFM2.5's ColBERT models, and attending both ways, its embedding models; the class
        # Liquid's own code names)
        also=("Lfm2Model", BIDIRECTIONAL, "LFM2ForCausalLM"),
    ),
    Family(
        "LFM2-VL",
        "lfm2_vl",
        "Lfm2VlForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's LFM2 layout (short convolutions) is not mapped yet"),
        **no_trainer_model("LFM2-VL"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"), ("w1", "w3")),
        gguf=replace(LFM2, check_config=lfm2vl_checked),
        mmproj=LFM2VL_MMPROJ,
        moe_layout=NOT_A_MOE_INPUT,
    ),
    Family(
        "LFM2-MoE",
        "lfm2_moe",
        "Lfm2MoeForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's LFM2 layout (short convolutions) is not mapped yet"),
        **no_trainer_model("LFM2-MoE"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"), ("w1", "w3")),
        gguf=GGUFPart(
            "LFM2MOE",
            hyperparameters=lfm2moe_hyperparameters,
            check_config=lfm2_checked,
            rearranged=lfm2_kernel,
            # (the converter's names: the router's bias as a bias, the stacked experts without `model.`)
            renames=(
                (r"\.expert_bias$", ".expert_bias.bias"),
                (r"^model\.(layers\.\d+\.feed_forward\.experts\.)", r"\1"),
            ),
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    ),
)
