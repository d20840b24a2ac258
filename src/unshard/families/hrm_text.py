"""HRM-Text (`HrmTextForCausalLM`: Sapient's hierarchical reasoning model, DFM Mimir's): two stacks of layers, a low
one run L_cycles times for each run of a high one, H_cycles times, over the same tokens; attention gated by a sigmoid
of its own projection, every head its own keys, RMS norms without weights, the embeddings scaled. Its checkpoint keeps
gate, q, k and v in one `gqkv_proj` and the MLP's gate and up in one `gate_up_proj` (transformers splits both on
loading and joins them on saving). llama.cpp's hrm_text, which PyPI's gguf-py 0.19 lacks (written with llama.cpp's
own, sinks/gguf): the low stack's layers as blocks 0 to n - 1, the high stack's after them."""

from __future__ import annotations

import re
from dataclasses import replace
from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import text_hyperparameters
from .llama import TEXT_ONLY
from .parts import LLAMA_CPP_GGUF_PY, GGUFPart, Rearrangement, Unsupported, gguf_family, renamed_only

STACK_LAYER = re.compile(r"^model\.([LH])_module\.layers\.(\d+)\.(.+)$")
# The fused tensors of a layer, by their end: the pieces the converter cuts them into (equal parts of their rows, in
# this order), by the names it maps to llama.cpp's
FUSED = {
    "attn.gqkv_proj.weight": ("self_attn.g_proj.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight")
    + ("self_attn.v_proj.weight",),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}


def layers_per_stack(hparams: dict) -> int:
    return hparams.get("num_layers_per_stack") or hparams["num_hidden_layers"]


def hrm_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's HrmTextModel's: the TextModel's (its block count every run of a stack's layers, as llama.cpp
    caches keys and values for each), then rope over whole heads, the embeddings' scale, the stacks' size and runs,
    and whether instructions attend both ways (which llama.cpp keeps, and computes causally)."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_rope_dimension_count(hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"])
    writer.add_embedding_scale(hparams["embedding_scale"])
    writer.add_hrm_layers_per_stack(layers_per_stack(hparams))
    writer.add_hrm_h_cycles(hparams["H_cycles"])
    writer.add_hrm_l_cycles(hparams["L_cycles"])
    writer.add_hrm_prefix_lm(bool(hparams.get("prefix_lm", False)))


def hrm_checked(hparams: dict, where: Path) -> list[str] | None:
    """What llama.cpp's hrm_text computes: SwiGLU, no biases, the blocks the config counts (each run of a stack's
    layers). Another config is one line; a prefix-LM model is written with a note."""
    runs = layers_per_stack(hparams) * hparams["H_cycles"] * (hparams["L_cycles"] + 1)
    why = None
    if hparams.get("hidden_act", "silu") != "silu":
        why = f"hidden_act is {hparams['hidden_act']!r}, and llama.cpp's hrm_text runs SiLU"
    elif hparams.get("attention_bias") or hparams.get("mlp_bias"):
        why = "attention_bias or mlp_bias is set, and llama.cpp's hrm_text has no biases"
    elif hparams["num_hidden_layers"] != runs:
        why = (
            f"num_hidden_layers is {hparams['num_hidden_layers']}, and llama.cpp's hrm_text counts {runs} blocks "
            "(num_layers_per_stack x H_cycles x (L_cycles + 1), as transformers saves the config)"
        )
    if why:
        raise ConfigMismatchError(f"{where}: {why}: it would compute another model; serve this one with transformers")
    if hparams.get("prefix_lm"):
        return [
            "llama.cpp's hrm_text attends causally over the whole prompt: the instruction tokens that transformers "
            "lets attend both ways (prefix_lm, given token_type_ids) see only those before them there"
        ]
    return None


def stack_layers_as_blocks(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """A stack's layer tensor under the block the converter gives it (the low stack's first, then the high one's),
    its fused tensors cut into their equal parts as it cuts them."""
    if name == "model.z_L_init":
        return Rearrangement({"hrm.z_l_init": shape}, renamed_only, shape[0])
    layer = STACK_LAYER.match(name)
    if layer is None:
        return None
    stack, index, rest = layer.groups()
    block = int(index) + (layers_per_stack(hparams) if stack == "H" else 0)
    if rest not in FUSED:  # (as it is, under its block)
        renamed = rest.replace("attn.", "self_attn.", 1) if rest.startswith("attn.") else rest
        return Rearrangement({f"model.layers.{block}.{renamed}": shape}, renamed_only)
    parts = FUSED[rest]
    made = {f"model.layers.{block}.{part}": (shape[0] // len(parts), *shape[1:]) for part in parts}
    return Rearrangement(made, partial(equal_row_parts, count=len(parts)), shape[0])


def equal_row_parts(band, count: int) -> tuple:
    """A whole fused tensor's `count` equal parts of rows, in order."""
    rows = band.shape[0] // count
    return tuple(band[i * rows : (i + 1) * rows] for i in range(count))


FAMILIES = (
    replace(
        gguf_family(
            "HRM-Text",
            "hrm_text",
            "HrmTextForCausalLM",
            GGUFPart(
                "HRM_TEXT",
                hyperparameters=hrm_hyperparameters,
                check_config=hrm_checked,
                vocabulary="bpe",
                rearranged=stack_layers_as_blocks,
            ),
            Unsupported(
                "a checkpoint that joins gate, q, k and v in one tensor (gqkv_proj) is not compared with "
                "llm-compressor's quantization yet"
            ),
            TEXT_ONLY,
        ),
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="hrm_text")},
    ),
)
