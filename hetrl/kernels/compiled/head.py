"""What every loss head of the compiled kernel shares: its interface, its buffers, and the batch's arrays.

A head is one algorithm's loss on the compiled pieces (layers.py) and the one optimizer (optim.py): it finds
its algorithm's networks and compiles each into a program (or declines with one line), and runs a phase of K
updates as one numba call on the algorithm's own buffers. The batch's rows are split into fixed row blocks
(optim.blocks: a function of B only) that the learner's threads, its *lanes*, take from a ticket counter as they
come: a block runs its rows through the whole forward and backward of a step, block 0 writing the optimizer's
gradient buffer and block b > 0 a slot of its own, summed in block order before the step (the losses stay means
over the whole batch). The tasks and the order of the sums do not depend on the lanes: one lane and two give the
same bits.

A lane's workspace is scratch (a phase writes each part before reading it), so the heads of one class share
theirs per thread: the members of a population, learning one after another on a thread, hold one set between
them instead of one each. The set is let go with the last head.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import torch
from torch import nn

from hetrl.kernels.compiled.layers import (
    Declined,
    Program,
    compile_program,
    param_offsets,
)
from hetrl.kernels.compiled.optim import AdamViews

try:
    import numba
except ImportError:  # pragma: no cover
    numba = None


class Head:
    """One algorithm's phase on the compiled pieces (subclasses: actor_critic.ActorCriticHead,
    crossq.CrossQHead)."""

    algos: tuple[str, ...] = ()

    def __init__(self, algo, **options):
        self.algo = algo
        self.options = options
        _Scratch.hold(self)
        self._consts: dict[str, tuple] = {}
        self.lane_split: str | None = None

    @classmethod
    def check(cls, algo) -> str | None:
        """None where this head takes `algo` (its networks compile), else one line saying why not."""
        try:
            cls.programs(algo)
        except Declined as e:
            return str(e)
        return None

    @classmethod
    def programs(cls, algo) -> dict:
        """The algorithm's networks as programs (raises Declined)."""
        raise NotImplementedError

    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor, lanes: int) -> torch.Tensor:
        raise NotImplementedError

    def warm(self, lanes: int) -> None:
        """Compile (or load from numba's cache) the phase: one step on two rows over copies of the state."""
        raise NotImplementedError

    # ---- shared helpers ----
    def buffers(self, key: tuple, make) -> tuple:
        """The lanes' scratch buffers for the shapes in `key`: kept across calls, shared by the heads of this class
        on the calling thread, made again when the shapes change."""
        return _Scratch.get(type(self), key, make)

    def consts(self, name: str, values: tuple, dtype=np.float64) -> np.ndarray:
        """`values` (hyper-parameters) as the array a phase reads, made again only when one of them changed (a
        learning-rate schedule): a small array made per phase of one step is one more op run with cold caches."""
        got = self._consts.get(name)
        if got is None or got[0] != values:
            got = self._consts[name] = (values, np.array(values, dtype))
        return got[1]


class _Scratch:
    """The lanes' workspaces, one set per (thread, head class); cleared when no head is left."""

    sets: dict[tuple[int, type], tuple] = {}
    heads = 0
    lock = threading.Lock()

    @classmethod
    def hold(cls, head: Head) -> None:
        with cls.lock:
            cls.heads += 1
        weakref.finalize(head, cls._release)

    @classmethod
    def _release(cls) -> None:
        with cls.lock:
            cls.heads -= 1
            if cls.heads == 0:
                cls.sets.clear()

    @classmethod
    def get(cls, kind: type, key: tuple, make) -> tuple:
        slot = (threading.get_ident(), kind)
        got = cls.sets.get(slot)
        if got is None or got[0] != key:
            got = cls.sets[slot] = (key, make())
        return got[1]


def optimizer(opt, what: str) -> AdamViews:
    """A FlatAdam's torch Adam as the compiled kernel steps it (raises Declined)."""
    for attr in ("flat", "grad", "opt", "param"):
        if not hasattr(opt, attr):
            raise Declined(f"{what}'s optimizer is a {type(opt).__name__}, not a FlatAdam (one flat buffer)")
    why = AdamViews.check(opt.opt)
    if why:
        raise Declined(f"{what}'s optimizer is {why}")
    if opt.flat.dtype != torch.float32 or opt.flat.device.type != "cpu":
        raise Declined(f"{what}'s parameters are {opt.flat.dtype} on {opt.flat.device}; the compiled kernel runs "
                       "float32 on the CPU")
    return AdamViews(opt.opt, opt.param, opt.flat, opt.grad)


def covers(opt: AdamViews, count: int, what: str) -> None:
    """The programs (and heads) of a network must train every parameter its optimizer steps."""
    n = opt.flat.numel()
    if count != n:
        raise Declined(f"{what}'s optimizer holds {n} parameters, of which its layers the compiled kernel runs hold "
                       f"{count}")


