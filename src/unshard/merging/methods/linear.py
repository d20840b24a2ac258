"""A weighted average of the models (normalized by the weights' sum, unless `normalize: false`)."""

import torch

from .registry import Parameter, merge_method


@merge_method("linear", parameters=(Parameter("weight", per_input=True), Parameter("normalize", True)))
def combine(base, others, params, shared, numbers, generator):
    result = torch.zeros_like(others[0], dtype=torch.float32)
    for tensor, p in zip(others, params):
        result.add_(tensor, alpha=p["weight"])
    return result / sum(p["weight"] for p in params) if shared["normalize"] else result
