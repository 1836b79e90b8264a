"""The CUDA-graph kernel: the learner's phase replayed as one CUDA graph (`torch.cuda.CUDAGraph`, public API).

A small MLP update on a GPU is launch-bound: tens of kernels of a few microseconds each, with Python
between them. Captured once, the whole `algo.learn(batches, weights)` call (the K gradient steps of a
phase: targets, losses, backward, gradient clip, Adam, Polyak targets) is replayed by one call. The
same algorithm object and the same code run: nothing of the math is written here.

    kernel = CudaGraphKernel(algo)          # algo on a CUDA device; learner_kernel=cuda_graph (or auto)
    td = kernel.learn(batches, weights)     # == algo.learn(batches, weights), replayed

How it stays equal to the eager path:
- the inputs are copied into static buffers the graph reads; one graph per input shape (a phase's
  K and B; the last phase of a run can be shorter): at most `max_graphs`, later shapes run eager;
- capturing needs a few eager warm-up calls (on a side stream) and the capture itself runs the
  Python of `learn` once: every tensor the learner owns (parameters, targets, Adam moments and step
  counts, SAC's log_alpha) is saved before and copied back in place after, so no update is taken
  twice and no buffer the graph reads is replaced; the optimizers become `capturable` (their step
  counts live on the GPU);
- Python-side state of `learn` (the `updates` counter) advances per replay by what one call adds;
  an algorithm whose control flow depends on that counter (TD3's delayed actor step) says after how
  many steps it repeats (`graph_period()`), and only phases of a multiple of it are captured; other
  phases run eager;
- random draws inside the graph (TD3's smoothing noise, SAC's actions) come from torch's CUDA
  generator: a replay from generator state S draws what an eager call from S draws, which is how
  hetrl/kernels/select.py checks a graph equal to the eager update before choosing it.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from hetrl.algorithm import optimizers  # noqa: F401  (where the learner's optimizers are found)
from hetrl.kernels.kernel import Kernel


def owned_tensors(algo) -> list[torch.Tensor]:
    """Every tensor a learn call can write: the algorithm's tensors and modules' parameters and buffers
    (in lists/tuples too), its flat optimizers' buffers, and the optimizers' states."""
    found: dict[int, torch.Tensor] = {}

    def add(v) -> None:
        if isinstance(v, torch.Tensor):
            found.setdefault(id(v), v)
        elif isinstance(v, nn.Module):
            for t in v.state_dict(keep_vars=True).values():
                add(t)
        elif isinstance(v, (list, tuple)):
            for x in v:
                add(x)

    for v in vars(algo).values():
        add(v)
        if isinstance(getattr(v, "opt", None), torch.optim.Optimizer):   # FlatAdam: its flat buffers
            for x in vars(v).values():
                add(x)
    for opt in optimizers(algo):
        for state in opt.state.values():
            for t in state.values():
                add(t)
    return list(found.values())


def _generators(algo) -> list[torch.Generator]:
    return [v for v in vars(algo).values() if isinstance(v, torch.Generator)]


def snapshot(algo) -> tuple[list, int, set[int], list]:
    """What `restore` puts back: a copy of every tensor the learner owns, its `updates` counter, which
    optimizer state existed (Adam makes its moments at the first step) and its generators' states."""
    owned = owned_tensors(algo)
    return ([(t, t.detach().clone()) for t in owned], algo.updates, {id(t) for t in owned},
            [(g, g.get_state()) for g in _generators(algo)])


@torch.no_grad()
def restore(algo, saved: tuple[list, int, set[int]]) -> None:
    """Back to the snapshot, in place (the buffers a graph reads stay the same objects); optimizer state
    made since is zeroed: zero moments at step 0, as a fresh Adam's."""
    tensors, updates, known, generators = saved
    for g, state in generators:
        g.set_state(state)
    for t, v in tensors:
        t.copy_(v)
    for opt in optimizers(algo):
        for state in opt.state.values():
            for t in state.values():
                if isinstance(t, torch.Tensor) and id(t) not in known:
                    t.zero_()
    algo.updates = updates


def fits(algo, steps: int) -> bool:
    """Whether a phase of `steps` gradient steps replays as captured: whole multiples of the algorithm's
    graph_period() (its Python-side control flow repeats after that many steps)."""
    period = algo.graph_period() if hasattr(algo, "graph_period") else 1
    return steps % max(1, int(period)) == 0


def applies(algo, steps: int) -> bool:
    """Whether a phase of `steps` gradient steps of `algo` can be captured and replayed as it is: a
    learner on a CUDA device, a phase that `fits`."""
    if getattr(algo, "device", torch.device("cpu")).type != "cuda":
        return False
    return fits(algo, steps)


def _capturable(algo) -> None:
    for opt in optimizers(algo):
        for group in opt.param_groups:
            group["capturable"] = True
        for state in opt.state.values():   # step counts on the GPU, beside their parameters
            if isinstance(state.get("step"), torch.Tensor) and state["step"].device != algo.device:
                state["step"] = state["step"].to(algo.device)


