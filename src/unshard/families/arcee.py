"""Arcee's AFM: Llama's attention with a two-layer ReLU² MLP (up and down, no gate); llama.cpp's arcee, whose converter
is its LlamaModel (q and k reordered per head).

Arcee's AFMoE (Trinity, `AfmoeForCausalLM`): attention gated by a sigmoid of its own projection, q and k normed per
head, norms before and after attention and the MLP, three layers in four with a sliding window and rotary embeddings
and the fourth global without, dense first layers, then experts behind a sigmoid router with an expert bias beside
shared experts, the embeddings scaled by sqrt(hidden) (muP); llama.cpp's afmoe, whose converter is its LlamaModel's
header without reordering q and k (llama.cpp turns halves of each head, as transformers)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import llama_hyperparameters, sliding_three_in_four
from .llama import SIBLINGS, TEXT_ONLY, llama_computed
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model


def afmoe_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's AfmoeModel's: the LlamaModel's, then the shared experts' count, the experts' width, the dense
    first layers, the routing's renormalisation (which transformers' router always does: the Hub's config says
    route_norm, transformers' has no such key) and scale, the sliding window."""
    llama_hyperparameters(writer, hparams, ftype, blocks, folder)
    for key, add in (
        ("num_shared_experts", writer.add_expert_shared_count),
        ("moe_intermediate_size", writer.add_expert_feed_forward_length),
        ("num_dense_layers", writer.add_leading_dense_block_count),
    ):
        if hparams.get(key) is not None:
            add(hparams[key])
    writer.add_expert_weights_norm(hparams.get("route_norm", True))
    for key, add in (("route_scale", writer.add_expert_weights_scale), ("sliding_window", writer.add_sliding_window)):
        if hparams.get(key) is not None:
            add(hparams[key])


def afmoe_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's afmoe computes whatever the config says: the embeddings scaled by sqrt(hidden) (muP), a
    sliding window on three layers in four, the chosen experts' weights renormalised."""
    pattern = sliding_three_in_four(hparams["num_hidden_layers"])
    if not hparams.get("mup_enabled"):
        said = "mup_enabled is false, and llama.cpp's afmoe scales the embeddings by sqrt(hidden_size) (muP)"
    elif hparams.get("sliding_window") and (hparams.get("layer_types") or pattern) != pattern:
        said = "layer_types is not a sliding window on three layers in four, which llama.cpp's afmoe runs"
    elif hparams.get("route_norm") is False:
        said = "route_norm is false, and transformers' AFMoE renormalises the chosen experts' weights"
    else:
        return
    raise ConfigMismatchError(f"{where}: {said}; serve this model with transformers or vLLM")


FAMILIES = (
    Family(
        "Arcee (AFM)",
        "arcee",
        "ArceeForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's AFM layout (a ReLU² MLP without a gate) is not mapped yet"),
        **no_trainer_model("AFM"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"),),
        gguf=GGUFPart(
            "ARCEE",
            hyperparameters=llama_hyperparameters,
            computed=llama_computed,
            permute_qk=True,
            llama_vocabulary=True,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
    Family(
        "AFMoE (Trinity)",
        "afmoe",
        "AfmoeForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's AFMoE layout (gated attention, muP) is not mapped yet"),
        **no_trainer_model("AFMoE"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "AFMOE",
            hyperparameters=afmoe_hyperparameters,
            computed=llama_computed,
            llama_vocabulary=True,
            check_config=afmoe_checked,
            renames=((r"\.mlp\.expert_bias$", ".mlp.expert_bias.bias"),),
            expert_stack_order=("gate_proj.weight", "up_proj.weight", "down_proj.weight"),
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
    ),
)
