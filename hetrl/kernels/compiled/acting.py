"""Acting through the compiled pieces: the MLPs inside a policy's network, run as their programs.

`wrap(net, gemm)` replaces each nn.Sequential inside `net` that compiles (layers.compile_program) by a
`CompiledMLP`: the same child modules and parameters (so state_dict keys, loads and the policy's own code are
unchanged), whose forward runs the program in one compiled call for CPU float32 inputs when autograd is off
(acting), and the plain Sequential's forward otherwise. On the first compiled call in a process its parameters
become views of one flat buffer (nets.flatten), which the program reads; a pickled CompiledMLP (a policy sent
to an actor process) carries compact copies of its parameters and the GEMM's name, and makes the buffer again
where it is unpickled.

Acting on a CPU spends ~40 small torch ops per env step on a 2x256 MLP (250 us warm, ~800 us right after a
learner phase has evicted the caches); the compiled call is ~20 us.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

import numpy as np
import torch
from torch import nn

from hetrl.kernels.compiled import sgemm
from hetrl.kernels.compiled.layers import (
    Declined,
    Program,
    compile_program,
    order_offsets,
)

try:
    from hetrl.kernels.compiled.layers import run
except ImportError:  # pragma: no cover
    run = None


class CompiledMLP(nn.Sequential):
    """An nn.Sequential whose forward without autograd, on CPU float32 rows, is its compiled program."""

    def __init__(self, seq: nn.Sequential, gemm: str | None = None, program: Program | None = None):
        super().__init__(OrderedDict(seq.named_children()))
        self.program = program or compile_program(seq, order_offsets(seq), "the network")
        self.gemm = gemm
        self._flat: np.ndarray | None = None
        self._slots: tuple = ()      # (module, name, parameter, its data_ptr) per parameter, as flattened
        self._ws = np.zeros(0, np.float32)
        self._need: dict[int, int] = {}   # rows -> workspace floats

    def _buffer(self) -> np.ndarray:
        """The flat parameter buffer, made on first use and again if a load replaced the parameters (a module's
        parameter set anew, or its data swapped; an in-place load, as load_state_dict's, keeps the buffer). The
        check walks a tuple kept from the flattening: named_parameters() on every call cost more than the
        program's run on one row."""
        flat = self._flat
        if flat is not None:
            for params, n, p, ptr in self._slots:
                if params[n] is not p or p.data_ptr() != ptr:
                    break
            else:
                return flat
        from hetrl.algos.nets import flatten

        self._flat = flatten(self).numpy()
        self._slots = tuple((m._parameters, n, p, p.data_ptr()) for m in self.modules()
                            for n, p in m._parameters.items() if p is not None)
        return self._flat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.program
        if (torch.is_grad_enabled() or x.dtype != torch.float32 or not x.is_cpu or x.ndim == 0
                or x.shape[-1] != p.n_in or x.requires_grad):
            return super().forward(x)
        if sgemm.chosen() is None:
            sgemm.bind(self.gemm)
        flat = self._buffer()
        rows = x.numpy()
        if rows.ndim != 2:
            rows = rows.reshape(-1, p.n_in)
        if not rows.flags.c_contiguous:
            rows = np.ascontiguousarray(rows)
        R = rows.shape[0]
        need = self._need.get(R)
        if need is None:
            need = self._need[R] = p.floats(R, grads=False)
        if self._ws.shape[0] < need:
            self._ws = np.zeros(need, np.float32)
        out = np.empty((R, p.n_out), np.float32)
        run(p.ops, p.fc, flat, rows, self._ws, out)
        out = torch.from_numpy(out)
        return out if x.ndim == 2 else out.reshape(*x.shape[:-1], p.n_out)

    def __getstate__(self) -> dict:
        # the parameters are views of the flat buffer: pickled as they are, each would carry the whole buffer, so
        # compact copies go instead. They stay with this module: multiprocessing's pickler shares a tensor's memory
        # through a file descriptor that must stay open until the child process has received it, after pickling
        copies = self.__dict__.get("_pickled")
        if copies is None:
            copies = OrderedDict((k, copy.deepcopy(m)) for k, m in self._modules.items())
            self.__dict__["_pickled"] = copies
        else:
            for k, m in self._modules.items():
                copies[k].load_state_dict(m.state_dict())
        state = self.__dict__.copy()
        state.update(_flat=None, _slots=(), _need={}, _ws=np.zeros(0, np.float32), _pickled=None, _modules=copies)
        return state


def wrap(net: nn.Module, gemm: str | None = None) -> nn.Module:
    """Replace every nn.Sequential inside `net` that the compiled pieces take (and whose parameters are float32 on
    the CPU) by a CompiledMLP over the same modules; returns `net` (or its replacement, when `net` itself is one)."""
    if run is None:
        return net
    if type(net) is nn.Sequential:
        return _compiled(net, gemm) or net
    for name, child in list(net.named_children()):
        got = _compiled(child, gemm) if type(child) is nn.Sequential else None
        if got is not None:
            setattr(net, name, got)
        else:
            wrap(child, gemm)
    return net


def _compiled(seq: nn.Sequential, gemm: str | None) -> CompiledMLP | None:
    if any(p.dtype != torch.float32 or p.device.type != "cpu" for p in seq.parameters()):
        return None
    try:
        return CompiledMLP(seq, gemm, compile_program(seq, order_offsets(seq), "the network"))
    except Declined:
        return None
