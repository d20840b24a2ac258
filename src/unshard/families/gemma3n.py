"""Gemma 3n's text model (`Gemma3nForCausalLM`), and the whole model (`Gemma3nForConditionalGeneration`, the Hub's E2B
and E4B: that text model beside MobileNetV5's vision tower and a Conformer audio encoder). Gemma 3's attention (q and
k normed, sliding and global layers) with AltUp (the hidden state carried as 4 streams, 3 of them projected in and
out of the model), LAuReL (a low-rank residual beside attention), per-layer embeddings (a second embedding of every
token, a slice for each layer, gated into it), activation sparsity in the first layers' MLPs, and the last layers
reusing earlier layers' keys and values.
Its norms are applied as they are (not as 1 + weight, as Gemma 3's).

llama.cpp's gemma3n, as the converter writes it: the 3 AltUp projections in and out each stacked into one tensor, the
embeddings padded with zero rows to the vocabulary's size (the Hub's per-layer embedding has none for the image and
audio tokens), Gemma 3's header with AltUp's, the per-layer embedding's width, the shared layers' count, each layer's
sparsity as the normal distribution's quantile, and which layers are sliding. Of the whole model, the text model's file
alone, as the converter writes it, the towers left out with a note (their mmproj file is not written yet)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import ConfigMismatchError
from .gemma import DENSE_ONLY, MEGATRON, gemma3_after_vocabulary, gemma3_header
from .llama import SIBLINGS, TEXT_ONLY
from .parts import NO_TABLE, Family, GGUFPart, Unsupported, gguf_family, no_trainer_model

# What llama.cpp's gemma3n fixes in its code whatever the file says, as E2B and E4B have it: the first 20 layers keys
# and values of their own (E2B's 30 layers and E4B's 35 both share from there), AltUp's 4 streams (as the converter
# asserts) of which the first is active, LAuReL's rank, the per-layer embeddings' width, and activation sparsity in the
# first 10 layers at the 0.95 quantile
OWN_KV_LAYERS = 20
FIXED = {"altup_num_inputs": 4, "altup_active_idx": 0, "laurel_rank": 64, "hidden_size_per_layer_input": 256}
SPARSE_LAYERS, SPARSITY = 10, 0.95
EMBEDDINGS = ("embed_tokens.weight", "embed_tokens_per_layer.weight")


def gemma3n_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Gemma3NModel's, in its order: Gemma 3's, then AltUp's active stream and count, the per-layer
    embedding's width, the shared layers, each layer's activation sparsity as the standard normal's quantile (computed
    by torch in float32, as the converter), and which layers are sliding."""
    import torch

    gemma3_header(writer, hparams, ftype, blocks, folder)
    writer.add_altup_active_idx(hparams["altup_active_idx"])
    writer.add_altup_num_inputs(hparams["altup_num_inputs"])
    writer.add_embedding_length_per_layer_input(hparams["hidden_size_per_layer_input"])
    writer.add_shared_kv_layers(hparams["num_kv_shared_layers"])
    normal = torch.distributions.normal.Normal(0, 1)
    quantiles = [
        normal.icdf(torch.tensor(s, dtype=torch.float32)).item() for s in hparams["activation_sparsity_pattern"]
    ]
    writer.add_activation_sparsity_scale(quantiles)
    writer.add_sliding_window_pattern([kind == "sliding_attention" for kind in hparams["layer_types"]])


def gemma3n_checked(hparams: dict, where: Path) -> list[str]:
    """What llama.cpp's gemma3n computes otherwise than transformers (FIXED and the rest it fixes in its code), or the
    converter refuses: one line. Noted: the sparse layers' cut-off, which llama.cpp sets by the activations' standard
    deviation over n - 1 and transformers over n, a factor that the model's width makes small."""
    why = _computed_otherwise(hparams)
    if why:
        raise ConfigMismatchError(f"{where}: {why}; serve this model with transformers or vLLM")
    widths = hparams["intermediate_size"]
    width = min(widths) if isinstance(widths, list) else widths
    return [
        f"llama.cpp's gemma3n cuts the first {SPARSE_LAYERS} layers' activations at a standard deviation over n - 1, "
        f"transformers over n: {(width / (width - 1)) ** 0.5:.6f} times transformers' at this width ({width}), "
        "as in the converter's file"
    ]


