"""The Qwen vision-language models verl trains with FSDP: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, Qwen3.5 (its
text model Qwen3-Next's layers: qwen_next.py; Llama 3.2 Vision is mllama.py). They convert from rank files, DCP and
DeepSpeed by transformers' own names (save_pretrained's `visual.*` / `model.*`), and quantize with their vision
towers left as they are (Qwen3-VL-MoE's fused experts as llm-compressor makes Linear layers of them). The Qwen models
go to GGUF too, as llama.cpp's converter writes them: the text model as llama.cpp's qwen2vl, qwen3vl, qwen3vlmoe or
qwen35 (M-RoPE's sections in the header; the experts stacked), the vision tower and its patch merger as the mmproj
file (q, k and v apart, the Conv3D patch embedding as two 2-D ones)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from ..names.meta_rules import Fused, Reshaped, Zeros, torchtitan_routed_experts
from .gguf_hooks import mmproj_model_forced_type, text_hyperparameters
from .parts import (
    DEFAULT_FUSED_SIBLINGS,
    LLAMA_CPP_GGUF_PY,
    NO_META_NAMES,
    NO_TABLE,
    NO_TORCHTITAN_NAMES,
    Family,
    GGUFPart,
    MmprojPart,
    Rearrangement,
    Unsupported,
    renamed_only,
    transposed,
)
from .qwen4_exp import QWEN4EXP_GGUF
from .qwen_moe import routing_checked
from .qwen_next import deltanet_gguf, qwen35_hyperparameters

MEGATRON = Unsupported("verl's Megatron vision-language layouts are not mapped yet")
NO_MOE = Unsupported("a dense family; merge-moe assembles no MoE from vision-language models", applies=False)

# torchtitan's Qwen3.5 (its Qwen35StateDictAdapter, torchtitan 0.3): the text model's names as its other models', the
# linear attention's fused q/k/v projection and convolution each three tensors, the vision tower's blocks as
# `vision_encoder.layers`, their fused qkv three, its patch embedding (transformers' Conv3d) a Linear layer. No rows
# permuted: torchtitan's multimodal rotary turns halves of each head, as transformers'.
_T, _V = "model.language_model.layers.{i}.", "model.visual.blocks.{i}."
# (the linear attention's q, k and v rows, in the fused projection and convolution: heads and their width)
_DELTANET_PARTS = {
    "q": ("linear_num_key_heads", "linear_key_head_dim"),
    "k": ("linear_num_key_heads", "linear_key_head_dim"),
    "v": ("linear_num_value_heads", "linear_value_head_dim"),
}
TORCHTITAN_QWEN35 = {
    "tok_embeddings.weight": ("model.language_model.embed_tokens.weight", None),
    "norm.weight": ("model.language_model.norm.weight", None),
    "lm_head.weight": ("lm_head.weight", None),
    **{f"layers.{{i}}.attn.w{p}.weight": (f"{_T}self_attn.{p}_proj.weight", None) for p in "qkvo"},
    **{f"layers.{{i}}.attn.{n}_norm.weight": (f"{_T}self_attn.{n}_norm.weight", None) for n in "qk"},
    **{f"layers.{{i}}.attn.{n}": (f"{_T}linear_attn.{n}", None) for n in ("A_log", "dt_bias")},
    **{
        f"layers.{{i}}.attn.{n}.weight": (f"{_T}linear_attn.{n}.weight", None)
        for n in ("in_proj_z", "in_proj_a", "in_proj_b", "norm", "out_proj")
    },
    **{
        f"layers.{{i}}.attn.{kind}_{p}.weight": Fused(_T + f"linear_attn.{fused}.weight", n, *_DELTANET_PARTS[p])
        for kind, fused in (("in_proj", "in_proj_qkv"), ("conv", "conv1d"))
        for n, p in enumerate("qkv")
    },
    **{
        f"layers.{{i}}.feed_forward.{w}.weight": (f"{_T}mlp.{p}.weight", None)
        for w, p in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj"))
    },
    "layers.{i}.attention_norm.weight": (_T + "input_layernorm.weight", None),
    "layers.{i}.ffn_norm.weight": (_T + "post_attention_layernorm.weight", None),
    "vision_encoder.pos_embed": ("model.visual.pos_embed.weight", None),
    "vision_encoder.patch_embed.weight": Reshaped(
        "model.visual.patch_embed.proj.weight",
        ("vision_config.in_channels", "vision_config.temporal_patch_size", *["vision_config.patch_size"] * 2),
    ),
    "vision_encoder.patch_embed.bias": ("model.visual.patch_embed.proj.bias", None),
    **{
        f"vision_encoder.layers.{{i}}.{n}.{k}": (f"{_V}{n}.{k}", None)
        for n in ("norm1", "norm2", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2")
        for k in ("weight", "bias")
    },
    **{
        f"vision_encoder.layers.{{i}}.attn.w{p}.{k}": Fused(f"{_V}attn.qkv.{k}", n)
        for n, p in enumerate("qkv")
        for k in ("weight", "bias")
    },
    **{
        f"vision_encoder.merger.{n}.{k}": (f"model.visual.merger.{n}.{k}", None)
        for n in ("norm", "linear_fc1", "linear_fc2")
        for k in ("weight", "bias")
    },
}

# torchtitan's Qwen3.5-MoE: the dense model's names, its MoE layers' as torchtitan's Qwen3-MoE's (grouped experts, the
# router, the load-balancing bias transformers' routing has none of), and the sigmoid-gated shared expert. (Its own
# adapter's to_hf fuses each layer's gate and up into a gate_up_proj [experts, dim, 2 x width], the transpose of what
# transformers 5 holds; unshard reads the experts by what torchtitan computes, into the names save_pretrained writes.)
_M = _T + "mlp."
TORCHTITAN_QWEN35_MOE = {
    **TORCHTITAN_QWEN35,
    **torchtitan_routed_experts(_M),
    **{
        f"layers.{{i}}.moe.shared_experts.{w}.weight": (f"{_M}shared_expert.{p}.weight", None)
        for w, p in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj"))
    },
    "layers.{i}.moe.shared_experts.gate.weight": (_M + "shared_expert_gate.weight", None),
    "layers.{i}.moe.expert_bias_E": Zeros(
        _M + "gate.weight",
        "torchtitan's load-balancing expert bias (transformers' Qwen3.5-MoE routes without one, as torchtitan's own "
        "Qwen35StateDictAdapter drops it)",
    ),
}


def qwen2vl_sizes(vision: dict, where: Path) -> dict:
    """The tower's sizes as the converter reads Qwen's vision_config: heads and depth renamed, an image of 560
    pixels; Qwen2-VL's width is its embed_dim (and the converter writes its merger's width, hidden_size, as the
    feed-forward width, which llama.cpp's qwen2vl does not read)."""
    vision = {**vision, "image_size": vision.get("image_size", 560)}
    vision["num_attention_heads"], vision["num_hidden_layers"] = vision.get("num_heads"), vision.get("depth")
    if "embed_dim" in vision:
        vision["intermediate_size"], vision["hidden_size"] = vision.get("hidden_size"), vision["embed_dim"]
    if vision.get("temporal_patch_size", 2) != 2:
        raise ConfigMismatchError(
            f"{where}: vision_config's temporal_patch_size is {vision['temporal_patch_size']}; llama.cpp's qwen2vl "
            "takes frames two at a time; serve this model with transformers or vLLM"
        )
    return vision


