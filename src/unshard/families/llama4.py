"""Llama 4 (`Llama4ForConditionalGeneration`: Scout's and Maverick's layout): a MoE layer every
`interleave_moe_layer_step` layers (experts behind a sigmoid router that scales their input, a shared expert beside),
the others an MLP of their own width (`intermediate_size_mlp`); q and k L2-normed, no rotary embeddings on every fourth
layer and attention in chunks on the others, Llama 3's rope scaling. The text model as llama.cpp's llama4, which fixes
much of that layout in code (the chunks' size, the layers without rope, the attention's temperature): what it fixes is
checked against the config. The experts are held fused as Meta's release has them (gate and up side by side, each
expert's matrices transposed): llama.cpp stacks them apart, llm-compressor makes a Linear layer of each. The vision
tower (patches embedded by one linear layer, a class token, rope in two dimensions, its patches shuffled 2 x 2 into an
MLP) as the mmproj file of llama.cpp's llama4 projector. Its text model alone (`Llama4ForCausalLM`) is the same file
without the tower."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import gguf_py, llama_hyperparameters, mmproj_model_forced_type, rope_parameters
from .llama import TEXT_ONLY, llama_computed
from .parts import (
    DEFAULT_FUSED_SIBLINGS,
    NO_TABLE,
    Family,
    GGUFPart,
    MmprojPart,
    Rearrangement,
    Unsupported,
    transposed,
)
from .vlm import transposed_halves


def llama4_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Llama4Model's: Llama's with the dense layers' width as the model's, then the MoE layers' step
    and the experts' width; no sliding window where every layer attends to all (MobileLLM's)."""
    dense = {**hparams, "intermediate_size": hparams["intermediate_size_mlp"]}
    llama_hyperparameters(writer, dense, ftype, blocks, folder)
    writer.add_interleave_moe_layer_step(hparams["interleave_moe_layer_step"])
    writer.add_expert_feed_forward_length(hparams["intermediate_size"])
    if "layer_types" in hparams and all(kind == "full_attention" for kind in hparams["layer_types"]):
        writer.add_sliding_window(0)


def llama4_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's llama4 computes whatever the file says: attention in chunks of 8192 tokens on three layers in
    four and the fourth without rope, the attention's temperature over 8192 positions at 0.1, q and k normed but
    with 128 experts, a MoE layer every `interleave_moe_layer_step` layers, SiLU."""
    layers, step = hparams["num_hidden_layers"], hparams["interleave_moe_layer_step"]
    experts = hparams["num_local_experts"]
    every_fourth = [int((i + 1) % 4 != 0) for i in range(layers)]
    chunked = ["chunked_attention" if rope else "full_attention" for rope in every_fourth]
    runs = {
        "no_rope_layers": (list(hparams.get("no_rope_layers") or every_fourth), every_fourth),
        "layer_types": (list(hparams.get("layer_types") or chunked), chunked),
        "attention_chunk_size": (hparams.get("attention_chunk_size"), 8192),
        "attn_temperature_tuning": (hparams.get("attn_temperature_tuning", True), True),
        "floor_scale": (hparams.get("floor_scale", 8192), 8192),
        "attn_scale": (hparams.get("attn_scale", 0.1), 0.1),
        "use_qk_norm": (hparams.get("use_qk_norm", True), experts != 128),
        "moe_layers": (
            list(hparams.get("moe_layers") or range(step - 1, layers, step)),
            list(range(step - 1, layers, step)),
        ),
        "hidden_act": (hparams.get("hidden_act", "silu"), "silu"),
    }
    for key, (found, computed) in runs.items():
        if found != computed:
            raise ConfigMismatchError(
                f"{where}: text_config's {key} is {found}, and llama.cpp's llama4 computes {computed} (with "
                f"{experts} experts): it would compute another model; serve this one with transformers or vLLM"
            )


def llama4_experts(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """The fused experts as llama.cpp stacks them (and llm-compressor makes Linear layers of them): gate_up_proj
    (experts x hidden x gate's and up's columns) as gate's and up's stacks, each expert [intermediate, hidden], and
    down_proj (experts x intermediate x hidden) each expert transposed."""
    if name.endswith(".experts.gate_up_proj"):
        stack, base = (shape[0], shape[2] // 2, shape[1]), name.removesuffix("gate_up_proj")
        return Rearrangement({base + "gate_proj.weight": stack, base + "up_proj.weight": stack}, transposed_halves)
    if name.endswith(".experts.down_proj"):
        return Rearrangement({name + ".weight": (shape[0], shape[2], shape[1])}, transposed)
    return None


def llama4_vision_sizes(vision: dict, where: Path) -> dict:
    """The tower as llama.cpp's llama4 projector runs it: rope at base 10000 whatever the file says, and the pixel
    shuffle merging n x n patches, n a whole number (the converter writes 1 / pixel_shuffle_ratio rounded down). Its
    MLPs run GELU whatever hidden_act says, as transformers' do (the converter asserts "gelu")."""
    theta = rope_parameters(vision)[1].get("rope_theta", 10000)
    if theta != 10000:
        raise ConfigMismatchError(
            f"{where}: the vision tower's rope_theta is {theta}, and llama.cpp's llama4 projector turns its rope at "
            "10000; serve this model with transformers or vLLM"
        )
    ratio = vision.get("pixel_shuffle_ratio", 0.5)
    if not ratio or (1 / ratio) != int(1 / ratio):
        raise ConfigMismatchError(
            f"{where}: the vision tower's pixel_shuffle_ratio is {ratio}, and llama.cpp's llama4 projector merges "
            "n x n patches, 1 / ratio a whole number; serve this model with transformers or vLLM"
        )
    return vision