def program(seq, flat: torch.Tensor, what: str) -> Program:
    return compile_program(seq, param_offsets(flat), what)


def same_layout(a: Program, b: Program, what: str) -> None:
    """b must be a's network at the same offsets (a target network in its own flat buffer)."""
    if a.ops.shape != b.ops.shape or not (a.ops == b.ops).all() or not (a.fc == b.fc).all():
        raise Declined(f"{what} is not laid out as its online network in its flat buffer")


def gaussian_heads(actor, body: Program, flat: torch.Tensor, act_dim: int) -> np.ndarray:
    """The offsets [mean weight, mean bias, log_std weight, log_std bias] in `flat` of a squashed-Gaussian actor's
    two Linear heads on its body's output (SAC's and CrossQ's actors; raises Declined)."""
    off = param_offsets(flat)
    heads = []
    for name in ("mean", "log_std"):
        m = getattr(actor, name, None)
        if type(m) is not nn.Linear or m.bias is None or m.in_features != body.n_out or m.out_features != act_dim:
            raise Declined(f"the actor's {name} head is a {type(m).__name__}, not a Linear layer with a bias from its "
                           "body's output to the action")
        try:
            heads += [off(m.weight), off(m.bias)]
        except Declined as e:
            raise Declined(f"the actor's {name} head: its parameter {e}") from None
    return np.array(heads, np.int64)


class Alpha:
    """An entropy coefficient log_alpha and, where it is learned, its own torch Adam, as a phase steps them (SAC's
    and CrossQ's)."""

    def __init__(self, algo):
        self.algo, self.grad = algo, torch.zeros(1)
        self.views = (AdamViews(algo.alpha_opt, algo.log_alpha, algo.log_alpha, self.grad)
                      if algo.alpha_opt is not None else None)

    @staticmethod
    def check(algo) -> None:
        if algo.alpha_opt is not None:
            why = AdamViews.check(algo.alpha_opt)
            if why:
                raise Declined(f"the entropy coefficient's optimizer is {why}")

    @property
    def learned(self) -> bool:
        return self.views is not None

    def get(self) -> tuple[list[np.ndarray], list[float]]:
        """[log_alpha, its gradient, exp_avg, exp_avg_sq, step] and [lr, beta1, beta2, eps] (zeros for a fixed
        coefficient: the phase never reads them)."""
        if self.views is not None:
            (la, _, lm, lv, lst), hp = self.views.get()
        else:
            la, hp = self.algo.log_alpha.detach().view(1).numpy(), [0.0] * 4
            lm, lv, lst = np.zeros((3, 1), np.float32)
        return [la, self.grad.numpy(), lm, lv, lst], hp


def vector_obs(algo) -> None:
    if getattr(algo, "pixels", False):
        raise Declined("the observations are pixels, through the Nature CNN (convolutions), which the compiled "
                       "kernel has no piece for")
    dev = getattr(algo, "device", torch.device("cpu"))
    if torch.device(dev).type != "cpu":
        raise Declined(f"the learner runs on {dev}; the compiled kernel runs on the CPU")


def f32(t: torch.Tensor, K: int, B: int) -> np.ndarray:
    """A batch field as a C-contiguous float32 array of shape (K, B, features) (observations flattened)."""
    return np.ascontiguousarray(t.numpy(), np.float32).reshape(K, B, -1)


def f32kb(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.numpy(), np.float32)


def discount_of(b: dict[str, torch.Tensor], gamma: float) -> np.ndarray:
    """The batches' gamma ** n * (1 - terminated), (K, B) float32 (as the algorithms' losses compute it)."""
    return discounts(np.ascontiguousarray(b["steps"].numpy()), np.ascontiguousarray(b["terminated"].numpy()),
                     float(gamma))


if numba is not None:
    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def discounts(steps, terminated, gamma):  # pragma: no cover - compiled
        """gamma ** n * (1 - terminated) per transition, in one call: as five torch ops around a phase of one step
        these cost ~40 us, each run cold after the phase evicted the caches."""
        K, B = steps.shape
        out = np.empty((K, B), np.float32)
        g = np.float32(gamma)
        for k in range(K):
            for i in range(B):
                out[k, i] = np.float32(0.0) if terminated[k, i] else g ** np.float32(steps[k, i])
        return out

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def cat(a, b, out):  # pragma: no cover - compiled
        """out = [a, b] along the features (a critic's input: observation, action)."""
        da = a.shape[1]
        for i in range(out.shape[0]):
            for j in range(da):
                out[i, j] = a[i, j]
            for j in range(b.shape[1]):
                out[i, da + j] = b[i, j]
