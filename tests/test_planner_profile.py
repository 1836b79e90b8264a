"""The profiler on the real CPU (tiny grid), its cache, and the power readers (mocked where absent)."""

import json

import pytest

from hetrl.config import make_config
from hetrl.planner import plan
from hetrl.planner.measure import measure
from hetrl.planner.power import (RaplReader, cpu_power, device_power, estimate_cpu_power, estimate_gpu_power,
                                 gpu_power)
from hetrl.planner.profile import PREFETCH_MARGIN, cache_dir, cache_path, load_or_profile

TINY = dict(net_arch=[32, 32], batch_size=32, buffer_size=2000, train_freq=16, gradient_steps=8, num_envs=2)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HETRL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cache_dir_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv("HETRL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "hetrl"
    monkeypatch.setenv("HETRL_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"


def test_measure_reports_a_spread():
    t = measure(lambda: sum(range(100)), cap_s=0.3, min_round_s=0.001)
    assert t.s > 0 and t.rounds >= 2 and t.spread >= 0 and t.calls >= 1


def test_profile_writes_rereads_and_refreshes_its_cache(cache):
    cfg = make_config("dqn", "CartPole-v1", {**TINY, "priority_lag": 1})   # (a lag that lets PER prefetch)
    t1 = load_or_profile(cfg, quick=True)
    path = cache_path(cfg)
    assert path.exists() and path.parent == cache and not t1.from_cache
    doc = json.loads(path.read_text())
    assert doc["format"] == "hetrl-profile/15" and doc["learner_kernel"]["cpu"]["name"] in ("public", "compiled")
    assert doc["machine"]["cores"] >= 1
    for section in ("env", "act", "infer", "learn", "ds_insert", "ds_gather", "rm_sample", "rm_update",
                    "transfer", "power"):
        assert doc[section], section
    assert set(doc["env"]) == {"1", "2"}
    # the local schedule's learner loop, with and without its prefetch thread, for both kinds of replay; prioritized
    # replay's only where its priority lag leaves room for a prefetch (exact PER, the default, never prefetches)
    assert set(doc["prefetch"]) == set(doc["grid"]["prefetch"]) == {"uniform:8", "prioritized:1"}  # TINY: 8 steps a phase
    from hetrl.planner.profile import grid_for

    assert grid_for(make_config("dqn", "CartPole-v1", TINY), quick=True)["prefetch"] == ["uniform:8"]
    for name, p in doc["prefetch"].items():
        assert p["serial_s"] > 0 and p["prefetch_s"] > 0
        assert p["chosen"] == (p["prefetch_s"] < (1 - PREFETCH_MARGIN) * p["serial_s"])
    entry = doc["learn"]["cpu"]["1"]["32"]
    assert entry["s"] > 0 and "spread" in entry and "stable" in entry
    assert doc["power"]["cpu"]["source"] in ("rapl", "estimated")
    # re-read: the same file, not measured again
    doc["marker"] = 1
    path.write_text(json.dumps(doc))
    t2 = load_or_profile(cfg, quick=True)
    assert t2.from_cache and t2.data.get("marker") == 1
    # the cached table answers a plan without measuring
    r = plan(cfg, profile=t2)
    assert r.predicted_env_steps_per_s > 0 and r.plan.learner_device == "cpu"
    # --refresh measures again and replaces the file
    t3 = load_or_profile(cfg, refresh=True, quick=True)
    assert not t3.from_cache and "marker" not in json.loads(path.read_text())
    # a corrupt cache is measured again, not an error
    path.write_text("{not json")
    assert not load_or_profile(cfg, quick=True).from_cache


def test_profile_of_a_continuous_action_env(cache):
    cfg = make_config("ddpg", "Pendulum-v1", {**TINY, "num_envs": 1})
    t = load_or_profile(cfg, quick=True)
    assert t.key["action"].startswith("box")
    # obs 3 + action 1 + next_obs 3 floats, reward float, 2 bools, uint8 steps
    assert t.bytes_per_transition == 4 * (3 + 1 + 3 + 1) + 3


# --- power ---------------------------------------------------------------------------------------
class FakeRapl(RaplReader):
    """Package counters that advance 5 J per idle read pair and 15 J per busy pair (1 core)."""

    def __init__(self, wrap=False):
        self.domains = [(None, 1e9)]  # the counter wraps at 1e9 uJ
        self.seq = iter(([999_000_000.0, 4_000_000.0] if wrap else [0.0, 5e6]) + [10e6, 25e6])

    def _raw(self):
        return [next(self.seq)]


def test_rapl_reader_finds_package_domains(tmp_path):
    for name, uj in (("intel-rapl:0", "123"), ("intel-rapl:0:0", "7"), ("intel-rapl:1", "5")):
        d = tmp_path / name
        d.mkdir()
        (d / "energy_uj").write_text(uj)
        (d / "max_energy_range_uj").write_text("262143328850")
    r = RaplReader(str(tmp_path))
    assert r.available and len(r.domains) == 2
    assert not RaplReader(str(tmp_path / "absent")).available


def test_cpu_power_from_rapl(monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)
    monkeypatch.setattr("hetrl.planner.power._spin", lambda s: None)
    p = cpu_power("Some CPU", 2, FakeRapl(), seconds=0.0)
    assert p.source == "rapl" and p.idle_w > 0 and p.busy_w > 0
    wrapped = cpu_power("Some CPU", 2, FakeRapl(wrap=True), seconds=0.0)
    assert wrapped.source == "rapl" and wrapped.idle_w > 0   # 999 J -> 4 J across the wrap at 1000 J


def test_cpu_power_is_estimated_without_rapl():
    class NoRapl:
        available = False
    p = cpu_power("Intel(R) Xeon(R) Processor", 2, NoRapl())
    assert p.source == "estimated" and p.busy_w > 0 and "default" in p.note
    known = estimate_cpu_power("AMD EPYC 7763 64-Core Processor", 128)
    assert known.busy_w == pytest.approx(280 / 64) and "EPYC 7763" in known.note


class FakeNvml:
    def __init__(self, fail=False):
        self.fail = fail

    def nvmlInit(self):
        if self.fail:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000  # mW

    def nvmlDeviceGetPowerUsage(self, h):
        return 75_000


def test_gpu_power_from_nvml_else_the_table():
    p = gpu_power(0, "NVIDIA H200", FakeNvml())
    assert (p.source, p.busy_w, p.idle_w) == ("nvml", 700.0, 75.0)
    q = gpu_power(0, "NVIDIA H200", FakeNvml(fail=True))
    assert q.source == "estimated" and q.busy_w == 700.0
    assert estimate_gpu_power("Tesla T4").busy_w == 70.0
    assert estimate_gpu_power("Mystery Accelerator").source == "estimated"


def test_device_power_covers_every_device():
    class NoRapl:
        available = False
    out = device_power(["cpu", "cuda:0"], {"cpu_model": "x", "cores": 4, "gpus": ["NVIDIA A100-SXM4-80GB"]},
                       rapl=NoRapl(), nvml=FakeNvml(fail=True))
    assert out["cpu"].source == "estimated" and out["cuda:0"].busy_w == 400.0


# --- devices ---------------------------------------------------------------------------------------
import torch  # noqa: E402

from hetrl.errors import UsageError  # noqa: E402
from hetrl.planner.profile import run_profile  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_profiling_an_absent_gpu_is_a_usage_error():
    with pytest.raises(UsageError, match="CUDA is not available"):
        run_profile(make_config("dqn", "CartPole-v1", TINY), devices=["cpu", "cuda:0"], quick=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_profile_and_plan_on_a_gpu(cache):
    cfg = make_config("dqn", "CartPole-v1", TINY)
    t = load_or_profile(cfg, quick=True)
    assert "cuda:0" in t.devices
    for section in ("infer", "learn", "ds_insert", "ds_gather", "param_sync"):
        assert "cuda:0" in t.data[section], section
    link = t.data["transfer"]["cpu->cuda:0"]
    assert link["bandwidth_Bps"] > 0 and "pinned" in link and "cuda:0->cpu" in t.data["transfer"]
    assert t.data["power"]["cuda:0"]["source"] in ("nvml", "estimated")
    r = plan(cfg, profile=t, placement="all")
    assert r.predicted_env_steps_per_s > 0
    gpu = plan(cfg, profile=t, pins={"device": "cuda:0"})
    assert gpu.plan.learner_device == "cuda:0" and "cuda:0" in gpu.busy


def test_thread_ratio_is_measured_in_pairs():
    import torch

    from hetrl.planner.measure import measure_threads

    a = torch.randn(256, 256)
    before = torch.get_num_threads()
    t = measure_threads(lambda: a @ a, 2, cap_s=0.5, min_round_s=0.002)
    assert t.s > 0 and t.rounds >= 1 and t.calls >= 1
    assert torch.get_num_threads() == before   # the caller's thread count is restored


def test_a_profile_belongs_to_the_optional_packages_installed():
    """A venv without EnvPool (or numba) must not read a profile made where they were installed: its plan
    would ask for them. Their versions are part of the machine's id, hence of the cache file's name."""
    from hetrl.planner.profile import machine_info

    m = machine_info()
    assert set(m["optional"]) == {"envpool", "numba"}
    other = {**m, "optional": {**m["optional"], "envpool": None if m["optional"]["envpool"] else "0.8.4"}}
    cfg = make_config("dqn", "CartPole-v1")
    assert cache_path(cfg, other) != cache_path(cfg, m)


def test_a_profile_belongs_to_the_blas_kernels_in_force(monkeypatch):
    """OPENBLAS_CORETYPE picks OpenBLAS's kernels (AVX2 or AVX-512: ~2x apart for the compiled learner), so a
    profile measured under one setting is not read under another."""
    from hetrl.planner.profile import machine_info

    cfg = make_config("dqn", "CartPole-v1")
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    haswell = machine_info()
    monkeypatch.setenv("OPENBLAS_CORETYPE", "SkylakeX")
    assert machine_info()["blas_env"]["OPENBLAS_CORETYPE"] == "SkylakeX"
    assert cache_path(cfg, machine_info()) != cache_path(cfg, haswell)
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    assert "OPENBLAS_CORETYPE" not in machine_info()["blas_env"]


def test_the_profile_times_acting_with_the_learner_kernel_it_chose(monkeypatch):
    """The actors and inference the profile times act as the run will: through the chosen kernel's acting
    (its wrap_policy), whichever kernel wins on this machine."""
    import hetrl.actors
    from hetrl import kernels

    built, wrapped = [], []

    class Recording(hetrl.actors.ActorSpec):
        def build(self):
            built.append(self.policy)
            return super().build()

    def recording_build(choice, algo, _build=kernels.build):
        kernel = _build(choice, algo)
        wrap = kernel.wrap_policy
        kernel.wrap_policy = lambda policy: wrapped.append(wrap(policy)) or wrapped[-1]
        return kernel

    monkeypatch.setattr(hetrl.actors, "ActorSpec", Recording)
    monkeypatch.setattr(kernels, "build", recording_build)
    t = run_profile(make_config("dqn", "CartPole-v1", TINY), devices=["cpu"], quick=True)
    assert t.data["learner_kernel"]["cpu"]["name"] in ("public", "compiled")
    assert built and all(any(p is w for w in wrapped) for p in built)


def test_the_profile_times_the_inline_loop_whole(cache):
    """Section ``loop``: a short real inline run of the workload, timed per phase in wall time less the learner's
    updates (the core's own count), per env step; what a plan then reads back."""
    from hetrl.planner.profile import ProfileTable, _pass, grid_for

    cfg = make_config("dqn", "CartPole-v1", {**TINY, "learner_kernel": "public"})
    grid = {**grid_for(cfg, quick=True), "loop": [1]}
    assert grid_for(cfg)["loop"] == grid_for(cfg)["threads"]
    assert grid_for(make_config("ppo", "CartPole-v1"))["loop"] == []   # on-policy: a rollout, not this loop
    data = {"grid": grid}
    _pass(cfg, None, ["cpu"], grid, data, 5.0, 0.3, 0.05, True, lambda msg: None, False, False, None,
          only={("loop", "cpu", "1")})
    e = data["loop"]["cpu"]["1"]
    assert e["envs"] == 2 and e["threads"] == 1 and e["steps_per_phase"] >= 16
    assert e["s"] > 0 and e["act_s"] > 0 and e["grads_per_step"] == pytest.approx(0.5, rel=0.3)
    got = ProfileTable(data).loop("cpu", 2)   # the nearest thread count measured quiet; none under load
    assert (got is None) == bool(e.get("provisional")) and (got is None or got["s"] == e["s"])
