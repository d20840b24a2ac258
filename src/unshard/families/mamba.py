"""Mamba (`MambaForCausalLM`, state-spaces' models as transformers holds them) and Falcon Mamba
(`FalconMambaForCausalLM`: Mamba's layers with weightless RMS norms on the time step, B and C): llama.cpp's mamba, as
the converter's MambaModel writes them (A as -exp(A_log), the convolution's kernel 2-D, its own header)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..errors import ConfigMismatchError
from .llama import TEXT_ONLY
from .mamba2 import in_rows_of, state_space_header
from .parts import (
    NO_TABLE,
    NOT_A_MOE_INPUT,
    Family,
    GGUFPart,
    Rearrangement,
    Unsupported,
    middle_axis_dropped,
    no_trainer_model,
)


def mamba_inner(hparams: dict) -> int:
    return hparams.get("intermediate_size") or 2 * hparams["hidden_size"]


def mamba_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """The converter's MambaModel's: the state-space keys (the time step's rank a sixteenth of the width where the
    config names none), the norms' epsilon, and whether the time step, B and C are normed (Falcon Mamba's)."""
    rank = hparams.get("time_step_rank") or -(hparams["hidden_size"] // -16)
    state_space_header(writer, hparams, blocks, mamba_inner(hparams), hparams.get("state_size") or 16, rank)
    writer.add_layer_norm_rms_eps(hparams.get("layer_norm_epsilon") or 1e-5)
    writer.add_ssm_dt_b_c_rms(hparams.get("model_type") == "falcon_mamba")
    writer.add_file_type(ftype)


def mamba_checked(hparams: dict, where: Path) -> None:
    """What llama.cpp's mamba has not, or the converter refuses: an inner width other than twice the model's, biases
    on the projections, a convolution without its bias, another activation than SiLU, a vocabulary not of whole
    eights (the converter pads it to them, past the embedding's rows)."""
    vocab = hparams["vocab_size"]
    for wrong, why in (
        (
            mamba_inner(hparams) != 2 * hparams["hidden_size"],
            f"intermediate_size is {mamba_inner(hparams)}, not twice hidden_size, which llama.cpp's converter requires",
        ),
        (hparams.get("use_bias"), "use_bias is set, and llama.cpp's mamba has no biases on its projections"),
        (not hparams.get("use_conv_bias", True), "use_conv_bias is off, and llama.cpp's mamba reads the bias"),
        (hparams.get("hidden_act", "silu") != "silu", f"hidden_act is {hparams.get('hidden_act')!r}, not SiLU"),
        (vocab % 8, f"vocab_size is {vocab}, which the converter pads to a multiple of 8 past the embedding's rows"),
    ):
        if wrong:
            raise ConfigMismatchError(
                f"{where}: {why}: llama.cpp would compute another model or not load the file; serve this model with "
                "transformers or vLLM"
            )


def mamba_tensors(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """A as -exp(A_log), the depthwise convolution's kernel 2-D; the others as they are (Mamba's layers and
    Jamba's)."""
    if name.endswith(".A_log"):
        return Rearrangement({name: shape}, partial(in_rows_of, width=shape[-1], negated=True))
    if name.endswith(".conv1d.weight"):
        return Rearrangement({name: (shape[0], shape[-1])}, middle_axis_dropped)
    return None


GGUF = GGUFPart(
    "MAMBA",
    hyperparameters=mamba_hyperparameters,
    check_config=mamba_checked,
    vocabulary="bpe",
    rearranged=mamba_tensors,
)


def _mamba(name: str, model_type: str, architecture: str) -> Family:
    return Family(
        name,
        model_type,
        architecture,
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Mamba layout is not mapped yet"),
        **no_trainer_model(name),
        fused_siblings=(),
        gguf=GGUF,
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    )


FAMILIES = (
    _mamba("Mamba", "mamba", "MambaForCausalLM"),
    _mamba("Falcon Mamba", "falcon_mamba", "FalconMambaForCausalLM"),
)
