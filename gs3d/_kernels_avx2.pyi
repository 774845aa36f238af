"""Type stub of gs3d/_kernels_avx2.pyx: the same functions as gs3d/_kernels.pyx."""
from ._kernels import (
    SCRATCH_EXTRA as SCRATCH_EXTRA,
    BackwardRunner as BackwardRunner,
    ForwardRunner as ForwardRunner,
    backward as backward,
    backward_lead_row as backward_lead_row,
    channels_last_pays as channels_last_pays,
    cpu_has_avx2 as cpu_has_avx2,
    cpu_has_avx512 as cpu_has_avx512,
    few_channels_backward as few_channels_backward,
    few_channels_forward as few_channels_forward,
    forward_prefetches as forward_prefetches,
    forward as forward,
    max_threads as max_threads,
    openmp_enabled as openmp_enabled,
    slab_bounds as slab_bounds,
    workspace_bytes as workspace_bytes,
)
