"""Granite (IBM's): Llama's layout with four multipliers, on the embedding, the attention's scores, each residual and
the logits; llama.cpp's granite, whose converter is its LlamaModel (q and k reordered per head) with those four scales
after the Llama's header. Granite MoE: the same with experts behind a softmax router, each expert's gate and up in one
tensor (JetMoE's `input_linear`), which the converter splits into llama.cpp's gate and up stacks (granitemoe).
Granite MoE Shared: the same with a shared expert beside them (`shared_mlp`, its gate and up in one tensor too).

Granite 4.0's hybrids (`GraniteMoeHybridForCausalLM`, granite-4.0-h): Granite MoE Shared's layers with Mamba-2 layers in
place of attention in most of them (or the shared expert alone as the MLP), without rope; llama.cpp's granitehybrid,
whose converter is Granite MoE's with Mamba-2's tensors as its Mamba2Model stores them (A = -exp(A_log), A and D as
columns, the convolution's kernel 2-D, the gated norm's weight a row per group) and a header of both (the attention's
key-value heads per layer, 0 where a layer is recurrent). Granite 4.0 of attention layers alone (granite-4.0-micro,
with rope), which the converter writes as llama.cpp's granite (granitemoe with experts), with the same header but rope
on. Bamba (`BambaForCausalLM`): Mamba-2 layers beside attention layers with rope on half of each head and an MLP in
every layer; llama.cpp's granitehybrid with rope on, its rotary rows reordered within that half (the converter
reorders whole heads, and its file computes another model)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import first_of, gguf_quiet, llama_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY, llama_computed
from .mamba2 import add_mamba2_sizes, mamba2_checked, mamba2_tensors
from .parts import (
    LLAMA_CPP_GGUF_PY,
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    Rearrangement,
    Unsupported,
    gate_then_up,
    no_trainer_model,
    pairs_from_halves,
    renamed_only,
    rows_of_each_head,
)

# The config's multipliers, as llama.cpp's scales, in the converter's order (a multiplier of 0 or none: not written)
SCALES = (
    ("attention_multiplier", "add_attention_scale"),
    ("embedding_multiplier", "add_embedding_scale"),
    ("residual_multiplier", "add_residual_scale"),
    ("logits_scaling", "add_logit_scale"),
)


def granite_hyperparameters(
    writer, hparams: dict, ftype, blocks: int, folder: Path, expert_groups: bool = False
) -> None:
    """The converter's GraniteModel's: a Llama's header without the head width (it ignores head_dim), then the
    scales."""
    without_head_dim = {k: v for k, v in hparams.items() if k != "head_dim"}
    llama_hyperparameters(writer, without_head_dim, ftype, blocks, folder, expert_groups)
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


def granite_swa_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's GraniteSWAModel's: Granite's, then the window, the layers that attend within it (by
    layer_types, else three in four as transformers' default) and the layers turning rope, where the config names
    some without (no_rope_layers)."""
    granite_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_sliding_window(hparams.get("sliding_window", 128))
    kinds = hparams.get("layer_types")
    writer.add_sliding_window_pattern(
        [kind == "sliding_attention" for kind in kinds] if kinds else [i % 4 != 0 for i in range(blocks)]
    )
    if hparams.get("no_rope_layers"):
        writer.add_rope_pattern([bool(turns) for turns in hparams["no_rope_layers"]])


def granitemoe_swa_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's GraniteMoeSWAModel's: Granite SWA's, then the shared expert's width."""
    granite_swa_hyperparameters(writer, hparams, ftype, blocks, folder)
    if hparams.get("shared_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(hparams["shared_intermediate_size"])


def granitemoe_hyperparameters(
    writer, hparams: dict, ftype, blocks: int, folder: Path, expert_groups: bool = False
) -> None:
    """The converter's GraniteMoeModel's: the Granite's, then a shared expert's width where the config has one."""
    granite_hyperparameters(writer, hparams, ftype, blocks, folder, expert_groups)
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


def recurrent_layers(hparams: dict) -> list[bool]:
    """Which layers are Mamba-2's, by the config's layer types as the Hub writes them (mamba, attention) or as
    transformers 5 saves them (linear_attention, full_attention), else by its attention layers' indices (Bamba's)."""
    if kinds := hparams.get("layer_types"):
        return [kind in ("mamba", "linear_attention") for kind in kinds]
    if (attention := hparams.get("attn_layer_indices")) is not None:
        return [layer not in attention for layer in range(hparams["num_hidden_layers"])]
    return []


def granite_hybrid_hyperparameters(
    writer, hparams: dict, ftype, blocks: int, folder: Path, rotary: int | None = None
) -> None:
    """The converter's GraniteHybridModel's: Granite MoE's, then Mamba-2's (mamba2.add_mamba2_sizes); for a Bamba, rope
    kept on, turning `rotary` dimensions of each head."""
    granitemoe_hyperparameters(writer, hparams, ftype, blocks, folder)
    if rotary:  # (in the place of the Llama header's, as the converter writes the Hub's attn_rotary_emb)
        with gguf_quiet():
            writer.add_rope_dimension_count(rotary)
    sizes = {
        "conv": hparams["mamba_d_conv"],
        "state": hparams["mamba_d_state"],
        "groups": hparams["mamba_n_groups"],
        "inner": hparams["mamba_expand"] * hparams["hidden_size"],
        "heads": hparams["mamba_n_heads"],
    }
    kv_heads = hparams.get("num_key_value_heads") or hparams["num_attention_heads"]
    add_mamba2_sizes(writer, sizes, kv_heads, [not layer for layer in recurrent_layers(hparams)], rope=bool(rotary))


def bamba_rotary(hparams: dict) -> int:
    """The dimensions of each head Bamba turns: half, whatever the config says (transformers fixes it)."""
    return hparams["hidden_size"] // hparams["num_attention_heads"] // 2


def bamba_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's GraniteHybridModel's for a BambaForCausalLM: rope on, over half of each head."""
    granite_hybrid_hyperparameters(writer, hparams, ftype, blocks, folder, rotary=bamba_rotary(hparams))


