"""Granite 4 Vision (`Granite4VisionForConditionalGeneration`): a Granite beside a SigLIP tower whose layers' outputs
windowed Q-Former projectors turn into the text model's width, each projector's tokens added to the image's positions
before a layer of the text model (deepstack): some projectors read a layer of the tower, averaged to fewer patches;
four read one layer sampled at each corner of 2 x 2 patches. Images as LLaVA-NeXT's: an overview and tiles, a newline
embedding after each row of tiles' tokens.

To GGUF as llama.cpp's converter writes it: the text model as Granite's (llama.cpp's granite: the converter's
GraniteModel, which writes that key for Granite 4 Vision, given the class in text_config that transformers 5 does not
save) with which projector each layer takes; the tower and the
projectors as the mmproj file of llama.cpp's granite4_vision projector, the projectors numbered by the text layer they
feed (the first feeds the input embeddings), SigLIP's pooling head left out (the model never runs it). gguf-py's
projector is llama.cpp's own (PyPI's 0.19 lacks it)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from ..errors import ConfigMismatchError
from .gguf_hooks import fixed_in_code, json_or_empty, mmproj_model_forced_type
from .granite import GRANITE_GGUF, granite_checked, granite_hyperparameters
from .parts import LLAMA_CPP_GGUF_PY, MmprojPart, Rearrangement, multimodal_family, renamed_only

# the spatial projectors transformers builds, one per corner of 2 x 2 patches
CORNERS = 4
# a projector's tensor: which kind, its index among them, the rest of its name
PROJECTOR = re.compile(r"^model\.(layerwise|spatial)_projectors\.(\d+)\.(.*)$")
# the Q-Former's layer within a projector's name (the converter moves the projector's number there)
QFORMER_LAYER = re.compile(r"^qformer\.encoder\.layer\.(\d+)\.(.*)$")


def projectors(config: dict) -> list[tuple[int, int, str, int]]:
    """The projectors as the converter numbers them, by the text layer each feeds: (the tower's layer it reads, the
    text layer, layerwise or spatial, its index among its kind), negative layers counted from the end."""
    vision_layers = config["vision_config"]["num_hidden_layers"]
    text_layers = config["text_config"]["num_hidden_layers"]
    found = [
        (vision % vision_layers, text % text_layers, "layerwise", i)
        for i, (vision, text) in enumerate(config.get("deepstack_layer_map") or ())
    ]
    spatial = config.get("spatial_vision_layer", -1) % vision_layers
    found += [(spatial, text % text_layers, "spatial", i) for i, text in enumerate(config["spatial_target_layers"])]
    return sorted(found, key=lambda projector: projector[1])


def projectors_checked(config: dict, where: Path) -> list[tuple[int, int, str, int]]:
    """The projectors, refusing a map llama.cpp would read otherwise than transformers (tower_layers_checked,
    text_layers_checked): the first text layer fed not the first (llama.cpp feeds that projector as the input
    embeddings), two fed to one layer, more projectors than the tower has layers (the converter names them as its
    blocks)."""
    vision_layers = config["vision_config"]["num_hidden_layers"]
    tower_layers_checked(config, where)
    text_layers_checked(config, where)
    found = projectors(config)
    fed = [text for _, text, _, _ in found]
    if fed[0] != 0 or len(set(fed)) != len(fed):
        raise ConfigMismatchError(
            f"{where}: the projectors feed the text model's layers {sorted(fed)}, and llama.cpp's granite takes the "
            "first projector as the input embeddings and one projector a layer: it would compute another model; "
            "serve this one with transformers or vLLM"
        )
    if len(found) > vision_layers:
        raise ConfigMismatchError(
            f"{where}: {len(found)} projectors and a tower of {vision_layers} layers, and llama.cpp's converter names "
            "the projectors as the tower's blocks: no more of them than layers; serve this model with transformers "
            "or vLLM"
        )
    return found


def tower_layers_checked(config: dict, where: Path) -> None:
    """The tower's hidden states the projectors read as llama.cpp reads them: counted from the end (transformers'
    hidden state N from the start is layer N - 1's output, the converter's layer N's), none the embeddings."""
    vision_layers = config["vision_config"]["num_hidden_layers"]
    read = [vision for vision, _ in config.get("deepstack_layer_map") or ()] + [config.get("spatial_vision_layer", -1)]
    for layer in read:
        if layer in (0, -vision_layers - 1):  # (the tower's embeddings, before its first layer)
            raise ConfigMismatchError(
                f"{where}: a projector reads the tower's hidden state {layer}, its embeddings, and llama.cpp's "
                "granite4_vision reads its layers' outputs alone; serve this model with transformers or vLLM"
            )
        if 0 < layer <= vision_layers:
            raise ConfigMismatchError(
                f"{where}: a projector reads the tower's hidden state {layer}, which llama.cpp's converter takes for "
                f"layer {layer}'s output where transformers takes layer {layer - 1}'s; name it from the end "
                f"({layer - vision_layers - 1}, the same hidden state) in a config.json passed with --config-from"
            )
        if not -vision_layers <= layer < 0:
            raise ConfigMismatchError(
                f"{where}: a projector reads the tower's hidden state {layer}, and the tower has {vision_layers} "
                "layers; pass --config-from the model's own folder"
            )


