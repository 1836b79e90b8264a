#!/usr/bin/env python
"""The GPU check: hetrl's CUDA paths, learner kernels, populations, planner and peers on a GPU machine.

    python benchmarks/gpu_check.py [--quick] [--out DIR] [--stages a,b,c,k,g,d] [--max-s S]
    python benchmarks/gpu_check.py --merge A/gpu_check.json B/gpu_check.json [--out DIR]

Stages (letters or names), run in this order, each in its own process group under a wall budget; a
stage that fails, runs out of time or lacks its imports is recorded with the reason, and the rest go on:

  a env         torch and CUDA versions, the GPU, CPU count, which packages import
  b tests       `pytest -m gpu` (the tests marked gpu): pass / fail / skip counts and the tail
  c learner     updates/s of the learner alone: DQN CartPole-v1, DDPG / TD3 / SAC Pendulum-v1, the
                Nature CNN of DQN ALE/Breakout-v5 (with ale-py) and CrossQ Pendulum-v1 (where crossq is
                registered), at their presets, on synthetic batches, timed as the planner profiles
                (hetrl.planner.profile.learn_timing): CPU 1 thread public kernel, CPU compiled kernel,
                CUDA eager (the public kernel on cuda), CUDA graph (hetrl.kernels.cuda_graph.CudaGraphKernel);
                each kernel but public checked equal to it first (hetrl.kernels.check_equal); last, in a
                process per case, torch.compile(mode="reduce-overhead") as a peer, checked the same way
  k kernels     hetrl.kernels.select on cuda and on cpu for each case at the run's phase length: the
                kernel chosen, the timings, what was dropped (differs) or declined, and why
  g population  hetrl.train("dqn", "CartPole-v1", seeds=N) on cuda with learner_kernel=cuda_graph for
                N = 1, 8, 64 (the members' phases replayed from one CUDA graph) and with the public
                kernel for N = 1, 8, the same env steps per member: wall, wall(N) / wall(1), env steps/s,
                where the time goes (learner, capture, acting, replay)
  d planner     `hetrl profile` + `hetrl plan` (default, pinned to cuda, pinned to cpu) for DQN
                CartPole-v1: the plans and their learner line (the kernels.Choice); `hetrl train`
                under the default plan where the budget leaves time
  e sb3         Stable-Baselines3 vs hetrl (inline), DQN CartPole-v1 preset, 20k env steps, on cuda and
                on cpu (benchmarks/sb3_preset.py builds the SB3 model)
  f sweep       local schedule on bench_local's HeavyCartPole-v1 (+0.2 ms CPU per step), actors
                1, 2, 4, 8, 15: env steps/s without the rate limiter and at the preset's replay ratio

The default stages (a,b,c,k,g,d) are the one call docs/gpu.md runs on a GPU machine with --max-s 480;
the budgets (STAGES) of a, b, c, k and g fit in it, d takes what they leave. The compiled CPU kernel
is numba code that compiles for about a minute per algorithm on a fresh machine: while stages a and
b run, it is compiled into numba's on-disk cache by background processes (one per algorithm), which
stages c and k wait for (each only as long as its budget allows).

--quick makes every workload about 10x smaller (env steps, timing caps, a quick profile grid) to
smoke-test the script on a CPU-only machine, where what needs CUDA records "skipped: no CUDA"; the
wall budgets triple there. --max-s bounds the whole invocation (each stage gets at most what is left).
Writes, in DIR (--out, else $OUT, else benchmarks/results/gpu_check): gpu_check.json (everything),
gpu_check.txt (the summary), gpu_check_learner.png, gpu_check_sweep.png and gpu_check_logs.txt (the
stages' output); run directories, logs and the profile cache go to a scratch folder (--work). An
existing gpu_check.json in DIR is merged: stages not run now are kept. Without --out and $OUT the files
are then renamed by the results' naming scheme (gpu_check_<date>_<machine>_<commit>.json, .txt, .png;
benchmarks/result_files.py) and the logs moved to the scratch folder.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
SCHEMA = "hetrl-gpu-check/2"

# (letter, name, wall budget in seconds on the GPU machine), in the order they run. The default call
# (DEFAULT_STAGES, --max-s 480) fits a, b, c, k and g (470 s of budgets); d runs in what they leave.
STAGES = [("a", "env", 15), ("b", "tests", 90), ("c", "learner", 130), ("k", "kernels", 30),
          ("g", "population", 195), ("d", "planner", 120), ("e", "sb3", 150), ("f", "sweep", 210)]
DEFAULT_STAGES = "a,b,c,k,g,d"
BUDGETS_S = {name: s for _, name, s in STAGES}
QUICK_BUDGET_FACTOR = 3   # --quick rehearses on a CPU machine, whose imports and CPU work are slower than the GPU host's
LEARNER_CASES = [("dqn", "CartPole-v1"), ("ddpg", "Pendulum-v1"), ("td3", "Pendulum-v1"), ("sac", "Pendulum-v1"),
                 ("dqn", "ALE/Breakout-v5"),   # the Nature CNN learner on 4 x 84 x 84 frames (needs ale-py)
                 ("crossq", "Pendulum-v1")]    # where an algorithm named crossq is registered
# numba's compile of the compiled kernel, per algorithm (TD3's phase is DDPG's); done in the background
WARM_UP = {"dqn": "dqn", "ddpg": "ddpg", "td3": "ddpg", "sac": "sac", "crossq": "crossq"}
POP_STEPS = 10_240     # env steps per member: 40 of DQN CartPole's 256-step phases, none cut short
POP_STEPS_QUICK = 1_536
# in this order: the public N=1 before the costly N=64, the public N=8 last (skipped when ~8 x N=1 does not fit)
POP_RUNS = [("cuda_graph", 1), ("cuda_graph", 8), ("public", 1), ("cuda_graph", 64), ("public", 8)]
PLAN_CASES = [("dqn", "CartPole-v1", 20_000, {})]
SB3_STEPS = 20_000
SWEEP_ACTORS = (1, 2, 4, 8, 15)
SWEEP_STEPS = 20_000
SWEEP_ENV = "benchmarks.bench_local:HeavyCartPole-v1"
PACKAGES = ["hetrl", "numpy", "numba", "scipy", "threadpoolctl", "gymnasium", "stable_baselines3", "ale_py", "ray",
            "rich", "tensorboard", "matplotlib", "yaml", "pytest", "pytest_timeout", "pynvml", "triton",
            "cloudpickle", "pandas"]


class Skip(Exception):
    """A stage (or part) that cannot run here: recorded as skipped with the reason."""


# --- helpers shared by the parent and the stages ------------------------------------------------
def write_json(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, default=_jsonable))
    os.replace(tmp, path)


def _jsonable(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def require(*modules: str) -> None:
    import importlib

    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001 (an import can fail in many ways)
            raise Skip(f"skipped: {m} does not import ({type(e).__name__}: {e})") from None


def cuda_ok() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


class Rec(dict):
    """A stage's record, saved after every part so that a stage cut off by its budget keeps what it had."""

    def __init__(self, path: Path):
        super().__init__(status="running")
        self.path = path

    def save(self) -> None:
        write_json(dict(self), self.path)


def left(ctx: dict) -> float:
    return ctx["deadline"] - time.time()


def run_cmd(cmd: list[str], timeout: float, label: str | None = None, **kw) -> dict:
    """A subprocess in its own process group, killed (the group) at its timeout; rc, out, wall_s.
    One line goes to the stage's log (with the tail of stderr when it failed)."""
    t = time.time()
    label = label or " ".join(cmd[2:] if cmd[:2] == [sys.executable, "-m"] else cmd)
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, **kw)
    try:
        out, err = p.communicate(timeout=max(1.0, timeout))
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_group(p)
        out, err = p.communicate()
        timed_out = True
    wall = round(time.time() - t, 2)
    print(f"$ {label}: rc {p.returncode} in {wall:.1f} s{' (killed at its timeout)' if timed_out else ''}", flush=True)
    if p.returncode != 0:
        print((err or out or "")[-3000:], flush=True)
    return {"cmd": label, "rc": p.returncode, "timed_out": timed_out, "stdout": out or "", "stderr": err or "",
            "wall_s": wall}


