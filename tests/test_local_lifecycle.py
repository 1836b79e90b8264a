"""Life cycle of the local schedule with real signals: `hetrl train --schedule local` as a
subprocess: SIGINT stops it with a checkpoint and exit status 130; SIGKILL of the main process
leaves no process and no shared-memory segment behind.  SIGTERM (turned into the same stop)
is tested in-process, which is cheaper than another interpreter."""

from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

HETRL = str(Path(sys.executable).with_name("hetrl"))
SHM = Path("/dev/shm")
OURS = ("hetrl", "sem.mp-", "psm_", "torch_", "mp-")  # what a multiprocessing/torch program could leave


def children_of() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(d.name))
    return kids


def descendants(pid: int) -> set[int]:
    kids, out, todo = children_of(), set(), [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            if k not in out:
                out.add(k)
                todo.append(k)
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has exited; its reaper is not ours to wait for


def shm_entries() -> set[str]:
    return {p.name for p in SHM.iterdir() if p.name.startswith(OURS)} if SHM.is_dir() else set()


def start_training(out: Path, steps: int = 1_000_000, tmp: Path | None = None, schedule: str = "local",
                   group: bool = False) -> subprocess.Popen:
    sched = ["--schedule", "local", "--actors", "2", "--envs-per-actor", "2"] if schedule == "local" else \
        ["--schedule", "inline", "--set", "num_envs=4"]
    cmd = [HETRL, "train", "dqn", "--env", "CartPole-v1", "--plan", "none", *sched, "--steps", str(steps), "--out", str(out), "--no-progress",
           "--set", "net_arch=[32,32]", "--set", "learning_starts=200", "--set", "train_freq=100",
           "--set", "gradient_steps=10", "--set", "batch_size=32", "--set", "buffer_size=5000",
           "--set", "log_interval=200", "--set", "threads=1", "--set", "eval_episodes=0"]
    env = {**os.environ, "TMPDIR": str(tmp)} if tmp is not None else None
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=group)


def wait_until_training(p: subprocess.Popen, out: Path, timeout: float = 120.0, processes: int = 2) -> set[int]:
    """Wait for a logged progress row; return the process tree (actors, forkserver ...)."""
    deadline = time.monotonic() + timeout
    csv = out / "progress.csv"
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise AssertionError(f"training exited early ({p.returncode}): {p.stderr.read()}")
        if csv.exists() and len(csv.read_text().splitlines()) >= 2:
            tree = descendants(p.pid)
            if len(tree) >= processes:  # the two actors at least (local)
                return tree
        time.sleep(0.2)
    p.kill()
    raise AssertionError("training did not start in time")


def wait_gone(pids: set[int], timeout: float = 15.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = {pid for pid in pids if alive(pid)}
        if not left:
            return left
        time.sleep(0.1)
    return {pid for pid in pids if alive(pid)}


@pytest.mark.parametrize("schedule", ["inline", "local"])
def test_sigterm_to_the_process_group_stops_like_ctrl_c(tmp_path, schedule):
    """`timeout` or a cluster scheduler signals the whole group: checkpoint, result.json, exit 143, and
    actors that got the signal too are neither reported as crashed nor restarted."""
    out = tmp_path / "run"
    p = start_training(out, schedule=schedule, group=True)
    try:
        tree = wait_until_training(p, out, processes=2 if schedule == "local" else 0)
        os.killpg(p.pid, signal.SIGTERM)
        rc = p.wait(60)
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 143, err
    res = json.loads((out / "result.json").read_text())
    assert res["interrupted"] == "SIGTERM" and (out / "checkpoint.pt").is_file()
    assert "starting a new one" not in err and "Traceback" not in err and "interrupted (SIGTERM) at" in err
    assert wait_gone(tree) == set()


def test_sigint_stops_all_processes_and_saves_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    p = start_training(out)
    try:
        tree = wait_until_training(p, out)
        p.send_signal(signal.SIGINT)
        rc = p.wait(60)
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 130, err
    assert (out / "checkpoint.pt").is_file(), err
    res = json.loads((out / "result.json").read_text())
    assert res["interrupted"] == "SIGINT" and res["schedule"] == "local" and 0 < res["env_steps"] < 1_000_000
    assert "interrupted (SIGINT) at" in err and "Traceback" not in err
    assert wait_gone(tree) == set()


def test_sigkill_of_the_main_process_leaves_no_process_and_no_shm(tmp_path):
    before = shm_entries()
    # a short TMPDIR: the forkserver's socket path inside it must fit AF_UNIX's 108 bytes
    out, tmp = tmp_path / "run", Path(tempfile.mkdtemp(prefix="hl-", dir="/tmp"))
    p = start_training(out, tmp=tmp)
    try:
        tree = wait_until_training(p, out)
        # while it runs: no named segment at all (the shared memory is memfd, nameless)
        assert shm_entries() - before == set()
        p.kill()
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
    assert wait_gone(tree) == set(), "processes left behind"
    assert shm_entries() - before == set(), "shared memory left behind"
    left = [p.name for p in tmp.iterdir() if p.name.startswith("pymp-")]
    shutil.rmtree(tmp, ignore_errors=True)
    assert left == [], "temp folder left behind"


def test_sigterm_stops_the_run_like_ctrl_c(tiny, tmp_path):
    import threading

    from hetrl.api import Run
    from hetrl.config import make_config

    cfg = make_config("dqn", "CartPole-v1", {**tiny, "steps": 10**6, "schedule": "local", "actors": 1})
    out = tmp_path / "run"
    out.mkdir()
    run = Run(cfg, "CartPole-v1", out)
    pids = set(run.schedule.actor_pids())
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        run.learn(progress=False)
    finally:
        timer.cancel()
        run.schedule.close()
    assert run.interrupted == "SIGTERM" and (out / "checkpoint.pt").is_file()
    assert 0 < run.result["env_steps"] < 10**6
    assert signal.getsignal(signal.SIGTERM) is not None and wait_gone(pids) == set()
