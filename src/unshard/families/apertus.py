"""Apertus (ApertusForCausalLM, the Swiss AI Initiative's): Llama's layout with q and k normed per head, one up
projection and the xIELU activation, whose parameters (trained ones and constants, one of each per layer) llama.cpp's
`apertus` reads from the header, where the converter writes their values; q and k as they are (its rope turns halves,
as transformers does)."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import llama_hyperparameters
from .llama import TEXT_ONLY, llama_computed
from .parts import NO_TABLE, NOT_A_MOE_INPUT, Family, GGUFPart, Unsupported, no_trainer_model

# xIELU's parameters, in the order the converter completes them (it writes each once it has read all layers' own)
XIELU = ("alpha_n", "alpha_p", "beta", "eps")
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def xielu_keys(writer, values: dict[str, list[float]], hparams: dict, where: Path) -> None:
    """Each xIELU parameter of every layer, in layer order, as the converter writes them (the value as it is:
    llama.cpp applies softplus to alpha_p and alpha_n as transformers does). llama.cpp reads one per layer."""
    layers = hparams["num_hidden_layers"]
    for kind in XIELU:
        by_layer = {int(_LAYER.search(n)[1]): v for n, v in values.items() if n.endswith(f".act_fn.{kind}")}
        if sorted(by_layer) != list(range(layers)) or any(len(v) != 1 for v in by_layer.values()):
            raise ConfigMismatchError(
                f"{where}: llama.cpp's apertus reads one xIELU {kind} for each of the {layers} layers, and the "
                f"checkpoint has act_fn.{kind} for layers {sorted(by_layer)}; pass --config-from the model's own folder"
            )
        getattr(writer, f"add_xielu_{kind}")([by_layer[layer][0] for layer in range(layers)])


def apertus_checked(hparams: dict, where: Path) -> None:
    """llama.cpp's apertus runs xIELU alone."""
    if hparams.get("hidden_act", "xielu") != "xielu":
        raise ConfigMismatchError(
            f"{where}: hidden_act is {hparams['hidden_act']}, and llama.cpp's apertus runs xIELU: it would compute "
            "another model; serve this one with transformers or vLLM"
        )


FAMILIES = (
    Family(
        "Apertus",
        "apertus",
        "ApertusForCausalLM",
        tensors=NO_TABLE,
        megatron=Unsupported("Megatron's Apertus layout (its xIELU activation) is not mapped yet"),
        **no_trainer_model("Apertus"),
        fused_siblings=(("q_proj", "k_proj", "v_proj"),),
        gguf=GGUFPart(
            "APERTUS",
            hyperparameters=llama_hyperparameters,
            computed=llama_computed,
            llama_vocabulary=True,
            check_config=apertus_checked,
            header_tensors=r"\.act_fn\.(alpha_n|alpha_p|beta|eps)$",
            header_from_tensors=xielu_keys,
        ),
        mmproj=TEXT_ONLY,
        moe_layout=NOT_A_MOE_INPUT,
    ),
)