def _kill_group(p: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the process group we started for `p` (hetrl stops at the end of a phase), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _last_json(text: str):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def _error(e: BaseException) -> dict:
    return {"error": f"{type(e).__name__}: {e}"[:500], "traceback": traceback.format_exc()[-1500:]}


# --- stage a: environment -------------------------------------------------------------------------
def stage_env(ctx: dict, rec: Rec) -> None:
    import importlib
    import platform

    import torch

    info = {"python": sys.version.split()[0], "executable": sys.executable, "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
        info["mem_total_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (OSError, ValueError):
        pass
    if torch.cuda.is_available():
        t = time.perf_counter()
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        p = torch.cuda.get_device_properties(0)
        info.update(cuda_init_s=round(time.perf_counter() - t, 3), device_count=torch.cuda.device_count(),
                    device_name=p.name, capability=f"{p.major}.{p.minor}", gpu_memory_gb=round(p.total_memory / 2**30, 1),
                    multiprocessors=p.multi_processor_count, tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
    rec["info"] = info
    pk = {}
    for name in PACKAGES:
        try:
            m = importlib.import_module(name)
            ver = getattr(m, "__version__", None)
            if ver is None:
                import importlib.metadata as md

                ver = md.version({"yaml": "pyyaml", "pynvml": "nvidia-ml-py"}.get(name, name).replace("_", "-"))
            pk[name] = {"ok": True, "version": str(ver), "from": str(Path(getattr(m, "__file__", "") or "").parent)}
        except Exception as e:  # noqa: BLE001
            pk[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:200]}
    rec["packages"] = pk
    rec["compilers"] = {c: shutil.which(c) for c in ("cc", "gcc", "nvcc")}
    smi = shutil.which("nvidia-smi")
    if smi:
        r = run_cmd([smi, "--query-gpu=name,driver_version,power.limit,clocks.max.sm", "--format=csv,noheader"], 15)
        rec["nvidia_smi"] = (r["stdout"] or r["stderr"]).strip()[:500]
    missing = [k for k, v in pk.items() if not v["ok"]]
    rec["missing"] = missing


# --- stage b: the GPU tests ---------------------------------------------------------------------------
def stage_tests(ctx: dict, rec: Rec) -> None:
    require("pytest")
    # -o addopts=: pyproject's addopts has -q already (twice -q drops the counts line)
    r = run_cmd([sys.executable, "-m", "pytest", "-o", "addopts=", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
                 "tests"], left(ctx) - 5,
                # the tests marked gpu use no compiled CPU kernel: conftest's numba warm-up (minutes on a cold cache,
                # done for stages c and k by the background processes) is left out of this stage's budget
                env={**os.environ, "HETRL_TEST_NO_WARM": "1"})
    out = r["stdout"] + r["stderr"]
    last = [ln for ln in out.splitlines() if re.search(r"\d+ (passed|failed|skipped|deselected|error)", ln)]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)",
                                                last[-1] if last else "")}
    rec.update(cmd="pytest -m gpu -q -rs tests", rc=r["rc"], timed_out=r["timed_out"], wall_s=r["wall_s"],
               counts=counts, tail=out[-4000:])
    if r["timed_out"]:
        rec.update(status="timeout", reason="pytest ran past the stage budget")
    elif r["rc"] not in (0, 5):
        rec.update(status="failed", reason=f"pytest exit code {r['rc']} ({counts})")
    elif not cuda_ok():
        rec["note"] = "skipped: no CUDA (the gpu tests skip themselves)"


# --- the learner cases (stages c and k) ------------------------------------------------------------------
def atari_spaces(env: str, cfg):
    """The spaces of an Atari id after hetrl's preprocessing (grayscale square frames, stacked), without
    OpenCV, which the GPU machine lacks (its wheel is larger than what travels there): the learner is
    timed on synthetic batches, so only the shapes and the action count matter."""
    import ale_py
    import gymnasium as gym
    import numpy as np

    gym.register_envs(ale_py)
    n = cfg.atari.screen_size
    return gym.spaces.Box(0, 255, (cfg.frame_stack, n, n), np.uint8), gym.make(env).action_space


class Case:
    """One learner of stage c / k: its preset config, spaces, replay fields, the run's phase length K (gradient
    steps per learn call) and the CUDA graph's period (a captured phase is a multiple of it)."""

    def __init__(self, algo: str, env: str):
        import torch

        from hetrl import registry
        from hetrl.actors import probe_spaces
        from hetrl.actors.envs import prepare_env
        from hetrl.algos import make_algorithm, replay_spec
        from hetrl.config import atari_id, make_config
        from hetrl.errors import UsageError
        from hetrl.runtime.layout import grads_per_phase, group_size

        if algo not in registry.names():
            raise Skip(f"no algorithm named {algo} is registered here")
        if atari_id(env) and importlib.util.find_spec("ale_py") is None:
            raise Skip("ale-py is not installed")
        self.algo, self.env = algo, env
        self.cfg = cfg = make_config(algo, env, {})
        try:
            self.obs, self.act = probe_spaces(prepare_env(env, cfg))   # Atari: the preprocessed, stacked frames
        except UsageError:
            if not atari_id(env):
                raise
            self.obs, self.act = atari_spaces(env, cfg)   # no OpenCV there: the shapes are all the learner needs
        self.spec = replay_spec(cfg, self.obs, self.act)
        self.B = cfg.batch_size
        self.K = group_size(grads_per_phase(cfg), cfg.prioritized)
        self._make = make_algorithm
        torch.manual_seed(0)
        self.probe = make_algorithm(cfg, self.obs, self.act, "cpu")
        self.period = int(self.probe.graph_period()) if hasattr(self.probe, "graph_period") else 1

    def maker(self, dev: str):
        return lambda: self._make(self.cfg, self.obs, self.act, dev)

    def describe(self) -> dict:
        return {"batch_size": self.B, "net_arch": list(getattr(self.cfg, "net_arch", [])), "phase_k": self.K,
                "graph_period": self.period}

    def phases(self, dev: str, k: int, n: int = 2) -> tuple[list, object]:
        """`n` synthetic phases of k steps (as kernels.select draws them) and their weights."""
        import torch

        from hetrl.kernels import synthetic_batch

        g = torch.Generator().manual_seed(0)
        return ([synthetic_batch(self.spec, self.act, self.B, k, dev, g)[0] for _ in range(n)],
                torch.ones(k, self.B, device=dev))


def case_list() -> list[tuple[str, str, Case | dict]]:
    """(algo, env, the Case, or a record saying why it is skipped or failed) for every learner case."""
    out = []
    for algo, env in LEARNER_CASES:
        try:
            out.append((algo, env, Case(algo, env)))
        except Skip as e:
            out.append((algo, env, {"skipped": str(e)}))
        except Exception as e:  # noqa: BLE001 (one case that cannot be built leaves the others)
            out.append((algo, env, _error(e)))
            print(f"{algo} {env}: {traceback.format_exc()}", flush=True)
    return out


def warm_marker(work: str | Path, name: str) -> Path:
    return Path(work) / f"numba_warm_{name}.json"


def wait_warm(ctx: dict, algo: str, reserve_s: float) -> str | None:
    """Wait (while the stage's budget leaves `reserve_s`) for the background compile of `algo`'s compiled
    kernel; None when it is in numba's cache, else why not."""
    name = WARM_UP.get(algo)
    if name not in (ctx.get("warm_up") or []):
        return None   # no background compile for it: the kernel compiles where it is built
    path = warm_marker(ctx["work"], name)
    t = time.time()
    while not path.exists() and left(ctx) > reserve_s:
        time.sleep(0.5)
    if not path.exists():
        return f"numba's compile of the {name} kernel did not finish within the stage budget"
    if time.time() - t > 1:
        print(f"waited {time.time() - t:.0f} s for numba's compile of the {name} kernel", flush=True)
    got = json.loads(path.read_text())
    return got.get("error")


def _check(case: Case, cls, dev: str, k: int) -> dict:
    from hetrl.kernels import check_equal

    phases, w = case.phases(dev, k)
    t = time.perf_counter()
    ok, detail = check_equal(case.maker(dev), cls, phases, w, seed=0)
    return {"ok": ok, **detail, "wall_s": round(time.perf_counter() - t, 2)}


