"""RWKV-7 (`RWKV7ForCausalLM`: flash-linear-attention's layout and names, which fla-hub's models, its trainers and
rwkv7-hf's pure-PyTorch model share; custom code: transformers has no class of it): a recurrent model of token-shift
mixes, a matrix-valued state per head decayed and updated by low-rank projections, and a squared-ReLU channel mix.

GGUF: llama.cpp's rwkv7, as the converter's Rwkv7Model writes it: its own header (the head size, the low-rank
projections' ranks), each layer's six token-shift mixes stacked in one tensor (r, w, k, v, a, g), the low-rank
projections renamed by their parts (1: down, 2: up, 0: the bias), the first layer's `a` projections written a second
time as its `v` ones (which llama.cpp loads in every layer, and the first layer has none of), r_k flattened; the RWKV
world vocabulary (sinks/gguf/rwkv_world.py)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .llama import TEXT_ONLY
from .parts import (
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    Rearrangement,
    Unsupported,
    no_trainer_model,
)

# the head width and epsilon llama.cpp's rwkv7 norms each head's output with, whatever the model's (RWKV's own: 64,
# 1e-5), where rwkv7-hf and fla norm it with head_dim x norm_eps
LLAMA_CPP_HEAD_NORM_EPS = 64e-5


def _lora_rank(hparams: dict, key: str, exponent: float, multiplier: float) -> int:
    """A low-rank projection's rank: the config's, else the converter's rule of thumb from the width."""
    if hparams.get(key) is not None:
        return hparams[key]
    return max(1, round(hparams["hidden_size"] ** exponent * multiplier / 32)) * 32


def rwkv7_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Rwkv7Model's own header (no context limit: RWKV's state is not a window), in its order."""
    width = hparams["hidden_size"]
    writer.add_context_length(1048576)
    writer.add_embedding_length(width)
    writer.add_block_count(blocks)
    writer.add_layer_norm_eps(hparams["norm_eps"])
    writer.add_wkv_head_size(hparams["head_dim"])
    writer.add_decay_lora_rank(_lora_rank(hparams, "decay_low_rank_dim", 0.5, 1.8))
    writer.add_iclr_lora_rank(_lora_rank(hparams, "a_low_rank_dim", 0.5, 1.8))
    writer.add_value_residual_mix_lora_rank(_lora_rank(hparams, "v_low_rank_dim", 0.5, 1.3))
    writer.add_gate_lora_rank(_lora_rank(hparams, "gate_low_rank_dim", 0.8, 0.6))
    writer.add_feed_forward_length(hparams.get("intermediate_size") or 4 * width)
    writer.add_file_type(ftype)
    writer.add_head_count(0)  # (llama.cpp requires it, and reads none)


def rwkv7_checked(hparams: dict, where: Path) -> list[str]:
    """Refuses what llama.cpp's rwkv7 would not load or run: an attention or value width other than the model's, norms
    without biases, a wkv without its gate. Notes an epsilon of the heads' norm other than llama.cpp's."""
    why = None
    if (hparams.get("attention_hidden_size") or hparams["hidden_size"]) != hparams["hidden_size"]:
        why = f"attention_hidden_size {hparams['attention_hidden_size']} is not hidden_size, as llama.cpp's rwkv7 takes"
    elif any(width != hparams["hidden_size"] for width in _value_widths(hparams)):
        why = f"value_dim is {hparams['value_dim']}, and llama.cpp's rwkv7 takes values as wide as hidden_size"
    elif not hparams.get("norm_bias", True):
        why = "norm_bias is off, and llama.cpp's rwkv7 loads each LayerNorm's bias"
    elif not hparams.get("wkv_has_gate", True):
        why = "wkv_has_gate is off, and llama.cpp's rwkv7 runs the gate"
    if why:
        raise ConfigMismatchError(f"{where}: {why}: serve this model with flash-linear-attention or rwkv7-hf")
    eps = hparams["head_dim"] * hparams["norm_eps"]
    if abs(eps - LLAMA_CPP_HEAD_NORM_EPS) > 1e-12:
        return [
            f"llama.cpp's rwkv7 norms each head's output with an epsilon of {LLAMA_CPP_HEAD_NORM_EPS:g} (RWKV's heads "
            f"of 64, 1e-5), where this model's is head_dim x norm_eps = {eps:g}: its outputs differ a little"
        ]
    return []


def _value_widths(hparams: dict) -> list[int]:
    """fla's value_dim: one for every layer, or each layer's (rwkv7-hf's), or none (the attention's width)."""
    widths = hparams.get("value_dim")
    if widths is None:
        return []
    return list(widths) if isinstance(widths, list) else [widths]


def both(band) -> tuple:
    """A Rearrangement's pieces for a tensor the converter writes twice, under two names (the same band each)."""
    return (band, band)


def flattened(band) -> tuple:
    return (band.reshape(-1),)


def rwkv7_tensors(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """r_k (heads x head width) flattened; the first layer's `a` projections (down, up, bias) written first as its `v`
    ones, then as themselves, as the converter writes them."""
    if name.endswith(".attn.r_k"):
        return Rearrangement({name: (shape[0] * shape[1],)}, flattened, rows_per_band=shape[0])
    if name.startswith("model.layers.0.attn.a_lora."):
        return Rearrangement({name.replace(".a_lora.", ".v_lora."): shape, name: shape}, both)
    return None


GGUF = GGUFPart(
    "RWKV7",
    hyperparameters=rwkv7_hyperparameters,
    check_config=rwkv7_checked,
    vocabulary="rwkv",
    rearranged=rwkv7_tensors,
    # (the converter skips them: the first layer has no value residual to mix, and llama.cpp takes its `a`
    # projections in their place)
    skipped=(
        (
            r"^model\.layers\.0\.attn\.v_lora\.",
            "dummy v projections of the first layer left out, as llama.cpp's converter leaves them (no first layer "
            "computes them)",
        ),
    ),
    # (a layer's six token-shift mixes, each 1 x 1 x width, stacked in the converter's order once it has read the last)
    stacked=r"^(model\.layers\.\d+\.attn)\.x_([rwkvag])()$",
    stack_order=("r", "w", "k", "v", "a", "g"),
    # (the converter's renames, in its order: the stack by llama.cpp's own name; the low-rank projections' parts;
    # fla's module names as its map has them; the vectors named without a suffix, as weights)
    renames=(
        (r"^model\.layers\.(\d+)\.attn\.$", r"blk.\1.time_mix_lerp_fused.weight"),
        (r"_lora\.lora\.0\.weight$", "1.weight"),
        (r"_lora\.lora\.2\.weight$", "2.weight"),
        (r"_lora\.lora\.2\.bias$", "0.weight"),
        (r"ffn", "feed_forward"),
        (r"attn", "attention"),
        (r"feed_forward_norm", "ln2"),
        (r"g_norm", "ln_x"),
        (r"\.(k_k|k_a|r_k|x_k)$", r".\1.weight"),
    ),
)

FAMILIES = (
    Family(
        "RWKV-7",
        "rwkv7",
        "RWKV7ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron-LM trains no RWKV model", applies=False),
        **no_trainer_model("RWKV-7"),
        fused_siblings=Unsupported(
            "llm-compressor, the oracle of --quantize, quantizes transformers' models, and RWKV-7's is custom code"
        ),
        gguf=GGUF,
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
        notes={"gguf": "llama.cpp's rwkv7, with the RWKV world vocabulary (rwkv_vocab_v20230424.txt)"},
    ),
)