def text_layers_checked(config: dict, where: Path) -> None:
    """The text layers the projectors feed as llama.cpp reads them: counted from the start (transformers feeds no
    other; the converter counts the others from the end), the layerwise projectors in the order of the tower's layers
    they read (the converter sorts them so before it pairs them with their tensors), four corners."""
    pairs = [tuple(pair) for pair in config.get("deepstack_layer_map") or ()]
    corners = list(config.get("spatial_target_layers") or ())
    text_layers = config["text_config"]["num_hidden_layers"]
    fed = [text for _, text in pairs] + corners
    if not all(0 <= text < text_layers for text in fed):
        raise ConfigMismatchError(
            f"{where}: the projectors feed the text model's layers {fed}, and transformers feeds none but those from 0 "
            f"to {text_layers - 1}, where llama.cpp's converter counts others from the end: it would compute another "
            "model; serve this one with transformers or vLLM"
        )
    if pairs != sorted(pairs):
        raise ConfigMismatchError(
            f"{where}: deepstack_layer_map is not in the order of the tower's layers, which llama.cpp's converter "
            "numbers its projectors by: it would pair them with other layers; list it sorted in a config.json passed "
            "with --config-from"
        )
    if len(corners) != CORNERS:
        raise ConfigMismatchError(
            f"{where}: spatial_target_layers names {len(corners)} layers, and Granite 4 Vision has {CORNERS} spatial "
            "projectors, which llama.cpp's converter numbers by them; serve this model with transformers or vLLM"
        )


def granite4_vision_checked(hparams: dict, where: Path) -> None:
    """Granite's, and the projectors' map as llama.cpp reads it."""
    granite_checked(hparams, where)
    projectors_checked(hparams, where)


def granite4_vision_hyperparameters(writer, hparams: dict, ftype, blocks: int, folder: Path) -> None:
    """Granite's header, then the projector each text layer takes (-1: none; the first projector is the input
    embeddings), as the converter's GraniteModel writes it for Granite 4 Vision (gguf-py 0.19's writer has no method
    for the key)."""
    granite_hyperparameters(writer, hparams, ftype, blocks, folder)
    mapping = [-1] * blocks
    for index, (_, text, _, _) in enumerate(projectors(hparams)):
        if index:
            mapping[text] = index
    writer.add_array(f"{writer.arch}.deepstack_mapping", mapping)


def granite4_vision_sizes(vision: dict, where: Path) -> dict:
    """The SigLIP tower as the converter reads it, refusing what llama.cpp's granite4_vision computes otherwise: GELU
    (tanh), each projector's norm at the tower's epsilon (transformers' is 1e-6), a Q-Former of one layer normed at
    1e-12 (its heads 64 wide, as transformers makes them); and the projectors' map, which the converter numbers the
    projectors by (read from config.json: the tower's sizes alone come here)."""
    config = json_or_empty(where)
    qformer = config.get("qformer_config") or {}
    runs = {
        "hidden_act": (vision.get("hidden_act", "gelu_pytorch_tanh"), "gelu_pytorch_tanh"),
        "layer_norm_eps": (vision.get("layer_norm_eps", 1e-6), 1e-6),
        "Q-Former's num_hidden_layers": (qformer.get("num_hidden_layers", 1), 1),
        "Q-Former's layer_norm_eps": (qformer.get("layer_norm_eps", 1e-12), 1e-12),
        "Q-Former's hidden_act": (qformer.get("hidden_act", "gelu"), "gelu"),
    }
    fixed_in_code(where, "vision", "granite4_vision projector", runs)
    if not re.fullmatch(r"[1-9]\d*/[1-9]\d*", str(config.get("downsample_rate"))):
        raise ConfigMismatchError(
            f"{where}: downsample_rate is {config.get('downsample_rate')!r}, where Granite 4 Vision's projectors take "
            "the sides of their queries and of their windows as 'Q/W'; pass --config-from the model's own folder"
        )
    numbers = {(kind, index): number for number, (_, _, kind, index) in enumerate(projectors_checked(config, where))}
    return {**vision, "projector_numbers": numbers}


