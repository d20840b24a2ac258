"""Granite (IBM's): Llama's layout with four multipliers, on the embedding, the attention's scores, each residual and
the logits; llama.cpp's granite, whose converter is its LlamaModel (q and k reordered per head) with those four scales
after the Llama's header. Granite MoE: the same with experts behind a softmax router, each expert's gate and up in one
tensor (JetMoE's `input_linear`), which the converter splits into llama.cpp's gate and up stacks (granitemoe).
Granite MoE Shared: the same with a shared expert beside them (`shared_mlp`, its gate and up in one tensor too)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import llama_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY, llama_computed
from .parts import (
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    Rearrangement,
    Unsupported,
    no_trainer_model,
    renamed_only,
)

# The config's multipliers, as llama.cpp's scales, in the converter's order (a multiplier of 0 or none: not written)
SCALES = (
    ("attention_multiplier", "add_attention_scale"),
    ("embedding_multiplier", "add_embedding_scale"),
    ("residual_multiplier", "add_residual_scale"),
    ("logits_scaling", "add_logit_scale"),
)


def granite_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's GraniteModel's: a Llama's header without the head width (it ignores head_dim), then the
    scales."""
    llama_hyperparameters(writer, {k: v for k, v in hparams.items() if k != "head_dim"}, ftype, blocks, folder)
    for key, add in SCALES:
        if hparams.get(key):
            getattr(writer, add)(hparams[key])


def granite_checked(hparams: dict, where: Path) -> None:
    """llama.cpp's granite takes a head as hidden_size / heads wide, whatever head_dim says."""
    width = hparams["hidden_size"] // hparams["num_attention_heads"]
    if hparams.get("head_dim") not in (None, width):
        raise ConfigMismatchError(
            f"{where}: head_dim is {hparams['head_dim']}, and llama.cpp's granite takes heads of hidden_size / "
            f"num_attention_heads = {width}: it would compute another model; serve this one with transformers or vLLM"
        )


def granitemoe_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's GraniteMoeModel's: the Granite's, then a shared expert's width where the config has one."""
    granite_hyperparameters(writer, hparams, ftype, blocks, folder)
    if hparams.get("shared_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(hparams["shared_intermediate_size"])


def gate_and_up_apart(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """The experts' input_linear (experts x 2 widths x hidden: gate's rows, then up's) as llama.cpp's gate and up
    stacks, and the shared expert's (2 widths x hidden) as its gate and up, as the converter splits them. A band
    holds whole experts; the shared expert's halves are the whole tensor's, one band."""
    if name.endswith("block_sparse_moe.input_linear.weight"):
        key, ends, dims = "intermediate_size", ("block_sparse_moe.input_linear", "mlp.experts"), 3
    elif name.endswith("shared_mlp.input_linear.weight"):
        key, ends, dims = "shared_intermediate_size", ("shared_mlp.input_linear", "mlp.shared_expert"), 2
    else:
        return None
    width = hparams.get(key)
    if len(shape) != dims or shape[-2] != 2 * (width or 0):
        raise ConfigMismatchError(
            f"{where}: {name} has shape {list(shape)}, not gate and up rows of {key} {width}; pass --config-from the "
            "model's own folder"
        )
    parts = name.replace(ends[0], ends[1]).replace(".weight", ".{}.weight")
    halves = (*shape[:-2], width, shape[-1])
    whole = 1 if dims == 3 else shape[0]
    return Rearrangement({parts.format("gate_proj"): halves, parts.format("up_proj"): halves}, gate_then_up, whole)


def linear_experts(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """The experts as llm-compressor makes Linear layers of them before quantizing (transformers holds input_linear
    as the experts' gate_up_proj, output_linear as their down_proj): each expert's gate_proj and up_proj (its rows of
    input_linear) and down_proj, under `block_sparse_moe.experts`, stacked here one expert after the other."""
    if name.endswith("block_sparse_moe.output_linear.weight"):
        return Rearrangement({name.replace("output_linear", "experts.down_proj"): shape}, renamed_only)
    if not name.endswith("block_sparse_moe.input_linear.weight"):
        return None
    apart = gate_and_up_apart(name, shape, hparams, where)
    stacks = {stack.replace(".mlp.experts.", ".block_sparse_moe.experts."): s for stack, s in apart.tensors.items()}
    return Rearrangement(stacks, apart.pieces, apart.rows_per_band)


def gate_then_up(band) -> tuple:
    """Each expert's rows as its gate's half and its up's."""
    half = band.shape[-2] // 2
    return band[..., :half, :], band[..., half:, :]


# (Granite MoE's and Granite MoE Shared's, which the converter writes with one class)
GRANITE_MOE_GGUF = GGUFPart(
    "GRANITE_MOE",
    hyperparameters=granitemoe_hyperparameters,
    computed=llama_computed,
    permute_qk=True,
    llama_vocabulary=True,
    check_config=granite_checked,
    rearranged=gate_and_up_apart,
)
FAMILIES = (
    Family(
        "Granite",
        "granite",
        "GraniteForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Granite layout (its multipliers) is not mapped yet"),
        **no_trainer_model("Granite"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "GRANITE",
            hyperparameters=granite_hyperparameters,
            computed=llama_computed,
            permute_qk=True,
            llama_vocabulary=True,
            check_config=granite_checked,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
    Family(
        "Granite MoE",
        "granitemoe",
        "GraniteMoeForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Granite MoE layout (its multipliers, JetMoE's experts) is not mapped yet"),
        **no_trainer_model("Granite MoE"),
        fused_siblings=SIBLINGS,
        gguf=GRANITE_MOE_GGUF,
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        linearized=linear_experts,
        notes={"quantize": "each expert's projections Linear layers, as llm-compressor makes them"},
    ),
    Family(
        "Granite MoE Shared",
        "granitemoeshared",
        "GraniteMoeSharedForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Granite MoE layout (its multipliers, JetMoE's experts) is not mapped yet"),
        **no_trainer_model("Granite MoE Shared"),
        fused_siblings=SIBLINGS,
        gguf=GRANITE_MOE_GGUF,
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        linearized=linear_experts,
        notes={"quantize": "each expert's projections Linear layers, as llm-compressor makes them"},
    ),
)
