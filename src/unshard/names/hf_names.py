"""Checkpoint names -> the names `save_pretrained` writes, and the check against the model config.

Trainers save in-memory names. Hugging Face folders hold on-disk names, which differ where
transformers converts weights when loading (transformers >= 5 fuses MoE experts in memory, for
example). Rather than keep our own tables for every model, we ask transformers: a model is built on
the meta device (no memory, no weights) and transformers' own reverse conversion tells which names
and shapes `save_pretrained` would write. Those facts are cached per config (known.py), so
converting the next checkpoint of a run need not import transformers; for the most common dense
families they are written down (each family's TensorTable: names/dense_tables.py), so not even the first does. Without
transformers, other models' names are kept as they are.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigMismatchError
from . import dense_tables, known
from .model_facts import LinearLayers, ModelFacts, built_by_transformers, meta_model

if TYPE_CHECKING:
    import torch

log = logging.getLogger("unshard")

# Module wrappers insert these path components into every parameter name below them (FSDP1,
# activation checkpointing, torch.compile); DDP and DeepSpeed put `module.` in front of all names.
WRAPPER_COMPONENTS = {"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"}


def strip_wrappers(name: str) -> str:
    parts = [p for p in name.split(".") if p not in WRAPPER_COMPONENTS]
    if parts[0] == "module" and len(parts) > 1:
        parts = parts[1:]
    return ".".join(parts)


@dataclass
class Naming:
    """How checkpoint tensors become output tensors."""

    # checkpoint name -> [(output name, shape)]; one entry for a rename, several for a split
    outputs: dict[str, list[tuple[str, tuple[int, ...]]]]
    # checkpoint name -> converts the whole tensor into {output name: tensor}; absent for renames
    converters: dict[str, Callable[[torch.Tensor], dict[str, torch.Tensor]]]
    dropped: dict[str, str]
    notes: list[str]
    question: Question | None = None  # transformers' answer, still to come (plan_names(ask_later=True))
    linear: LinearLayers | None = None  # (None: not known)
    # output dtype name -> checkpoint names that transformers keeps in float32 at that dtype (ModelFacts.float32)
    float32: dict[str, set[str]] = field(default_factory=dict)
    # output name -> (the checkpoint names whose rows it is, in order; its shape; where its rows come from in theirs
    # one after another, None where in that order): a tensor transformers splits on loading (HRM-Text's gate, q, k and
    # v of one gqkv_proj; Step 3.7's tower's q, k and v of one in_proj_weight, q's and k's rows turned for rope),
    # written whole again as save_pretrained does
    joined: dict[str, tuple[list[str], tuple[int, ...], tuple[int, ...] | None]] = field(default_factory=dict)


def read_config(folder: Path | None) -> dict[str, Any] | None:
    if folder is None or not (folder / "config.json").exists():
        return None
    try:
        return json.loads((folder / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigMismatchError(
            f"{folder / 'config.json'}: not valid JSON ({e}); fix it or pass --config-from"
        ) from None


# What this process asked transformers already, by cache entry (answers of None included), so that
# a plan made again finds the answer with the cache off too.
_answers: dict[str, ModelFacts | None] = {}


# Raised when the way a config's model is built for the question changes (meta_model), so that answers
# remembered by an earlier unshard are asked again.
FACTS_REVISION = 8


def _facts_entry(config_folder: Path, config: dict, updates: dict | None) -> str | None:
    """The cache entry of the question "what does this config's model hold"; None where transformers
    cannot be asked (not installed, or custom code, which is never run)."""
    version = known.transformers_version()
    if version is None or not built_by_transformers(config):
        return None
    return known.key("model", FACTS_REVISION, version, (config_folder / "config.json").read_text(), updates or {})


def _recalled(entry: str) -> tuple[bool, ModelFacts | None]:
    """(answered before, the answer) from this process or the cache."""
    if entry in _answers:
        return True, _answers[entry]
    if (cached := known.recall("models", entry)) is not None:
        try:
            return True, ModelFacts.from_json(cached)
        except (KeyError, TypeError, AttributeError):
            pass  # an entry of another shape: ask again
    return False, None


def _ask(config_folder: Path, config: dict, updates: dict | None, entry: str) -> ModelFacts | None:
    """The facts of the model the config describes (None if transformers has no class for it), remembered."""
    import torch

    model = meta_model(config_folder, config, updates, dtype=torch.bfloat16)
    facts = None if model is None else ModelFacts.of(model)
    if facts is not None:
        known.remember("models", entry, facts.to_json())
    _answers[entry] = facts
    return facts


class NamingChanged(Exception):
    """transformers' answer names the tensors otherwise than the names as saved, which the writing
    started with: write again with a plan made from the answer."""


class Question:
    """transformers asked on a thread what the config's model holds, while the weights are written
    under the names as saved: importing torch and transformers takes 3-6 s, as long as writing a few
    GB, and most models keep their names. `verdict` compares the answer with that naming."""

    def __init__(
        self, ask: Callable[[], ModelFacts | None], naming: Naming, settle: Callable[[ModelFacts | None], Naming]
    ):
        self.naming, self._settle, self._notes = naming, settle, None
        self._answer: Future = Future()

        def run():
            try:
                self._answer.set_result(ask())
            except BaseException as e:  # (raised in the thread that asks for the verdict)
                self._answer.set_exception(e)

        # A daemon: a conversion that fails first need not wait for the import to end.
        self._thread = threading.Thread(target=run, name="unshard-asks-transformers", daemon=True)
        self._thread.start()

    def answered(self) -> bool:
        return self._answer.done()

    def verdict(self) -> list[str]:
        """Waits for the answer. The notes of the naming it gives, if that is the naming written; raises
        NamingChanged if not, and ConfigMismatchError if the checkpoint does not fit the config."""
        if self._notes is None:
            self._thread.join()  # (gone, not just done, before any writer process is forked)
            settled = self._settle(self._answer.result())
            if (
                settled.outputs != self.naming.outputs
                or set(settled.dropped) != set(self.naming.dropped)
                or settled.converters
                or settled.float32 != self.naming.float32
            ):
                raise NamingChanged
            self._notes = settled.notes
        return self._notes


def head_updates(
    names: set[str], shapes: dict[str, tuple[int, ...]], config: dict | None, architecture: str | None = None
) -> dict[str, Any]:
    """config.json changes so the head in the weights loads: verl saves a critic or reward model's
    weights (a `score` head, one label) beside the config of the causal LM it started from."""
    updates: dict[str, Any] = {}
    if architecture:
        updates["architectures"] = [architecture]
    score = next((shapes[n] for n in names if strip_wrappers(n) == "score.weight"), None)
    if score is None or config is None or "lm_head.weight" in {strip_wrappers(n) for n in names}:
        return updates
    declared = (config.get("architectures") or [""])[0]
    if not architecture and declared.endswith("ForCausalLM"):
        updates["architectures"] = [declared.replace("ForCausalLM", "ForTokenClassification")]
    if config.get("num_labels", len(config.get("id2label") or {}) or 2) != score[0]:
        updates.update(
            num_labels=score[0],
            id2label={str(i): f"LABEL_{i}" for i in range(score[0])},
            label2id={f"LABEL_{i}": i for i in range(score[0])},
        )
    return updates


def plan_names(
    shapes: dict[str, tuple[int, ...]],
    config_folder: Path | None,
    check: bool = True,
    renames: dict[str, str] | None = None,
    updates: dict | None = None,
    ask_later: bool = False,
    table: Any = None,
    as_saved: str | None = None,
    hub_renames: tuple[tuple[str, str], ...] = (),
    copies: Callable[[set[str]], set[str]] | None = None,
) -> Naming:
    """Decide the output names for checkpoint tensors of the given shapes (after `renames`).
    copies: of some checkpoint tensors, those that are another's bytes (Checkpoint.copies): a weight the model ties
    to another is dropped as saved once only where the checkpoint's is such a copy (None: always).
    table: the family's TensorTable (families.tensor_table), where it has one: transformers need not be asked.
    as_saved: why the names are kept as saved, not asked of transformers (the family's `hub_names`).
    hub_renames: the family's renames of the names save_pretrained writes into the Hub's (Family.hub_renames).
    ask_later: if transformers must be asked (a config not seen before), name the tensors as saved now and
    ask on a thread; the naming's `question` then tells whether that holds."""
    renames = renames or {}
    renamed = {name: strip_wrappers(renames.get(name, name)) for name in shapes}
    if len(set(renamed.values())) < len(renamed):
        clash = next(c for c in renamed.values() if list(renamed.values()).count(c) > 1)
        raise ConfigMismatchError(f"two checkpoint tensors are both named {clash} once wrappers are removed")
    config = read_config(config_folder) or {}
    _naming = partial(_hub_naming, hub_renames=hub_renames) if hub_renames else _plain_naming
    _naming = partial(_naming, copies=copies)
    if as_saved:
        naming = _naming(None, renamed, shapes, config, config_folder, check, updates, note=False)
        naming.notes.append(as_saved)
        return naming
    naming = None if table is None else _named_by_table(table, renamed, shapes, config, config_folder, updates, copies)
    if naming is not None:
        return naming
    entry = _facts_entry(config_folder, config, updates) if config else None
    if entry is None:
        return _naming(None, renamed, shapes, config, config_folder, check, updates)
    answered, facts = _recalled(entry)
    if not answered and ask_later:
        naming = _naming(None, renamed, shapes, config, config_folder, check, updates, note=False)
        naming.question = Question(
            lambda: _ask(config_folder, config, updates, entry),
            naming,
            lambda facts: _naming(facts, renamed, shapes, config, config_folder, check, updates),
        )
        return naming
    if not answered:
        facts = _ask(config_folder, config, updates, entry)
    return _naming(facts, renamed, shapes, config, config_folder, check, updates)


def _named_by_table(
    table: Any,
    renamed: dict[str, str],
    shapes: dict[str, tuple[int, ...]],
    config: dict,
    config_folder: Path | None,
    updates: dict | None,
    copies: Callable[[set[str]], set[str]] | None = None,
) -> Naming | None:
    """The naming the family's tensor table gives, if it covers the config and the checkpoint fits its
    answer exactly (checked even under --no-check); None otherwise, and transformers has the last word."""
    found = dense_tables.tensors(table, config, updates)
    if found is None:
        return None
    in_memory, tied = found
    try:  # (these families save the names they hold in memory)
        naming = _plain_naming(
            ModelFacts(in_memory, tied, in_memory, LinearLayers(dense_tables.linear(in_memory))),
            renamed,
            shapes,
            config,
            config_folder,
            True,
            updates,
            copies=copies,
        )
    except ConfigMismatchError:
        return None
    log.debug("tensors named and checked by unshard's table of %s models", config["model_type"])
    return naming


def _hub_naming(facts: ModelFacts | None, *args, hub_renames: tuple[tuple[str, str], ...], **kwargs) -> Naming:
    """The naming of _plain_naming, in the Hub's names where the family's save_pretrained writes others: transformers
    is told of the Hub's names as what it saves (a checkpoint of them is taken as saved), and its reverse conversion's
    names are renamed so."""

    def hub(name: str) -> str:
        for pattern, replacement in hub_renames:
            name = re.sub(pattern, replacement, name)
        return name

    if facts is not None:
        linear = facts.linear
        linear = replace(
            linear,
            weights=[hub(n) for n in linear.weights],
            held_as={hub(n): held for n, held in linear.held_as.items()},
            routers=[hub(n) for n in linear.routers],
            listed_as={hub(n): listed for n, listed in linear.listed_as.items()},
        )
        facts = replace(facts, saved={hub(n): s for n, s in facts.saved.items()}, linear=linear)
    naming = _plain_naming(facts, *args, **kwargs)
    naming.outputs = {n: [(hub(o), s) for o, s in outs] for n, outs in naming.outputs.items()}
    naming.converters = {
        n: lambda tensor, convert=convert: {hub(o): t for o, t in convert(tensor).items()}
        for n, convert in naming.converters.items()
    }
    return naming


def _plain_naming(
    facts: ModelFacts | None,
    renamed: dict[str, str],
    shapes: dict[str, tuple[int, ...]],
    config: dict,
    config_folder: Path | None,
    check: bool,
    updates: dict | None,
    note: bool = True,
    copies: Callable[[set[str]], set[str]] | None = None,
) -> Naming:
    """The naming the model's facts give (None: names as saved, a tied head dropped as the config says); a tied
    weight the checkpoint stores apart (not among `copies`) kept, as transformers 5 loads it untied."""
    if facts is None:
        return _unchecked_naming(renamed, shapes, config, note)
    notes: list[str] = []
    in_memory, saved = facts.in_memory, facts.saved
    held = {n for n, c in renamed.items() if c in facts.tied}
    apart = held - (copies(held) if copies and held else held)
    if apart:  # (the model as transformers loads this checkpoint: those weights not tied)
        notes.append(
            f"{', '.join(sorted(renamed[n] for n in apart))} kept: the checkpoint holds its own values, which "
            "transformers loads apart from the weight the config ties them to"
        )
    tied = facts.tied - {renamed[n] for n in apart}
    dropped = {n: "tied weight, saved once" for n in held - apart}
    live = {n: c for n, c in renamed.items() if n not in dropped}
    if mtp := {n: c for n, c in live.items() if _in_mtp_layer(c, config)}:
        # (the Hub's DeepSeek-V3 and GLM-4.5 hold them; transformers' classes load none, vLLM and llama.cpp do)
        naming = _plain_naming(
            facts,
            {n: c for n, c in renamed.items() if n not in mtp},
            shapes,
            config,
            config_folder,
            check,
            updates,
            note,
            copies,
        )
        naming.outputs.update({n: [(c, shapes[n])] for n, c in mtp.items()})
        naming.notes.append(
            f"{len(mtp)} tensors of the multi-token prediction layer(s) config.json counts "
            "(num_nextn_predict_layers) kept as saved: transformers does not load them, vLLM and llama.cpp do"
        )
        return naming
    # A tied weight is saved once; the checkpoint may hold both copies or one.
    live_shapes = {c: shapes[n] for n, c in live.items()}
    if not set(live.values()) <= set(in_memory) and set(live.values()) <= set(saved):
        # Already the names save_pretrained writes (a reader that names tensors itself, as for Megatron).
        if check:
            _check_against_model(
                {n: s for n, s in saved.items() if n not in tied | (facts.tied_as_saved - set(live.values()))},
                live_shapes,
                config_folder,
                config.get("model_type"),
            )
        return Naming(
            {n: [(c, shapes[n])] for n, c in live.items()},
            {},
            dropped,
            notes,
            linear=facts.linear,
            float32=_float32_by_checkpoint_name(facts, live),
        )
    if check:
        _check_against_model(
            {n: s for n, s in in_memory.items() if n not in tied}, live_shapes, config_folder, config.get("model_type")
        )
    return _converted_naming(facts, live, shapes, config, config_folder, updates, dropped, notes)


def _unchecked_naming(renamed: dict[str, str], shapes: dict[str, tuple[int, ...]], config: dict, note: bool) -> Naming:
    """Names as saved, unchecked, where no model class answers for the config; a tied head dropped as it says."""
    notes = []
    if config and note:
        notes.append(
            "tensor names kept as saved and not checked against the config "
            "(transformers not installed, a custom-code model, or no model class for this config)"
        )
    dropped = {}
    if config.get("tie_word_embeddings") and "lm_head.weight" in renamed.values():
        dropped = {n: "tied to model.embed_tokens.weight" for n, c in renamed.items() if c == "lm_head.weight"}
    outputs = {n: [(c, shapes[n])] for n, c in renamed.items() if n not in dropped}
    return Naming(outputs, {}, dropped, notes)


def _converted_naming(
    facts: ModelFacts,
    live: dict[str, str],
    shapes: dict[str, tuple[int, ...]],
    config: dict,
    config_folder: Path | None,
    updates: dict | None,
    dropped: dict[str, str],
    notes: list[str],
) -> Naming:
    """Tensors under the names transformers holds in memory (`live`: checkpoint name -> that name), written under
    those save_pretrained writes: transformers' conversion of the model reversed, where it converts any."""
    if facts.saved == facts.in_memory:  # transformers converts nothing for this model: names stay as they are
        outputs, converters, joined = {c: [(c, shapes[n])] for n, c in live.items()}, {}, {}
    else:
        model = meta_model(config_folder, config, updates)
        outputs, converters, joined = _reverse_conversion(model, {c: shapes[n] for n, c in live.items()})
    by_name = {c: n for n, c in live.items()}
    return Naming(
        {n: outputs[c] for n, c in live.items() if c in outputs},
        {n: converters[c] for n, c in live.items() if c in converters},
        dropped,
        notes,
        linear=facts.linear,
        float32=_float32_by_checkpoint_name(facts, live),
        joined={out: ([by_name[c] for c in members], *rest) for out, (members, *rest) in joined.items()},
    )


def _float32_by_checkpoint_name(facts: ModelFacts, live: dict[str, str]) -> dict[str, set[str]]:
    """ModelFacts.float32 under the checkpoint's names (`live`: checkpoint name -> name in memory)."""
    kept = {dtype: set(names) for dtype, names in facts.float32.items()}
    return {dtype: {n for n, c in live.items() if c in names} for dtype, names in kept.items()}


_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def _in_mtp_layer(name: str, config: dict) -> bool:
    """Whether a tensor is in a multi-token prediction layer the config counts after the model's own
    (num_nextn_predict_layers: DeepSeek-V3's, GLM-4.5's), numbered on from the last of them."""
    layer = _LAYER.match(name)
    blocks = config.get("num_hidden_layers")
    return bool(layer and blocks is not None and config.get("num_nextn_predict_layers") and int(layer[1]) >= blocks)


def _check_against_model(
    expected: dict[str, tuple[int, ...]],
    shapes: dict[str, tuple[int, ...]],
    config_folder: Path,
    model_type: str | None = None,
) -> None:
    missing = sorted(set(expected) - set(shapes))
    unexpected = sorted(set(shapes) - set(expected))
    wrong = sorted(
        n
        for n in set(expected) & set(shapes)
        if expected[n] != shapes[n] and not _loaded_transposed(model_type, n, shapes[n], expected[n])
    )
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} (e.g. {unexpected[0]})")
        if wrong:
            parts.append(
                f"{len(wrong)} with other shapes (e.g. {wrong[0]}: {shapes[wrong[0]]} vs {expected[wrong[0]]})"
            )
        raise ConfigMismatchError(
            f"{config_folder / 'config.json'}: the checkpoint does not fit this config: {'; '.join(parts)}. "
            "Pass the config the model was trained with (--config-from DIR), or --no-check to write anyway"
        )