def granite4_vision_keys(writer, hparams: dict, vision: dict, processor: dict) -> None:
    """The tower's norm epsilon, GELU, the tile's size; the Q-Former's queries and windows (downsample_rate's numerator
    and denominator), the tower's layer each projector reads and the corner it samples (-1: averaged), the tiles'
    shapes (width, height each: the config's are height, width)."""
    query_side, window_side = map(int, hparams["downsample_rate"].split("/"))
    found = projectors(hparams)
    writer.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
    writer.add_vision_use_gelu(True)
    writer.add_vision_preproc_image_size(vision.get("image_size", 384))
    writer.add_vision_projector_query_side(query_side)
    writer.add_vision_projector_window_side(window_side)
    writer.add_vision_feature_layers([vision_layer for vision_layer, _, _, _ in found])
    writer.add_vision_spatial_offsets([index if kind == "spatial" else -1 for _, _, kind, index in found])
    if pinpoints := hparams.get("image_grid_pinpoints"):
        writer.add_vision_image_grid_pinpoints([side for height, width in pinpoints for side in (width, height)])


def granite4_vision_numbered(name: str, shape: tuple[int, ...], sizes: dict) -> Rearrangement | None:
    """A projector's tensor under the converter's name for it: its number by the text layer it feeds, in the place of
    the projector's index, or of the Q-Former's layer (one a projector: the converter drops the projector's index)."""
    match = PROJECTOR.match(name)
    if match is None:
        return None
    kind, index, rest = match[1], int(match[2]), match[3]
    number = sizes["projector_numbers"].get((kind, index))
    if number is None:  # (a projector the config feeds to no layer: the checkpoint is another model's)
        raise ConfigMismatchError(
            f"{name}: a projector the config's deepstack_layer_map and spatial_target_layers do not name; pass "
            "--config-from the model's own folder"
        )
    if layer := QFORMER_LAYER.match(rest):
        if layer[1] != "0":
            raise ConfigMismatchError(
                f"{name}: a Q-Former layer past the config's one; pass --config-from the model's own folder"
            )
        renamed = f"model.{kind}_projectors.qformer.encoder.layer.{number}.{layer[2]}"
    else:
        renamed = f"model.{kind}_projectors.{number}.{rest}"
    return Rearrangement({renamed: shape}, renamed_only)


GRANITE4_VISION_MMPROJ = MmprojPart(
    "GRANITE4_VISION",
    r"^model\.(?:vision_tower\.(?!head\.)|layerwise_projectors\.|spatial_projectors\.|image_newline$)",
    granite4_vision_sizes,
    granite4_vision_keys,
    forced_type=mmproj_model_forced_type,
    rearranged=granite4_vision_numbered,
)
GRANITE4_VISION_GGUF = replace(
    GRANITE_GGUF,
    hyperparameters=granite4_vision_hyperparameters,
    check_config=granite4_vision_checked,
    towers=r"^model\.vision_tower\.head\.",
    towers_left_out="SigLIP's pooling head, which Granite 4 Vision never runs; the converter leaves it out",
)
FAMILIES = (
    replace(
        multimodal_family(
            "Granite 4 Vision",
            "granite4_vision",
            "Granite4VisionForConditionalGeneration",
            GRANITE4_VISION_GGUF,
            GRANITE4_VISION_MMPROJ,
            "its SigLIP tower and Q-Former projectors",
        ),
        notes={"mmproj": LLAMA_CPP_GGUF_PY.format(arch="its granite4_vision projector")},
    ),
)
