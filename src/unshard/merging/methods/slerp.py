"""Spherical interpolation between the base (t=0) and one other model (t=1)."""

import math

import torch

from .registry import Parameter, merge_method


def _dot(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(torch.dot(x.reshape(-1), y.reshape(-1)))


def _slerp_survey(bands, params, shared, eps=1e-8) -> float:
    """The cosine of the angle between the base and the other model, over the whole tensor."""
    aa = bb = ab = 0.0
    for base, others, _ in bands():
        a, b = base.float(), others[0].float()
        aa, bb, ab = aa + _dot(a, a), bb + _dot(b, b), ab + _dot(a, b)
    norm_a, norm_b = math.sqrt(aa), math.sqrt(bb)
    return max(-1.0, min(1.0, ab / ((norm_a if norm_a > eps else 1.0) * (norm_b if norm_b > eps else 1.0))))


@merge_method("slerp", needs_base=True, parameters=(Parameter("t"),), survey=_slerp_survey, inputs=(1, 1))
def _slerp(base, others, params, shared, cosine, generator, threshold=0.9995):
    """Spherical interpolation from the base (t=0) to the other model (t=1), at the angle between the
    whole tensors; linear where the two are nearly parallel."""
    t = shared["t"]
    a, b = base.float(), others[0].float()
    if abs(cosine) > threshold:
        return (1 - t) * a + t * b
    theta = math.acos(cosine)
    return (math.sin((1 - t) * theta) * a + math.sin(t * theta) * b) / math.sin(theta)
