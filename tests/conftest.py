import os
from pathlib import Path

import pytest
import torch

# one BLAS thread per test process keeps timings and results stable on the 2-core CI machine
torch.set_num_threads(1)
os.environ.setdefault("HETRL_TEST", "1")

# The compiled learner kernel compiled into numba's on-disk cache before any test runs (`hetrl warm`, which
# `make install` runs: seconds where it is cached, minutes where it is not), in three
# processes side by side: otherwise every test process that meets it first (test workers, local actors, Ray workers)
# compiles it at the same time.
def pytest_configure(config):
    if hasattr(config, "workerinput"):   # the controlling process only
        return
    if hasattr(config.option, "loadscopereorder"):   # xdist: hand out files in LONGEST_FIRST's order (below)
        config.option.loadscopereorder = False
    if os.environ.get("HETRL_TEST_NO_WARM"):
        return
    from hetrl.kernels.compiled.warm import warm

    warm(timeout=600)   # a failure here shows again, with its message, in the tests of the kernel


# The longest files first: pytest-xdist hands whole files to its workers in collection order, so a long file
# collected last would run alone at the end while the other worker idles. (xdist's own order, by its default
# --loadscope-reorder, is by number of tests per file: the few long Ray and learning tests would come last;
# pytest_configure turns it off.)
LONGEST_FIRST = ("test_ray.py", "test_algorithm_contract.py", "test_kernel_compiled.py", "test_local.py",
                 "test_sac_td3.py", "test_atari.py", "test_ray_cluster.py", "test_population.py", "test_learning.py",
                 "test_onpolicy_runs.py", "test_local_lifecycle.py", "test_onpolicy_sb3.py", "test_sb3_api.py",
                 "test_plan_preset.py", "test_crossq.py", "test_atari_envpool.py", "test_cli.py", "test_sb3_surface.py",
                 "test_ray_start.py", "test_obs_spaces.py", "test_compiler.py", "test_planner_busy.py",
                 "test_params.py", "test_kernel_layers.py", "test_planner_profile.py", "test_kernels.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # stable: a file's tests keep their order


# One Ray on loopback per test process, started by the first test that asks for it and shared by every file that
# process runs (each start costs seconds); a test that needs Ray stopped or another cluster (test_ray_start.py,
# test_ray_cluster.py) shuts it down, and the next test that asks starts it again.
_RAY = {}


def _our_ray(ray) -> bool:
    return ray.is_initialized() and ray.get_runtime_context().gcs_address == _RAY.get("gcs")


@pytest.fixture
def local_ray(_ray_at_exit):
    """Ray, started here with 2 CPUs on loopback unless this process's is running (another left by a test is stopped
    first). Its workers import the modules of this folder by name (docs/extending.md's example): Ray adds the
    driver script's folder and the current one to their path by itself, and pytest's are neither."""
    ray = pytest.importorskip("ray")
    if not _our_ray(ray):
        if ray.is_initialized():
            ray.shutdown()
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="warning",
                 job_config=ray.job_config.JobConfig(code_search_path=[str(Path(__file__).parent)]))
        _RAY["gcs"] = ray.get_runtime_context().gcs_address
    return ray


@pytest.fixture(scope="session")
def _ray_at_exit():
    yield
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and _our_ray(ray):
        ray.shutdown()


@pytest.fixture
def tiny():
    """Settings for a fast DQN run on CartPole (seconds, not minutes)."""
    return dict(steps=600, learning_starts=200, train_freq=100, gradient_steps=10, batch_size=32,
                buffer_size=1000, net_arch=[32, 32], num_envs=4, eval_episodes=0, threads=1)


class _StopAt:
    """A callback that stops a run at the first phase boundary at or past `steps` env steps (as Ctrl-C would)."""

    def __init__(self, steps: int):
        self.steps = steps

    def phase(self, run, episodes):
        return run.env_steps < self.steps


@pytest.fixture
def stop_at():
    """stop_at(steps): a callback that stops a run at the first phase boundary at or past `steps` env steps."""
    return _StopAt