def llama4_vision_name(name: str) -> str:
    """The Hub's names as the converter maps them: the position embedding (a parameter) as a weight, the projector's
    one linear layer as llama.cpp's `mm.model.fc`. But the norm before each layer's MLP: gguf-py 0.19 maps its name to
    Gemma 4's norm after attention (`attn_post_norm`, its later entry for the same name), which llama.cpp's llama4
    graph then applies to the attention's output, leaving the MLP's input unnormed: the converter's file computes
    another tower. It is written where that graph reads it, `ln2`."""
    gguf = gguf_py()
    name = name.removeprefix("model.")
    if name == "multi_modal_projector.linear_1.weight":
        return gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.V_MMPROJ_FC] + ".weight"
    found = re.fullmatch(r"vision_model\.model\.layers\.(\d+)\.post_attention_layernorm\.(weight|bias)", name)
    if found:
        block, kind = found.groups()
        return gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.V_ENC_POST_ATTN_NORM].format(bid=block) + "." + kind
    return name + ".weight" if name.endswith("positional_embedding_vlm") else name


def llama4_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The tower's norm epsilon, the pixel shuffle's n, GELU."""
    writer.add_vision_attention_layernorm_eps(vision.get("norm_eps", 1e-5))
    writer.add_vision_projector_scale_factor(int(1 / vision.get("pixel_shuffle_ratio", 0.5)))
    writer.add_vision_use_gelu(True)


LLAMA4_MMPROJ = MmprojPart(
    "LLAMA4",
    r"^(?:model\.)?(?:vision_model|multi_modal_projector)\.",
    llama4_vision_sizes,
    llama4_projector_keys,
    forced_type=mmproj_model_forced_type,
    converter_name=llama4_vision_name,
    note="llama.cpp's llama4 projector gives an image's tokens column by column, where transformers gives them row by "
    "row (its pixel shuffle lacks transformers' last transpose): the text model reads them in an order not trained on",
)

LLAMA4 = GGUFPart(
    "LLAMA4",
    hyperparameters=llama4_hyperparameters,
    computed=llama_computed,
    check_config=llama4_checked,
    vocabulary="bpe",
    rearranged=llama4_experts,
)

LLAMA4_FAMILY = Family(
    "Llama 4",
    "llama4",
    "Llama4ForConditionalGeneration",
    tensors=NO_TABLE,
    megatron=Unsupported("Megatron's Llama 4 layout is not mapped yet"),
    meta_names=Unsupported(
        "torchtitan 0.3 and torchtune 0.6.1 have no Llama 4 model (torchtitan's main branch has one, unreleased)",
        applies=False,
    ),
    fused_siblings=DEFAULT_FUSED_SIBLINGS,
    gguf=LLAMA4,
    mmproj=LLAMA4_MMPROJ,
    moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    linearized=llama4_experts,
    notes={
        "quantize": "each expert's projections Linear layers, as llm-compressor makes them",
        "mmproj": "yes: the converter's file with each layer's norm before its MLP where llama.cpp reads it (ln2); "
        "llama.cpp gives an image's tokens column by column, transformers row by row",
    },
)

FAMILIES = (
    LLAMA4_FAMILY,
    replace(  # (its text model alone, as Llama4ForCausalLM holds and saves it)
        LLAMA4_FAMILY,
        name="Llama 4 (text)",
        model_type="llama4_text",
        architecture="Llama4ForCausalLM",
        mmproj=TEXT_ONLY,
        notes={
            "quantize": "each expert's projections Linear layers, as for the whole model (not compared: "
            "llm-compressor 0.14 quantizes no Llama4ForCausalLM, its Llama 4 code reads the whole model's config)"
        },
    ),
)
