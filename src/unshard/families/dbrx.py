"""DBRX (`DbrxForCausalLM`, Databricks'): q, k and v in one tensor clipped to `clip_qkv`, LayerNorms without biases,
experts behind a softmax router whose top weights are renormalised, each expert's projections held as one 2-D tensor
(experts times their width, by the model's width); llama.cpp's dbrx, as the converter's DbrxModel writes it (its own
header; the experts as stacks, down's transposed; every matrix, the router too, in the file's type)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import rope_parameters
from .llama import TEXT_ONLY
from .parts import NO_TABLE, Family, GGUFPart, Rearrangement, Unsupported, no_trainer_model


def dbrx_read(hparams: dict, where: Path) -> dict:
    """The config with its attention's and experts' settings (nested in attn_config and ffn_config) beside the rest."""
    attention, experts = hparams.get("attn_config") or {}, hparams.get("ffn_config") or {}
    return {
        **hparams,
        "num_key_value_heads": attention.get("kv_n_heads"),
        "num_experts": experts.get("moe_num_experts"),
    }


def dbrx_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's DbrxModel's (not the TextModel's): the sizes, the key-value heads, rope's base, the clip of q, k
    and v, the experts, the norms' epsilon (1e-5, whatever the config)."""
    attention, experts = hparams["attn_config"], hparams["ffn_config"]
    writer.add_block_count(blocks)
    writer.add_context_length(hparams["max_seq_len"])
    writer.add_embedding_length(hparams["d_model"])
    writer.add_feed_forward_length(experts["ffn_hidden_size"])
    writer.add_head_count(hparams["n_heads"])
    writer.add_head_count_kv(attention["kv_n_heads"])
    writer.add_rope_freq_base(attention["rope_theta"])
    writer.add_clamp_kqv(attention["clip_qkv"])
    writer.add_expert_count(experts["moe_num_experts"])
    writer.add_expert_used_count(experts["moe_top_k"])
    writer.add_layer_norm_eps(1e-5)
    writer.add_file_type(ftype)


def dbrx_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's dbrx computes whatever the file says: q, k and v clipped, the top experts' weights summing to
    one, SiLU; and rope's base, which the converter reads from attn_config and transformers 5 from rope_parameters."""
    attention, experts = hparams.get("attn_config") or {}, hparams.get("ffn_config") or {}
    activation = (experts.get("ffn_act_fn") or {}).get("name", "silu")
    theta, turned = attention.get("rope_theta"), rope_parameters(hparams)[1].get("rope_theta", 10000.0)
    for wrong, why in (
        (
            theta != turned,
            f"attn_config's rope_theta is {theta}, which llama.cpp's converter writes, and transformers turns rope at "
            f"{turned} (rope_parameters)",
        ),
        (attention.get("clip_qkv") is None, "attn_config's clip_qkv is null, and llama.cpp's dbrx clips q, k and v"),
        (
            experts.get("moe_normalize_expert_weights", 1) != 1,
            "ffn_config's moe_normalize_expert_weights is not 1, and llama.cpp's dbrx sums the top weights to one",
        ),
        (activation != "silu", f"ffn_config's ffn_act_fn is {activation!r}, and llama.cpp's dbrx runs SiLU"),
    ):
        if wrong:
            raise ConfigMismatchError(
                f"{where}: {why}: it would compute another model; serve this one with transformers or vLLM"
            )


def dbrx_experts(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """Each expert projection (experts times their width, by the model's width) as a stack of experts, down's each
    transposed, named with `.weight` as the converter names them."""
    if not name.endswith((".experts.mlp.w1", ".experts.mlp.v1", ".experts.mlp.w2")):
        return None
    width = hparams["ffn_config"]["ffn_hidden_size"]
    experts, down = shape[0] // width, name.endswith(".w2")
    stack = (experts, shape[1], width) if down else (experts, width, shape[1])
    return Rearrangement({name + ".weight": stack}, partial(expert_stack, width, down), rows_per_band=width)


def expert_stack(width: int, down: bool, band) -> tuple:
    """A band of whole experts' rows as a stack of them (each transposed for down)."""
    stack = band.reshape(-1, width, band.shape[-1])
    return (stack.swapaxes(1, 2) if down else stack,)


FAMILIES = (
    Family(
        "DBRX",
        "dbrx",
        "DbrxForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's DBRX layout is not mapped yet"),
        **no_trainer_model("DBRX"),
        fused_siblings=(),
        gguf=GGUFPart(
            "DBRX",
            hyperparameters=dbrx_hyperparameters,
            check_config=dbrx_checked,
            vocabulary="bpe",
            rearranged=dbrx_experts,
            as_the_converter_reads=dbrx_read,
            routers_in_file_type=True,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={
            "quantize": "not compared with llm-compressor, whose pinned transformers (5.17) cannot read the DBRX "
            "config transformers 5.24 writes"
        },
    ),
)
