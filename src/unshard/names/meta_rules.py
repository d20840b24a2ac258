"""Meta-style names (torchtitan, torchtune) -> Hugging Face names, by the family's table (its `meta_names`,
families/llama.py), and the rotary permutation.

torchtitan and torchtune keep the names of Meta's reference Llama and apply rotary embeddings to
interleaved pairs (complex numbers); Hugging Face's Llama rotates the two halves of each head. The
same weights serve both once the rows of each q and k head are reordered: HF row (head, half, i) is
row (head, 2 i + half) here. The head counts come from the Hugging Face config (--config-from),
which these checkpoints do not carry.

A table maps each name (layer as {i}) to (Hugging Face name, which rotary permutation: "q", "k", the config key of a
vision tower's heads, or None), and kinds more: a Hugging Face name with {e} is one tensor per index of the first axis
(torchtitan's grouped experts, [experts, rows, columns]: expert e's is `[e]`); `Stacked` (names/stacked.py): the
grouped experts as one Hugging Face tensor, each expert turned; `Fused`: rows of a Hugging Face tensor that fuses
several (written as its parts, one tensor each); `Zeros`: the trainer's state that no Hugging Face tensor holds (a
load-balancing buffer), skipped when read, zeros when written (the trainer loads every name it has); `AfterTheModel`:
the trainer's layers numbered apart from the model's (DeepSeek-V3's MTP layers), the Hugging Face layers after the
model's; `Reshaped`: a Hugging Face tensor of more axes, row by row (written flat again); `CrossLayers`: cross-attention
layers fused into the trainer's, which Hugging Face numbers apart; `Tiled`: a tile embedding Hugging Face holds per
aspect ratio. A layer's number is {i} in a trainer's `layers.N.`, wherever it is (torchtitan's
vision tower's `vision_encoder.layers.N.` too).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .stacked import Stacked

if TYPE_CHECKING:
    import torch


TORCHTUNE_ATTENTION = re.compile(r"\.attn\.(?:q|k|v|output)_proj\.")
# (a layer's number: `layers.N.`, and Meta's Llama 3.2 Vision's `resblocks.N.` and `cross_attention_layers.N.`)
LAYER = re.compile(r"(?:^|(?<=\.))(?:layers|resblocks|cross_attention_layers)\.(\d+)\.")


@dataclass(frozen=True)
class Zeros:
    """A table's rule for a trainer's tensor no Hugging Face tensor holds: skipped when read (`why`), and written as
    zeros, one per row of the Hugging Face tensor `rows_of` (of the same layer)."""

    rows_of: str
    why: str


@dataclass(frozen=True)
class AfterTheModel:
    """A table's rule for the trainer's layers numbered apart from the model's, under its key (DeepSeek-V3's
    multi-token prediction layers, `mtp_layers.N.`): the Hugging Face layers after the model's (num_hidden_layers + N),
    as the Hub's checkpoints hold them (names.mtp_layers), their tensors by the table's layer rules, where the config
    counts them (num_nextn_predict_layers); else skipped when read (`why`)."""

    why: str


@dataclass(frozen=True)
class Fused:
    """A table's rule for a trainer's tensor that is rows of one Hugging Face tensor: its `part`-th, the parts
    one after another (torchtune's Phi-3: q, k and v of qkv_proj; gate and up of gate_up_proj). `heads`: the config
    key counting the part's heads, which gives its rows (times the head width: the config's `width` key, else its
    head_dim); `rows`: the config key of its rows (torchtune's fusion embedding: the text vocabulary's, the special
    tokens' after it); without either the parts share the rows equally."""

    into: str
    part: int
    heads: str | None = None
    width: str | None = None
    rows: str | None = None  # (the config key of its rows; a part without one then takes the rows left)


@dataclass(frozen=True)
class Reshaped:
    """A table's rule for a trainer's tensor whose columns are more axes of one Hugging Face tensor, row by row, the
    same bytes (torchtitan's vision towers' patch embedding, a Linear layer, of transformers' Conv3d): its name, and
    the axes after the first, each a config key (dotted: `vision_config.patch_size`) or a size (a tower's 3 colour
    channels, where its config has no key for them); once renamed, their sizes."""

    into: str
    axes: tuple[str | int, ...]


@dataclass(frozen=True)
class CrossLayers:
    """A table's rule, under the key of the trainer's decoder layers (`decoder.layers.`), for cross-attention layers
    it fuses into them under `fused` (torchtune's Llama 3.2 Vision: `decoder.layers.N.fusion_layer.`), which Hugging
    Face numbers as layers of their own, each before the layer it is fused into, at the text config's `key`; or,
    under the key of the trainer's cross-attention layers numbered `apart` (Meta's `cross_attention_layers.K.`), the
    K-th of those. The table's rules number the layers as Hugging Face does."""

    fused: str | None = None
    apart: bool = False  # (the cross-attention layers numbered on their own, the k-th being k: Meta's)
    key: str = "cross_attention_layers"

    def hugging_face_layer(self, number: int, rest: str, config: dict[str, Any], where: str) -> int:
        """The Hugging Face layer of the trainer's layer `number`'s tensor `rest` (its fused part, or its own)."""
        cross = sorted(config.get(self.key) or [])
        holding = [layer - k for k, layer in enumerate(cross)]  # (the trainer's layers holding one, in its numbers)
        if self.apart:
            if number < len(cross):
                return cross[number]
            which = f"cross-attention layer {number} is"
        elif self.fused is None or not rest.startswith(self.fused):
            return number + sum(held <= number for held in holding)
        elif number in holding:
            return cross[holding.index(number)]
        else:
            which = f"layer {number} holds a cross-attention layer"
        from ..errors import CheckpointError

        raise CheckpointError(
            f"{where}: the trainer's {which}, which the config's {self.key} {cross} does not place; pass "
            "--config-from the model's own config"
        )

    def trainer_layer(self, number: int, config: dict[str, Any]) -> int:
        """The trainer's layer of Hugging Face's layer `number` (a cross-attention layer: the one it is fused into)."""
        return number - sum(layer < number for layer in config.get(self.key) or [])


@dataclass(frozen=True)
class Tiled:
    """A table's rule for a trainer's embedding of image tiles, one per (row, column) of tiles [tiles, tiles, n, d],
    that Hugging Face holds per aspect ratio the config supports (torchtune's Llama 3.2 Vision's tile and token
    position embeddings): row 0 zeros, row r + 1 the tiles of ratio r's (h, w) in order, flattened and padded with
    zeros to `tiles`, as torchtune's own converter builds them. `ratios`: the config key of the ratios; once renamed,
    the ratios."""

    into: str
    ratios: str | tuple[tuple[int, int], ...]
    tiles: str | int = "vision_config.max_num_tiles"
    width: str | int = "vision_config.hidden_size"

    def trainer_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The trainer's [tiles, tiles, n, d] of Hugging Face's [ratios + 1, tiles x n x d] (once renamed)."""
        return (self.tiles, self.tiles, shape[1] // self.tiles // self.width, self.width)

    def per_tile(self, rows):
        """The other way, as torchtune's own converter goes (llama3_vision_hf_to_tune): from the rows of the ratios
        of all tiles, in order (a later one's tiles over an earlier's), the tiles no such ratio covers zeros. (A
        numpy array: rows of the ratios of fewer tiles, which torchtune's model has no place for, are left.)"""
        import numpy as np

        tiles, _, *each = self.trainer_shape(rows.shape)
        out = np.zeros((tiles, tiles, *each), rows.dtype)
        for r, (h, w) in enumerate(self.ratios):
            if h * w == tiles:
                out[:h, :w] = rows[r + 1].reshape(h, w, *each)
        return out

    def per_ratio(self, embedding: torch.Tensor) -> torch.Tensor:
        import torch

        tiles, _, *each = embedding.shape
        out = torch.zeros((len(self.ratios) + 1, tiles, *each), dtype=embedding.dtype)
        for r, (h, w) in enumerate(self.ratios):
            out[r + 1, : h * w] = embedding[:h, :w].reshape(h * w, *each)
        return out.flatten(1)


def torchtitan_routed_experts(mlp: str = "model.layers.{i}.mlp.") -> dict[str, tuple[str, None]]:
    """torchtitan's (0.3) MoE layer, as its MoE state-dict adapters map it: the routed experts' weights grouped on a
    first axis (the suffix names the axes: Experts, FFN width, model Dim), the router's gate; Qwen3-MoE, DeepSeek-V3
    and Qwen3.5-MoE alike, the Hugging Face MLP at `mlp` (each expert's projections as saved)."""
    return {
        "layers.{i}.moe.routed_experts.inner_experts.w1_EFD": (mlp + "experts.{e}.gate_proj.weight", None),
        "layers.{i}.moe.routed_experts.inner_experts.w3_EFD": (mlp + "experts.{e}.up_proj.weight", None),
        "layers.{i}.moe.routed_experts.inner_experts.w2_EDF": (mlp + "experts.{e}.down_proj.weight", None),
        "layers.{i}.moe.router.gate.weight": (mlp + "gate.weight", None),
    }


TORCHTITAN_ROUTED_EXPERTS = torchtitan_routed_experts()


def trainer(names) -> str | None:
    """Whose names these are: "torchtune", "Meta" (Meta's own, as its `consolidated.00.pth`, torchtune's Meta
    checkpointer and torchtitan before 0.3 have them), "torchtitan", or None for names of neither."""
    # (torchtitan's and torchtune's; Muse Glimmer's; torchtune's fusion models'; Meta's Llama 3.2 Vision's)
    embeddings = (
        "tok_embeddings.weight",
        "tok_embeddings.embedding.weight",
        "decoder.tok_embeddings.weight",
        "text_model.tok_embeddings.weight",
    )
    if not any(embedding in names for embedding in embeddings):
        return None
    if any(TORCHTUNE_ATTENTION.search(n) for n in names):  # (torchtitan's Qwen3.5 has `attn.wq`, `attn.in_proj_q`)
        return "torchtune"
    return "Meta" if any(".attention.wq." in n for n in names) else "torchtitan"


def interleaved_to_halves(heads: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """q or k rows (or their biases) from interleaved pairs to halves, head by head."""

    def permute(w: torch.Tensor) -> torch.Tensor:
        return w.view(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)

    return permute


def heads_turned(rotary: str | None, config: dict[str, Any], where: str) -> int:
    """How many heads a rule's rotary permutation turns the rows in: the text model's heads ("q") or key-value heads
    ("k"), or those of the config key it names (`vision_config.num_attention_heads`: a vision tower's); 0: none."""
    if not rotary:
        return 0
    text = config.get("text_config") or config  # (a vision-language model's text model: its heads)
    if rotary == "q":
        return text["num_attention_heads"]
    if rotary == "k":
        return text.get("num_key_value_heads") or text["num_attention_heads"]
    return _config_value(config, rotary, where)


def rename(
    table: dict[str, Any], family: str, shapes: dict[str, tuple[int, ...]], config: dict[str, Any], where: str
) -> tuple[dict[str, str | list[str] | Fused | Stacked | Reshaped | Tiled], dict[str, Callable], dict[str, str]]:
    """By the family's table: (trainer's name -> Hugging Face name, the list of names the first axis stacks, or the
    part of a fused one, or the Stacked rule of its experts, or the Reshaped or Tiled tensor it is; Hugging Face name ->
    transform; trainer's name skipped -> why)."""
    text = config.get("text_config") or config  # (a vision-language model's text model: its layers)
    renamed, transforms, skipped, unknown = {}, {}, {}, []
    after = _layers_after_the_model(table, shapes, text)
    crossed = {prefix: rule for prefix, rule in table.items() if isinstance(rule, CrossLayers)}
    for name, shape in shapes.items():
        if prefix := next((p for p in after if name.startswith(p)), None):
            if isinstance(after[prefix], str):
                skipped[name] = after[prefix]
                continue
            number, rest = name.removeprefix(prefix).split(".", 1)
            looked_up = f"layers.{after[prefix] + int(number)}.{rest}"
        elif prefix := next((p for p in crossed if name.startswith(p)), None):
            number, rest = name.removeprefix(prefix).split(".", 1)
            looked_up = f"{prefix}{crossed[prefix].hugging_face_layer(int(number), rest, text, where)}.{rest}"
        else:
            looked_up = name
        match = LAYER.search(looked_up)
        key = f"{looked_up[: match.start(1)]}{{i}}{looked_up[match.end(1) :]}" if match else looked_up
        if key not in table:
            unknown.append(name)
            continue
        layer = match.group(1) if match else None
        if isinstance(table[key], Zeros):
            skipped[name] = table[key].why
            continue
        if isinstance(table[key], Fused):
            renamed[name] = Fused(table[key].into.format(i=layer), table[key].part)
            continue
        if isinstance(table[key], Stacked):
            renamed[name] = dataclasses.replace(table[key], name=table[key].name.format(i=layer))
            continue
        if isinstance(table[key], Tiled):
            renamed[name] = _tiled(table[key], config, where, layer)
            continue
        if isinstance(table[key], Reshaped):
            axes = tuple(a if isinstance(a, int) else _config_value(config, a, where) for a in table[key].axes)
            renamed[name] = Reshaped(table[key].into.format(i=layer), axes)
            continue
        hf, rotary = table[key]
        if "{e}" in hf:
            renamed[name] = [hf.format(i=layer, e=e) for e in range(shape[0])]
            continue
        hf = hf.format(i=layer) if match else hf
        renamed[name] = hf
        if rotary:
            transforms[hf] = interleaved_to_halves(heads_turned(rotary, config, where))
    if unknown:
        from ..errors import CheckpointError

        raise CheckpointError(
            f"{where}: {len(unknown)} tensors have no rule in unshard's table of {family} names (e.g. {unknown[0]}); "
            "`unshard families` says which trainers' names it maps for each family; report the model if it should"
        )
    return renamed, transforms, skipped


def _tiled(rule: Tiled, config: dict[str, Any], where: str, layer: str | None = None) -> Tiled:
    """A Tiled rule with its config keys' values."""
    ratios = tuple(tuple(r) for r in _config_value(config, rule.ratios, where, list))
    tiles, width = (_config_value(config, key, where) for key in (rule.tiles, rule.width))
    return Tiled(rule.into.format(i=layer), ratios, tiles, width)


def _layers_after_the_model(
    table: dict[str, Any], shapes: dict[str, tuple[int, ...]], config: dict[str, Any]
) -> dict[str, int | str]:
    """For each AfterTheModel rule's key: the number of the first Hugging Face layer its layers become, or why they
    are skipped (the config counts another number of them)."""
    found: dict[str, int | str] = {}
    for prefix, rule in table.items():
        if isinstance(rule, AfterTheModel):
            count = len({name.removeprefix(prefix).split(".")[0] for name in shapes if name.startswith(prefix)})
            said = config.get("num_nextn_predict_layers") or 0
            found[prefix] = config["num_hidden_layers"] if said == count else f"{rule.why}: the config counts {said}"
    return found


@dataclass(frozen=True)
class MetaName:
    """Where a Hugging Face tensor goes among a trainer's names: tensor `fqn`, at index `stacked` of its first axis
    (an expert of grouped experts) or whole (()); q or k rows reordered from halves to interleaved pairs in heads of
    `rotary_heads` (0: none); `zeros`: (name, rows) of a tensor of zeros written beside it (see Zeros); `turn`: a
    tensor of a layer's experts, each turned back as the trainer holds it (gpt-oss's: names.stacked); `parts`:
    (name, rows) of the trainer's tensors its rows are, one after another (see Fused; then `fqn` is the first's);
    `flat`: each row stored as one axis (see Reshaped); `tiled`: laid out per tile (see Tiled)."""

    fqn: str
    rotary_heads: int = 0
    stacked: tuple[int, ...] = ()
    zeros: tuple[tuple[str, int], ...] = ()
    turn: Stacked | None = None
    parts: tuple[tuple[str, int], ...] = ()
    flat: bool = False
    tiled: Tiled | None = None


def to_meta(
    table: dict[str, Any],
    family: str,
    shapes: dict[str, tuple[int, ...]],
    config: dict[str, Any],
    where: str,
    trainer: str = "torchtitan",
) -> tuple[dict[str, MetaName], dict[str, tuple[int, ...]]]:
    """The other way (writing torchtitan's or torchtune's names): Hugging Face name -> MetaName; and each stacked
    tensor's shape (experts first). Every name must have a rule."""
    text = config.get("text_config") or config  # (a vision-language model's text model: its layers and heads)
    rules, zeros_of, fused, flat, tiled = [], {}, {}, set(), {}
    for meta, rule in table.items():
        if isinstance(rule, Zeros):
            zeros_of.setdefault(rule.rows_of, []).append(meta)
            continue
        if isinstance(rule, Fused):
            fused.setdefault(rule.into, []).append((rule.part, meta))
            continue
        if isinstance(rule, (AfterTheModel, CrossLayers)):  # (their layers by the layer rules: _numbered_apart)
            continue
        if isinstance(rule, (Reshaped, Tiled)):
            if isinstance(rule, Tiled):
                tiled[meta] = _tiled(rule, config, where)
            else:
                flat.add(meta)
            rules.append((_pattern(rule.into), rule.into, meta, 0, None))
            continue
        hf, rotary, turn = (rule.name, None, rule) if isinstance(rule, Stacked) else (*rule, None)
        rules.append((_pattern(hf), hf, meta, heads_turned(rotary, config, where), turn))
    for hf, parts in fused.items():
        rules.append((_pattern(hf), hf, tuple(meta for _, meta in sorted(parts)), 0, None))
    renamed, stacked_shapes, unknown = {}, {}, []
    for name, shape in shapes.items():
        for pattern, hf, meta, rotary_heads, turn in rules:
            if not (match := pattern.match(name)):
                continue
            found = match.groupdict()
            if isinstance(meta, str) and not _of_its_kind(meta, found.get("i"), table, text):
                continue  # (a rule of a cross-attention layer's tensor, on a layer of the other kind: or the reverse)
            if isinstance(meta, tuple):  # (a fused tensor, written as its parts)
                rows = _part_rows([table[m] for m in meta], shape[0], text, f"{where}: {name}")
                parts = tuple((m.format(i=found.get("i")), n) for m, n in zip(meta, rows))
                renamed[name] = MetaName(parts[0][0], parts=parts)
                break
            fqn = _numbered_apart(meta.format(i=found.get("i")), table, text)
            zeros = tuple((z.format(i=found.get("i")), shape[0]) for z in zeros_of.get(hf, ()))
            stacked = (int(found["e"]),) if "e" in found else ()
            renamed[name] = MetaName(fqn, rotary_heads, stacked, zeros, turn, flat=meta in flat, tiled=tiled.get(meta))
            if stacked:
                experts = max(stacked_shapes.get(fqn, (0,))[0], stacked[0] + 1)
                stacked_shapes[fqn] = (experts, *shape)
            break
        else:
            unknown.append(name)
    counts = Counter(m.fqn for m in renamed.values() if m.stacked)
    for fqn, count in counts.items():
        if count != stacked_shapes[fqn][0]:
            from ..errors import UnshardError

            raise UnshardError(f"{where}: {fqn} stacks {stacked_shapes[fqn][0]} experts, but only {count} are here")
    if unknown:
        from ..errors import UnshardError

        raise UnshardError(
            f"{where}: {len(unknown)} tensors have no {trainer} name in unshard's table of {family} names (e.g. "
            f"{unknown[0]}); --names hf writes the Hugging Face names"
        )
    return renamed, stacked_shapes


def _of_its_kind(meta: str, layer: str | None, table: dict[str, Any], config: dict[str, Any]) -> bool:
    """Whether a rule's trainer name `meta` is of the kind of the Hugging Face layer it matched: a tensor of a
    cross-attention layer (a CrossLayers rule's fused part) on a layer the config places one at, any other on any
    other. Both kinds of layer name their norms and MLPs alike on the Hugging Face side."""
    for prefix, rule in table.items():
        if isinstance(rule, CrossLayers) and meta.startswith(prefix) and layer is not None:
            fused = meta.removeprefix(prefix).split(".", 1)[1].startswith(rule.fused)
            return fused == (int(layer) in (config.get(rule.key) or []))
    return True


def _numbered_apart(fqn: str, table: dict[str, Any], config: dict[str, Any]) -> str:
    """A trainer's name of a layer past the model's, as its AfterTheModel rule numbers it (`layers.4.x` of a
    4-layer model -> `mtp_layers.0.x`); of a layer a CrossLayers rule numbers apart, the trainer's number; any other
    name as it is."""
    for prefix, rule in table.items():
        if isinstance(rule, CrossLayers) and fqn.startswith(prefix):
            number, rest = fqn.removeprefix(prefix).split(".", 1)
            return f"{prefix}{rule.trainer_layer(int(number), config)}.{rest}"
    match = LAYER.match(fqn)
    layers = config.get("num_hidden_layers")
    if match is None or layers is None or int(match.group(1)) < layers:
        return fqn
    prefix = next((p for p, rule in table.items() if isinstance(rule, AfterTheModel)), None)
    return fqn if prefix is None else f"{prefix}{int(match.group(1)) - layers}.{fqn[match.end() :]}"


def _pattern(hf: str) -> re.Pattern:
    """A Hugging Face name of a table ({i}: a layer, {e}: an expert) as a pattern matching its tensors."""
    return re.compile("^" + re.escape(hf).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{e\}", r"(?P<e>\d+)") + "$")


def _part_rows(parts: list[Fused], rows: int, config: dict[str, Any], where: str) -> list[int]:
    """The rows of each part of a fused tensor of `rows` rows: by the config (Fused.rows; a part without, what is
    left), by its heads (Fused.heads), or equal shares."""
    if any(part.rows for part in parts):
        given = [config.get(part.rows, 0) if part.rows else None for part in parts]
        sizes = [rows - sum(g for g in given if g) if g is None else g for g in given]
    elif all(part.heads is None for part in parts):
        sizes = [rows // len(parts)] * len(parts)
    else:
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        sizes = [
            (config.get(part.heads) or config["num_attention_heads"])
            * (config.get(part.width) if part.width else head_dim)
            for part in parts
        ]
    if sum(sizes) != rows:
        from ..errors import UnshardError

        raise UnshardError(f"{where}: {rows} rows are not its {len(parts)} parts' {sizes} by config.json")
    return sizes


def _config_value(config: dict[str, Any], key: str, where: str, kind: type = int) -> Any:
    """A config's value at a dotted key (`vision_config.patch_size`), of `kind`."""
    value: Any = config
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if not isinstance(value, kind):
        from ..errors import CheckpointError

        raise CheckpointError(f"{where}: the config has no {key}, which the trainer's names need; pass --config-from")
    return value
