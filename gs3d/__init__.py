"""gs3d: fast CPU 3-D grid sampling and its backward pass for numpy.

A re-implementation of the Ascend operator ``aclnnGridSampler3DBackward`` (and of the forward it
differentiates) with the semantics of ``torch.nn.functional.grid_sample`` on 5-D tensors.
"""
from ._validation import GridSamplerError
from ._api import (
    BackwardPlan,
    ForwardPlan,
    clear_cache,
    deterministic,
    get_deterministic,
    grid_sample_3d,
    grid_sample_3d_backward,
    plan_backward,
    plan_forward,
    set_deterministic,
    show_config,
)
from . import reference

__version__ = "0.1.0"

__all__ = [
    "BackwardPlan",
    "ForwardPlan",
    "GridSamplerError",
    "clear_cache",
    "deterministic",
    "get_deterministic",
    "grid_sample_3d",
    "grid_sample_3d_backward",
    "plan_backward",
    "plan_forward",
    "reference",
    "set_deterministic",
    "show_config",
]
