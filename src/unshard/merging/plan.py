"""Planning a merge: open every input (metadata only), decide each output tensor's inputs and parameters,
then plan the merged model as a conversion of a MergedCheckpoint (`output.dtype` auto: the recipe's)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import dtypes
from ..hub import hub_ids
from ..names import hf_names
from ..plan import TOKENIZER_FILES, build_plan, choose_dtype
from ..sources import SourceOptions, SourceTensor
from ..types import OutputOptions, OutputTensor, Plan
from .checkpoint import MergedCheckpoint, TensorMerge
from .inputs import LAYER, Input, open_input
from .methods import METHODS, REQUIRED, Method
from .recipe import Recipe, RecipeError, Slice, Source, parse_recipe, resolve
from .vocabulary import VOCABULARY_TENSORS, Vocabulary

# Tensors outside the layers that come before them (merged from the first slice's models; the rest, the
# final norm and the head, from the last slice's), as mergekit's architectures list them.
EMBEDDINGS = ("embed", "wte", "wpe")


def plan_merge(
    recipe_path: str | Path,
    output: OutputOptions = OutputOptions(),
    *,
    seed: int = 0,
    check: bool = True,
    text: str | None = None,
) -> Plan:
    """text: the recipe itself, where it is in no file (merge-search's trials); models are then found
    relative to `recipe_path`'s folder still."""
    recipe = parse_recipe(Path(recipe_path), text)
    method = METHODS[recipe.method]
    recipe_dir = Path(recipe_path).resolve().parent
    where = str(recipe_path)
    slices = _with_bases(recipe, method, where)
    inputs: dict[str, Input] = {}
    for reference in dict.fromkeys(
        [*([recipe.base] if recipe.base else []), *(s.model for piece in slices for s in piece.sources)]
    ):
        inputs[reference] = open_input(reference, recipe_dir, check)
    lead = inputs[recipe.base or slices[0].sources[0].model]
    work = dtypes.OUTPUT[recipe.dtype or "float32"]
    vocabulary = _vocabulary(recipe, inputs, lead, where)
    merges = _tensor_merges(recipe, method, slices, inputs, lead, where, vocabulary)

    chosen = recipe.vocabulary.source if recipe.vocabulary else "base"
    source = lead if chosen in ("base", "union") else inputs.get(chosen)
    if source is None:
        raise RecipeError(f"{where}: tokenizer source {chosen!r} is none of union, base or the models")
    tensors = {
        name: SourceTensor(name, m.out.shape, work if m.out.dtype.is_floating_point else m.out.dtype, [])
        for name, m in merges.items()
    }
    checkpoint = MergedCheckpoint(
        layout="merge",
        path=Path(recipe_path),
        tensors=tensors,
        hf_folder=source.plan.config_folder,
        facts={"method": recipe.method, "inputs": ", ".join(inputs), "base_model": recipe.base, "seed": seed},
    )
    checkpoint.setup(method, merges, work, seed, list(inputs.values()), recipe, vocabulary)
    if recipe.sliced:
        checkpoint.config_changes = _layer_count(slices, lead)
    if vocabulary is not None:
        checkpoint.config_changes["vocab_size"] = vocabulary.rows
    requested, reason = next(
        (value, why)
        for value, why in (
            (None if output.dtype == "auto" else output.dtype, "asked for with --dtype"),
            (recipe.out_dtype, "the recipe's out_dtype"),
            (recipe.dtype, "the recipe's dtype"),
            ("", "the base model's"),
        )
        if value is not None
    )
    if not requested:  # asked for nowhere: the dtype the base would be converted to
        natural, _ = choose_dtype("auto", hf_names.read_config(lead.plan.config_folder), lead.plan.checkpoint)
        requested = natural.name if natural.name in dtypes.OUTPUT else "float32"
    plan = build_plan(checkpoint, replace(output, dtype=requested), SourceOptions(check=check))
    plan.dtype_reason = reason
    # Per tensor in flight: one copy per input, the stacked task vectors and the result.
    plan.copies_per_tensor = 2 * max(len(piece.sources) for piece in slices) + 1
    plan.notes = [note for note in plan.notes if "--config-from" not in note]
    plan.base_models = hub_ids([recipe.base] + recipe.models)
    if vocabulary is not None:  # (its own tokenizer files, not the source's)
        plan.extra_files, plan.own_tokenizer = vocabulary.files(), True
    elif not any((source.plan.config_folder / name).exists() for name in TOKENIZER_FILES):
        plan.notes.append(f"{source.reference} has no tokenizer: set tokenizer_source to a model that has one")
    return plan


def _vocabulary(recipe: Recipe, inputs: dict[str, Input], lead: Input, where: str) -> Vocabulary | None:
    """The output's vocabulary and each input's rows on it, where the recipe asks for one (as mergekit: even
    `base`, which lays every model's rows onto the base's tokens)."""
    if recipe.vocabulary is None:
        return None
    sizes = {}
    for reference, item in inputs.items():
        rows = item.output(VOCABULARY_TENSORS[0])
        if rows is None:
            raise RecipeError(
                f"{reference}: has no {VOCABULARY_TENSORS[0]}; unshard merges vocabularies of models "
                "that name their embeddings so (Llama, Mistral, Qwen and their kin)"
            )
        sizes[reference] = rows.shape[0]
    return Vocabulary(
        recipe.vocabulary, lead.reference, {r: i.plan.config_folder for r, i in inputs.items()}, sizes, where
    )


def _with_bases(recipe: Recipe, method: Method, where: str) -> list[Slice]:
    """The slices with the base model among their sources where the method needs it (added to `models:`, as
    mergekit adds it; a slice must list it with its layer range), and their inputs counted."""
    slices = []
    for i, piece in enumerate(recipe.slices):
        at = f"{where}: slices[{i}]" if recipe.sliced else where
        models = [s.model for s in piece.sources]
        base = recipe.base_of(piece)
        if method.needs_base:
            if not base:
                raise RecipeError(f"{at}: {recipe.method} needs base_model")
            if base not in models:
                if recipe.sliced:
                    raise RecipeError(
                        f"{at}: {recipe.method} needs the base model {base} among the slice's sources, "
                        "with its layer_range"
                    )
                piece = replace(piece, sources=[*piece.sources, Source(base, None, {})])
        others = [s for s in piece.sources if not (method.needs_base and s.model == base)]
        least, most = method.inputs
        if len(others) < least or (most is not None and len(others) > most):
            wanted = f"exactly {least}" if least == most else f"at least {least}"
            raise RecipeError(f"{at}: {recipe.method} takes {wanted} model(s) besides the base, got {len(others)}")
        slices.append(piece)
    return slices


def _tensor_merges(
    recipe: Recipe,
    method: Method,
    slices: list[Slice],
    inputs: dict[str, Input],
    lead: Input,
    where: str,
    vocabulary: Vocabulary | None,
) -> dict[str, TensorMerge]:
    """Every output tensor, in order, with the tensor of each input it is made from and its parameters."""
    merges = _Merges(recipe, method, inputs, lead, where, vocabulary)
    named = {o.name: o for g in lead.plan.groups for o in g.outputs}
    if not recipe.sliced:  # the lead's tensors, each from the same tensor of every input
        (piece,) = slices
        for name, out in named.items():
            found = LAYER.match(name)
            layers = lead.stacks.get(found[1], 1) if found else 1
            t = (int(found[2]) / (layers - 1) if layers > 1 else 1.0) if found else 0.0
            merges.add(out, piece, None, t)
        return merges.found

    # Slices: the embeddings from the first slice's models, each slice's layers renumbered, the rest from the last.
    stacks = set(lead.stacks).union(*(inputs[s.model].stacks for piece in slices for s in piece.sources))
    if len(stacks) != 1:
        raise RecipeError(
            f"{where}: slices take models with one stack of layers; {lead.reference} has "
            f"{', '.join(sorted(stacks)) or 'none'} (mergekit merges such models by `modules`, which "
            "unshard does not)"
        )
    (stack,) = stacks
    outside = [o for name, o in named.items() if not LAYER.match(name)]
    for out in outside:
        if any(word in out.name for word in EMBEDDINGS):
            merges.add(out, slices[0], None, 0.0)
    index = 0
    for i, piece in enumerate(slices):
        for j, source in enumerate(piece.sources):
            has = inputs[source.model].stacks[stack]
            if source.layers[1] > has:
                raise RecipeError(
                    f"{where}: slices[{i}].sources[{j}]: layer_range {list(source.layers)} goes past "
                    f"{source.model}'s {has} layers"
                )
        first = piece.sources[0]
        count = first.layers[1] - first.layers[0]
        first_named = {o.name: o for g in inputs[first.model].plan.groups for o in g.outputs}
        for offset in range(count):
            t = offset / (count - 1) if count > 1 else 1.0
            prefix = f"{stack}.{first.layers[0] + offset}."
            for name, out in first_named.items():
                if name.startswith(prefix):
                    renamed = f"{stack}.{index}.{name[len(prefix) :]}"
                    merges.add(replace(out, name=renamed), piece, (offset, index), t)
            index += 1
    for out in outside:
        if not any(word in out.name for word in EMBEDDINGS):
            merges.add(out, slices[-1], None, 0.0)
    return merges.found


@dataclass
class _Merges:
    """The output tensors planned so far, each with the tensor of each input it is made from and the
    method's parameters resolved for it (`t`: its place in the layers, for gradient parameters)."""

    recipe: Recipe
    method: Method
    inputs: dict[str, Input]
    lead: Input
    where: str
    vocabulary: Vocabulary | None
    found: dict[str, TensorMerge] = field(default_factory=dict)

    def add(self, out: OutputTensor, piece: Slice, layer: tuple[int, int] | None, t: float) -> None:
        """`layer`: (offset in the slice, output index) for a tensor of the layers, renamed from each source's."""
        recipe = self.recipe
        base_model = recipe.base_of(piece) if self.method.needs_base else None

        def input_name(source: Source) -> str:
            if layer is None:
                return out.name
            found = LAYER.match(out.name)
            return f"{found[1]}.{(source.layers or (0, 0))[0] + layer[0]}.{found[3]}"

        read = [(self.inputs[s.model], input_name(s)) for s in piece.sources]  # (a model may come twice)
        by_token = self.vocabulary is not None and out.name in VOCABULARY_TENSORS
        if by_token:  # (its rows are the output vocabulary's)
            out = replace(out, shape=(self.vocabulary.rows, *out.shape[1:]))
        _check_shapes(read, out, self.lead, by_token)
        at_base = next((i for i, s in enumerate(piece.sources) if s.model == base_model), None)
        others = [i for i in range(len(read)) if i != at_base]
        at_lead = next((i for i, s in enumerate(piece.sources) if s.model == recipe.base_of(piece)), 0)
        shared = self._shared(piece, out.name, t)
        per_input = [self._per_input(piece, i, read[i][1], t) for i in others]
        self.found[out.name] = TensorMerge(
            out,
            read[at_lead],
            read[at_base] if at_base is not None else None,
            [read[i] for i in others],
            per_input,
            shared,
            [item.reference for item, _ in read] if by_token else None,
        )

    def _shared(self, piece: Slice, name: str, t: float) -> dict:
        shared = {}
        for key, default in self.method.shared.items():
            value = resolve(key, [piece.parameters, self.recipe.parameters], name, t)
            if value is None and default is REQUIRED:
                raise RecipeError(f"{self.where}: {self.recipe.method} needs parameters.{key}")
            shared[key] = default if value is None else value
        return shared

    def _per_input(self, piece: Slice, i: int, name: str, t: float) -> dict:
        scopes = [piece.sources[i].parameters, piece.parameters, self.recipe.parameters]
        values = {}
        for key, default in self.method.per_input.items():
            value = resolve(key, scopes, name, t)
            if value is None and default is REQUIRED:
                raise RecipeError(
                    f"{self.where}: model {piece.sources[i].model} needs parameters.{key} for {self.recipe.method}"
                )
            values[key] = default if value is None else value
        return values


def _check_shapes(read: list[tuple[Input, str]], out: OutputTensor, lead: Input, by_token: bool) -> None:
    """Every input has the tensor, in the output's shape (a row per token: its rows may be as many as its
    vocabulary's)."""
    for item, name in read:
        theirs = item.output(name)
        if theirs is None:
            raise RecipeError(
                f"{item.reference}: has no {name}, which {lead.reference} has; "
                "models merged together must share an architecture"
            )
        if by_token and theirs.shape[1:] != out.shape[1:] or not by_token and theirs.shape != out.shape:
            raise RecipeError(
                f"{item.reference}: {name} has shape {tuple(theirs.shape)}, {lead.reference} "
                f"{tuple(out.shape)}; unshard merges equal shapes only (different vocabularies: "
                "set tokenizer_source: union, or base)"
            )


def _layer_count(slices: list[Slice], lead: Input) -> dict:
    """What the output's config says otherwise: its layer count (and per-layer types, where the config
    lists them, the layers' own)."""
    total = sum(piece.sources[0].layers[1] - piece.sources[0].layers[0] for piece in slices)
    changes: dict = {"num_hidden_layers": total}
    config = hf_names.read_config(lead.plan.config_folder) or {}
    if isinstance(config.get("layer_types"), list):
        changes["layer_types"] = [config["layer_types"][i] for piece in slices for i in range(*piece.sources[0].layers)]
    return changes


def model_card(plan: Plan) -> str:
    """The opening of README.md for the merged folder: the method, the inputs and the recipe
    (the writer adds the dtype and the list of files)."""
    recipe = plan.checkpoint.recipe
    lines = [
        "# Merged model",
        "",
        f"Made with [unshard](https://pypi.org/project/unshard/) `merge` using the **{recipe.method}** method.",
        "",
    ]
    if recipe.base:
        lines += [f"Base model: `{recipe.base}`", ""]
    lines += (
        ["Models:", ""]
        + [f"- `{m}`" for m in recipe.models]
        + ["", "Recipe:", "", "```yaml", recipe.text.rstrip(), "```", ""]
    )
    return "\n".join(lines)


def recipe_files(plan: Plan) -> dict[str, str]:
    return {"mergekit_config.yml": plan.checkpoint.recipe.text, "README.md": model_card(plan)}