# --- stage c: the learner alone --------------------------------------------------------------------------
def stage_learner(ctx: dict, rec: Rec) -> None:
    require("gymnasium")
    import warnings

    import torch

    from hetrl.kernels import kernel_class, synthetic_batch
    from hetrl.planner.profile import learn_timing

    warnings.filterwarnings("ignore", message=".*capturable=True.*")
    quick, cuda = ctx["quick"], torch.cuda.is_available()
    cap = 0.2 if quick else 1.0   # seconds per figure (quick: run_profile's quick settings)
    mkw = {"min_rounds": 4, "window": 3, "min_round_s": 0.003} if quick else {}
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    rec["how"] = ("seconds per gradient step of a kernel's learn on synthetic batches at the preset's batch size, "
                  "hetrl.planner.profile.learn_timing (CPU: CPU time of the process, 1 thread; CUDA: wall time, "
                  f"synchronize per round), cap {cap} s per figure; k = gradient steps per learn call (K: the run's "
                  "phase length); each kernel but public checked equal to public first (hetrl.kernels.check_equal, "
                  "2 phases of k steps, the same random draws): ok, tolerance_used (<= 1 is within tolerance), worst")
    rec["cuda"] = cuda
    rec["cases"] = {}
    rec.save()
    deferred = []   # the compiled CPU kernel waits for numba's background compile: after every GPU figure
    reserve = 5 if quick else 12

    for algo, env, case in case_list():
        key = f"{algo} {env}"
        if isinstance(case, dict):
            rec["cases"][key] = {**case, "variants": {}}
            rec.save()
            continue
        rec["cases"][key] = {**case.describe(), "variants": {}}
        V = rec["cases"][key]["variants"]

        def timed(name: str, dev: str, k: int, kernel: str, case=case, V=V, algo=algo) -> None:
            if dev != "cpu" and not cuda:
                V[name] = {"skipped": "no CUDA"}
                return
            if left(ctx) < reserve:
                V[name] = {"skipped": "stage budget spent"}
                return
            try:
                cls = kernel_class(kernel)
                torch.manual_seed(0)
                algo_obj = case.maker(dev)()
                why = cls.check(algo_obj) if kernel != "public" else None
                if why:
                    V[name] = {"skipped": why}
                    return
                entry = {"device": dev, "k": k, "kernel": kernel}
                if kernel != "public":
                    entry["check"] = _check(case, cls, dev, k)
                kern = cls(algo_obj)
                kern.use_threads(1)
                torch.manual_seed(1)
                batch, wts = synthetic_batch(case.spec, case.act, case.B, k, dev)
                t0 = time.perf_counter()
                kern.prepare(batch, wts)
                entry["prepare_s"] = round(time.perf_counter() - t0, 3)
                t = learn_timing(kern, batch, wts, dev, k, cap_s=cap, **mkw)
                entry.update(s_per_update=t.s, updates_per_s=1.0 / t.s if t.s > 0 else None,
                             spread=round(t.spread, 4), stable=t.stable, rounds=t.rounds,
                             compile_s=round(kern.compile_s, 3), **kern.figures())
                if kernel == "cuda_graph":
                    entry["captured"] = bool(kern.graphs)   # False: this k is no multiple of the graph period
                kern.close()
                V[name] = entry
                chk = entry.get("check")
                print(f"{algo} {name}: {entry['updates_per_s']:,.0f} updates/s"
                      + (f", check {'ok' if chk['ok'] else 'DIFFERS'} ({chk['tolerance_used']}, {chk['worst']})"
                         if chk else ""), flush=True)
            except Exception as e:  # noqa: BLE001
                V[name] = _error(e)
                print(f"{algo} {name}: {traceback.format_exc()}", flush=True)
            rec.save()

        K, P = case.K, case.period
        timed("cpu_public", "cpu", 1, "public")
        if K > 1:
            timed(f"cpu_public_k{K}", "cpu", K, "public")
        timed("cuda_eager", "cuda", 1, "public")
        if K > 1:
            timed(f"cuda_eager_k{K}", "cuda", K, "public")
        timed("cuda_graph" if P == 1 else f"cuda_graph_k{P}", "cuda", P, "cuda_graph")
        if K > 1 and K != P:
            timed(f"cuda_graph_k{K}", "cuda", K, "cuda_graph")
        deferred.append((algo, case, V, timed))

    # the compiled CPU kernel: once numba's background compile of it is in the cache
    for algo, case, V, timed in deferred:
        why = kernel_class("compiled").check(case.probe)
        if why:
            V["cpu_compiled"] = {"skipped": why}
            continue
        why = wait_warm(ctx, algo, reserve + 5)
        if why:
            V["cpu_compiled"] = {"skipped": why}
            continue
        timed("cpu_compiled", "cpu", 1, "compiled")
        if case.K > 1:
            timed(f"cpu_compiled_k{case.K}", "cpu", case.K, "compiled")
    rec.save()

    # torch.compile last, a process per case: a CUDA error it leaves behind cannot spoil another figure
    for algo, case, V, timed in deferred:
        name = "cuda_compile" if case.period == 1 else f"cuda_compile_k{case.period}"
        if not cuda:
            V[name] = {"skipped": "no CUDA"}
            continue
        if left(ctx) < 30:
            V[name] = {"skipped": "stage budget spent (torch.compile needs half a minute or more)"}
            continue
        spec = {"algo": algo, "env": case.env, "k": case.period, "cap": cap, "mkw": mkw}
        r = run_cmd([sys.executable, str(Path(__file__).resolve()), "--_compile", json.dumps(spec)],
                    min(90.0, left(ctx) - 5), label=f"torch.compile {algo} {case.env}")
        got = _last_json(r["stdout"])
        if got is None:
            got = {"error": f"compile_failed: rc {r['rc']}" + (" (killed at its timeout)" if r["timed_out"] else ""),
                   "stderr_tail": (r["stderr"] or r["stdout"])[-1500:]}
        got["process_wall_s"] = r["wall_s"]
        V[name] = got
        print(f"{algo} {name}: {got}", flush=True)
        rec.save()
    try:
        plot_learner(rec, Path(ctx["out"]) / "gpu_check_learner.png")
        rec["plot"] = "gpu_check_learner.png"
    except Exception as e:  # noqa: BLE001
        rec["plot_error"] = f"{type(e).__name__}: {e}"


def compile_child(spec: dict) -> int:
    """One case's torch.compile(algo.learn, mode="reduce-overhead") on cuda, in its own process: checked equal
    to the public kernel as the kernels are (kernels.check_equal), then timed; one JSON line."""
    out: dict = {"device": "cuda", "k": spec["k"], "kernel": "torch.compile(reduce-overhead)"}
    try:
        import warnings

        import torch

        from hetrl.kernels import Kernel, synthetic_batch
        from hetrl.planner.profile import learn_timing

        warnings.filterwarnings("ignore", message=".*capturable=True.*")
        case = Case(spec["algo"], spec["env"])

        class TorchCompileKernel(Kernel):
            """algo.learn under torch.compile (inductor's CUDA graphs); the twin check_equal builds is kept."""

            name = "torch_compile"
            last = None

            def __init__(self, algo, **options):
                super().__init__(algo)
                self.fn = torch.compile(algo.learn, mode="reduce-overhead")
                self.calls = 0
                TorchCompileKernel.last = self

            def learn(self, batches, weights):
                t = time.perf_counter()
                td = self.fn(batches, weights)
                if self.calls < 3:   # compile, then the CUDA-graph trees' warm-up and recording
                    torch.cuda.synchronize()
                    self.compile_s += time.perf_counter() - t
                self.calls += 1
                return td

        try:  # dynamo's counters (private API; informative only)
            from torch._dynamo.utils import counters

            counters.clear()
        except Exception:  # noqa: BLE001
            counters = None
        k = spec["k"]
        out["check"] = _check(case, TorchCompileKernel, "cuda", k)
        kern = TorchCompileKernel.last
        out["compile_s"] = round(kern.compile_s, 2)
        torch.manual_seed(1)
        batch, wts = synthetic_batch(case.spec, case.act, case.B, k, "cuda")
        t = learn_timing(kern, batch, wts, "cuda", k, cap_s=spec["cap"], **spec["mkw"])
        out.update(s_per_update=t.s, updates_per_s=1.0 / t.s if t.s > 0 else None, spread=round(t.spread, 4),
                   stable=t.stable, rounds=t.rounds)
        if counters is not None:
            try:
                out["graph_breaks"] = int(sum(counters["graph_break"].values()))
                out["unique_graphs"] = int(counters["stats"].get("unique_graphs", 0))
                out["cudagraph_skips"] = int(counters["inductor"].get("cudagraph_skips", 0))
            except Exception:  # noqa: BLE001
                pass
    except BaseException as e:  # noqa: BLE001 (recorded: this is what the variant is there to show)
        out.update(_error(e))
        out["error"] = "compile_failed: " + out["error"]
    print(json.dumps(out, default=_jsonable), flush=True)
    return 0


