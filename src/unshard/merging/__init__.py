"""Blend several models into one, tensor by tensor, from any layout unshard reads.

Recipes use mergekit's YAML format for what both support (`models:` or layer `slices:`), and each method
computes what mergekit 0.1.5 computes (its defaults and parameter names), so a mergekit recipe gives the
same model.

A merge is planned and written like a conversion: `MergedCheckpoint` is a Checkpoint whose tensors
are the output tensors and whose `read` (or, for a large tensor, `read_rows`, a band of rows at a
time) computes one of them from the inputs' tensors. Planner, streaming writer, progress bar, --verify
and the output folder are the conversion's; memory is a 64 MB band per input at a time, or a whole
tensor per input where an input cannot be read in bands (split experts, a LoRA adapter to fold,
Megatron's fused QKV, ZeRO's flat partitions).

    recipe.py      the YAML and its parameters' values per tensor
    inputs.py      the models named, opened (folders, Hub ids, `model+adapter`)
    adapter.py     a PEFT LoRA adapter folded onto an input
    plan.py        each output tensor's inputs and parameters; the plan
    checkpoint.py  the merged model as a Checkpoint the writer reads
    methods/       one module per merge method
"""

from .checkpoint import MergedCheckpoint
from .methods import METHODS
from .plan import plan_merge, recipe_files
from .recipe import RecipeError, evaluate, parse_recipe

__all__ = ["METHODS", "MergedCheckpoint", "RecipeError", "evaluate", "parse_recipe", "plan_merge", "recipe_files"]
