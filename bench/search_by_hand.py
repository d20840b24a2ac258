"""What a user does without merge-search, per trial: write a recipe, `unshard merge` it to disk, load the folder
with transformers and score it on the eval file. The benchmark's baseline for merge-search's trials.

    python bench/search_by_hand.py SPACE_DIR EVAL TRIALS WORK
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path

import torch


def main() -> None:
    folder, eval_file, trials, work = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder / "base")
    lines = [line for line in eval_file.read_text().splitlines() if line.strip()]
    rng = random.Random(0)
    for trial in range(trials):
        recipe = work / "trial.yml"
        recipe.write_text(
            f"merge_method: task_arithmetic\nbase_model: {folder / 'base'}\nmodels:\n"
            f"  - model: {folder / 'ft0'}\n    parameters: {{weight: {rng.random():.3f}}}\n"
            f"  - model: {folder / 'ft1'}\n    parameters: {{weight: {rng.random():.3f}}}\n"
            "dtype: float32\n"
        )
        out = work / "trial-model"
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(
            [sys.executable, "-m", "unshard", "merge", str(recipe), str(out), "--no-progress"],
            check=True,
            capture_output=True,
        )
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        total = count = 0
        with torch.no_grad():
            for line in lines:
                ids = tokenizer(line, return_tensors="pt").input_ids
                total += float(model(input_ids=ids, labels=ids).loss) * (ids.shape[1] - 1)
                count += ids.shape[1] - 1
        print(f"trial {trial}: {total / count:.4f}", flush=True)
        del model
    shutil.rmtree(work / "trial-model", ignore_errors=True)


if __name__ == "__main__":
    main()