def bamba_tensors(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """q's and k's rotary rows (the first half of each head) from transformers' order (turned by halves) into
    llama.cpp's (by consecutive pairs), the other half as it is; Mamba-2's tensors as Granite 4.0's."""
    if name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight", "q_proj.bias", "k_proj.bias")):
        head = hparams["hidden_size"] // hparams["num_attention_heads"]
        order = pairs_from_halves(head, bamba_rotary(hparams), 0)
        return Rearrangement({name: shape}, partial(rows_of_each_head, order=order), head)
    return granite_hybrid_tensors(name, shape, hparams, where)


def all_attention_arch(hparams: dict) -> str | None:
    """The converter's architecture of a Granite 4.0 without Mamba-2 layers (Granite 4.0 Micro's): Granite MoE's where
    the config chooses experts, else Granite's; None (granitehybrid) for a hybrid."""
    if any(recurrent_layers(hparams)):
        return None
    return "GRANITE_MOE" if first_of(hparams, "num_experts_per_tok", "num_experts_per_token") else "GRANITE"


TWICE_THE_WIDTH = (
    "mamba_expand is {}, and llama.cpp's granitehybrid runs Mamba-2 layers twice the model's width only; serve this "
    "model with transformers or vLLM"
)


def granite_hybrid_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's granitehybrid would compute otherwise than transformers, or not load: rope (it turns rope off
    where there are Mamba-2 layers; a Granite 4.0 of attention layers alone, written as llama.cpp's granite or
    granitemoe, has it on), Mamba-2 widths other than twice the model's; what it would not load: experts chosen where
    there are none; and every hybrid's Mamba-2 checks (mamba2.mamba2_checked)."""
    granite_checked(hparams, where)
    hybrid = any(recurrent_layers(hparams))
    other_model = "; serve this model with transformers or vLLM"
    dense = not hparams.get("num_local_experts")
    rope = hparams.get("position_embedding_type") == "rope"
    refused = [
        (
            hybrid and rope,
            "position_embedding_type is rope, and llama.cpp's granitehybrid turns rope off in a model with Mamba-2 "
            f"layers{other_model}",
        ),
        (
            not hybrid and not rope,
            f"position_embedding_type is {hparams.get('position_embedding_type')} in a model of attention layers "
            f"alone, which llama.cpp's granite turns rope in{other_model}",
        ),
        (hybrid and hparams.get("mamba_expand") != 2, TWICE_THE_WIDTH.format(hparams.get("mamba_expand"))),
        (
            dense and bool(hparams.get("num_experts_per_tok")),
            f"num_experts_per_tok is {hparams.get('num_experts_per_tok')} with no experts, and llama.cpp would not "
            "load the file; set it to 0, as Granite 4.0 H-Micro's config has it",
        ),
        (
            dense and hparams.get("intermediate_size") != hparams.get("shared_intermediate_size"),
            f"intermediate_size is {hparams.get('intermediate_size')} and the MLP's width (shared_intermediate_size) "
            f"{hparams.get('shared_intermediate_size')}, and llama.cpp's granitehybrid takes the first for the second "
            "in a model without experts: it would not load the file; set intermediate_size to the MLP's width",
        ),
    ]
    for refuse, why in refused:
        if refuse:
            raise ConfigMismatchError(f"{where}: {why}")
    if hybrid:
        mamba2_checked(hparams, where, "granitehybrid")