def _loaded_transposed(model_type: str | None, name: str, shape: tuple[int, ...], held: tuple[int, ...]) -> bool:
    """Whether transformers loads this tensor stored transposed: its conversion transposes it where the shapes say
    so (Qwen3-VL-MoE's experts, held transposed in Qwen's release and by transformers 4)."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:
        return False
    if not model_type:
        return False
    for converter in get_checkpoint_conversion_mapping(model_type) or []:
        operations = getattr(converter, "operations", None) or []
        transpose = operations[0] if len(operations) == 1 else None
        if getattr(transpose, "check_dims", False) and any(re.search(p, name) for p in converter.source_patterns):
            swapped = list(held)
            swapped[transpose.dim0], swapped[transpose.dim1] = held[transpose.dim1], held[transpose.dim0]
            return tuple(swapped) == shape
    return False


def _reverse_conversion(model, shapes: dict[str, tuple[int, ...]]):
    """Ask transformers which on-disk tensors each in-memory tensor becomes: (in-memory name -> [(on-disk name,
    shape)], in-memory name -> its conversion where it is split, on-disk name -> the in-memory tensors whose rows it
    is, in order, and its shape)."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers < 5 saves in-memory names as they are
        return {n: [(n, s)] for n, s in shapes.items()}, {}, {}

    def meta(shape):
        import torch

        return torch.empty(shape, device="meta")

    whole = revert_weight_conversion(model, {n: meta(s) for n, s in shapes.items()})
    wanted = {n: tuple(t.shape) for n, t in whole.items()}
    outputs, converters, together = {}, {}, []
    for name, shape in shapes.items():
        if wanted.get(name) == shape:
            outputs[name] = [(name, shape)]
            continue
        alone = [(n, tuple(t.shape)) for n, t in revert_weight_conversion(model, {name: meta(shape)}).items()]
        if not all(wanted.get(n) == s for n, s in alone):  # (a part of a tensor made of several)
            together.append(name)
            continue
        outputs[name] = alone
        converters[name] = lambda tensor, name=name: revert_weight_conversion(model, {name: tensor})
    joined = _joined_rows(model, revert_weight_conversion, shapes, together)
    made = {n: s for outs in outputs.values() for n, s in outs} | {n: s for n, (_, s, _) in joined.items()}
    if made != wanted or sum(len(members) for members, _, _ in joined.values()) != len(together):
        raise ConfigMismatchError(
            f"transformers' conversion for {type(model).__name__} combines several checkpoint tensors into one "
            "otherwise than by their rows; unshard cannot stream that yet. Please report it with the output of "
            "`unshard inspect`"
        )
    return outputs, converters, joined


