"""`unshard merge-search SPACE.yaml OUT --eval FILE`: the merge recipe, among those SPACE allows, whose merged
model scores best on the user's own data, found by Optuna (TPE, seeded) and written to OUT as `unshard merge`
writes it.

Trial 0 is the untuned recipe (each range's default or midpoint, each choice's first). Every trial plans its
recipe as `unshard merge` does, merges it tensor by tensor into a model held in memory (each input read once)
and scores it (evaluation.py). The study lives in an SQLite file (`--study`), so a second run continues it.
OUT gets the best recipe's merge, the recipe as mergekit_config.yml (`unshard merge` makes the same model
from it, bit for bit), and in OUT/search/ the leaderboard (CSV, JSON) and a plot of the trials.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UnshardError
from ..types import OutputOptions
from .evaluation import EvalSet, context_length, merged_model
from .plan import plan_merge, recipe_files
from .recipe import RecipeError
from .search_space import Space, parse_space

STUDY_NAME = "unshard-merge-search"


@dataclass
class SearchOptions:
    eval_file: Path
    trials: int = 20
    seed: int = 0
    device: str = "auto"
    study: Path | None = None  # default: OUT's path + ".study.db"


def device_of(choice: str) -> str:
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise UnshardError("--device cuda: torch sees no CUDA device here; use --device cpu")
    return choice


@dataclass
class Prepared:
    """What every trial shares: the space, the scored data, the device and the memory a trial takes."""

    space: Space
    evaluation: EvalSet
    device: str
    bound: int  # bytes: the merged model in memory, the merge's working set and the largest logits


def prepare(space_path: str | Path, options: SearchOptions, output: OutputOptions = OutputOptions()) -> Prepared:
    """Everything checked before any trial: the space, every method's recipe at the defaults (its models,
    its parameters), the eval file tokenised."""
    space = parse_space(Path(space_path))
    device = device_of(options.device)
    plans = []
    for method in space.methods:  # (each choice of method must find the parameters it needs in the space)
        values = {**space.defaults(), **({"merge_method": method} if len(space.methods) > 1 else {})}
        try:
            plans.append(plan_merge(space.path, output, text=space.recipe(values)))
        except RecipeError as e:
            raise RecipeError(f"{e} (merge_method {method}, at the space's defaults)") from None
        plans[-1].checkpoint.close()  # (its metadata is all that is used)
    plan = plans[0]
    evaluation = EvalSet.read(options.eval_file, plan.config_folder, context_length(plan))
    width = max(ids.shape[1] for ids, _, _ in evaluation.batches)
    vocabulary = max(o.shape[0] for o in plan.outputs if o.name.endswith(("lm_head.weight", "embed_tokens.weight")))
    held = (
        sum(math.prod(o.shape) * 4 for o in plan.outputs)
        + plan.peak_memory_estimate(1)
        + 2 * 8 * width * vocabulary * 4
    )
    return Prepared(space, evaluation, device, held)


def score(prepared: Prepared, recipe: str, seed: int, output: OutputOptions = OutputOptions()) -> float:
    """The eval loss of the model `recipe` merges, built in memory."""
    plan = plan_merge(prepared.space.path, output, seed=seed, text=recipe)
    try:
        model = merged_model(plan, prepared.device)
    finally:
        plan.checkpoint.close()
    loss = prepared.evaluation.loss(model, prepared.device)
    del model
    return loss


def run_search(
    prepared: Prepared,
    options: SearchOptions,
    study_path: Path,
    progress: bool | None = None,
    output: OutputOptions = OutputOptions(),
):
    """Run `options.trials` more trials of the study in `study_path`; the study."""
    import optuna
    from tqdm import tqdm

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=STUDY_NAME,
        storage=f"sqlite:///{study_path}",
        load_if_exists=True,
        direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=options.seed),
    )
    space = prepared.space
    if not study.trials:
        study.enqueue_trial(space.defaults())  # trial 0: the untuned recipe

    def objective(trial) -> float:
        values = {}
        for d in space.dimensions:
            values[d.name] = (
                trial.suggest_categorical(d.name, list(d.choices))
                if d.choices
                else trial.suggest_float(d.name, d.low, d.high, log=d.log)
            )
        recipe = space.recipe(values)
        trial.set_user_attr("recipe", recipe)
        loss = score(prepared, recipe, options.seed, output)
        if not math.isfinite(loss):
            raise optuna.TrialPruned(f"loss {loss}")
        return loss

    bar = tqdm(total=options.trials, desc="trials", unit="trial", disable=progress is False, leave=False)

    def advance(study, trial) -> None:
        bar.update(1)
        if any(t.value is not None for t in study.trials):
            bar.set_postfix(best=f"{study.best_value:.4f}")

    try:
        study.optimize(objective, n_trials=options.trials, callbacks=[advance], catch=())
    finally:
        bar.close()
    return study


def leaderboard(study) -> list[dict[str, Any]]:
    """Every finished trial, best first."""
    rows = [{"trial": t.number, "loss": t.value, **t.params} for t in study.trials if t.value is not None]
    return sorted(rows, key=lambda row: row["loss"])


def search_files(study, space: Space) -> dict[str, str | bytes]:
    """OUT/search/: the leaderboard as CSV and JSON (with each trial's recipe), and the plot."""
    rows = leaderboard(study)
    columns = ["trial", "loss", *(d.name for d in space.dimensions)]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    recipes = {t.number: t.user_attrs.get("recipe") for t in study.trials}
    files: dict[str, str | bytes] = {
        "search/leaderboard.csv": text.getvalue(),
        "search/leaderboard.json": json.dumps([{**row, "recipe": recipes.get(row["trial"])} for row in rows], indent=2)
        + "\n",
    }
    if (plot := _plot(study, space)) is not None:
        files["search/trials.png"] = plot
    return files


def _plot(study, space: Space) -> bytes | None:
    """Loss per trial with the best so far; beside it, loss against the two most important parameters (by
    Optuna's fANOVA importance, where it can be computed). None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    done = [t for t in study.trials if t.value is not None]
    important = [d.name for d in space.dimensions if not d.choices][:2]
    try:
        import optuna

        ranked = [
            n
            for n in optuna.importance.get_param_importances(study)
            if n in {d.name for d in space.dimensions if not d.choices}
        ]
        important = ranked[:2] or important
    except Exception:  # (too few trials, or no variation yet: keep the space's order)
        pass
    figure, axes = plt.subplots(1, 1 + len(important), figsize=(5 * (1 + len(important)), 4), squeeze=False)
    numbers, losses = [t.number for t in done], [t.value for t in done]
    best = [min(losses[: i + 1]) for i in range(len(losses))]
    axes[0][0].plot(numbers, losses, "o", label="trial")
    axes[0][0].step(numbers, best, where="post", label="best so far")
    axes[0][0].set(xlabel="trial", ylabel="eval loss per token", title="merge-search")
    axes[0][0].legend()
    for axis, name in zip(axes[0][1:], important):
        axis.scatter([t.params.get(name) for t in done], losses, c=numbers, cmap="viridis")
        axis.set(xlabel=name, ylabel="eval loss per token")
    figure.tight_layout()
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=100)
    plt.close(figure)
    return png.getvalue()


def search_card(study, space: Space, options: SearchOptions, evaluation: EvalSet) -> str:
    """The merge-search part of OUT/README.md."""
    rows = leaderboard(study)
    first = next((t for t in study.trials if t.number == 0 and t.value is not None), None)
    lines = [
        "",
        "## merge-search",
        "",
        f"Chosen by `unshard merge-search` over {len(rows)} scored trial(s) (TPE, seed {options.seed}) by the loss "
        f"per token of `{Path(options.eval_file).name}` ({evaluation.tokens} tokens scored): best "
        f"{rows[0]['loss']:.4f} (trial {rows[0]['trial']})"
        + (f", untuned (trial 0) {first.value:.4f}" if first else "")
        + ".",
        f"`unshard merge mergekit_config.yml OUT --seed {options.seed}` makes this model again. The search's "
        "leaderboard is in `search/`.",
        "",
        "| trial | loss | " + " | ".join(d.name for d in space.dimensions) + " |",
        "|---|---|" + "---|" * len(space.dimensions),
    ]
    for row in rows[:10]:
        lines.append(
            f"| {row['trial']} | {row['loss']:.4f} | "
            + " | ".join(_shown(row.get(d.name)) for d in space.dimensions)
            + " |"
        )
    return "\n".join(lines) + "\n"


def _shown(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def best_plan(prepared: Prepared, study, options: SearchOptions, output: OutputOptions):
    """The best trial's recipe, planned as `unshard merge` plans it, and OUT's extra files."""
    if not any(t.value is not None for t in study.trials):
        raise UnshardError(f"{options.eval_file}: no trial scored a finite loss; check the eval file and the ranges")
    recipe = study.best_trial.user_attrs["recipe"]
    plan = plan_merge(prepared.space.path, output, seed=options.seed, text=recipe)
    files: dict[str, str | bytes] = dict(recipe_files(plan))
    files["README.md"] += search_card(study, prepared.space, options, prepared.evaluation)
    files.update(search_files(study, prepared.space))
    return plan, files


def search_and_write(
    space_path: str | Path,
    out: str | Path,
    options: SearchOptions,
    output: OutputOptions,
    overwrite: bool = False,
    threads: int = 1,
    progress: bool | None = None,
    sync: bool = True,
):
    """The whole command: check, search, write the best merge to OUT; (the Result, the study)."""
    from ..errors import OutputExistsError
    from ..write.execute import convert

    prepared = prepare(space_path, options, output)
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())) and not overwrite:
        raise OutputExistsError(
            f"{out}: already exists; choose another OUT or pass --overwrite (checked before the search, not after it)"
        )
    study_path = options.study or Path(str(out).rstrip("/") + ".study.db")
    study = run_search(prepared, options, study_path, progress, output)
    plan, files = best_plan(prepared, study, options, output)
    try:
        result = convert(
            plan, out, overwrite=overwrite, threads=threads, progress=progress, extra_files=files, sync=sync
        )
    finally:
        plan.checkpoint.close()
    return result, study


__all__ = ["SearchOptions", "best_plan", "prepare", "run_search", "score", "search_and_write"]