class _Graph:
    """One captured learn call of each of `algos` on static inputs of one shape. Several learners (a population's
    members) are captured as branches of one graph, each on its own stream: the GPU runs their small kernels
    side by side instead of one learner's after another's."""

    def __init__(self, algos: list, batches: list[dict[str, torch.Tensor]], weights: list[torch.Tensor],
                 warmup: int = 3):
        self.algos = algos
        self.inputs = [{k: v.clone() for k, v in b.items()} for b in batches]
        self.weights = [w.clone() for w in weights]
        for algo in algos:
            _capturable(algo)
        saved = [snapshot(algo) for algo in algos]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                for algo, inputs, w in zip(algos, self.inputs, self.weights):
                    algo.learn(inputs, w)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        branches = [torch.cuda.Stream() for _ in algos] if len(algos) > 1 else []
        with torch.cuda.graph(self.graph):
            if branches:   # fork from the capturing stream, one branch per learner, joined at the end
                capture = torch.cuda.current_stream()
                self.out = []
                for algo, stream, inputs, w in zip(algos, branches, self.inputs, self.weights):
                    stream.wait_stream(capture)
                    with torch.cuda.stream(stream):
                        self.out.append(algo.learn(inputs, w))
                for stream in branches:
                    capture.wait_stream(stream)
            else:
                self.out = [algos[0].learn(self.inputs[0], self.weights[0])]
        self.step_updates = [(algo.updates - sv[1]) // (warmup + 1) for algo, sv in zip(algos, saved)]
        for algo, sv in zip(algos, saved):
            restore(algo, sv)   # no update taken twice; Adam's state made by the warm-up starts fresh
        torch.cuda.synchronize()

    def replay(self, batches: list[dict[str, torch.Tensor]], weights: list[torch.Tensor]) -> list[torch.Tensor]:
        for inputs, b, static, w in zip(self.inputs, batches, self.weights, weights):
            for k, v in b.items():
                inputs[k].copy_(v, non_blocking=True)
            static.copy_(w, non_blocking=True)
        self.graph.replay()
        for algo, n in zip(self.algos, self.step_updates):
            algo.updates += n
        return [o.clone() for o in self.out]


def _shape_key(batches: dict[str, torch.Tensor], weights: torch.Tensor) -> tuple:
    return (tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(batches.items())), tuple(weights.shape))


class MembersGraph:
    """The phases of a population's members (learners on one GPU) replayed together from one CUDA graph per
    phase shape (hetrl/runtime/population.py); members' phases run as parallel branches."""

    def __init__(self, algos: list, max_graphs: int = 2):
        self.algos, self.max_graphs = algos, max_graphs
        self.graphs: dict[tuple, _Graph] = {}
        self.compile_s = 0.0

    def applies(self, steps: int) -> bool:
        return all(applies(a, steps) for a in self.algos)

    def learn(self, batches: list[dict[str, torch.Tensor]], weights: list[torch.Tensor]) -> list[torch.Tensor]:
        key = _shape_key(batches[0], weights[0])
        graph = self.graphs.get(key)
        if graph is None:
            if len(self.graphs) >= self.max_graphs or not self.applies(int(weights[0].shape[0])):
                return [a.learn(b, w) for a, b, w in zip(self.algos, batches, weights)]
            t = time.perf_counter()
            graph = self.graphs[key] = _Graph(self.algos, batches, weights)
            self.compile_s += time.perf_counter() - t
        return graph.replay(batches, weights)


class CudaGraphKernel(Kernel):
    """`learn` as the algorithm's, replayed from CUDA graphs where `applies`; eager otherwise."""

    name = "cuda_graph"

    def __init__(self, algo, max_graphs: int = 4, **options):
        super().__init__(algo)
        self.max_graphs = max_graphs
        self.graphs: dict[tuple, _Graph] = {}

    @classmethod
    def check(cls, algo) -> str | None:
        device = getattr(algo, "device", torch.device("cpu"))
        if device.type != "cuda":
            return f"the CUDA-graph kernel replays a GPU learner; this one is on {device}"
        if getattr(getattr(algo, "cfg", None), "lr_schedule", "constant") != "constant":
            return "a learning-rate schedule changes lr between phases, which a captured graph keeps fixed"
        return None

    @property
    def capture_s(self) -> float:
        return self.compile_s

    def _graph(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> "_Graph | None":
        key = _shape_key(batches, weights)
        graph = self.graphs.get(key)
        if graph is None:
            if len(self.graphs) >= self.max_graphs or not applies(self.algo, int(weights.shape[0])):
                return None
            t = time.perf_counter()
            graph = self.graphs[key] = _Graph([self.algo], [batches], [weights])
            self.compile_s += time.perf_counter() - t
        return graph

    def prepare(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> None:
        """Capture the graph of this shape now (the learner's state is left as it was)."""
        self._graph(batches, weights)

    def learn(self, batches: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        graph = self._graph(batches, weights)
        if graph is None:
            return self.algo.learn(batches, weights)
        return graph.replay([batches], [weights])[0]

    def figures(self) -> dict:
        return {"cuda_graphs": len(self.graphs)}