def _joined_rows(model, revert, shapes: dict[str, tuple[int, ...]], parts: list[str]) -> dict:
    """The on-disk tensors transformers makes of several in-memory ones by gathering their rows (what it splits on
    loading, a row permutation perhaps among its steps), found by reverting one-column stand-ins that number every
    row: on-disk name -> (the in-memory names, in the order their rows first come; its shape; the rows of those
    members one after another it takes, in its order, or None where it takes them in that order). Another
    combination (experts stacked on a new axis, columns joined) names none."""
    import bisect

    import torch

    if not parts:
        return {}
    starts = [0]
    for name in parts:
        starts.append(starts[-1] + shapes[name][0])
    probes = {
        n: torch.arange(starts[i], starts[i + 1], dtype=torch.float64).reshape(-1, *(1,) * (len(shapes[n]) - 1))
        for i, n in enumerate(parts)
    }
    joined = {}
    for name, made in revert(model, probes).items():
        rows = [int(v) for v in made.reshape(-1).tolist()]
        owners = [bisect.bisect_right(starts, row) - 1 for row in rows]
        members = [parts[i] for i in dict.fromkeys(owners)]
        trailing = {shapes[m][1:] for m in members}
        if made.shape != (len(rows), *(1,) * (made.dim() - 1)) or len(trailing) != 1 or len(set(rows)) < len(rows):
            continue
        if made.dim() != len(shapes[members[0]]) or len(rows) != sum(shapes[m][0] for m in members):
            continue
        before = dict(zip(members, itertools.accumulate((shapes[m][0] for m in members), initial=0)))
        order = tuple(before[parts[i]] + row - starts[i] for i, row in zip(owners, rows))
        joined[name] = (members, (len(rows), *trailing.pop()), None if order == tuple(range(len(rows))) else order)
    return joined
