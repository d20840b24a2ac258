"""Mistral Small 3.1 and 3.2 (Mistral3ForConditionalGeneration) and Ministral 3 (Ministral3ForCausalLM, or beside the
tower): the text model as llama.cpp's `mistral3` (Llama's header, q and k reordered per head; Ministral 3's YaRN with
its own keys), Mistral Small 4's (a `mistral4` text model beside the same tower) as llama.cpp's `mistral4`, and the
Pixtral vision tower with its patch merger and projector, the mmproj file of llama.cpp's `pixtral` projector: the
tower's q and k reordered as the text model's (its 2-D rope turns halves, as llama.cpp's), and the [IMG_BREAK]
token's embedding, which llama.cpp puts after each row of an image's tokens."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import ConfigMismatchError
from .deepseek import DEEPSEEK2, latent_query_checked
from .gguf_hooks import gguf_py, json_or_empty, llama_hyperparameters, mmproj_model_forced_type, rope_parameters
from .llama import SIBLINGS, TEXT_ONLY, llama_computed
from .parts import (
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    MmprojPart,
    Unsupported,
    fused_experts_as_linear,
    no_trainer_model,
)

# The token whose embedding llama.cpp's pixtral projector puts after each row of an image's tokens but the last
IMAGE_BREAK = "[IMG_BREAK]"
# Pixtral's tower as transformers computes it: its RMS norms' epsilon (fixed there; the converter writes it)
PIXTRAL_NORM_EPS = 1e-5


def ministral3_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """Llama's; Ministral 3's YaRN with its log multiplier and the scale of attention's temperature by position (Llama
    4's), as the converter writes them."""
    llama_hyperparameters(writer, hparams, ftype, blocks, folder)
    if hparams.get("model_type") == "ministral3":
        rope = rope_parameters(hparams)[0]
        writer.add_rope_scaling_yarn_log_mul(rope["mscale_all_dim"])
        writer.add_attn_temperature_scale(rope["llama_4_scaling_beta"])


def ministral3_checked(hparams: dict, where: Path) -> None:
    """Ministral 3's YaRN, with the keys the converter writes of it."""
    rope = rope_parameters(hparams)[0]
    missing = [key for key in ("mscale_all_dim", "llama_4_scaling_beta") if rope.get(key) is None]
    if str(rope.get("rope_type")).lower() != "yarn" or missing:
        raise ConfigMismatchError(
            f"{where}: Ministral 3's rope_parameters are not YaRN with mscale_all_dim and llama_4_scaling_beta "
            f"({rope.get('rope_type')!r}{', lacking ' + ', '.join(missing) if missing else ''}), which llama.cpp's "
            "converter writes of it; pass --config-from the model's own folder"
        )


def mistral3_checked(hparams: dict, where: Path) -> None:
    """Mistral Small 3's and Ministral 3's text models as llama.cpp's mistral3 computes them (Llama's, with no sliding
    window; Ministral 3's YaRN), and the projector as llama.cpp's pixtral computes it (Mistral 4's text model, which
    the converter writes otherwise: MISTRAL4_TEXT)."""
    if hparams.get("model_type") not in ("mistral", "ministral3"):
        raise ConfigMismatchError(
            f"{where}: text_config's model_type is {hparams.get('model_type')!r}, a Mistral 3 that unshard does not "
            "write as GGUF yet (Mistral Small 3's, Ministral 3's and Mistral 4's text models it does); write a folder "
            "and use llama.cpp's convert_hf_to_gguf.py"
        )
    if hparams["model_type"] == "ministral3":
        ministral3_checked(hparams, where)
    if hparams.get("sliding_window") is not None:
        raise ConfigMismatchError(
            f"{where}: sliding_window is {hparams['sliding_window']}, and llama.cpp's mistral3 has no sliding window: "
            "it would compute another model; serve this one with transformers or vLLM"
        )
    pixtral_projector_checked(hparams, where)


def mistral4_checked(hparams: dict, where: Path) -> None:
    """Mistral 4's text model as llama.cpp's mistral4 computes it (deepseek2's latent attention, a query down
    projection; its softmax router ranks expert groups by their best two, as llama.cpp), the projector as pixtral's."""
    latent_query_checked(hparams, where)
    pixtral_projector_checked(hparams, where)


def pixtral_projector_checked(hparams: dict, where: Path, merger: bool = True) -> None:
    """The projector as llama.cpp's pixtral computes it: the tower's last layer, GELU, the patch merger's norm (where
    there is a merger: Mistral 3's, not Pixtral-12B's) at the tower's epsilon."""
    projector = {
        "vision_feature_layer": (hparams.get("vision_feature_layer", -1), -1),
        "projector_hidden_act": (hparams.get("projector_hidden_act", "gelu"), "gelu"),
    }
    if merger:
        projector["text_config's rms_norm_eps (the patch merger's norm's)"] = (
            hparams.get("rms_norm_eps"),
            PIXTRAL_NORM_EPS,
        )
    for key, (found, computed) in projector.items():
        if "vision_config" in hparams and found != computed:
            raise ConfigMismatchError(
                f"{where}: {key} is {found}, and llama.cpp's pixtral projector computes {computed}: its images would "
                "be another model's; serve this one with transformers or vLLM"
            )


