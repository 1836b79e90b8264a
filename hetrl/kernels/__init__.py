"""Learner kernels: what runs an algorithm's updates, wrapping it from outside (hetrl/kernels/kernel.py).

* ``public``: the algorithm's own `learn` (autograd, torch.optim): the reference;
* ``compiled``: every update of a phase in one native call on a CPU, derived from the algorithm's own
  `learn` (traced, lowered onto the GEMM and a precompiled numba VM), or for a built-in a hand-derived loss
  head where it is measured faster (hetrl/kernels/compiled/);
* ``cuda_graph``: the phase replayed as one CUDA graph on a GPU (hetrl/kernels/cuda_graph.py).

One setting, ``learner_kernel = auto | public | compiled | cuda_graph``; with auto, `select.choose`
takes the fastest kernel that is checked equal to public on this machine's shapes and device.
"""

from hetrl.kernels.kernel import Kernel
from hetrl.kernels.select import NAMES, Choice, build, check_equal, choose, kernel_class, select, synthetic_batch

__all__ = ["Kernel", "NAMES", "Choice", "build", "check_equal", "choose", "kernel_class", "select",
           "synthetic_batch"]