def _computed_otherwise(hparams: dict) -> str | None:
    layers, shared = hparams["num_hidden_layers"], hparams.get("num_kv_shared_layers") or 0
    for key, value in FIXED.items():
        if hparams.get(key) != value:
            return f"{key} is {hparams.get(key)}, and llama.cpp's gemma3n takes {value}"
    if layers - shared != OWN_KV_LAYERS:
        return (
            f"{layers - shared} layers have keys and values of their own (num_kv_shared_layers {shared} of {layers}), "
            f"and llama.cpp's gemma3n gives them to the first {OWN_KV_LAYERS}"
        )
    if (hparams.get("layer_types") or [])[OWN_KV_LAYERS - 2 : OWN_KV_LAYERS] != ["sliding_attention", "full_attention"]:
        return (
            f"layers {OWN_KV_LAYERS - 2} and {OWN_KV_LAYERS - 1} are not a sliding then a global one, whose keys and "
            "values llama.cpp's gemma3n has the shared layers reuse"
        )
    if hparams.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        return f"hidden_activation is {hparams['hidden_activation']}, and llama.cpp's gemma3n runs GELU (tanh)"
    if list(hparams.get("activation_sparsity_pattern") or []) != [SPARSITY] * SPARSE_LAYERS + [0.0] * (
        layers - SPARSE_LAYERS
    ):
        return (
            f"activation_sparsity_pattern is not {SPARSITY} in the first {SPARSE_LAYERS} layers and 0 after, which "
            "llama.cpp's gemma3n applies whatever the file says"
        )
    return None


def gemma3n_padded_rows(name: str, shape: tuple[int, ...], hparams: dict) -> int | None:
    """The embeddings' rows in the file: the vocabulary's, the tokens past the tensor's own rows zero (the converter
    pads them so)."""
    return hparams["vocab_size"] if name.endswith(EMBEDDINGS) else None


def gemma3n_unused(hparams: dict) -> dict[str, tuple[int, ...]]:
    """The shared layers' keys, values and keys' norm, which llama.cpp's gemma3n loads for every layer (the Hub's
    checkpoints hold them) and computes with for the first 20 only: transformers 5 builds none for the shared layers."""
    layers, shared = hparams["num_hidden_layers"], hparams.get("num_kv_shared_layers") or 0
    head, width = hparams["head_dim"], hparams["num_key_value_heads"] * hparams["head_dim"]
    tensors = {}
    for layer in range(layers - shared, layers):
        for kind in ("attn_k", "attn_v"):
            tensors[f"blk.{layer}.{kind}.weight"] = (width, hparams["hidden_size"])
        tensors[f"blk.{layer}.attn_k_norm.weight"] = (head,)
    return tensors


GEMMA3N = GGUFPart(
    "GEMMA3N",
    hyperparameters=gemma3n_hyperparameters,
    after_vocabulary=gemma3_after_vocabulary,
    check_config=gemma3n_checked,
    renames=((r"_scale$", "_scale.weight"),),
    stacked=r"^(.*\.altup_(?:unembed_)?projections)\.(\d+)\.(weight)$",
    padded_rows=gemma3n_padded_rows,
    unused=gemma3n_unused,
)
# (the whole model's towers and their embedders, by the names transformers saves them under)
TOWERS = r"^model\.(?:vision_tower|audio_tower|embed_vision|embed_audio)\."

FAMILIES = (
    Family(
        "Gemma 3n (text)",
        "gemma3n_text",
        "Gemma3nForCausalLM",
        tensors=NO_TABLE,
        megatron=MEGATRON,
        **no_trainer_model("Gemma 3n"),
        fused_siblings=SIBLINGS,
        gguf=GEMMA3N,
        mmproj=TEXT_ONLY,
        moe_layout=DENSE_ONLY,
    ),
    gguf_family(
        "Gemma 3n",
        "gemma3n",
        "Gemma3nForConditionalGeneration",
        replace(GEMMA3N, towers=TOWERS),
        # (llm-compressor builds the model, its MobileNetV5 tower with timm, which takes torchvision: PyPI's loads
        # beside CUDA's torch alone, and llm-compressor's venv holds the CPU build)
        Unsupported(
            "not written: llm-compressor builds Gemma 3n's vision tower with timm, which takes torchvision's CUDA "
            "build, so it was not compared here"
        ),
        Unsupported(
            "Gemma 3n's MobileNetV5 vision tower and Conformer audio encoder (llama.cpp's gemma3n projectors): not "
            "written yet"
        ),
        tower="its MobileNetV5 and Conformer towers",
    ),
)
