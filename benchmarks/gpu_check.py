#!/usr/bin/env python
"""The GPU check: hetrl's CUDA paths, learner speed, planner and peers on a GPU machine, in one command.

    python benchmarks/gpu_check.py [--quick] [--out DIR] [--stages a,b,c,d,e,f] [--max-s S]
    python benchmarks/gpu_check.py --merge A/gpu_check.json B/gpu_check.json [--out DIR]

Stages (letters or names), each in its own process group under a wall budget; a stage that
fails, runs out of time or lacks its imports is recorded with the reason, and the rest go on:

  a env      torch and CUDA versions, the GPU, CPU count, which packages import
  b tests    `pytest -m gpu -q` (the tests marked gpu): pass / fail / skip counts and the tail
  c learner  updates/s of the learner alone: DQN CartPole-v1, DDPG / TD3 / SAC Pendulum-v1 and the
             CNN learner of DQN ALE/Breakout-v5 at their presets, timed as the planner profiles it (hetrl.planner.profile.learn_timing on
             synthetic_batch): CPU 1 thread, CUDA eager, CUDA with the update captured in a CUDA
             graph (torch.cuda.graph on the existing algorithm object) and torch.compile
             (mode="reduce-overhead"); both checked against the eager update
  d planner  `hetrl profile` + `hetrl plan` (also pinned to cuda and to cpu) for DQN CartPole-v1 and
             DDPG Pendulum-v1, then `hetrl train` under the default plan (DQN 20k env steps, DDPG 5k
             with learning_starts 1000): measured vs predicted env steps/s, evaluation returns
  e sb3      Stable-Baselines3 vs hetrl (inline), DQN CartPole-v1 preset, 20k env steps, on cuda and
             on cpu (benchmarks/sb3_preset.py builds the SB3 model)
  f sweep    local schedule on bench_local's HeavyCartPole-v1 (+0.2 ms CPU per step), actors
             1, 2, 4, 8, 15: env steps/s without the rate limiter and at the preset's replay ratio

--quick makes every workload about 10x smaller (env steps, timing caps, a quick profile grid) to
smoke-test the script on a CPU-only machine, where what needs CUDA records "skipped: no CUDA". The
wall budgets (BUDGETS_S) stay; --max-s bounds the whole invocation (each stage gets at most what
is left). Writes, in DIR (--out, else $OUT, else benchmarks/results/gpu_check): gpu_check.json
(everything), gpu_check.txt (the summary), gpu_check_learner.png, gpu_check_sweep.png and
gpu_check_logs.txt (the stages' output); run directories, logs and the profile cache go to a
scratch folder (--work). An existing gpu_check.json in DIR is merged: stages not run now are kept.
See docs/gpu.md for running it all in two parts on an offline GPU machine.
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
SCHEMA = "hetrl-gpu-check/1"

# (letter, name, wall budget in seconds on the GPU machine); the two parts of docs/gpu.md
# run a,b,c,e (540 s) and a,d,f (540 s)
STAGES = [("a", "env", 30), ("b", "tests", 120), ("c", "learner", 240), ("d", "planner", 300),
          ("e", "sb3", 150), ("f", "sweep", 210)]
BUDGETS_S = {name: s for _, name, s in STAGES}
LEARNER_CASES = [("dqn", "CartPole-v1"), ("ddpg", "Pendulum-v1"), ("td3", "Pendulum-v1"), ("sac", "Pendulum-v1"),
                 ("dqn", "ALE/Breakout-v5")]   # the Nature CNN learner on 4 x 84 x 84 frames (needs ale-py)
PLAN_CASES = [("dqn", "CartPole-v1", 20_000, {}), ("ddpg", "Pendulum-v1", 5_000, {"learning_starts": 1000})]
SB3_STEPS = 20_000
SWEEP_ACTORS = (1, 2, 4, 8, 15)
SWEEP_STEPS = 20_000
SWEEP_ENV = "benchmarks.bench_local:HeavyCartPole-v1"
PACKAGES = ["hetrl", "numpy", "numba", "gymnasium", "stable_baselines3", "ale_py", "ray", "rich", "tensorboard",
            "matplotlib", "yaml", "pytest", "pytest_timeout", "pynvml", "triton", "cloudpickle", "pandas"]


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
                 "tests"], left(ctx) - 5)
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


# --- stage c: the learner alone --------------------------------------------------------------------------
class CompiledLearn:
    """torch.compile(algo.learn, mode="reduce-overhead") on the existing object (CUDA graphs by inductor)."""

    def __init__(self, algo):
        import torch

        self.algo = algo
        self.fn = torch.compile(algo.learn, mode="reduce-overhead")

    def learn(self, batch, wts):
        return self.fn(batch, wts)


def _params(algo) -> list:
    return [p.detach() for name in type(algo).nets for p in getattr(algo, name).parameters()]


def _max_diff(a: list, b: list) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b)) if a else 0.0


def atari_spaces(env: str, cfg):
    """The spaces of an Atari id after hetrl's preprocessing (grayscale square frames, stacked), without
    OpenCV, which the GPU machine lacks (its wheel is larger than what travels there): the learner is
    timed on synthetic batches, so only the shapes and the action count matter."""
    import ale_py
    import gymnasium as gym
    import numpy as np

    gym.register_envs(ale_py)
    n = cfg.atari_screen_size
    return gym.spaces.Box(0, 255, (cfg.frame_stack, n, n), np.uint8), gym.make(env).action_space


def stage_learner(ctx: dict, rec: Rec) -> None:
    require("gymnasium")
    import warnings
    from dataclasses import replace

    import torch

    from hetrl.actors import probe_spaces
    from hetrl.actors.envs import prepare_env
    from hetrl.algos import fastpath, make_algorithm, replay_spec
    from hetrl.config import atari_id, make_config
    from hetrl.errors import UsageError
    from hetrl.planner.profile import learn_timing, synthetic_batch
    from hetrl.runtime.layout import grads_per_phase, group_size

    warnings.filterwarnings("ignore", message=".*capturable=True.*")
    quick, cuda = ctx["quick"], torch.cuda.is_available()
    cap = 0.2 if quick else 2.0   # run_profile's cap_s (quick: its quick settings)
    mkw = {"min_rounds": 4, "window": 3, "min_round_s": 0.003} if quick else {}
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    rec["how"] = ("seconds per gradient step of algo.learn on a synthetic batch at the preset's batch size, "
                  "hetrl.planner.profile.learn_timing (CPU: CPU time of the process, 1 thread; CUDA: wall time, "
                  f"synchronize per round), cap {cap} s per figure; k = gradient steps per learn call")
    rec["cuda"] = cuda
    rec["cases"] = {}
    rec.save()
    compile_queue = []

    for algo_name, env in LEARNER_CASES:
        if atari_id(env) and importlib.util.find_spec("ale_py") is None:
            rec["cases"][f"{algo_name} {env}"] = {"skipped": "ale-py is not installed", "variants": {}}
            continue
        cfg = make_config(algo_name, env, {"fastpath": False})
        try:
            obs_space, act_space = probe_spaces(prepare_env(env, cfg))   # Atari: the preprocessed, stacked frames
        except UsageError:
            if not atari_id(env):
                raise
            obs_space, act_space = atari_spaces(env, cfg)   # no OpenCV there: the shapes are all the learner needs
        spec = replay_spec(obs_space, act_space)
        B = cfg.batch_size
        K = group_size(grads_per_phase(cfg), cfg.prioritized)   # local schedule's steps per learn call
        kg = cfg.policy_delay if algo_name == "td3" else 1   # steps per captured call (hetrl/algos/graphed.py: applies)
        case = rec["cases"][f"{algo_name} {env}"] = {"batch_size": B, "net_arch": list(cfg.net_arch), "group_k": K,
                                                     "variants": {}}
        V = case["variants"]

        def build(dev: str, fast: bool = False, seed: int = 0, cfg=cfg, obs_space=obs_space, act_space=act_space):
            torch.manual_seed(seed)
            return make_algorithm(replace(cfg, fastpath=fast), obs_space, act_space, dev)

        def timed(name: str, dev: str, k: int, fast: bool = False, wrap=None, check=None) -> None:
            if dev != "cpu" and not cuda:
                V[name] = {"skipped": "no CUDA"}
                return
            if fast and not (fastpath.available() and algo_name in ("dqn", "ddpg")):
                V[name] = {"skipped": "no fast path for this algorithm / torch"}
                return
            if left(ctx) < (5 if quick else 15):
                V[name] = {"skipped": "stage budget spent"}
                return
            try:
                torch.manual_seed(1)
                batch, wts = synthetic_batch(spec, act_space, B, k, dev)
                algo = build(dev, fast)
                if fast and getattr(algo, "fast", None) is None:   # e.g. a CNN: the public path, timed already
                    V[name] = {"skipped": "the fast path declines this network"}
                    return
                t0 = time.perf_counter()
                runner = wrap(algo, batch, wts) if wrap else algo
                setup_s = time.perf_counter() - t0
                checked = check(runner, batch, wts, dev, fast) if check else None   # before timing moves it on
                t = learn_timing(runner, batch, wts, dev, k, cap_s=cap, **mkw)
                V[name] = {"device": dev, "k": k, "fastpath": fast, "s_per_update": t.s,
                           "updates_per_s": 1.0 / t.s if t.s > 0 else None, "spread": round(t.spread, 4),
                           "stable": t.stable, "rounds": t.rounds}
                if wrap:
                    V[name]["setup_s"] = round(setup_s, 3)
                if checked is not None:
                    V[name]["check"] = checked
                print(f"{algo_name} {name}: {V[name]['updates_per_s']:,.0f} updates/s"
                      + (f", check {checked}" if checked else ""), flush=True)
            except Exception as e:  # noqa: BLE001
                V[name] = {"error": f"{type(e).__name__}: {e}"[:500], "traceback": traceback.format_exc()[-1500:]}
                print(f"{algo_name} {name}: {traceback.format_exc()}", flush=True)
            rec.save()

        def against_eager(runner, batch, wts, dev, fast, warmup=1) -> dict:
            """The captured update vs the eager one from the same start: a second object built with
            the same seed takes the update the first replay took, then one more step each, the
            random draws (TD3's smoothing noise, SAC's sampling) from the same generator state."""
            ref = build(dev, fast)
            torch.manual_seed(1)
            for _ in range(warmup):
                ref.learn(batch, wts)
            torch.manual_seed(7)
            want = ref.learn(batch, wts)
            torch.manual_seed(7)
            got = runner.learn(batch, wts)
            torch.cuda.synchronize()
            d_td, d_p = float((want - got).abs().max()), _max_diff(_params(ref), _params(runner.algo))
            scale = max(1e-6, float(want.abs().max()))
            ok = d_td <= 1e-4 * scale + 1e-5 and d_p <= 1e-5
            return {"match": ok, "max_abs_diff_td": d_td, "max_abs_diff_params": d_p,
                    "note": "" if ok or algo_name in ("dqn", "ddpg") else "random draws may differ under capture"}

        def graphed(algo, batch, wts):   # hetrl's own (the learner core's cuda_graph=true)
            from hetrl.algos.graphed import GraphedLearner

            torch.manual_seed(1)
            runner = GraphedLearner(algo)
            runner.learn(batch, wts)    # the capture (state restored after it), then its replay: one update
            return runner

        timed("cpu_1t", "cpu", 1)
        timed("cpu_1t_fastpath", "cpu", 1, fast=True)
        if K > 1:
            timed(f"cpu_1t_k{K}", "cpu", K)
        timed("cuda_eager", "cuda", 1)
        timed("cuda_eager_fastpath", "cuda", 1, fast=True)   # the planner gives a CUDA learner the CPU's choice
        if K > 1:
            timed(f"cuda_eager_k{K}", "cuda", K)
        timed("cuda_graph" if kg == 1 else f"cuda_graph_k{kg}", "cuda", kg, wrap=graphed, check=against_eager)
        if K > 1:
            timed(f"cuda_graph_k{K}", "cuda", K, wrap=graphed, check=against_eager)
        compile_queue.append((case, build, spec, act_space, B, kg, algo_name))

    # torch.compile last: it can take minutes; each algorithm only while the budget lasts
    for case, build, spec, act_space, B, kg, algo_name in compile_queue:
        name = "cuda_compile" if kg == 1 else f"cuda_compile_k{kg}"
        V = case["variants"]
        if not cuda:
            V[name] = {"skipped": "no CUDA"}
            continue
        if left(ctx) < 60:
            V[name] = {"skipped": "stage budget spent (torch.compile needs a minute or more)"}
            continue
        try:
            torch.manual_seed(1)
            batch, wts = synthetic_batch(spec, act_space, B, kg, "cuda")
            try:  # per algorithm: dynamo's counters are global (private API; informative only)
                from torch._dynamo.utils import counters

                counters.clear()
            except Exception:  # noqa: BLE001
                pass
            algo = build("cuda")
            runner = CompiledLearn(algo)
            t0 = time.perf_counter()
            torch.manual_seed(1)
            for _ in range(3):          # compile, then cudagraph-tree warm-up and recording
                runner.learn(batch, wts)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            ref = build("cuda")
            torch.manual_seed(1)
            for _ in range(3):
                ref.learn(batch, wts)
            torch.cuda.synchronize()
            d_p = _max_diff(_params(ref), _params(algo))
            t = learn_timing(runner, batch, wts, "cuda", kg, cap_s=cap, **mkw)
            V[name] = {"device": "cuda", "k": kg, "s_per_update": t.s, "updates_per_s": 1.0 / t.s if t.s > 0 else None,
                       "spread": round(t.spread, 4), "stable": t.stable, "compile_s": round(compile_s, 2),
                       "check": {"max_abs_diff_params_after_3_calls": d_p, "match": d_p <= 1e-4,
                                 "note": "inductor may reorder float sums; TD3/SAC draw other random numbers"}}
            try:  # how often dynamo split or recompiled (private counters; informative only)
                from torch._dynamo.utils import counters

                V[name]["graph_breaks"] = int(sum(counters["graph_break"].values()))
                V[name]["unique_graphs"] = int(counters["stats"].get("unique_graphs", 0))
                V[name]["cudagraph_skips"] = int(counters["inductor"].get("cudagraph_skips", 0))
            except Exception:  # noqa: BLE001
                pass
            print(f"{algo_name} {name}: {V[name]}", flush=True)
        except Exception as e:  # noqa: BLE001
            V[name] = {"error": f"compile_failed: {type(e).__name__}: {e}"[:500],
                       "traceback": traceback.format_exc()[-1500:]}
            print(f"{algo_name} {name}: {traceback.format_exc()}", flush=True)
        rec.save()
    rec.save()
    try:
        plot_learner(rec, Path(ctx["out"]) / "gpu_check_learner.png")
        rec["plot"] = "gpu_check_learner.png"
    except Exception as e:  # noqa: BLE001
        rec["plot_error"] = f"{type(e).__name__}: {e}"


def plot_learner(rec: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = rec["cases"]
    names = []
    for c in cases.values():
        for n, v in c["variants"].items():
            if v.get("updates_per_s") and n not in names:
                names.append(n)
    if not names:
        return
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cases)), 4))
    w = 0.8 / len(names)
    for i, n in enumerate(names):
        ys = [c["variants"].get(n, {}).get("updates_per_s") or 0 for c in cases.values()]
        ax.bar([j + i * w for j in range(len(cases))], ys, w, label=n)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(cases))])
    ax.set_xticklabels(list(cases), fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("gradient steps / s (learner alone)")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("learner updates/s at the presets' batch sizes", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


# --- stage d: profile, plan, train --------------------------------------------------------------------------
def _sets(d: dict) -> list[str]:
    out = []
    for k, v in d.items():
        out += ["--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    return out


def _last_json(text: str):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def _plan_brief(p: dict) -> dict:
    if not p:
        return {}
    pl, pr = p.get("plan", {}), p.get("predicted", {})
    return {"plan": pl, "settings": p.get("settings"), "predicted_env_steps_per_s": pr.get("env_steps_per_s"),
            "predicted_gradient_steps_per_s": pr.get("gradient_steps_per_s"), "bound": pr.get("bound"),
            "bottleneck": p.get("bottleneck"), "candidates": p.get("candidates"),
            "fastpath": (p.get("profile") or {}).get("fastpath"),
            "runners_up": [{"plan": r["plan"], "env_steps_per_s": r["predicted"].get("env_steps_per_s")}
                           for r in p.get("runners_up", [])[:5]]}


RESULT_KEYS = ["schedule", "device", "actors", "envs_per_actor", "env_steps", "gradient_steps", "wall_s",
               "env_steps_per_s", "env_steps_per_s_learning", "predicted_env_steps_per_s", "train_samples_per_s",
               "learner_busy_fraction", "replay_ratio_achieved", "policy_lag_mean", "eval_return_mean",
               "eval_return_std", "best_select_return_mean", "best_env_steps", "policy", "peak_rss_mb",
               "gpu_max_memory_allocated_mb", "interrupted"]


def stage_planner(ctx: dict, rec: Rec) -> None:
    require("gymnasium")
    quick, cuda = ctx["quick"], cuda_ok()
    py = [sys.executable, "-m", "hetrl.cli"]
    rec["cases"] = {}
    for algo, env, steps, sets in PLAN_CASES:
        if quick:
            steps = steps // 10
            sets = {**sets, **({"learning_starts": min(sets["learning_starts"], steps // 3)}
                               if "learning_starts" in sets else {})}
        c = rec["cases"][f"{algo} {env}"] = {"steps": steps, "sets": sets}
        rec.save()
        q = ["--quick"] if quick else []
        base = [algo, "--env", env, *_sets(sets)]
        r = run_cmd([*py, "profile", *base, *q, "--json"], left(ctx) - 5)
        prof = _last_json(r["stdout"])
        c["profile"] = {"cmd": r["cmd"], "rc": r["rc"], "wall_s": r["wall_s"]}
        if prof:
            c["profile"].update(devices=prof.get("devices"), machine=prof.get("machine"),
                                profile_s=prof.get("profile_s"), fastpath=prof.get("fastpath"),
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
            r = run_cmd([*py, "plan", *base, *pin, *q, "--json"], left(ctx) - 5)
            p = _last_json(r["stdout"])
            plans[label] = _plan_brief(p) if p else {"error": (r["stderr"] or r["stdout"])[-2000:], "rc": r["rc"]}
        c["plans"] = plans
        rec.save()
        run_dir = Path(ctx["work"]) / "runs" / f"{algo}-{env}"
        cmd = [*py, "train", algo, "--env", env, "--steps", str(steps), *_sets(sets), "--out", str(run_dir),
               "--force", "--no-progress"]
        if quick:   # a quick profile does not cover what --plan auto measures: run the quick plan's settings
            d = plans.get("default") or {}
            fixed = {**(d.get("settings") or {}), "fastpath": bool((d.get("fastpath") or {}).get("chosen", False))}
            cmd += ["--plan", "none", *_sets({k: v for k, v in fixed.items() if k != "num_envs"})]
            c["train_how"] = "quick: --plan none with the quick plan's settings (a quick profile does not cover --plan auto's)"
        else:
            c["train_how"] = "hetrl train under the default plan (--plan auto, the profile cached above)"
        if left(ctx) < 20:
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


STAGE_FNS = {"env": stage_env, "tests": stage_tests, "learner": stage_learner, "planner": stage_planner,
             "sb3": stage_sb3, "sweep": stage_sweep}


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


def run_stage(name: str, args, work: Path, out: Path, end: float | None) -> dict:
    budget = BUDGETS_S[name]
    if end is not None:
        budget = min(budget, end - time.time())
    if budget < 5:
        return {"status": "skipped", "reason": "skipped: --max-s leaves no time for it", "budget_s": 0}
    ctx = {"quick": args.quick, "work": str(work), "out": str(out), "deadline": time.time() + budget - 3}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("HETRL_CACHE_DIR", str(work / "cache"))   # a fresh profile, taken on this machine
    env.update(PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    stage_json, log = work / f"stage_{name}.json", work / f"stage_{name}.log"
    stage_json.unlink(missing_ok=True)
    t0 = time.time()
    print(f"gpu_check: stage {name} (budget {budget:.0f} s) ...", flush=True)
    with open(log, "w") as f:
        p = subprocess.Popen([sys.executable, "-u", str(Path(__file__).resolve()), "--_stage", name,
                              "--_ctx", json.dumps(ctx)], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
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
    for name, fn in (("env", _sum_env), ("tests", _sum_tests), ("learner", _sum_learner),
                     ("planner", _sum_planner), ("sb3", _sum_sb3), ("sweep", _sum_sweep)):
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


def _sum_learner(r: dict) -> list[str]:
    out = [f"[learner] gradient steps/s of the learner alone ({'CUDA' if r.get('cuda') else 'no CUDA'}); "
           "k = steps per learn call; graph/compile: checked against eager"]
    for case, c in (r.get("cases") or {}).items():
        parts = [f"skipped: {c['skipped']}"] if c.get("skipped") else []
        for n, v in c.get("variants", {}).items():
            if v.get("updates_per_s"):
                chk = v.get("check") or {}
                mark = "" if not chk else (" ok" if chk.get("match") else " MISMATCH")
                extra = f", compile {v['compile_s']:.0f} s" if v.get("compile_s") is not None else ""
                parts.append(f"{n} {v['updates_per_s']:,.0f}{mark}{extra}")
            elif v.get("error"):
                parts.append(f"{n} ERROR {v['error'][:80]}")
            elif v.get("skipped"):
                parts.append(f"{n} skipped: {v['skipped']}")
        out.append(f"  {case} (B={c.get('batch_size')}, {c.get('net_arch')}): " + "; ".join(parts))
    return out


def _sum_planner(r: dict) -> list[str]:
    out = ["[planner] hetrl profile + plan + train (measured env steps/s while learning vs the plan's prediction)"]
    for case, c in (r.get("cases") or {}).items():
        prof = c.get("profile", {})
        out.append(f"  {case}: profile rc {prof.get('rc')} in {_fmt(prof.get('wall_s'))} s, devices "
                   f"{prof.get('devices')}, cuda considered: {c.get('considered_cuda')}")
        for label, p in (c.get("plans") or {}).items():
            if p.get("plan"):
                pl = p["plan"]
                out.append(f"    plan {label:<7}: {pl.get('schedule')} {pl.get('actors')}x{pl.get('envs_per_actor')} "
                           f"learner {pl.get('learner_device')} ({pl.get('threads')} thr) predicted "
                           f"{_fmt(p.get('predicted_env_steps_per_s'))} env steps/s; {str(p.get('bottleneck'))[:90]}")
            else:
                out.append(f"    plan {label:<7}: {p.get('skipped') or str(p.get('error'))[:120]}")
        t = c.get("train") or {}
        res = t.get("result") or {}
        if res:
            out.append(f"    train {c.get('steps'):,} steps ({res.get('schedule')}, {res.get('device')}): "
                       f"{_fmt(res.get('env_steps_per_s_learning'))} env steps/s learning vs predicted "
                       f"{_fmt(t.get('predicted_env_steps_per_s'))} = {_fmt(t.get('measured_over_predicted'), 2)}x; "
                       f"whole run {_fmt(res.get('env_steps_per_s'))}; eval return {_fmt(res.get('eval_return_mean'), 1)} "
                       f"+- {_fmt(res.get('eval_return_std'), 1)}")
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="~10x smaller workloads: a smoke test (CPU-only machines too)")
    ap.add_argument("--out", help="where the JSON, summary, plots and logs go (default $OUT, else "
                                  "benchmarks/results/gpu_check)")
    ap.add_argument("--stages", default="a,b,c,d,e,f", help="letters or names, e.g. a,b,c,e (default: all)")
    ap.add_argument("--max-s", type=float, help="wall seconds for this whole invocation (stages get what is left)")
    ap.add_argument("--work", help="scratch folder for run directories, logs and the profile cache (default: a new "
                                   "temporary folder)")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="merge gpu_check.json files of several calls "
                                                               "(later files win per stage) into --out; runs nothing")
    ap.add_argument("--_stage", help=argparse.SUPPRESS)
    ap.add_argument("--_ctx", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._stage:
        return child_main(args._stage, json.loads(args._ctx))

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
        write_outputs(doc, out)
        print(summary(doc), end="")
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
    for name in stages:
        rec = run_stage(name, args, work, out, end)
        doc["stages"][name] = rec
        try:
            logs.append(f"===== stage {name} =====\n" + (work / f"stage_{name}.log").read_text(errors="replace")[-200_000:])
        except OSError:
            pass
        write_outputs(doc, out)
        (out / "gpu_check_logs.txt").write_text("\n".join(logs))
    print(summary(doc), end="")
    print(f"gpu_check: wrote {out}/gpu_check.json, gpu_check.txt (+ plots, logs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
