"""Kimi K2.5 (and K2.6, K2.7-Code, Kimi-VL: the same tensors): DeepSeek-V3's text model beside MoonViT, a vision
tower of fused-QKV blocks, and a projector merging 2 x 2 patches into the text model's width.

Its Hugging Face folder holds the names of the Hub's checkpoints (`language_model.model.layers.N.`,
`vision_tower.encoder.blocks.N.wqkv`, `mm_projector.proj.0`), which vLLM and llama.cpp's converter read and
transformers renames as it loads them. (transformers' save_pretrained writes its own module names instead, which no
other tool reads, so they are declared here and not asked of it.) torchtitan 0.3 trains it as `kimi_k2_7`, and its
names are read and written as its KimiK25StateDictAdapter maps them: the text model's as DeepSeek-V3's, the tower's q,
k and v apart (their rows as the Hub's, whose rotary turns interleaved pairs as torchtitan's does), its patch
embedding a Linear layer of the Hub's Conv2d.

GGUF: the text model as llama.cpp's deepseek2; MoonViT and its projector as the mmproj file of llama.cpp's `kimik25`
projector, as the converter's KimiK25Model writes them from the Hub's names. Its config may be the Hub's (remote
code: `vt_hidden_size`, `init_pos_emb_height`, `projector_ln_eps`) or transformers' (`hidden_size`, `pos_emb_height`,
`projection_layer_norm_eps`): either is read.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from ..names.meta_rules import Fused, Reshaped
from .deepseek import DEEPSEEK2, TORCHTITAN_WITHOUT_MTP
from .gguf_hooks import fixed_in_code, mmproj_model_forced_type
from .parts import (
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    MmprojPart,
    Rearrangement,
    Unsupported,
    rows_of_each_head,
)

_B = "vision_tower.encoder.blocks.{i}."
# (the Hub's checkpoints have no multi-token prediction layers: torchtitan's Kimi K2.5 flavors have none either)
TORCHTITAN_KIMI_K25 = {
    **{trainer: ("language_model." + hub, rotary) for trainer, (hub, rotary) in TORCHTITAN_WITHOUT_MTP.items()},
    "vision_encoder.pos_embed": ("vision_tower.patch_embed.pos_emb.weight", None),
    "vision_encoder.patch_embed.weight": Reshaped(
        "vision_tower.patch_embed.proj.weight", (3, "vision_config.patch_size", "vision_config.patch_size")
    ),
    "vision_encoder.patch_embed.bias": ("vision_tower.patch_embed.proj.bias", None),
    **{
        f"vision_encoder.layers.{{i}}.{titan}.{k}": (f"{_B}{hub}.{k}", None)
        for titan, hub in (
            ("norm1", "norm0"),
            ("norm2", "norm1"),
            ("attn.proj", "wo"),
            ("mlp.linear_fc1", "mlp.fc0"),
            ("mlp.linear_fc2", "mlp.fc1"),
        )
        for k in ("weight", "bias")
    },
    **{
        f"vision_encoder.layers.{{i}}.attn.w{p}.{k}": Fused(f"{_B}wqkv.{k}", n)
        for n, p in enumerate("qkv")
        for k in ("weight", "bias")
    },
    **{
        f"vision_encoder.{titan}.{k}": (hub + k, None)
        for titan, hub in (
            ("final_norm", "vision_tower.encoder.final_layernorm."),
            ("projector.pre_norm", "mm_projector.pre_norm."),
            ("projector.linear_1", "mm_projector.proj.0."),
            ("projector.linear_2", "mm_projector.proj.2."),
        )
        for k in ("weight", "bias")
    },
}

# MoonViT's sizes: the Hub's remote-code config names them with a `vt_` prefix, transformers' without
TOWER_SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
GRID = (("height", 64), ("width", 64), ("time", 4))  # the position grid's axes, and the converter's defaults


def kimi_k25_vision_sizes(vision: dict, where: Path) -> dict:
    """MoonViT as the converter reads it: the sizes under either config's names, the image size its position grid
    spans (which llama.cpp does not use). Refuses what llama.cpp's kimik25 computes otherwise whatever the file says:
    rope at a base of 10000, GELU (tanh) in the tower's MLPs, the patches merged as many down as across."""
    # (the Hub's first: transformers, reading a Hub config, fills its own keys with its defaults beside them)
    sizes = {key: vision.get("vt_" + key, vision.get(key)) for key in TOWER_SIZES}
    merge = list(vision.get("merge_kernel_size", [2, 2]))
    runs = {
        "rope_theta": ((vision.get("rope_parameters") or {}).get("rope_theta", vision.get("rope_theta", 1e4)), 1e4),
        "hidden_act": (vision.get("hidden_act", "gelu_pytorch_tanh"), "gelu_pytorch_tanh"),
        "merge_kernel_size": (merge, [merge[0], merge[0]]),
    }
    fixed_in_code(where, "vision", "kimik25 projector", runs)
    width, heads = sizes["hidden_size"], sizes["num_attention_heads"]
    if width and heads and (width % heads or (width // heads) % 4):
        raise ConfigMismatchError(
            f"{where}: the vision tower's width {width} is not {heads} heads of a multiple of 4 rows, as MoonViT's "
            "rope pairs them by axis; pass --config-from the model's own folder"
        )
    patch = vision.get("patch_size", 14)
    return {**vision, **sizes, "patch_size": patch, "image_size": position_grid(vision)[0] * patch}


def position_grid(vision: dict) -> tuple[int, int, int]:
    """The learned positions' height and width and the frames of the temporal table (the Hub's init_pos_emb_*,
    transformers' pos_emb_*)."""
    return tuple(vision.get(f"init_pos_emb_{axis}", vision.get(f"pos_emb_{axis}", size)) for axis, size in GRID)


def kimi_k25_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The converter's KimiK25Model's: the position grid, GELU, the projector's norm epsilon (which llama.cpp's
    kimik25 takes for MoonViT's own norms too, 1e-5 in code, as is the projector's in every release), the merge, and
    the least and most pixels of an image (8 patches; the image processor's patch budget: the Hub's in_patch_limit,
    transformers' max_patches)."""
    for (axis, _), size in zip(GRID, position_grid(vision)):
        writer.add_uint32(f"vision.pos_emb_{axis}", size)
    writer.add_vision_use_gelu(vision.get("projector_hidden_act", "gelu") == "gelu")
    eps = vision.get("projector_ln_eps", hparams.get("projection_layer_norm_eps", 1e-5))
    writer.add_vision_attention_layernorm_eps(eps)
    writer.add_vision_projector_scale_factor(int(list(vision.get("merge_kernel_size", [2, 2]))[0]))
    pixels = vision["patch_size"] ** 2
    writer.add_vision_min_pixels(8 * pixels)
    writer.add_vision_max_pixels(int(processor.get("in_patch_limit", processor.get("max_patches", 16384))) * pixels)


def pairs_by_axis(rows: int) -> list[int]:
    """The order of a head's `rows` of q or k that puts its rotary pairs as llama.cpp's kimik25 turns them: MoonViT
    interleaves the two axes (a pair turned by one, then a pair by the other, in turn); llama.cpp's 2-D rope turns the
    head's first half by one axis and its second half by the other."""
    return [quad * 4 + axis * 2 + i for axis in range(2) for quad in range(rows // 4) for i in range(2)]


def kimi_k25_rearranged(name: str, shape: tuple[int, ...], vision: dict) -> Rearrangement | None:
    """The converter's: the fused q, k and v (weights and biases) with q's and k's heads' rows paired by axis
    (pairs_by_axis; v's as they are), the whole tensor a band."""
    if not name.endswith((".wqkv.weight", ".wqkv.bias")):
        return None
    heads, width = vision["num_attention_heads"], shape[0] // 3
    head = pairs_by_axis(width // heads)
    order = [h * len(head) + row for h in range(2 * heads) for row in head] + list(range(2 * width, 3 * width))
    return Rearrangement({name: shape}, partial(rows_of_each_head, order=tuple(order)), shape[0])


def kimi_k25_name(name: str) -> str:
    """The projector's two layers under the names the converter maps them by."""
    return name.replace("mm_projector.proj.0.", "mm_projector.proj.linear_1.").replace(
        "mm_projector.proj.2.", "mm_projector.proj.linear_2."
    )


KIMI_K25_MMPROJ = MmprojPart(
    "KIMIK25",
    r"^(?:vision_tower|mm_projector)\.",
    kimi_k25_vision_sizes,
    kimi_k25_projector_keys,
    forced_type=mmproj_model_forced_type,
    converter_name=kimi_k25_name,
    rearranged=kimi_k25_rearranged,
)

FAMILIES = (
    Family(
        "Kimi K2.5",
        "kimi_k25",
        "KimiK25ForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Kimi K2.5 layout is not mapped yet"),
        meta_names=TORCHTITAN_KIMI_K25,
        torchtitan_names=TORCHTITAN_KIMI_K25,
        # (transformers names its modules otherwise than the Hub's tensors, by which its Linear layers are found; and
        # llm-compressor 0.14, with its transformers 5.17, saves the tower and projector quantized under names of
        # neither kind, `model.mm_projector.pre_norm` and `vision_tower.encoder.patch_embed.proj` (measured): no
        # oracle to be exact against)
        fused_siblings=Unsupported(
            "not written: llm-compressor 0.14 saves Kimi K2.5's tower under names no loader reads, so there is no "
            "file to be exact against"
        ),
        gguf=DEEPSEEK2,
        mmproj=KIMI_K25_MMPROJ,
        moe_layout=NOT_A_MOE_INPUT,
        hub_names="tensor names kept as saved, not asked of transformers (its Kimi K2.5 renames the Hub's names as it "
        "loads them, and its save_pretrained writes others)",
        notes={
            "meta_names": "torchtitan's names (kimi_k2_7), its vision tower's too; the Hub's names in the folder",
            "to_torchtitan": "its vision tower's q, k and v apart, its patch embedding flat",
        },
    ),
)
