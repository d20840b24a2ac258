"""T5 (`T5ForConditionalGeneration`: T5's, Flan-T5's; mT5's and UMT5's alike): an encoder and a decoder, each layer
RMS-normed before its attention and its MLP, positions as buckets of relative distance whose biases each stack's
first layer holds (the layers after it reuse them; UMT5's each its own), the decoder attending to the encoder's
output too, a ReLU MLP (T5's) or a gated GELU one (T5 v1.1's and Flan-T5's). To GGUF as llama.cpp's converter writes
it (llama.cpp's t5, which encodes the prompt and decodes from the decoder's start token), and its encoder alone
(`T5EncoderModel`: image models' text encoders, sentence-t5's) as llama.cpp's t5encoder; a UMT5 without its head
(`UMT5Model`) as the converter writes it, llama.cpp reading the embedding as the head. The vocabulary is T5's
SentencePiece unigram (llama.cpp's `t5` tokenizer)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigMismatchError
from .llama import TEXT_ONLY
from .parts import Family, GGUFPart, Unsupported, gguf_family

# llama.cpp's t5 computes the buckets of distances up to this many tokens (its relative_position_bucket's constant)
LLAMA_CPP_MAX_DISTANCE = 128
# The MLPs llama.cpp's t5 computes: ReLU without a gate, a GELU (tanh's approximation) with one, by transformers'
# names of those activations
LLAMA_CPP_ACTIVATIONS = {False: ("relu",), True: ("gelu_new", "gelu_pytorch_tanh")}


def encoder_alone(hparams: dict) -> bool:
    return (hparams.get("architectures") or [None])[0] == "T5EncoderModel"


def t5_architecture(hparams: dict) -> str | None:
    """llama.cpp's t5encoder for an encoder alone, else its t5."""
    return "T5ENCODER" if encoder_alone(hparams) else None


def t5_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's t5 computes otherwise than transformers, refused: buckets of other distances, an MLP of
    another activation."""
    distance = hparams.get("relative_attention_max_distance", LLAMA_CPP_MAX_DISTANCE)
    if distance != LLAMA_CPP_MAX_DISTANCE:
        raise ConfigMismatchError(
            f"{where}: relative_attention_max_distance {distance}, and llama.cpp's t5 buckets distances up to "
            f"{LLAMA_CPP_MAX_DISTANCE}; serve this model with transformers"
        )
    projection = str(hparams.get("feed_forward_proj", "relu"))
    gated = projection.startswith("gated-")
    # (transformers' reading: the activation from feed_forward_proj alone, gated-gelu's as gelu_new)
    activation = "gelu_new" if projection == "gated-gelu" else projection.split("-")[-1]
    if activation not in LLAMA_CPP_ACTIVATIONS[gated]:
        raise ConfigMismatchError(
            f"{where}: feed_forward_proj {projection!r}, and llama.cpp's t5 computes a ReLU MLP or a gated GELU one; "
            "serve this model with transformers"
        )


def t5_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's T5Model's (or T5EncoderModel's, without the decoder's), in its order: the context 512 where the
    config says none (T5's have none), the sizes, the buckets, the norms' epsilon as both kinds, the decoder's start."""
    epsilon = hparams["layer_norm_epsilon"]
    writer.add_context_length(hparams.get("n_positions", 512))
    writer.add_embedding_length(hparams["d_model"])
    writer.add_feed_forward_length(hparams["d_ff"])
    writer.add_block_count(blocks)
    if not encoder_alone(hparams) and hparams.get("num_decoder_layers") is not None:
        writer.add_decoder_block_count(hparams["num_decoder_layers"])
    writer.add_head_count(hparams["num_heads"])
    writer.add_key_length(hparams["d_kv"])
    writer.add_value_length(hparams["d_kv"])
    writer.add_layer_norm_eps(epsilon)
    writer.add_relative_attn_buckets_count(hparams["relative_attention_num_buckets"])
    writer.add_layer_norm_rms_eps(epsilon)
    if not encoder_alone(hparams):
        if hparams.get("decoder_start_token_id") is None:
            raise ConfigMismatchError(
                f"{folder / 'config.json'}: no decoder_start_token_id, which llama.cpp's t5 starts decoding from; "
                "add it (T5's is 0, its padding token)"
            )
        writer.add_decoder_start_token_id(hparams["decoder_start_token_id"])
    writer.add_file_type(ftype)


def t5_notes(hparams: dict, where: Path) -> list[str] | None:
    """llama.cpp's t5 applies the head to the decoder's output as it is, where transformers scales it by the width to
    the -1/2 first (T5's, whose head is its embedding; not Flan-T5's): the same tokens greedily, logits times the
    square root of the width."""
    t5_checked(hparams, where)
    if (hparams.get("architectures") or [None])[0] == "UMT5Model":
        return [
            "UMT5Model has no head: llama.cpp computes logits with the embedding as it, where transformers gives the "
            "decoder's last hidden states"
        ]
    # (transformers 5 writes whether it scales; a config before it says so by tying the head, T5's and not Flan-T5's;
    # its mT5 scales none)
    tied = hparams.get("tie_word_embeddings", True) is not False and hparams.get("model_type") != "mt5"
    scaled = hparams.get("scale_decoder_outputs", tied)
    if not encoder_alone(hparams) and scaled:
        return [
            "llama.cpp's t5 does not scale the decoder's output by d_model ** -0.5 before the head as transformers "
            f"does for this T5 (its head the embedding): its logits are transformers' times {hparams['d_model']} ** "
            "0.5, the same tokens greedily"
        ]
    return None


# (one for the three: the converter's T5Model writes each of them)
T5_GGUF = GGUFPart(
    "T5",
    hyperparameters=t5_hyperparameters,
    arch_by_config=t5_architecture,
    check_config=t5_notes,
    vocabulary="t5",
)


def t5_family(name: str, model_type: str, architecture: str, also: tuple[str, ...] = ()) -> Family:
    """A T5 unshard writes as GGUF, as the converter's T5Model writes each of them: no --quantize."""
    no_vllm = Unsupported(f"vLLM, which reads compressed-tensors' folders, serves no {name}")
    return gguf_family(name, model_type, architecture, T5_GGUF, no_vllm, TEXT_ONLY, also)


FAMILIES = (
    # (T5WithLMHeadModel: the class the original T5 releases' configs name, transformers' first)
    t5_family("T5", "t5", "T5ForConditionalGeneration", also=("T5EncoderModel", "T5WithLMHeadModel")),
    # (T5 v1.1's layout, multilingual: its head apart)
    t5_family("mT5", "mt5", "MT5ForConditionalGeneration"),
    # (mT5's, each layer with buckets' biases of its own, as llama.cpp's t5 reads them where the file has them; and
    # without the head, as the converter writes it too)
    t5_family("UMT5", "umt5", "UMT5ForConditionalGeneration", also=("UMT5Model",)),
)
