"""Replay: raw ring storage, sum tree, replay manager, n-step adder, rate limiter.

* :class:`Storage`      -- preallocated struct-of-arrays ring buffer (CPU NumPy or device tensors).
* :class:`FrameStorage` -- the same for stacked frames (Atari), each frame stored once.
* :class:`SumTree`      -- K-ary float64 sum tree for proportional sampling (numba kernels).
* :class:`ReplayBuffer` -- uniform / prioritized replay over a Storage and a SumTree.
* :class:`BatchGroups`  -- draws the K batches of one learner call, into two reused buffers.
* :class:`NStepAdder`   -- actor-side n-step transition accumulator over a vector of envs.
* :class:`RateLimiter`  -- Reverb-style sample-to-insert ratio limiter (threads).
"""

from hetrl.replay.buffer import BatchGroups, ReplayBuffer
from hetrl.replay.frames import FrameStorage
from hetrl.replay.nstep import NStepAdder
from hetrl.replay.rate_limiter import RateLimiter, RatioRule
from hetrl.replay.storage import Spec, Storage
from hetrl.replay.sumtree import SumTree

__all__ = ["BatchGroups", "Storage", "FrameStorage", "Spec", "SumTree", "ReplayBuffer", "NStepAdder", "RateLimiter", "RatioRule"]
