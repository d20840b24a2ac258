"""dots.llm1 (rednote's `Dots1ForCausalLM`): Qwen3's attention (q and k normed per head), dense first layers, then
DeepSeek-V3's experts (a sigmoid router choosing by a correction bias, shared experts, a routing scale); llama.cpp's
dots1, whose converter is its Qwen2-MoE's (the experts' count from n_routed_experts, their width after the file type)
with the dense layers, the shared experts' count, the scale and the renormalisation after."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import GATING_KEYS, first_of, qwen2moe_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY
from .parts import NO_TABLE, Family, GGUFPart, Unsupported, no_trainer_model


def dots1_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Dots1Model's, in its order."""
    qwen2moe_hyperparameters(writer, hparams, ftype, blocks, folder, expert_groups=True)
    writer.add_leading_dense_block_count(hparams["first_k_dense_replace"])
    writer.add_expert_shared_count(hparams["n_shared_experts"])
    writer.add_expert_weights_scale(hparams["routed_scaling_factor"])
    writer.add_expert_weights_norm(hparams["norm_topk_prob"])


def dots1_checked(hparams: dict, where: Path) -> None:
    """transformers' Dots1 routes by a sigmoid; llama.cpp's dots1 does where the config says so (the converter writes
    the gating function only then), and by a softmax otherwise. And llama.cpp's dots1 gives every head its own keys
    and values, as dots.llm1 has them."""
    heads = hparams["num_attention_heads"]
    if (hparams.get("num_key_value_heads") or heads) != heads:
        raise ConfigMismatchError(
            f"{where}: num_key_value_heads is {hparams['num_key_value_heads']}, and llama.cpp's dots1 gives each of "
            f"the {heads} heads its own keys; serve this model with transformers or vLLM"
        )
    gating = first_of(hparams, *GATING_KEYS)
    if gating != "sigmoid":
        raise ConfigMismatchError(
            f"{where}: the experts' gating function is {gating!r}, not 'sigmoid' (scoring_func), and llama.cpp's dots1 "
            'would route by another than transformers\' sigmoid; add "scoring_func": "sigmoid" to the config'
        )


FAMILIES = (
    Family(
        "dots.llm1",
        "dots1",
        "Dots1ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's dots.llm1 layout is not mapped yet"),
        **no_trainer_model("dots.llm1"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart("DOTS1", hyperparameters=dots1_hyperparameters, check_config=dots1_checked, vocabulary="bpe"),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    ),
)
