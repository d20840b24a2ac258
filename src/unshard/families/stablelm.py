"""StableLM (Stability AI's StableLM 2 and 3B): LayerNorms with biases, rope over part of each head, biases on q, k and
v where the config says, the attention and the MLP in parallel where it says, a LayerNorm per head of q and k where it
says (StableLM 2 12B: llama.cpp stacks them, sinks/gguf/tensors.py's HEAD_NORM); llama.cpp's stablelm, whose converter
writes a header of its own (no rope base: llama.cpp takes 10000)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import first_of, rope_parameters, turned_at_llama_cpp_base
from .llama import SIBLINGS, TEXT_ONLY
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model


def stablelm_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's StableLMModel's, in its order."""
    writer.add_context_length(hparams["max_position_embeddings"])
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(hparams["intermediate_size"])
    head = hparams["hidden_size"] // hparams["num_attention_heads"]
    writer.add_rope_dimension_count(int(rope_parameters(hparams)[1]["partial_rotary_factor"] * head))
    writer.add_head_count(hparams["num_attention_heads"])
    writer.add_head_count_kv(hparams["num_key_value_heads"])
    writer.add_parallel_residual(hparams.get("use_parallel_residual", True))
    writer.add_layer_norm_eps(first_of(hparams, "layer_norm_eps", "norm_eps"))
    writer.add_file_type(ftype)


def stablelm_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's stablelm would compute otherwise: a rope base other than its own."""
    _, rope = rope_parameters(hparams)
    if rope.get("partial_rotary_factor") is None:
        raise ConfigMismatchError(f"{where}: no partial_rotary_factor, which llama.cpp's stablelm needs; add it")
    turned_at_llama_cpp_base(hparams, where, "stablelm")


FAMILIES = (
    Family(
        "StableLM",
        "stablelm",
        "StableLmForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's StableLM layout (LayerNorms, partial rope) is not mapped yet"),
        **no_trainer_model("StableLM"),
        fused_siblings=SIBLINGS,
        gguf=GGUFPart(
            "STABLELM", hyperparameters=stablelm_hyperparameters, check_config=stablelm_checked, vocabulary="bpe"
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)
