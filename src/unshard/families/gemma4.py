"""Gemma 4's text model (Gemma4ForCausalLM): Gemma 3's layout with norms applied as they are, sliding-window and
global layers of head widths of their own (the global ones with keys as values where attention_k_eq_v, and rope on
part of each head), each layer's output scaled; E2B's and E4B's per-layer embeddings and last layers reusing earlier
layers' keys and values; 26B-A4B's fused experts beside the MLP, behind a router with scales of its own. llama.cpp's
gemma4, whose converter writes Gemma 3's header with Gemma 4's after it, rope on part of a global head as frequency
factors, and the vocabulary as llama.cpp's gemma4 tokenizer."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .gemma import DENSE_ONLY, MEGATRON, gemma3_header
from .gguf_hooks import (
    first_of,
    fixed_in_code,
    gguf_py,
    gguf_quiet,
    json_or_empty,
    mmproj_model_forced_type,
    rope_parameters,
)
from .llama import SIBLINGS, TEXT_ONLY
from .parts import (
    LLAMA_CPP_GGUF_PY,
    NO_TABLE,
    Family,
    GGUFPart,
    MmprojPart,
    Rearrangement,
    Unsupported,
    fused_experts_as_linear,
    middle_axis_dropped,
    no_trainer_model,
    patch_embedding_as_convolution,
    pixels_channels_first,
    softplus,
)

SLIDING, GLOBAL = "sliding_attention", "full_attention"


def global_attention(hparams: dict) -> tuple[int | None, int | None]:
    """The global layers' head width and key-value heads, as the converter finds them: the config's own keys (the
    Hub's), else the first global layer's per_layer_config (transformers 5 saves them so); None where neither says."""
    layer_types, per_layer = hparams.get("layer_types") or [], hparams.get("per_layer_config") or {}
    first_global = next(
        (each for i, each in per_layer.items() if int(i) < len(layer_types) and layer_types[int(i)] == GLOBAL), {}
    )
    head_dim = hparams.get("global_head_dim") or first_global.get("head_dim")
    kv_heads = hparams.get("num_global_key_value_heads") or first_global.get("num_key_value_heads")
    return head_dim, kv_heads


def gemma4_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Gemma4Model's header: Gemma 3's, then the layers sharing keys and values, the per-layer
    embeddings' width, which layers slide, each kind's head width, the experts' width, a wider MLP where layers share
    keys and values (use_double_wide_mlp), each layer's key-value heads where the global ones have their own count,
    and the rotated dimensions (a global head whole: its rope_freqs leave the rest unturned)."""
    gemma3_header(writer, hparams, ftype, blocks, folder)
    with gguf_quiet():  # (the keys the converter writes again, over Gemma 3's: gguf-py warns of each)
        _gemma4_header(writer, hparams, blocks)


def _gemma4_header(writer, hparams: dict, blocks: int) -> None:
    shared = hparams["num_kv_shared_layers"]
    writer.add_shared_kv_layers(shared)
    writer.add_embedding_length_per_layer_input(hparams.get("hidden_size_per_layer_input") or 0)
    sliding = [kind == SLIDING for kind in hparams["layer_types"]]
    writer.add_sliding_window_pattern(sliding)
    global_head_dim, global_kv_heads = global_attention(hparams)
    writer.add_key_length(global_head_dim)
    writer.add_value_length(global_head_dim)
    writer.add_key_length_swa(hparams["head_dim"])
    writer.add_value_length_swa(hparams["head_dim"])
    if (expert_width := first_of(hparams, "expert_intermediate_size", "moe_intermediate_size")) is not None:
        writer.add_expert_feed_forward_length(expert_width)
    if hparams.get("use_double_wide_mlp"):
        width, first_shared = hparams["intermediate_size"], blocks - shared
        writer.add_feed_forward_length([width if i < first_shared else width * 2 for i in range(blocks)])
    if global_kv_heads is not None and hparams.get("num_key_value_heads") is not None:
        writer.add_head_count_kv([hparams["num_key_value_heads"] if s else global_kv_heads for s in sliding])
    writer.add_rope_dimension_count(global_head_dim)
    writer.add_rope_dimension_count_swa(hparams["head_dim"])


def gemma4_rope_factors(writer, hparams: dict, rope: dict, head_dim: int, where: Path) -> dict[str, list[float]]:
    """The global layers' proportional rope as llama.cpp turns a whole head (NeoX's halves): the frequencies of the
    rotated part as they are, the others divided by 1e30, so that those dimensions stay where they are."""
    global_head_dim, _ = global_attention(hparams)
    rotated = int(global_head_dim * rope.get("partial_rotary_factor", 1.0) / 2)  # (transformers' default too)
    return {"rope_freqs.weight": [1.0] * rotated + [1e30] * (global_head_dim // 2 - rotated)}


def gemma4_checked(hparams: dict, where: Path) -> None:
    """A config llama.cpp's gemma4 would compute otherwise than transformers (or not load) is one line."""
    refusal = _gemma4_refusal(hparams)
    if refusal:
        raise ConfigMismatchError(f"{where}: {refusal}")


def _gemma4_refusal(hparams: dict) -> str | None:
    layers, layer_types = hparams["num_hidden_layers"], hparams.get("layer_types") or []
    serve = "serve this model with transformers or vLLM"
    if len(layer_types) != layers:
        return f"layer_types lists {len(layer_types)} layers of {layers}; pass --config-from the model's own folder"
    rope_by_layer, _ = rope_parameters(hparams)
    global_rope, sliding_rope = rope_by_layer.get(GLOBAL) or {}, rope_by_layer.get(SLIDING) or {}
    if global_rope.get("rope_type") != "proportional" or sliding_rope.get("rope_type", "default") != "default":
        return (
            "rope_parameters are not Gemma 4's (proportional rope on the global layers, the default on the sliding "
            f"ones), the only ones llama.cpp's gemma4 turns; {serve}"
        )
    if sliding_rope.get("partial_rotary_factor", 1.0) != 1.0:
        return f"the sliding layers' rope turns part of a head, which llama.cpp's gemma4 turns whole; {serve}"
    # (per_layer_config's layers are sized alike within each kind: transformers builds no model otherwise)
    if global_attention(hparams)[0] is None:
        return "no head width of the global layers (global_head_dim); pass --config-from the model's own folder"
    shared = hparams.get("num_kv_shared_layers") or 0
    first_shared = layers - shared
    reused = layer_types[first_shared - 2 : first_shared] if first_shared >= 2 else []
    if shared and reused != [SLIDING, GLOBAL] and shared != layers:  # (every layer: a drafter's, on its target's)
        return (
            f"the last {shared} layers reuse keys and values of layers other than a global layer just before them and "
            f"a sliding one before that, the only ones llama.cpp's gemma4 reuses; {serve}"
        )
    per_layer_vocabulary = hparams.get("vocab_size_per_layer_input")
    if hparams.get("hidden_size_per_layer_input") and per_layer_vocabulary != hparams["vocab_size"]:
        return (
            "per-layer embeddings for another vocabulary than the model's (vocab_size_per_layer_input), which "
            f"llama.cpp's gemma4 does not load; {serve}"
        )
    if hparams.get("attention_bias"):
        return f"attention_bias is set, which llama.cpp's gemma4 has no tensors for; {serve}"
    if hparams.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        return f"hidden_activation is {hparams['hidden_activation']}, and llama.cpp's gemma4 runs GELU (tanh); {serve}"
    if hparams.get("use_bidirectional_attention") == "all":
        return f"attention is bidirectional (use_bidirectional_attention), and llama.cpp's gemma4 causal; {serve}"
    return None


# the converter's renames: Gemma 4's names without `.weight` (the layer's scale, the fused experts) with it, and the
# router's scales as llama.cpp's (of its input, and each expert's output as its down projection's)
RENAMES = (
    (r"\.layer_scalar$", ".layer_scalar.weight"),
    (r"\.experts\.(gate_up_proj|down_proj)$", r".experts.\1.weight"),
    (r"\.router\.scale$", ".router.proj.scale"),
    (r"\.router\.per_expert_scale$", ".experts.down_proj.scale"),
)
GEMMA4 = GGUFPart(
    "GEMMA4",
    hyperparameters=gemma4_hyperparameters,
    computed=gemma4_rope_factors,
    check_config=gemma4_checked,
    vocabulary="gemma4",
    renames=RENAMES,
)


def gemma4_vision_sizes(vision: dict, where: Path) -> dict:
    """Gemma 4's vision tower as llama.cpp's gemma4v runs it: 3 x 3 patches pooled into each token, rope at base 100,
    norms at 1e-6, GELU (tanh); the image size the converter writes (224, which llama.cpp does not use)."""
    runs = {
        "pooling_kernel_size": (vision.get("pooling_kernel_size", 3), 3),
        "rope_theta": (rope_parameters(vision)[1].get("rope_theta", 100.0), 100.0),
        "rms_norm_eps": (vision.get("rms_norm_eps", 1e-6), 1e-6),
        "hidden_activation": (vision.get("hidden_activation", "gelu_pytorch_tanh"), "gelu_pytorch_tanh"),
    }
    fixed_in_code(where, "vision", "gemma4v", runs)
    return {**vision, "image_size": 224}


def gemma4_tower_name(name: str) -> str:
    """The name the converter maps. The vision tower's layers under gguf-py's Gemma 4 names, a clipped linear layer's
    weight as the layer's, `.weight` after the layers' scales and the position embeddings; the audio tower's as the
    conformer's, each linear layer's parts as the layer's, `.weight` after the attention's scales."""
    if "audio_tower." in name or "embed_audio." in name:
        name = name.replace("model.audio_tower.", "conformer.").replace(".linear.", ".")
        return name + ".weight" if name.endswith(("per_dim_key_scale", "per_dim_scale")) else name
    name = name.replace("model.vision_tower.encoder.", "vision_model.model.").replace(".linear.weight", ".weight")
    return name + ".weight" if name.endswith(("layer_scalar", "position_embedding_table")) else name


def gemma4_rearranged(name: str, shape: tuple[int, ...], vision: dict) -> Rearrangement | None:
    """The patch embedding, a linear layer over each patch's pixels, as the converter's 2-D convolution; the audio
    attention's per-dimension scales as softplus of them, which llama.cpp multiplies by; the audio convolutions'
    depthwise kernels without their middle axis of one."""
    if name.endswith("patch_embedder.input_proj.weight"):
        return patch_embedding_as_convolution(name, shape)
    if name.endswith(("per_dim_scale.weight", "per_dim_key_scale.weight")):
        return Rearrangement({name: shape}, lambda band: (softplus(band),))
    if "depthwise_conv1d" in name and name.endswith(".weight"):
        return Rearrangement({name: (shape[0], shape[-1])}, middle_axis_dropped)
    return None


def gemma4_audio_sizes(config: dict, where: Path) -> dict | None:
    """E2B's and E4B's audio tower as llama.cpp's gemma4a runs it, whose graph fixes in code what its config could
    say otherwise: attention in chunks of 12 frames over the 12 before, its logits capped at 50, a causal depthwise
    convolution of 5, half-step MLPs of SiLU, norms at 1e-6; the MLP's width the converter writes (4 x hidden)."""
    audio = config.get("audio_config")
    if not audio:
        return None
    runs = {
        "attention_chunk_size": (audio.get("attention_chunk_size", 12), 12),
        "attention_context_left": (audio.get("attention_context_left", 13), 13),
        "attention_context_right": (audio.get("attention_context_right", 0), 0),
        "attention_logit_cap": (audio.get("attention_logit_cap", 50.0), 50.0),
        "conv_kernel_size": (audio.get("conv_kernel_size", 5), 5),
        "residual_weight": (audio.get("residual_weight", 0.5), 0.5),
        "rms_norm_eps": (audio.get("rms_norm_eps", 1e-6), 1e-6),
        "hidden_act": (audio.get("hidden_act", "silu"), "silu"),
    }
    fixed_in_code(where, "audio", "gemma4a", runs)
    return {**audio, "intermediate_size": audio["hidden_size"] * 4}


def gemma4_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The vision tower's norm epsilon, as the converter reads it (a key Gemma 4's config has not: 1e-6), and GELU;
    the audio tower's projector, mel bins and norm epsilon (1e-6, a key it has not either)."""
    writer.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
    writer.add_vision_use_gelu(True)
    audio = hparams.get("audio_config")
    if audio:
        writer.add_clip_audio_projector_type(gguf_py().VisionProjectorType.GEMMA4A)
        writer.add_audio_num_mel_bins(audio.get("input_feat_size", 128))
        writer.add_audio_attention_layernorm_eps(audio.get("layer_norm_eps", 1e-6))


def gemma4_forced_type(gguf, source: str, name: str, shape: tuple[int, ...], qtype, file_type: str):
    """The converter's Gemma4VisionAudioModel's: the audio tower's convolutions in F32 (with every weight of a name
    holding `_conv`, as its test reads: the subsampling's projection too), then MmprojModel's."""
    if source.startswith("conformer.") and (".conv" in source or "_conv" in source and ".weight" in source):
        return gguf.GGMLQuantizationType.F32
    return mmproj_model_forced_type(gguf, source, name, shape, qtype, file_type)


GEMMA4_MMPROJ = MmprojPart(
    "GEMMA4V",
    r"^(?:model\.)?(?:vision_tower|embed_vision|audio_tower|embed_audio)\.",
    gemma4_vision_sizes,
    gemma4_projector_keys,
    forced_type=gemma4_forced_type,
    converter_name=gemma4_tower_name,
    rearranged=gemma4_rearranged,
    audio_sizes=gemma4_audio_sizes,
    projector_type_key="clip.vision",
)


def gemma4_unified_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Gemma4UnifiedModel's: Gemma 4's header, then the tokens generation_config.json says generation
    suppresses (gguf-py 0.19's writer has no method for the key)."""
    gemma4_hyperparameters(writer, hparams, ftype, blocks, folder)
    suppressed = json_or_empty(folder / "generation_config.json").get("suppress_tokens")
    if suppressed is not None:
        writer.add_array("tokenizer.ggml.suppress_tokens", [int(token) for token in suppressed])


# the sizes the converter writes for Gemma 4 Unified's towers, which have no layers
NO_LAYERS = dict(intermediate_size=0, num_hidden_layers=0, num_attention_heads=0)


def gemma4_unified_vision_sizes(vision: dict, where: Path) -> dict:
    """Gemma 4 Unified's image embedder (a tower without layers) as llama.cpp's gemma4uv runs it, which fixes in code
    the 3 x 3 patches merged into one token and the projector's norm at 1e-6 (the file's, as the converter writes the
    epsilon: a key the config has not); the sizes the converter writes: the embedder's width, no layers, image size
    224 (which llama.cpp does not use)."""
    runs = {
        "pooling_kernel_size": (vision.get("pooling_kernel_size", 3), 3),
        "rms_norm_eps": (vision.get("rms_norm_eps", 1e-6), 1e-6),
    }
    fixed_in_code(where, "vision", "gemma4uv", runs)
    return {**vision, "image_size": 224, "hidden_size": vision["mm_embed_dim"], **NO_LAYERS}


def gemma4_unified_audio_sizes(config: dict, where: Path) -> dict | None:
    """Gemma 4 Unified's audio embedder: each token a frame of raw samples projected, as llama.cpp's gemma4ua cuts a
    sound into frames of 640 samples, normed at 1e-6; the sizes the converter writes (the frame's width, no layers)."""
    audio = config.get("audio_config")
    if not audio:  # (the vision embedder's alone, as Gemma 4's file without an audio tower; the converter needs both)
        return None
    runs = {
        "audio_embed_dim": (audio.get("audio_embed_dim", 640), 640),
        "rms_norm_eps": (audio.get("rms_norm_eps", 1e-6), 1e-6),
    }
    fixed_in_code(where, "audio", "gemma4ua", runs)
    return {**audio, "hidden_size": audio.get("audio_embed_dim", 640), **NO_LAYERS}


def gemma4_unified_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The projectors' keys as the converter writes them: the norm epsilon (1e-6, a key the config has not) and the
    mel bins (128, which gemma4ua reads as nothing: its frames are 640 samples) of Gemma 4's towers, under the
    unified projectors' types."""
    writer.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
    audio = hparams.get("audio_config")
    if audio:
        writer.add_clip_audio_projector_type(gguf_py().VisionProjectorType.GEMMA4UA)
        writer.add_audio_num_mel_bins(audio.get("input_feat_size", 128))
        writer.add_audio_attention_layernorm_eps(audio.get("layer_norm_eps", 1e-6))


def gemma4_unified_name(name: str) -> str:
    """The name the converter maps: the positions' table as a weight, their norm as the third patch norm."""
    if name.endswith("pos_embedding"):
        return name + ".weight"
    return name.replace(".pos_norm.", ".patch_ln3.")


def by_axis(band) -> tuple:
    """A Rearrangement's pieces for a table of positions by (position, axis) stored as one table per axis."""
    return (band.swapaxes(0, 1),)


def gemma4_unified_rearranged(name: str, shape: tuple[int, ...], vision: dict) -> Rearrangement | None:
    """The patch projection's columns and the first patch norm in im2col's order of a patch's pixels; the positions'
    table, (position, axis, width) in transformers, as one table per axis."""
    if name.endswith(("patch_dense.weight", "patch_ln1.weight", "patch_ln1.bias")):
        side = vision["patch_size"] * vision.get("pooling_kernel_size", 3)
        whole = shape[0] if len(shape) == 1 else 1  # (a norm's vector is one row of pixels; the projection's, a band)
        return Rearrangement({name: shape}, partial(pixels_channels_first, side), rows_per_band=whole)
    if name.endswith("pos_embedding.weight"):
        return Rearrangement({name: (shape[1], shape[0], shape[2])}, by_axis, rows_per_band=shape[0])
    return None


GEMMA4_UNIFIED_MMPROJ = MmprojPart(
    "GEMMA4UV",
    r"^model\.(?:vision_embedder|embed_vision|embed_audio)\.",
    gemma4_unified_vision_sizes,
    gemma4_unified_projector_keys,
    forced_type=mmproj_model_forced_type,
    converter_name=gemma4_unified_name,
    rearranged=gemma4_unified_rearranged,
    audio_sizes=gemma4_unified_audio_sizes,
    projector_type_key="clip.vision",
)


# Gemma 4 Unified's text model: Gemma 4's, its towers (without layers: an image's patches and an audio frame's samples
# projected into the text model) left out of the file as the converter's text model leaves them
GEMMA4_UNIFIED = replace(
    GEMMA4,
    hyperparameters=gemma4_unified_hyperparameters,
    towers=r"^(?:model\.)?(?:vision_embedder|embed_vision|embed_audio)\.",
)


def gemma4_assistant_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's Gemma4AssistantModel's: Gemma 4's header, then the width of the model it drafts for (the
    hidden states it reads and writes back) and its layers as that many predicted-next layers."""
    gemma4_hyperparameters(writer, hparams, ftype, blocks, folder)
    writer.add_embedding_length_out(hparams["backbone_hidden_size"])
    writer.add_nextn_predict_layers(blocks)


# Gemma 4's drafters (the -assistant checkpoints beside E2B, 26B-A4B and 31B, and Gemma 4 Unified's): Gemma 4's layers
# with queries only, each reading the keys and values of the model it drafts for, between a projection from twice that
# model's width and one back to it. llama.cpp runs one only beside its target (gemma4-assistant); its masked embedding
# (centroids that choose which tokens' logits to compute) is left out of the file as the converter leaves it out
GEMMA4_ASSISTANT = replace(
    GEMMA4,
    arch="GEMMA4_ASSISTANT",
    hyperparameters=gemma4_assistant_hyperparameters,
    towers=r"^masked_embedding\.",
    towers_left_out="its masked embedding's: llama.cpp's gemma4-assistant computes the logits of every token",
)

FAMILIES = (
    Family(
        "Gemma 4 (text)",
        "gemma4_text",
        "Gemma4ForCausalLM",
        tensors=NO_TABLE,
        megatron=MEGATRON,
        **no_trainer_model("Gemma 4"),
        fused_siblings=SIBLINGS,
        gguf=GEMMA4,
        mmproj=TEXT_ONLY,
        moe_layout=DENSE_ONLY,
        linearized=fused_experts_as_linear,
    ),
    Family(
        "Gemma 4",
        "gemma4",
        "Gemma4ForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=MEGATRON,
        **no_trainer_model("Gemma 4"),
        fused_siblings=SIBLINGS,
        gguf=GEMMA4,
        mmproj=GEMMA4_MMPROJ,
        moe_layout=DENSE_ONLY,
        linearized=fused_experts_as_linear,
    ),
    Family(
        "Gemma 4 Unified",
        "gemma4_unified",
        "Gemma4UnifiedForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Gemma 4 Unified layout (towers without layers) is not mapped yet"),
        **no_trainer_model("Gemma 4 Unified"),
        fused_siblings=SIBLINGS,
        gguf=GEMMA4_UNIFIED,
        mmproj=GEMMA4_UNIFIED_MMPROJ,
        notes={"mmproj": LLAMA_CPP_GGUF_PY.format(arch="its gemma4uv and gemma4ua projectors")},
        moe_layout=DENSE_ONLY,
    ),
    *(  # (the drafters of Gemma 4 and of Gemma 4 Unified: one layout, two classes)
        Family(
            name,
            model_type,
            architecture,
            tensors=NO_TABLE,
            megatron=Unsupported("Megatron's Gemma 4 drafters are not mapped yet"),
            **no_trainer_model(name),
            fused_siblings=SIBLINGS,
            gguf=GEMMA4_ASSISTANT,
            notes={"gguf": LLAMA_CPP_GGUF_PY.format(arch="gemma4-assistant")},
            mmproj=TEXT_ONLY,
            moe_layout=DENSE_ONLY,
        )
        for name, model_type, architecture in (
            ("Gemma 4 Assistant", "gemma4_assistant", "Gemma4AssistantForCausalLM"),
            ("Gemma 4 Unified Assistant", "gemma4_unified_assistant", "Gemma4UnifiedAssistantForCausalLM"),
        )
    ),
)