def plot_learner(rec: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = {k: c for k, c in rec["cases"].items() if any(v.get("updates_per_s") for v in c["variants"].values())}
    names = []
    for c in cases.values():
        for n, v in c["variants"].items():
            if v.get("updates_per_s") and n not in names:
                names.append(n)
    if not names:
        return
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(cases)), 4))
    w = 0.8 / len(names)
    for i, n in enumerate(names):
        ys = [c["variants"].get(n, {}).get("updates_per_s") or 0 for c in cases.values()]
        ax.bar([j + i * w for j in range(len(cases))], ys, w, label=n)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(cases))])
    ax.set_xticklabels(list(cases), fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("gradient steps / s (learner alone)")
    ax.legend(fontsize=7, ncol=3)
    ax.set_title("learner updates/s per kernel at the presets' batch sizes", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


# --- stage k: the kernel each device chooses ------------------------------------------------------------------
def stage_kernels(ctx: dict, rec: Rec) -> None:
    require("gymnasium")
    import warnings

    import torch

    from hetrl.kernels import NAMES, kernel_class, select
    from hetrl.kernels.cuda_graph import fits

    warnings.filterwarnings("ignore", message=".*capturable=True.*")
    cuda = torch.cuda.is_available()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    rec["how"] = ("hetrl.kernels.select(make_algo, spec, act_space, batch_size, K, device) at the run's phase length K, "
                  "1 torch thread: every kernel that applies is checked equal to public (2 synthetic phases, the same "
                  "random draws) and only those equal are timed (alternating rounds); the fastest is chosen")
    rec["cuda"] = cuda
    rec["cases"] = {}
    rec.save()
    reserve = 5 if ctx["quick"] else 8
    for algo, env, case in case_list():
        key = f"{algo} {env}"
        if isinstance(case, dict):
            rec["cases"][key] = case
            continue
        c = rec["cases"][key] = {**case.describe(), "devices": {}}
        runs = [("cuda", case.K), ("cpu", case.K)]
        if not fits(case.probe, case.K):   # the graph would replay nothing at K (TD3: K=1, period 2)
            runs.insert(1, (f"cuda_k{case.period}", case.period))
        for label, k in runs:
            dev = label.split("_")[0]
            if dev == "cuda" and not cuda:
                c["devices"][label] = {"skipped": "no CUDA"}
                continue
            if left(ctx) < reserve:
                c["devices"][label] = {"skipped": "stage budget spent"}
                continue
            candidates = list(NAMES)
            d: dict = {"steps": k}
            if dev == "cpu" and not kernel_class("compiled").check(case.probe):
                why = wait_warm(ctx, algo, reserve)
                if why:
                    candidates.remove("compiled")
                    d["left_out"] = {"compiled": why}
            try:
                t = time.perf_counter()
                choice = select(case.maker(dev), case.spec, case.act, case.B, k, dev, candidates=tuple(candidates),
                                seed=case.cfg.seed)
                d.update(wall_s=round(time.perf_counter() - t, 2), chosen=choice.name,
                         updates_per_s={n: round(1.0 / s, 1) for n, s in choice.s_per_update.items() if s > 0},
                         checked=choice.checked, differs=choice.differs, declined=choice.declined,
                         explain=choice.explain(), choice=choice.to_json())
                if dev == "cuda":
                    d["graph_captures"] = fits(case.probe, k)
                    # what stage k is for: a graph is chosen only with its equality check passed on this device
                    d["chosen_after_check"] = choice.name == "public" or choice.name in choice.checked
                print(f"{key} on {label} (k={k}): " + "; ".join(choice.explain()), flush=True)
            except Exception as e:  # noqa: BLE001
                d.update(_error(e))
                print(f"{key} on {label}: {traceback.format_exc()}", flush=True)
            c["devices"][label] = d
            rec.save()


# --- stage g: populations -------------------------------------------------------------------------------------------
POP_CHILD = r"""
import json, sys, time
from pathlib import Path
spec = json.loads(sys.argv[1])
t0 = time.perf_counter()
import torch
import hetrl
import_s = time.perf_counter() - t0
run = hetrl.train("dqn", "CartPole-v1", seeds=spec["seeds"], steps=spec["steps"], device=spec["device"],
                  learner_kernel=spec["kernel"], plan="none", eval_episodes=0, progress=False, out=spec["out"],
                  force=True)
process_s = time.perf_counter() - t0
res = run.result
out = {k: res.get(k) for k in ("members", "env_steps", "wall_s", "env_steps_per_s", "member_env_steps_per_s",
                               "gradient_steps", "train_samples_per_s", "lanes", "parallel_lanes", "learner_kernel",
                               "peak_rss_mb", "interrupted")}
members = []
for d in sorted(Path(spec["out"], "members").iterdir()):
    r = json.loads((d / "result.json").read_text())
    members.append({k: r.get(k) for k in ("learner_busy_s", "acting_s", "replay_busy_s", "compile_s",
                                          "gradient_steps", "env_steps", "learner_kernel")})
graph = getattr(run.schedule, "graph", None)
out["members_graph"] = graph is not None   # the members' phases replayed from one CUDA graph
out["capture_s"] = graph.compile_s if graph is not None else sum(m["compile_s"] or 0.0 for m in members)
total = lambda k: sum(m[k] or 0.0 for m in members)
out["time_split_s"] = {"learner": total("learner_busy_s"), "acting": total("acting_s"), "replay": total("replay_busy_s")}
out["member_gradient_steps"] = members[0]["gradient_steps"]
out["member_learner_busy_s"] = [m["learner_busy_s"] for m in members[:8]]
out["process_s"], out["import_s"] = process_s, import_s
if torch.cuda.is_available():
    out["gpu_max_memory_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
print(json.dumps(out))
"""


def stage_population(ctx: dict, rec: Rec) -> None:
    require("gymnasium")
    quick, cuda = ctx["quick"], cuda_ok()
    steps = POP_STEPS_QUICK if quick else POP_STEPS
    rec.update(steps=steps, env="CartPole-v1", algo="dqn", cuda=cuda,
               how=("hetrl.train('dqn', 'CartPole-v1', seeds=N, steps=STEPS, device=..., learner_kernel=K, plan='none', "
                    "eval_episodes=0, progress=False, out=...), one process per run; wall_s: the population's clock "
                    "(result.json), process_s: the whole process (imports, setup, saving); time_split_s: the members' "
                    "learner_busy_s, acting_s and replay_busy_s summed; capture_s: the CUDA graph captures (warm-up "
                    "and capture of every member's phase)"))
    runs = rec["runs"] = {}
    rec.save()
    for kernel, n in POP_RUNS:
        key = f"{kernel}_n{n}"
        if kernel == "cuda_graph" and not cuda:
            runs[key] = {"skipped": "no CUDA"}
            continue
        device = "cuda" if cuda else "cpu"
        one = runs.get(f"{kernel}_n1") or {}
        if n > 1 and one.get("wall_s") and one.get("process_s"):   # members learn one after another with the public kernel: ~n x one
            est = (n * one["wall_s"] if kernel == "public" else one["wall_s"]) + (one["process_s"] - one["wall_s"])
            if est > left(ctx) - 3:
                runs[key] = {"skipped": f"stage budget spent: {left(ctx):.0f} s left, about {est:.0f} s needed"}
                continue
        if left(ctx) < 10:
            runs[key] = {"skipped": "stage budget spent"}
            continue
        spec = {"seeds": n, "steps": steps, "device": device, "kernel": kernel,
                "out": str(Path(ctx["work"]) / "population" / key)}
        r = run_cmd([sys.executable, "-c", POP_CHILD, json.dumps(spec)], left(ctx) - 3,
                    label=f"population of {n}, learner_kernel={kernel}, on {device}")
        got = _last_json(r["stdout"]) if r["rc"] == 0 else None
        runs[key] = ({"device": device, **got} if got else
                     {"error": (r["stderr"] or r["stdout"])[-1500:], "rc": r["rc"], "timed_out": r["timed_out"],
                      "process_s": r["wall_s"]})
        rec.save()
    ratios = {}
    for kernel in ("cuda_graph", "public"):
        one = (runs.get(f"{kernel}_n1") or {}).get("wall_s")
        for n in (8, 64):
            other = (runs.get(f"{kernel}_n{n}") or {}).get("wall_s")
            if one and other:
                ratios[f"{kernel}_n{n}_over_n1"] = round(other / one, 2)
    rec["wall_ratio"] = ratios
    rec["target"] = "cuda_graph_n64_over_n1 <= 3"


# --- stage d: profile, plan (and train where time is left) ------------------------------------------------------
def _sets(d: dict) -> list[str]:
    out = []
    for k, v in d.items():
        out += ["--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    return out


def _plan_brief(p: dict) -> dict:
    if not p:
        return {}
    pl, pr = p.get("plan", {}), p.get("predicted", {})
    choice = ((p.get("profile") or {}).get("learner_kernel") or {}).get(pl.get("learner_device")) or {}
    try:
        from hetrl.kernels import Choice

        line = Choice.from_json(choice).explain() if choice else []
    except Exception as e:  # noqa: BLE001
        line = [f"(explain failed: {type(e).__name__}: {e})"]
    return {"plan": pl, "settings": p.get("settings"), "predicted_env_steps_per_s": pr.get("env_steps_per_s"),
            "predicted_gradient_steps_per_s": pr.get("gradient_steps_per_s"), "bound": pr.get("bound"),
            "bottleneck": p.get("bottleneck"), "candidates": p.get("candidates"),
            "learner_kernel": choice, "learner_line": line,
            "runners_up": [{"plan": r["plan"], "env_steps_per_s": r["predicted"].get("env_steps_per_s")}
                           for r in p.get("runners_up", [])[:5]]}


RESULT_KEYS = ["schedule", "device", "actors", "envs_per_actor", "env_steps", "gradient_steps", "wall_s",
               "env_steps_per_s", "env_steps_per_s_learning", "predicted_env_steps_per_s", "train_samples_per_s",
               "learner_busy_fraction", "replay_ratio_achieved", "policy_lag_mean", "eval_return_mean",
               "eval_return_std", "best_select_return_mean", "best_env_steps", "policy", "peak_rss_mb",
               "gpu_max_memory_allocated_mb", "learner_kernel", "learner_kernel_source", "interrupted"]
FULL_PROFILE_S = 100   # a full profile and three plans; with less time left the profile is the quick grid
TRAIN_S = 90           # what `hetrl train` under the plan needs at least


def stage_planner(ctx: dict, rec: Rec) -> None:
    require("gymnasium")
    quick, cuda = ctx["quick"], cuda_ok()
    py = [sys.executable, "-m", "hetrl.cli"]
    rec["cases"] = {}
    for algo, env, steps, sets in PLAN_CASES:
        if quick:
            steps = steps // 10
        c = rec["cases"][f"{algo} {env}"] = {"steps": steps, "sets": sets}
        rec.save()
        small = quick or left(ctx) < FULL_PROFILE_S
        q = ["--quick"] if small else []
        c["profile_grid"] = "quick" if small else "full"
        base = [algo, "--env", env, *_sets(sets)]
        r = run_cmd([*py, "profile", *base, *q, "--json"], left(ctx) - 5)
        prof = _last_json(r["stdout"])
        c["profile"] = {"cmd": r["cmd"], "rc": r["rc"], "wall_s": r["wall_s"]}
        if prof:
            c["profile"].update(devices=prof.get("devices"), machine=prof.get("machine"),
                                profile_s=prof.get("profile_s"), learner_kernel=prof.get("learner_kernel"),
                                learn=prof.get("learn"), learn_grouped=prof.get("learn_grouped"),
                                transfer={k: v for k, v in (prof.get("transfer") or {}).items() if "cuda" in k},
                                power=prof.get("power"))
            c["considered_cuda"] = any(d.startswith("cuda") for d in prof.get("devices", []))
        else:
            c["profile"]["error"] = (r["stderr"] or r["stdout"])[-2000:]
        rec.save()
        plans = {}
        for label, pin in (("default", []), ("cuda", ["--pin", "device=cuda"]), ("cpu", ["--pin", "device=cpu"])):
            if label == "cuda" and not cuda:
                plans[label] = {"skipped": "no CUDA"}
                continue
            if label != "default" and not cuda:
                continue   # without a GPU the default plan is the CPU's
            if left(ctx) < 8:
                plans[label] = {"skipped": "stage budget spent"}
                continue
            r = run_cmd([*py, "plan", *base, *pin, *q, "--json"], left(ctx) - 5)
            p = _last_json(r["stdout"])
            plans[label] = _plan_brief(p) if p else {"error": (r["stderr"] or r["stdout"])[-2000:], "rc": r["rc"]}
            rec.save()
        c["plans"] = plans
        rec.save()
        run_dir = Path(ctx["work"]) / "runs" / f"{algo}-{env}"
        cmd = [*py, "train", algo, "--env", env, "--steps", str(steps), *_sets(sets), "--out", str(run_dir),
               "--force", "--no-progress"]
        if small:   # a quick profile does not cover what --plan auto measures: run the quick plan's settings
            d = plans.get("default") or {}
            cmd += ["--plan", "none", *_sets({k: v for k, v in (d.get("settings") or {}).items() if k != "num_envs"})]
            c["train_how"] = "--plan none with the quick plan's settings (a quick profile does not cover --plan auto's)"
        else:
            c["train_how"] = "hetrl train under the default plan (--plan auto, the profile cached above)"
        if left(ctx) < (20 if quick else TRAIN_S):
            c["train"] = {"skipped": "stage budget spent"}
            continue
        r = run_cmd(cmd, left(ctx) - 5)
        c["train"] = {"cmd": r["cmd"], "rc": r["rc"], "wall_s": r["wall_s"], "timed_out": r["timed_out"],
                      "stderr_tail": r["stderr"][-1500:]}
        res_path = run_dir / "result.json"
        if res_path.exists():
            res = json.loads(res_path.read_text())
            c["train"]["result"] = {k: res.get(k) for k in RESULT_KEYS if k in res}
            c["train"]["result"]["plan_chosen"] = (res.get("plan") or {}).get("chosen")
            pred = res.get("predicted_env_steps_per_s") or (plans.get("default") or {}).get("predicted_env_steps_per_s")
            meas = res.get("env_steps_per_s_learning")
            c["train"]["predicted_env_steps_per_s"] = pred
            c["train"]["measured_over_predicted"] = (meas / pred) if meas and pred else None
        rec.save()


# --- stage e: SB3 on the same machine ----------------------------------------------------------------------------
SB3_CHILD = r"""
import json, sys, time
spec = json.loads(sys.argv[1])
from hetrl.config import make_config
over = {"steps": spec["steps"], "eval_episodes": 0, "keep_best": False}
cfg = make_config("dqn", "CartPole-v1", over)
if spec["lib"] == "hetrl":
    import hetrl
    settings = {k: v for k, v in cfg.to_dict().items() if k not in ("algo", "env")}
    settings.update(device=spec["device"], schedule="inline")
    t = time.perf_counter()
    run = hetrl.train("dqn", "CartPole-v1", progress=False, evaluate_episodes=0, plan="none", **settings)
    wall = time.perf_counter() - t
    out = {"env_steps": run.result["env_steps"], "gradient_steps": run.result["gradient_steps"], "wall_s": wall}
else:
    sys.path.insert(0, spec["bench_dir"])
    from sb3_preset import sb3_model
    model = sb3_model(cfg, "CartPole-v1", device=spec["device"])
    t = time.perf_counter()
    model.learn(total_timesteps=spec["steps"])
    wall = time.perf_counter() - t
    out = {"env_steps": model.num_timesteps, "gradient_steps": model._n_updates, "wall_s": wall,
           "device": str(model.device)}
import torch
out["env_steps_per_s"] = out["env_steps"] / out["wall_s"]
out["torch_threads"] = torch.get_num_threads()
print(json.dumps(out))
"""


def stage_sb3(ctx: dict, rec: Rec) -> None:
    require("gymnasium", "stable_baselines3")
    quick, cuda = ctx["quick"], cuda_ok()
    steps = SB3_STEPS // 10 if quick else SB3_STEPS
    rec.update(steps=steps, what="DQN CartPole-v1 preset (batch 64, 256x256, 128 gradient steps per 256 env steps); "
                                 "hetrl inline --plan none, SB3 via benchmarks/sb3_preset.py; wall of learn()")
    runs = rec["runs"] = {}
    for dev in ("cuda", "cpu"):
        for lib in ("sb3", "hetrl"):
            key = f"{lib}_{dev}"
            if dev == "cuda" and not cuda:
                runs[key] = {"skipped": "no CUDA"}
                continue
            if left(ctx) < 10:
                runs[key] = {"skipped": "stage budget spent"}
                continue
            spec = {"lib": lib, "device": dev, "steps": steps, "bench_dir": str(BENCH)}
            r = run_cmd([sys.executable, "-c", SB3_CHILD, json.dumps(spec)], left(ctx) - 3, label=f"{lib} on {dev}")
            got = _last_json(r["stdout"])
            runs[key] = got if got and r["rc"] == 0 else {"error": (r["stderr"] or r["stdout"])[-1500:],
                                                          "rc": r["rc"], "timed_out": r["timed_out"]}
            rec.save()
    ratio = {}
    for dev in ("cuda", "cpu"):
        a, b = runs.get(f"hetrl_{dev}", {}).get("env_steps_per_s"), runs.get(f"sb3_{dev}", {}).get("env_steps_per_s")
        ratio[dev] = a / b if a and b else None
    rec["hetrl_over_sb3"] = ratio


# --- stage f: actor sweep -------------------------------------------------------------------------------------------
def stage_sweep(ctx: dict, rec: Rec) -> None:
    require("gymnasium")
    sys.path.insert(0, str(BENCH))
    import bench_local   # its slow env (HeavyCartPole-v1) and its child runner

    quick, cuda = ctx["quick"], cuda_ok()
    cores = os.cpu_count() or 1
    counts = [n for n in SWEEP_ACTORS if n <= max(2, cores - 1)]
    steps = SWEEP_STEPS // 10 if quick else SWEEP_STEPS
    device = "cuda" if cuda else "cpu"
    rec.update(env=SWEEP_ENV, heavy_step_s=bench_local.HEAVY_STEP_S, steps=steps, device=device, cores=cores,
               actors=counts, left_out=[n for n in SWEEP_ACTORS if n not in counts],
               what="DQN CartPole-v1 preset on an env whose step burns 0.2 ms of CPU; local schedule, "
                    "1 env per actor, learner on " + device + "; env steps/s of the phase loop (bench_local.run_child)")
    sweep = rec["sweep"] = {"no_rate_limit": {}, "preset_ratio": {}}
    for variant, extra in (("no_rate_limit", {"rate_limit": False}), ("preset_ratio", {})):
        for n in counts:
            if left(ctx) < (10 if quick else 25):
                sweep[variant][str(n)] = {"skipped": "stage budget spent"}
                continue
            settings = {"schedule": "local", "actors": n, "envs_per_actor": 1, "device": device, **extra}
            try:
                r = bench_local.run_child("hetrl", "dqn", SWEEP_ENV, steps, settings, preset_env="CartPole-v1")
                sweep[variant][str(n)] = {k: r.get(k) for k in ("env_steps_per_s", "train_samples_per_s", "wall_s",
                                                                "setup_s", "env_steps", "gradient_steps", "local")}
                print(f"{variant} actors {n}: {r['env_steps_per_s']:,.0f} env steps/s", flush=True)
            except BaseException as e:  # run_child raises SystemExit with the child's stderr
                if isinstance(e, KeyboardInterrupt):
                    raise
                sweep[variant][str(n)] = {"error": str(e)[-1500:]}
                print(f"{variant} actors {n}: {str(e)[-3000:]}", flush=True)
            rec.save()
    try:
        plot_sweep(rec, Path(ctx["out"]) / "gpu_check_sweep.png")
        rec["plot"] = "gpu_check_sweep.png"
    except Exception as e:  # noqa: BLE001
        rec["plot_error"] = f"{type(e).__name__}: {e}"


def plot_sweep(rec: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for variant, label in (("no_rate_limit", "no rate limiter"), ("preset_ratio", "preset replay ratio")):
        pts = sorted((int(n), r["env_steps_per_s"]) for n, r in rec["sweep"][variant].items()
                     if r.get("env_steps_per_s"))
        if pts:
            ax.plot([n for n, _ in pts], [v for _, v in pts], marker="o", label=label)
            if variant == "no_rate_limit":
                ax.plot([n for n, _ in pts], [pts[0][1] * n / pts[0][0] for n, _ in pts], ls=":", color="gray",
                        label="linear from 1 actor")
    ax.set_xlabel("actor processes (1 env each)")
    ax.set_ylabel("env steps / s")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(rec["actors"])
    ax.set_xticklabels([str(n) for n in rec["actors"]])
    ax.set_title(f"local schedule, HeavyCartPole-v1 (+0.2 ms/step), {rec['cores']} cores, learner {rec['device']}",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


STAGE_FNS = {"env": stage_env, "tests": stage_tests, "learner": stage_learner, "kernels": stage_kernels,
             "population": stage_population, "planner": stage_planner, "sb3": stage_sb3, "sweep": stage_sweep}


def child_main(name: str, ctx: dict) -> int:
    rec = Rec(Path(ctx["work"]) / f"stage_{name}.json")
    rec.save()
    try:
        STAGE_FNS[name](ctx, rec)
        if rec["status"] == "running":
            rec["status"] = "ok"
    except Skip as e:
        rec.update(status="skipped", reason=str(e))
    except BaseException as e:  # noqa: BLE001 (recorded, never raised past the stage)
        rec.update(status="failed", reason=f"{type(e).__name__}: {e}"[:1000], traceback=traceback.format_exc()[-3000:])
    rec.save()
    return 0


# --- the parent: stages under budgets, the JSON and the summary ----------------------------------------------------------
def parse_stages(text: str) -> list[str]:
    names = {letter: name for letter, name, _ in STAGES}
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        name = names.get(part, part)
        if name not in BUDGETS_S:
            raise SystemExit(f"error: unknown stage {part!r}; stages: "
                             + ", ".join(f"{a} ({n})" for a, n, _ in STAGES))
        if name not in out:
            out.append(name)
    return [n for _, n, _ in STAGES if n in out]


def stage_environ(work: Path) -> dict:
    """The environment of every process the check starts: hetrl from this tree, a fresh profile cache."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("HETRL_CACHE_DIR", str(work / "cache"))   # a fresh profile, taken on this machine
    env.update(PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    return env


WARM_CHILD = r"""
import json, os, sys, time
name, marker = sys.argv[1], sys.argv[2]
os.nice(5)   # behind the stages' own work
t = time.perf_counter()
out = {"name": name}
try:
    from hetrl.kernels.compiled import available
    from hetrl.kernels.compiled.kernel import HEADS
    from hetrl.kernels.compiled.warm import compile_here
    why = available()
    out["available"] = why is None
    if why:
        out["error"] = why
    else:
        # what `hetrl warm` compiles for it: its acting piece and its head, or where it has no head the VM of
        # the phase derived from its learn, with the fused loops
        compile_here(name)
        if name not in {h.lower() for h in HEADS}:
            compile_here("derived")
        out["compile_s"] = time.perf_counter() - t
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"[:500]
out["wall_s"] = time.perf_counter() - t
tmp = marker + ".tmp"
with open(tmp, "w") as f:
    json.dump(out, f)
os.replace(tmp, marker)
"""


def start_warm_up(stages: list[str], work: Path) -> tuple[list[str], list[subprocess.Popen]]:
    """Compile the compiled CPU kernel of each algorithm stages c and k time into numba's on-disk cache, in
    background processes (one per algorithm) that run while the stages before them do."""
    if not {"learner", "kernels"} & set(stages) or importlib.util.find_spec("numba") is None:
        return [], []
    names = sorted({WARM_UP[a] for a, _ in LEARNER_CASES if a in WARM_UP and a != "crossq"})
    try:   # crossq's kernel where one is registered (a cheap look: the registry only)
        sys.path.insert(0, str(ROOT))
        from hetrl import registry

        if "crossq" in registry.names():
            names.append("crossq")
    except Exception:  # noqa: BLE001
        pass
    procs = []
    for name in names:
        warm_marker(work, name).unlink(missing_ok=True)
        log = open(work / f"numba_warm_{name}.log", "w")
        procs.append(subprocess.Popen([sys.executable, "-c", WARM_CHILD, name, str(warm_marker(work, name))], cwd=ROOT,
                                      env=stage_environ(work), stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    print(f"gpu_check: compiling the compiled kernel of {', '.join(names)} in the background", flush=True)
    return names, procs


def stop_warm_up(names: list[str], procs: list[subprocess.Popen], work: Path) -> dict:
    out = {}
    for name, p in zip(names, procs):
        running = p.poll() is None
        if running:
            _kill_group(p, grace_s=1)
        try:
            out[name] = json.loads(warm_marker(work, name).read_text())
        except (OSError, ValueError):
            out[name] = {"error": "stopped at the end of the check, unfinished" if running else f"exit code {p.returncode}"}
    return out


def run_stage(name: str, args, work: Path, out: Path, end: float | None, warm: list[str]) -> dict:
    budget = BUDGETS_S[name] * (QUICK_BUDGET_FACTOR if args.quick else 1)
    if end is not None:
        budget = min(budget, end - time.time())
    if budget < 5:
        return {"status": "skipped", "reason": "skipped: --max-s leaves no time for it", "budget_s": 0}
    ctx = {"quick": args.quick, "work": str(work), "out": str(out), "deadline": time.time() + budget - 3,
           "warm_up": warm}
    stage_json, log = work / f"stage_{name}.json", work / f"stage_{name}.log"
    stage_json.unlink(missing_ok=True)
    t0 = time.time()
    print(f"gpu_check: stage {name} (budget {budget:.0f} s) ...", flush=True)
    with open(log, "w") as f:
        p = subprocess.Popen([sys.executable, "-u", str(Path(__file__).resolve()), "--_stage", name,
                              "--_ctx", json.dumps(ctx)], cwd=ROOT, env=stage_environ(work), stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc, timed_out = p.wait(timeout=budget), False
        except subprocess.TimeoutExpired:
            _kill_group(p)
            rc, timed_out = p.returncode, True
        except KeyboardInterrupt:
            _kill_group(p, grace_s=2)
            raise
    try:
        rec = json.loads(stage_json.read_text())
    except (OSError, ValueError):
        rec = {"status": "failed", "reason": "the stage wrote no record"}
    if timed_out:
        rec.update(status="timeout", reason=f"over its wall budget of {budget:.0f} s; what it had finished is kept")
    elif rc != 0 and rec.get("status") in (None, "running"):
        rec.update(status="failed", reason=f"exit code {rc}")
    elif rec.get("status") == "running":
        rec.update(status="failed", reason="the stage ended without finishing its record")
    rec["wall_s"], rec["budget_s"] = round(time.time() - t0, 1), round(budget, 1)
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    rec["log_tail"] = text[-3000:]
    print(f"gpu_check: stage {name}: {rec['status']} in {rec['wall_s']:.0f} s"
          + (f" ({rec['reason']})" if rec.get("reason") else ""), flush=True)
    return rec


def _fmt(v, nd=0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return str(v)


def summary(doc: dict) -> str:
    st = doc.get("stages", {})
    L = [f"hetrl GPU check ({doc.get('schema')}), {'QUICK (smoke test) ' if doc.get('quick') else ''}"
         f"finished {doc.get('finished', '?')}"]
    env = (st.get("env") or {}).get("info") or {}
    if env:
        L.append(f"machine: {env.get('device_name', 'no CUDA device')}; {env.get('cpu_count')} CPUs "
                 f"({env.get('cpu_model', '?')}); torch {env.get('torch')} (CUDA {env.get('torch_cuda')}); "
                 f"python {env.get('python')}")
    L.append("")
    L.append("stage      status    wall / budget s   note")
    for _, name, budget in STAGES:
        r = st.get(name)
        if not r:
            L.append(f"{name:<10} {'not run':<9} {'-':>6} / {budget:<8}")
            continue
        note = r.get("reason") or r.get("note") or ""
        L.append(f"{name:<10} {r.get('status', '?'):<9} {_fmt(r.get('wall_s')):>6} / {_fmt(r.get('budget_s')):<8} "
                 f"{note[:110]}")
    warm = doc.get("numba_warm_up")
    if warm:
        L.append("numba's background compile of the compiled kernel: " + ", ".join(
            f"{n} {v['error'][:60] if v.get('error') else _fmt(v.get('compile_s'), 0) + ' s'}" for n, v in warm.items()))
    for name, fn in (("env", _sum_env), ("tests", _sum_tests), ("learner", _sum_learner), ("kernels", _sum_kernels),
                     ("population", _sum_population), ("planner", _sum_planner), ("sb3", _sum_sb3),
                     ("sweep", _sum_sweep)):
        r = st.get(name)
        if r and r.get("status") not in ("skipped",):
            L.append("")
            try:
                L.extend(fn(r))
            except Exception as e:  # noqa: BLE001 (a partial record must not stop the summary)
                L.append(f"[{name}] (summary failed: {type(e).__name__}: {e})")
    return "\n".join(L) + "\n"


def _sum_env(r: dict) -> list[str]:
    pk = r.get("packages", {})
    ok = ", ".join(f"{k} {v['version']}" for k, v in pk.items() if v.get("ok"))
    miss = ", ".join(k for k, v in pk.items() if not v.get("ok"))
    return [f"[env] imports: {ok}", f"[env] missing: {miss or 'none'}; compilers: "
            + ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in (r.get("compilers") or {}).items())]


def _sum_tests(r: dict) -> list[str]:
    c = r.get("counts", {})
    return [f"[tests] pytest -m gpu: {c.get('passed', 0)} passed, {c.get('failed', 0)} failed, "
            f"{c.get('skipped', 0)} skipped, {c.get('deselected', 0)} deselected, errors {c.get('errors', c.get('error', 0))}"
            f" (rc {r.get('rc')}){'; ' + r['note'] if r.get('note') else ''}"]


def _check_mark(chk: dict | None) -> str:
    if not chk:
        return ""
    return " ok" if chk.get("ok") else f" DIFFERS ({chk.get('tolerance_used')}x tolerance: {str(chk.get('worst'))[:60]})"


def _sum_learner(r: dict) -> list[str]:
    out = [f"[learner] gradient steps/s of the learner alone ({'CUDA' if r.get('cuda') else 'no CUDA'}); "
           "k = steps per learn call; ok / DIFFERS: kernels.check_equal against the public kernel"]
    for case, c in (r.get("cases") or {}).items():
        parts = ([f"skipped: {c['skipped']}"] if c.get("skipped") else
                 [f"ERROR {c['error'][:120]}"] if c.get("error") else [])
        for n, v in c.get("variants", {}).items():
            if v.get("updates_per_s"):
                extra = f", compile {v['compile_s']:.0f} s" if n.startswith("cuda_compile") and v.get("compile_s") else ""
                parts.append(f"{n} {v['updates_per_s']:,.0f}{_check_mark(v.get('check'))}{extra}")
            elif v.get("error"):
                parts.append(f"{n} ERROR {v['error'][:80]}")
            elif v.get("skipped"):
                parts.append(f"{n} skipped: {v['skipped'][:80]}")
        head = f"  {case}" + (f" (B={c.get('batch_size')}, {c.get('net_arch')}, K={c.get('phase_k')})"
                              if "batch_size" in c else "")
        out.append(head + ": " + "; ".join(parts))
    return out


def _sum_kernels(r: dict) -> list[str]:
    out = [f"[kernels] kernels.select at the run's phase length ({'CUDA' if r.get('cuda') else 'no CUDA'}): chosen "
           "kernel, updates/s of those checked equal, dropped / not used and why"]
    for case, c in (r.get("cases") or {}).items():
        if c.get("skipped") or c.get("error"):
            out.append(f"  {case}: " + (f"skipped: {c['skipped']}" if c.get("skipped") else f"ERROR {c['error'][:120]}"))
            continue
        for label, d in (c.get("devices") or {}).items():
            if d.get("chosen"):
                ups = ", ".join(f"{n} {v:,.0f}" for n, v in (d.get("updates_per_s") or {}).items())
                why = "; ".join([f"{n} differs: {str(w)[:70]}" for n, w in (d.get("differs") or {}).items()]
                                + [f"{n} not used: {str(w)[:70]}" for n, w in
                                   {**(d.get("declined") or {}), **(d.get("left_out") or {})}.items()])
                flag = "" if d.get("chosen_after_check", True) else " (CHOSEN WITHOUT A PASSED CHECK)"
                cap = "" if d.get("graph_captures", True) else " (the graph replays nothing at this k)"
                out.append(f"  {case} on {label} (k={d.get('steps')}): {d['chosen']}{flag}{cap}"
                           + (f" [{ups}]" if ups else "")
                           + (f" {why}" if why else ""))
            else:
                out.append(f"  {case} on {label}: {d.get('skipped') or 'ERROR ' + str(d.get('error'))[:100]}")
    return out


def _sum_population(r: dict) -> list[str]:
    out = [f"[population] {r.get('algo')} {r.get('env')}, {r.get('steps', 0):,} env steps per member: wall (population "
           "clock) / process s, member env steps/s, where the time goes (members summed)"]
    for key, v in (r.get("runs") or {}).items():
        if v.get("wall_s"):
            ts = v.get("time_split_s") or {}
            out.append(f"  {key:<15} {v.get('device')}: wall {v['wall_s']:,.1f} / {_fmt(v.get('process_s'), 1)} s, "
                       f"{_fmt(v.get('member_env_steps_per_s'))} env steps/s per member "
                       f"({_fmt(v.get('env_steps_per_s'))} all), {v.get('member_gradient_steps')} gradient steps each; "
                       f"learner {_fmt(ts.get('learner'), 1)} s (capture {_fmt(v.get('capture_s'), 1)}), acting "
                       f"{_fmt(ts.get('acting'), 1)}, replay {_fmt(ts.get('replay'), 1)}"
                       + ("; one graph for all members" if v.get("members_graph") else ""))
        else:
            out.append(f"  {key:<15} {v.get('skipped') or 'ERROR ' + str(v.get('error'))[-150:]}")
    if r.get("wall_ratio"):
        out.append("  wall ratios: " + ", ".join(f"{k} {v}" for k, v in r["wall_ratio"].items())
                   + f" (target: {r.get('target')})")
    return out


def _sum_planner(r: dict) -> list[str]:
    out = ["[planner] hetrl profile + plan (+ train where time was left: measured env steps/s vs the prediction)"]
    for case, c in (r.get("cases") or {}).items():
        prof = c.get("profile", {})
        out.append(f"  {case}: profile ({c.get('profile_grid')} grid) rc {prof.get('rc')} in {_fmt(prof.get('wall_s'))} "
                   f"s, devices {prof.get('devices')}, cuda considered: {c.get('considered_cuda')}")
        for label, p in (c.get("plans") or {}).items():
            if p.get("plan"):
                pl = p["plan"]
                out.append(f"    plan {label:<7}: {pl.get('schedule')} {pl.get('actors')}x{pl.get('envs_per_actor')} "
                           f"learner {pl.get('learner_device')} ({pl.get('threads')} thr) predicted "
                           f"{_fmt(p.get('predicted_env_steps_per_s'))} env steps/s; {str(p.get('bottleneck'))[:90]}")
                for line in p.get("learner_line") or []:
                    out.append(f"      {line[:160]}")
            else:
                out.append(f"    plan {label:<7}: {p.get('skipped') or str(p.get('error'))[:120]}")
        t = c.get("train") or {}
        res = t.get("result") or {}
        if res:
            out.append(f"    train {c.get('steps'):,} steps ({res.get('schedule')}, {res.get('device')}, kernel "
                       f"{res.get('learner_kernel')}): {_fmt(res.get('env_steps_per_s_learning'))} env steps/s learning "
                       f"vs predicted {_fmt(t.get('predicted_env_steps_per_s'))} = "
                       f"{_fmt(t.get('measured_over_predicted'), 2)}x; whole run {_fmt(res.get('env_steps_per_s'))}; "
                       f"eval return {_fmt(res.get('eval_return_mean'), 1)} +- {_fmt(res.get('eval_return_std'), 1)}")
        elif t:
            out.append(f"    train: {t.get('skipped') or ('rc ' + str(t.get('rc')) + ' ' + str(t.get('stderr_tail', ''))[-200:])}")
    return out


def _sum_sb3(r: dict) -> list[str]:
    runs = r.get("runs", {})
    out = [f"[sb3] DQN CartPole-v1 {r.get('steps', 0):,} env steps, env steps/s:"]
    for k, v in runs.items():
        out.append(f"    {k:<10} {_fmt(v.get('env_steps_per_s')) if 'env_steps_per_s' in v else (v.get('skipped') or str(v.get('error'))[-120:])}")
    rat = r.get("hetrl_over_sb3", {})
    out.append(f"    hetrl / SB3: cuda {_fmt(rat.get('cuda'), 2)}x, cpu {_fmt(rat.get('cpu'), 2)}x")
    return out


def _sum_sweep(r: dict) -> list[str]:
    out = [f"[sweep] local schedule, {r.get('env')}, {r.get('steps', 0):,} env steps per run, learner {r.get('device')}"
           + (f"; actor counts left out (too few cores): {r['left_out']}" if r.get("left_out") else "")]
    for variant, pts in (r.get("sweep") or {}).items():
        row = ", ".join(f"{n}: {_fmt(v.get('env_steps_per_s'))}" if v.get("env_steps_per_s") else
                        f"{n}: {v.get('skipped') or 'error'}" for n, v in pts.items())
        out.append(f"    {variant:<14} actors -> env steps/s: {row}")
    if r.get("plot"):
        out.append(f"    plot: {r['plot']}")
    return out


def write_outputs(doc: dict, out: Path) -> None:
    doc["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write_json(doc, out / "gpu_check.json")
    (out / "gpu_check.txt").write_text(summary(doc))


def keep_as_result(doc: dict, out: Path, work: Path) -> None:
    """Without --out or $OUT: the files in benchmarks/results/gpu_check/ under the results' naming scheme
    (gpu_check_<date>_<machine>_<commit>.json, .txt, .png, -sweep.png), the logs in the scratch folder."""
    sys.path.insert(0, str(BENCH))
    from result_files import gpu_key, machine_key, result_path

    device = ((doc.get("stages", {}).get("env") or {}).get("info") or {}).get("device_name")
    stem = result_path("gpu_check", machine=gpu_key(device) if device else machine_key(), folder=out).with_suffix("")
    for name, to in (("gpu_check.json", ".json"), ("gpu_check.txt", ".txt"), ("gpu_check_learner.png", ".png"),
                     ("gpu_check_sweep.png", "-sweep.png"), ("gpu_check_logs.txt", None)):
        if (out / name).exists():
            (out / name).replace(work / name if to is None else Path(f"{stem}{to}"))
    print(f"gpu_check: kept as {stem}.json, .txt (+ plots); logs in {work}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="~10x smaller workloads: a smoke test (CPU-only machines too)")
    ap.add_argument("--out", help="where the JSON, summary, plots and logs go (default $OUT, else "
                                  "benchmarks/results/gpu_check)")
    ap.add_argument("--stages", default=DEFAULT_STAGES,
                    help=f"letters or names, e.g. a,b,c,e (default: {DEFAULT_STAGES}, the GPU machine's call)")
    ap.add_argument("--max-s", type=float, help="wall seconds for this whole invocation (stages get what is left)")
    ap.add_argument("--work", help="scratch folder for run directories, logs and the profile cache (default: a new "
                                   "temporary folder)")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="merge gpu_check.json files of several calls "
                                                               "(later files win per stage) into --out; runs nothing")
    ap.add_argument("--_stage", help=argparse.SUPPRESS)
    ap.add_argument("--_ctx", help=argparse.SUPPRESS)
    ap.add_argument("--_compile", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._stage:
        return child_main(args._stage, json.loads(args._ctx))
    if args._compile:
        return compile_child(json.loads(args._compile))

    out = Path(args.out or os.environ.get("OUT") or BENCH / "results" / "gpu_check")
    out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        doc = {"schema": SCHEMA, "merged_from": [], "stages": {}}
        for path in args.merge:
            d = json.loads(Path(path).read_text())
            doc["merged_from"].append({"file": str(path), "started": d.get("started"), "quick": d.get("quick"),
                                       "stages": list(d.get("stages", {}))})
            doc["quick"] = doc.get("quick", False) or d.get("quick", False)
            doc["stages"].update(d.get("stages", {}))
            if d.get("numba_warm_up"):
                doc["numba_warm_up"] = d["numba_warm_up"]
        write_outputs(doc, out)
        print(summary(doc), end="")
        if not (args.out or os.environ.get("OUT")):
            keep_as_result(doc, out, Path(tempfile.mkdtemp(prefix="hetrl_gpu_check_")))
        return 0

    stages = parse_stages(args.stages)
    end = time.time() + args.max_s if args.max_s else None
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="hetrl_gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    old = out / "gpu_check.json"
    doc = json.loads(old.read_text()) if old.exists() else {}
    kept = [s for s in doc.get("stages", {}) if s not in stages]
    doc.update(schema=SCHEMA, started=time.strftime("%Y-%m-%d %H:%M:%S"), quick=args.quick,
               command=" ".join(["benchmarks/gpu_check.py", *sys.argv[1:]]), stages_run=stages,
               stages_kept_from_before=kept, budgets_s=dict(BUDGETS_S), work=str(work))
    doc.setdefault("stages", {})
    print(f"gpu_check: stages {', '.join(stages)} -> {out} (scratch {work})", flush=True)
    logs = []
    warm, procs = start_warm_up(stages, work)
    doc.pop("numba_warm_up", None)
    try:
        for name in stages:
            rec = run_stage(name, args, work, out, end, warm)
            doc["stages"][name] = rec
            try:
                logs.append(f"===== stage {name} =====\n"
                            + (work / f"stage_{name}.log").read_text(errors="replace")[-200_000:])
            except OSError:
                pass
            write_outputs(doc, out)
            (out / "gpu_check_logs.txt").write_text("\n".join(logs))
    finally:
        if warm:
            doc["numba_warm_up"] = stop_warm_up(warm, procs, work)
            for name in warm:
                try:
                    logs.append(f"===== numba's compile of the {name} kernel =====\n"
                                + (work / f"numba_warm_{name}.log").read_text(errors="replace")[-20_000:])
                except OSError:
                    pass
            write_outputs(doc, out)
            (out / "gpu_check_logs.txt").write_text("\n".join(logs))
    print(summary(doc), end="")
    print(f"gpu_check: wrote {out}/gpu_check.json, gpu_check.txt (+ plots, logs)")
    if not (args.out or os.environ.get("OUT")):
        keep_as_result(doc, out, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
