"""Laguna (poolside's, `LagunaForCausalLM`): q and k normed per head, attention's output gated by a softplus of its own
projection (per head, XS.2's, or per element, M.1's), heads counted per layer, a window on three layers in four (the
first of each four global) with rope of its own on those, dense first layers, then experts behind a sigmoid router with
its correction bias, the routing renormalised and scaled, a shared expert beside them; llama.cpp's laguna, which
PyPI's gguf-py 0.19 lacks (written with llama.cpp's own, sinks/gguf)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import gguf_py, gguf_quiet, rope_parameters, text_hyperparameters
from .llama import SIBLINGS, TEXT_ONLY
from .parts import LLAMA_CPP_GGUF_PY, NO_TABLE, Family, GGUFPart, Unsupported, no_trainer_model

# the values of `gating` transformers and the converter read alike, and the gate each gives (transformers reads any
# other but "per-head" as per element, where the converter refuses it)
GATES = {True: "per_head", "per-head": "per_head", "per-element": "per_element", "per_element": "per_element"}


def heads_per_layer(hparams: dict) -> list[int]:
    return (
        hparams.get("num_attention_heads_per_layer") or [hparams["num_attention_heads"]] * hparams["num_hidden_layers"]
    )


def laguna_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's LagunaModel's: the TextModel's, then the vocabulary's size, the heads of each layer (over the
    TextModel's count, in its place), the window, the experts' and the shared expert's widths, the routing (always
    renormalised, as transformers' router does; scaled; by a sigmoid), the dense first layers, and how much of a head
    rope turns on the global layers and on the sliding ones."""
    text_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_vocab_size(hparams["vocab_size"])
    with gguf_quiet():
        writer.add_head_count(heads_per_layer(hparams))
    if hparams.get("sliding_window"):
        writer.add_sliding_window(hparams["sliding_window"])
    writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
    writer.add_expert_shared_feed_forward_length(hparams["shared_expert_intermediate_size"])
    writer.add_expert_weights_norm(True)
    writer.add_expert_weights_scale(float(hparams.get("moe_routed_scaling_factor", 1.0)))
    writer.add_expert_gating_func(gguf_py().ExpertGatingFuncType.SIGMOID)
    kinds = hparams["mlp_layer_types"]
    writer.add_leading_dense_block_count(next((i for i, kind in enumerate(kinds) if kind != "dense"), len(kinds)))
    by_layer, full = rope_parameters(hparams)
    head_dim = hparams["head_dim"]
    writer.add_rope_dimension_count(int(head_dim * float(full.get("partial_rotary_factor", 1.0))))
    if by_layer.get("sliding_attention") is not None:
        sliding = by_layer["sliding_attention"]
        writer.add_rope_dimension_count_swa(int(head_dim * float(sliding.get("partial_rotary_factor", 1.0))))


def laguna_end_tokens(writer, hparams: dict, folder: Path) -> None:
    """After the vocabulary, as the converter: the chat template of chat_template.jinja where the folder has one
    (over tokenizer_config.json's, in its place), and the first of the config's end tokens that is not its start
    token as the end of turn (XS.2's `</assistant>`)."""
    template = folder / "chat_template.jinja"
    if template.is_file():
        with gguf_quiet():
            writer.add_chat_template(template.read_text(encoding="utf-8"))
    ends = hparams.get("eos_token_id")
    if isinstance(ends, list):
        turn_ends = [end for end in ends if end != hparams.get("bos_token_id")]
        if turn_ends:
            writer.add_eot_token_id(turn_ends[0])


def laguna_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's laguna computes: the window on three layers in four, the first of each four global (or no
    window at all), plain rope on the sliding layers, dense layers first only, SwiGLU without biases, router logits
    as they are, a gate the converter can tell. Another config is one line."""
    blocks = hparams["num_hidden_layers"]
    kinds = hparams.get("layer_types") or ["full_attention"] * blocks
    pattern = ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(blocks)]
    sliding_rope = (rope_parameters(hparams)[0].get("sliding_attention") or {}).get("rope_type", "default")
    dense = hparams.get("mlp_layer_types") or ()
    leading = next((i for i, kind in enumerate(dense) if kind != "dense"), len(dense))
    why = None
    if hparams.get("sliding_window") and kinds != pattern:
        why = f"layer_types is {kinds}, and llama.cpp's laguna slides the window on all but every fourth layer"
    elif not hparams.get("sliding_window") and "sliding_attention" in kinds:
        why = "layer_types has sliding layers and sliding_window is none, and llama.cpp's laguna then has none"
    elif sliding_rope != "default":
        why = f"the sliding layers' rope is {sliding_rope!r}, and llama.cpp's laguna turns theirs unscaled"
    elif any(kind == "dense" for kind in dense[leading:]):
        why = f"mlp_layer_types is {list(dense)}, and llama.cpp's laguna has dense layers first only"
    elif hparams.get("hidden_act", "silu") != "silu":
        why = f"hidden_act is {hparams['hidden_act']!r}, and llama.cpp's laguna runs SiLU"
    elif hparams.get("attention_bias"):
        why = "attention_bias is set, and llama.cpp's laguna has no biases"
    elif hparams.get("moe_router_logit_softcapping"):
        why = "moe_router_logit_softcapping is set, and llama.cpp's laguna caps no router logits"
    elif hparams.get("gating", True) not in GATES:
        why = f"gating is {hparams['gating']!r}: neither per-head nor per-element, which the converter tells apart"
    elif hparams.get("gating_types") and any(
        str(kind).replace("-", "_") != GATES[hparams.get("gating", True)] for kind in hparams["gating_types"]
    ):
        why = "gating_types differ from gating, which transformers and vLLM read alone (the converter refuses them)"
    if why:
        raise ConfigMismatchError(
            f"{where}: {why}: it would compute another model; serve this one with transformers or vLLM"
        )


FAMILIES = (
    Family(
        "Laguna",
        "laguna",
        "LagunaForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Laguna layout is not mapped yet"),
        **no_trainer_model("Laguna"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "LAGUNA",
            hyperparameters=laguna_hyperparameters,
            check_config=laguna_checked,
            vocabulary="bpe",
            after_vocabulary=laguna_end_tokens,
            control_tokens=("</assistant>",),
            expert_stack_order=("gate_proj.weight", "up_proj.weight", "down_proj.weight"),
        ),
        mmproj=TEXT_ONLY,
        moe_layout=Unsupported("merge-moe assembles Mixtral and Qwen MoE models only so far"),
        notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="laguna")},
    ),
)