def pixtral_sizes(vision: dict, where: Path) -> dict:
    """Pixtral's tower as llama.cpp runs it: a GELU or SiLU MLP, rope at base 10000 (llama.cpp's, whatever the file
    says)."""
    if vision.get("model_type") != "pixtral":
        raise ConfigMismatchError(
            f"{where}: the vision tower is {vision.get('model_type')!r}, and llama.cpp's converter writes Mistral 3's "
            "and LLaVA's Pixtral tower alone; serve this model with transformers or vLLM"
        )
    if vision.get("hidden_act", "gelu") not in ("gelu", "silu"):
        raise ConfigMismatchError(
            f"{where}: the vision tower's hidden_act is {vision['hidden_act']!r}, and llama.cpp's pixtral runs GELU "
            "or SiLU; serve this model with transformers or vLLM"
        )
    theta = rope_parameters(vision)[1].get("rope_theta", 10000)
    if theta != 10000:
        raise ConfigMismatchError(
            f"{where}: the vision tower's rope_theta is {theta}, and llama.cpp's pixtral turns its rope at 10000; "
            "serve this model with transformers or vLLM"
        )
    return vision


def pixtral_name(name: str) -> str:
    """The Hub's names (vision_tower..., multi_modal_projector...), as the converter maps them."""
    return name.removeprefix("model.")


def pixtral_projector_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The tower's norm epsilon, its MLP's activation, the patches merged n x n."""
    writer.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", PIXTRAL_NORM_EPS))
    if vision.get("hidden_act", "gelu") == "silu":
        writer.add_vision_use_silu(True)
    else:
        writer.add_vision_use_gelu(True)
    if "spatial_merge_size" in hparams:
        writer.add_vision_spatial_merge_size(hparams["spatial_merge_size"])


def image_break_row(hparams: dict, folder: Path) -> dict[str, tuple[str, int]]:
    """[IMG_BREAK]'s row of the text model's embedding, which llama.cpp's pixtral projector reads from the mmproj file
    (mtmd cannot load the file without it). The converter means to write it too, but its `--mmproj` reads none of a
    Hugging Face folder's text tensors, so its file lacks it. The token is found as the converter looks for it:
    tokenizer_config.json's added tokens, then tokenizer.json's."""
    config = json_or_empty(folder / "tokenizer_config.json").get("added_tokens_decoder") or {}
    found = [int(i) for i, token in config.items() if token.get("content") == IMAGE_BREAK]
    added = json_or_empty(folder / "tokenizer.json").get("added_tokens", [])
    found += [token["id"] for token in added if token.get("content") == IMAGE_BREAK]
    if not found:
        raise ConfigMismatchError(
            f"{folder}: the tokenizer has no {IMAGE_BREAK} token, whose embedding llama.cpp's pixtral projector puts "
            "after each row of an image; pass --config-from the model's own folder (with its tokenizer)"
        )
    name = gguf_py().TENSOR_NAMES[gguf_py().MODEL_TENSOR.V_TOK_EMBD_IMG_BREAK]
    return {name: ("token_embd.weight", found[0])}


PIXTRAL = MmprojPart(
    "PIXTRAL",
    r"^(?:model\.)?(?:vision_tower|multi_modal_projector)\.",
    pixtral_sizes,
    pixtral_projector_keys,
    forced_type=mmproj_model_forced_type,
    converter_name=pixtral_name,
    permute_qk=True,
    text_rows=image_break_row,
)

# llama.cpp's mistral4: Mistral 4's text model, as the converter writes it inside Mistral 3 (its DeepseekV2Model's
# layout, the experts stacked as transformers holds them). llama.cpp's deepseek2 graph applies an attention temperature
# only where the file has one, and the converter writes none of Mistral 4's (llama_4_scaling_beta): past the original
# context (8192 tokens) the file computes another model than transformers, as the converter's does
MISTRAL4_TEXT = replace(
    DEEPSEEK2,
    arch="MISTRAL4",
    check_config=mistral4_checked,
    renames=((r"\.experts\.(down_proj|gate_up_proj)$", r".experts.\1.weight"),),  # (named as weights, as it does)
)

# llama.cpp's mistral3: Mistral Small 3's and Ministral 3's text models (Llama's, q and k reordered per head)
MISTRAL3 = GGUFPart(
    "MISTRAL3",
    hyperparameters=ministral3_hyperparameters,
    computed=llama_computed,
    permute_qk=True,
    llama_vocabulary=True,
    check_config=mistral3_checked,
    text_models=(("mistral4", MISTRAL4_TEXT),),
)

FAMILIES = (
    Family(
        "Mistral 3",
        "mistral3",
        "Mistral3ForConditionalGeneration",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Mistral 3 layout (its Pixtral tower) is not mapped yet"),
        **no_trainer_model("Mistral 3"),
        fused_siblings=SIBLINGS,
        gguf=MISTRAL3,
        mmproj=PIXTRAL,
        moe_layout=NOT_A_MOE_INPUT,
        # (Mistral Small 4's experts, fused as transformers holds them, each made Linear layers as llm-compressor does)
        linearized=fused_experts_as_linear,
        notes={
            "gguf": "Mistral Small 4's text model too, as llama.cpp's mistral4 (DeepSeek-V2's layout)",
            "quantize": "Mistral Small 4's experts each Linear layers, as llm-compressor makes them",
        },
    ),
    Family(
        "Ministral 3",
        "ministral3",
        "Ministral3ForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Ministral 3 layout (its YaRN and attention temperature) is not mapped yet"),
        **no_trainer_model("Ministral 3"),
        fused_siblings=SIBLINGS,
        gguf=MISTRAL3,
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)