def qwen25vl_sizes(vision: dict, where: Path) -> dict:
    """Qwen2-VL's, and the window attention's pattern llama.cpp assumes: every n-th block attends to the whole image,
    the others by window."""
    full = vision.get("fullatt_block_indexes") or []
    if not full or any(b - a != full[0] + 1 for a, b in zip(full, full[1:])):
        raise ConfigMismatchError(
            f"{where}: vision_config's fullatt_block_indexes {full} are not every n-th block, which llama.cpp's "
            "qwen2.5vl assumes; serve this model with transformers or vLLM"
        )
    return qwen2vl_sizes(vision, where)


def qwen2vl_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    writer.add_vision_attention_layernorm_eps(hparams.get("rms_norm_eps", 1e-6))  # (the config's top level, or 1e-6)


def qwen25vl_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """SiLU, and the window attention's pattern (qwen25vl_sizes checked it)."""
    writer.add_vision_use_silu(True)
    writer.add_vision_n_wa_pattern(vision["fullatt_block_indexes"][0] + 1)
    qwen2vl_projector_keys(writer, hparams, vision, processor)


def qwen_vision_split(name: str, shape: tuple[int, ...], vision: dict) -> Rearrangement | None:
    """The converter's: each block's fused qkv (weight and bias) as q, k and v; the Conv3D patch embedding (two
    frames deep) as one 2-D convolution per frame, `v.patch_embd.weight` and `.weight.1`."""
    if ".attn.qkv." in name:
        third = (shape[0] // 3, *shape[1:])
        return Rearrangement({name.replace(".qkv.", f".{x}."): third for x in "qkv"}, thirds, shape[0])
    if name.endswith("patch_embed.proj.weight") and len(shape) == 5:
        frame = (shape[0], shape[1], *shape[3:])
        return Rearrangement({"v.patch_embd.weight": frame, "v.patch_embd.weight.1": frame}, frames)
    return None


def qwen3vl_sizes(vision: dict, where: Path) -> dict:
    """The tower's sizes as the converter reads Qwen3-VL's: heads and depth renamed, the image the learned position
    embeddings cover (a side of sqrt(positions) patches)."""
    side = int(vision.get("num_position_embeddings", 2304) ** 0.5)
    vision = {**vision, "image_size": vision.get("image_size", side * vision.get("patch_size", 16))}
    return qwen2vl_sizes(vision, where)


def qwen3vl_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """GELU, the patch merger's size, the text model's norm epsilon, which blocks feed the text model (deepstack)."""
    writer.add_vision_use_gelu(True)
    if vision.get("spatial_merge_size") is not None:
        writer.add_vision_spatial_merge_size(int(vision["spatial_merge_size"]))
    writer.add_vision_attention_layernorm_eps((hparams.get("text_config") or {}).get("rms_norm_eps", 1e-6))
    deepstack = set(vision.get("deepstack_visual_indexes") or [])
    if vision["num_hidden_layers"]:
        writer.add_vision_is_deepstack_layers([block in deepstack for block in range(vision["num_hidden_layers"])])


def qwen3vl_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """Qwen3's, then how many of the tower's blocks feed the text model's first layers (deepstack)."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_num_deepstack_layers(len((hparams.get("vision_config") or {}).get("deepstack_visual_indexes") or []))


def qwen3vl_moe_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """Qwen3-MoE's (the experts' width after the TextModel's), then the deepstack layers' count."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
    writer.add_num_deepstack_layers(len((hparams.get("vision_config") or {}).get("deepstack_visual_indexes") or []))


def qwen3vl_moe_experts(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """The fused experts as llama.cpp stacks them: gate_up_proj's gate and up halves apart, each expert [intermediate,
    hidden], and down_proj [hidden, intermediate]. Held as transformers 5 holds (and saves) them, they are so already;
    held as Qwen's release and transformers 4 hold them (each expert transposed), which is all the converter reads,
    each expert is transposed first."""
    if not name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
        return None
    hidden, width = hparams["hidden_size"], hparams["moe_intermediate_size"]
    fused = name.endswith("gate_up_proj")
    held, wanted = shape[1:], ((2 * width, hidden) if fused else (hidden, width))
    if wanted[0] == wanted[1] or held not in (wanted, wanted[::-1]):
        raise ConfigMismatchError(
            f"{where}: {name} is {list(shape)}, which cannot be told apart from its transpose with hidden_size "
            f"{hidden} and moe_intermediate_size {width} (or fits neither); llama.cpp's layout of it is unknown: "
            "write a folder and serve it with transformers or vLLM"
        )
    base, as_held = name.rsplit(".", 1)[0], held == wanted
    if not fused:
        down = {f"{base}.down_proj.weight": (shape[0], hidden, width)}
        return Rearrangement(down, renamed_only if as_held else transposed)
    stack = (shape[0], width, hidden)
    gate_up = {f"{base}.gate_proj.weight": stack, f"{base}.up_proj.weight": stack}
    return Rearrangement(gate_up, halves if as_held else transposed_halves)


def halves(band) -> tuple:
    """Gate's and up's experts from a band of gate_up_proj's: its first and second half of rows."""
    half = band.shape[1] // 2
    return band[:, :half], band[:, half:]


def transposed_halves(band) -> tuple:
    return halves(band.swapaxes(-1, -2))


def qwen3vl_vision_name(name: str) -> str:
    return name.removeprefix("model.")  # (transformers 5 saves `model.visual.*`; the converter reads `visual.*`)


# Qwen3-VL's patch merger (and each deepstack merger) as the converter names it
MERGER = {"linear_fc1": "mm.0", "linear_fc2": "mm.2", "norm": "v.post_ln"}
DEEPSTACK = {"linear_fc1": "fc1", "linear_fc2": "fc2", "norm": "norm"}


def qwen3vl_vision_split(name: str, shape: tuple[int, ...], vision: dict) -> Rearrangement | None:
    """The converter's: the patch embedding as Qwen2-VL's, with its bias; the mergers under names of its own (each
    deepstack merger by the block it follows)."""
    parts = name.split(".")
    if name.startswith("visual.merger.") and parts[2] in MERGER:
        return Rearrangement({f"{MERGER[parts[2]]}.{parts[-1]}": shape}, renamed_only)
    if name.startswith("visual.deepstack_merger_list.") and parts[3] in DEEPSTACK:
        block = vision["deepstack_visual_indexes"][int(parts[2])]
        return Rearrangement({f"v.deepstack.{block}.{DEEPSTACK[parts[3]]}.{parts[-1]}": shape}, renamed_only)
    if name == "visual.patch_embed.proj.bias":
        return Rearrangement({"v.patch_embd.bias": shape}, renamed_only)
    if ".attn.qkv." in name:
        return None  # (llama.cpp's qwen3vl keeps it fused)
    return qwen_vision_split(name, shape, vision)


def thirds(band) -> tuple:
    """q's, k's and v's rows of a whole fused tensor."""
    third = band.shape[0] // 3
    return band[:third], band[third : 2 * third], band[2 * third :]


def frames(band) -> tuple:
    return band[:, :, 0], band[:, :, 1]


def _qwen_vl(
    name: str,
    model_type: str,
    architecture: str,
    projector: str,
    sizes,
    keys,
    text=GGUFPart("QWEN2VL"),
    moe_layout=NO_MOE,
    linearized=None,
    notes=None,
    meta_names=NO_META_NAMES,
    torchtitan_names=NO_TORCHTITAN_NAMES,
    also: tuple[str, ...] = (),
    **names,
) -> Family:
    return Family(
        name,
        model_type,
        architecture,
        tensors=NO_TABLE,
        megatron=MEGATRON,
        meta_names=meta_names,
        torchtitan_names=torchtitan_names,
        fused_siblings=DEFAULT_FUSED_SIBLINGS,
        gguf=text,
        mmproj=MmprojPart(
            projector,
            r"^(?:model\.)?visual\.",
            sizes,
            keys,
            forced_type=mmproj_model_forced_type,
            **{"rearranged": qwen_vision_split, **names},
        ),
        moe_layout=moe_layout,
        linearized=linearized,
        notes=notes or {},
        also=also,
    )


FAMILIES = (
    _qwen_vl(
        "Qwen2-VL",
        "qwen2_vl",
        "Qwen2VLForConditionalGeneration",
        "QWEN2VL",
        qwen2vl_sizes,
        qwen2vl_projector_keys,
        also=("Qwen2VLModel",),  # (without the head)
    ),
    _qwen_vl(
        "Qwen2.5-VL",
        "qwen2_5_vl",
        "Qwen2_5_VLForConditionalGeneration",
        "QWEN25VL",
        qwen25vl_sizes,
        qwen25vl_projector_keys,
    ),
    _qwen_vl(
        "Qwen3-VL",
        "qwen3_vl",
        "Qwen3VLForConditionalGeneration",
        "QWEN3VL",
        qwen3vl_sizes,
        qwen3vl_projector_keys,
        GGUFPart("QWEN3VL", hyperparameters=qwen3vl_hyperparameters),
        converter_name=qwen3vl_vision_name,
        rearranged=qwen3vl_vision_split,
    ),
    _qwen_vl(
        "Qwen3-VL-MoE",
        "qwen3_vl_moe",
        "Qwen3VLMoeForConditionalGeneration",
        "QWEN3VL",
        qwen3vl_sizes,
        qwen3vl_projector_keys,
        GGUFPart(
            "QWEN3VLMOE",
            hyperparameters=qwen3vl_moe_hyperparameters,
            check_config=routing_checked("qwen3vlmoe", True),
            vocabulary="bpe",
            rearranged=qwen3vl_moe_experts,
        ),
        Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        qwen3vl_moe_experts,
        {"quantize": "each expert's projections Linear layers, as llm-compressor makes them"},
        converter_name=qwen3vl_vision_name,
        rearranged=qwen3vl_vision_split,
    ),
    _qwen_vl(
        "Qwen3.5",
        "qwen3_5",
        "Qwen3_5ForConditionalGeneration",
        "QWEN3VL",
        qwen3vl_sizes,
        qwen3vl_projector_keys,
        deltanet_gguf("QWEN35", qwen35_hyperparameters, tiled_values=True),
        meta_names=TORCHTITAN_QWEN35,
        torchtitan_names=TORCHTITAN_QWEN35,
        converter_name=qwen3vl_vision_name,
        rearranged=qwen3vl_vision_split,
    ),
    _qwen_vl(
        "Qwen3.5-MoE",
        "qwen3_5_moe",
        "Qwen3_5MoeForConditionalGeneration",
        "QWEN3VL",
        qwen3vl_sizes,
        qwen3vl_projector_keys,
        deltanet_gguf("QWEN35MOE", qwen35_hyperparameters, tiled_values=True),
        Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        meta_names=TORCHTITAN_QWEN35_MOE,
        torchtitan_names=TORCHTITAN_QWEN35_MOE,
        converter_name=qwen3vl_vision_name,
        rearranged=qwen3vl_vision_split,
    ),
    _qwen_vl(
        "Qwen4-Exp",
        "qwen4_exp",
        "Qwen4ExpForConditionalGeneration",
        "QWEN3VL",
        qwen3vl_sizes,
        qwen3vl_projector_keys,
        QWEN4EXP_GGUF,
        Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="qwen4exp")},
        converter_name=qwen3vl_vision_name,
        rearranged=qwen3vl_vision_split,
    ),
)