def bamba_checked(hparams: dict, where: Path) -> list[str]:
    """What llama.cpp's granitehybrid would compute otherwise than transformers' Bamba, or not load: Granite's head
    width, Mamba-2 layers of another width, a rotary width other than the half of each head transformers turns, and
    every hybrid's Mamba-2 checks. The note: the rotary rows reordered within that half, and its width written."""
    granite_checked(hparams, where)
    rotary = bamba_rotary(hparams)
    why = None
    if hparams.get("mamba_expand") != 2:
        why = TWICE_THE_WIDTH.format(hparams.get("mamba_expand"))
    elif hparams.get("attn_rotary_emb") not in (None, rotary):
        why = (
            f"attn_rotary_emb is {hparams['attn_rotary_emb']}, which the converter would write, where transformers "
            f"turns half of each head ({rotary}): fix the config"
        )
    if why:
        raise ConfigMismatchError(f"{where}: {why}")
    mamba2_checked(hparams, where, "granitehybrid")
    said = "" if hparams.get("attn_rotary_emb") else f" (the config names no attn_rotary_emb: {rotary} written)"
    return [
        f"Bamba turns rope on the first half of each head, transformers by halves and llama.cpp's granitehybrid by "
        f"consecutive pairs: q's and k's rows are reordered within that half{said}, so llama.cpp computes "
        "transformers' model (llama.cpp's converter reorders whole heads, and its file computes another)"
    ]


def granite_hybrid_tensors(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """Mamba-2's tensors as the converter's Mamba2Model stores them; the experts' and the shared expert's gate and up
    apart (gate_and_up_apart), or the shared expert's as the MLP's where there are no experts."""
    if ".mamba." in name:
        return mamba2_tensors(name, shape, ".mamba.", hparams["mamba_n_groups"])
    if not hparams.get("num_local_experts") and "shared_mlp." in name:  # (the shared expert as the layer's MLP)
        if name.endswith("shared_mlp.output_linear.weight"):
            return Rearrangement({name.replace("shared_mlp.output_linear", "mlp.down_proj"): shape}, renamed_only)
        apart = gate_and_up_apart(name, shape, hparams, where)
        return Rearrangement(
            {n.replace("mlp.shared_expert.", "mlp."): s for n, s in apart.tensors.items()},
            apart.pieces,
            apart.rows_per_band,
        )
    return gate_and_up_apart(name, shape, hparams, where)


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
GRANITE_GGUF = GGUFPart(
    "GRANITE",
    hyperparameters=granite_hyperparameters,
    computed=llama_computed,
    permute_qk=True,
    llama_vocabulary=True,
    check_config=granite_checked,
)
GRANITE_SWA_GGUF = replace(
    GRANITE_GGUF,
    arch="GRANITE_SWA",
    hyperparameters=granite_swa_hyperparameters,
    renames=((r"\.self_attn\.sinks$", ".self_attn.sinks.weight"),),  # (as the converter names a layer's sinks)
)
# Granite MoE SWA's experts and shared expert as the converter keeps them: gate and up fused (llama.cpp's
# ffn_gate_up_exps; the shared expert's in ffn_up_shexp, twice its width), by llama.cpp's names
GRANITE_MOE_SWA_GGUF = replace(
    GRANITE_SWA_GGUF,
    hyperparameters=granitemoe_swa_hyperparameters,
    renames=(
        *GRANITE_SWA_GGUF.renames,
        (r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(gate_up|down)_proj$", r"blk.\1.ffn_\2_exps.weight"),
        (r"^model\.layers\.(\d+)\.shared_mlp\.input_linear\.weight$", r"blk.\1.ffn_up_shexp.weight"),
    ),
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
        gguf=GRANITE_GGUF,
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
    Family(
        "Granite SWA",
        "granite_swa",
        "GraniteSWAForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Granite layout (its multipliers) is not mapped yet"),
        **no_trainer_model("Granite SWA"),
        fused_siblings=SIBLINGS,
        gguf=GRANITE_SWA_GGUF,
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="granite_swa")},
    ),
    Family(
        "Granite MoE SWA",
        "granitemoe_swa",
        "GraniteMoeSWAForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Granite MoE layout (its multipliers, fused experts) is not mapped yet"),
        **no_trainer_model("Granite MoE SWA"),
        fused_siblings=SIBLINGS,
        gguf=GRANITE_MOE_SWA_GGUF,
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="granite_swa")},
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
    Family(
        "Granite 4.0 (hybrid)",
        "granitemoehybrid",
        "GraniteMoeHybridForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Granite 4.0 layout (Mamba-2 layers) is not mapped yet"),
        **no_trainer_model("Granite 4.0"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "GRANITE_HYBRID",
            hyperparameters=granite_hybrid_hyperparameters,
            computed=llama_computed,
            permute_qk=True,
            check_config=granite_hybrid_checked,
            rearranged=granite_hybrid_tensors,
            arch_by_config=all_attention_arch,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        linearized=linear_experts,
        notes={"quantize": "each expert's projections Linear layers, as llm-compressor makes them"},
    ),
    Family(
        "Bamba",
        "bamba",
        "BambaForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Bamba layout (Mamba-2 layers) is not mapped yet"),
        **no_trainer_model("Bamba"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "GRANITE_HYBRID",
            hyperparameters=bamba_hyperparameters,
            computed=llama_computed,
            check_config=bamba_checked,
            rearranged=bamba_tensors,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)
