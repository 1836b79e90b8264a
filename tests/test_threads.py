"""The learner's threads follow the machine's load (decision logic on recorded readings)."""

from __future__ import annotations

import pytest
import torch

from hetrl.runtime.threads import ThreadGovernor, machine_busy_s


class Readings:
    """(wall s, machine busy s, own cpu s) as a 2-core machine would report them."""

    def __init__(self):
        self.t = self.machine = self.own = 0.0

    def advance(self, seconds: float, ours: float, others: float):
        self.t += seconds
        self.own += ours * seconds
        self.machine += (ours + others) * seconds

    def __call__(self):
        return self.t, self.machine, self.own


def test_the_learner_drops_to_one_thread_while_other_work_runs_and_returns_after():
    before = torch.get_num_threads()
    r = Readings()
    g = ThreadGovernor(planned=2, interval_s=1.0, cores=2, read=r)
    try:
        r.advance(1.0, ours=2.0, others=0.0)
        assert g.tick() == 2                    # alone: the planned threads
        r.advance(0.5, ours=1.0, others=1.0)
        assert g.tick() == 2                    # not yet time to look again
        r.advance(0.6, ours=1.0, others=1.0)
        assert g.tick() == 1 and torch.get_num_threads() == 1   # another process took a core
        r.advance(1.0, ours=1.0, others=0.0)
        assert g.tick() == 1                    # one calm reading is not enough
        r.advance(1.0, ours=1.0, others=0.0)
        assert g.tick() == 2 and torch.get_num_threads() == 2   # it left: back to the plan
        assert g.figures() == {"threads": 2, "learner_threads_follow_load": True, "learner_threads_planned": 2,
                               "learner_threads_min": 1, "learner_thread_changes": 2, "learner_threads_mostly": 2}
    finally:
        torch.set_num_threads(before)


def test_learner_time_is_kept_per_thread_count_for_the_calibration():
    before = torch.get_num_threads()
    r = Readings()
    g = ThreadGovernor(planned=2, interval_s=1.0, cores=2, read=r)
    try:
        assert g.mostly() == (2, 0.0, 0)         # nothing learned yet: the plan's count
        g.record(0.5, 10)                         # 2 threads
        r.advance(1.1, ours=1.0, others=1.0)
        assert g.tick() == 1                      # a neighbour took a core for the rest of the run
        for _ in range(3):
            g.record(0.8, 10)
        assert g.spent == {2: [0.5, 10], 1: [pytest.approx(2.4), 30]}
        # the run's learner time is compared with the profile at the count it mostly ran with
        assert g.mostly() == (1, pytest.approx(2.4), 30) and g.figures()["learner_threads_mostly"] == 1
    finally:
        torch.set_num_threads(before)


def test_a_kernel_whose_results_follow_the_thread_count_keeps_its_threads_under_load():
    """Changing the count mid-run would change what is learned (torch's GEMM reductions follow the threads): the
    governor leaves such a learner alone, and the planner's correction cannot replan it."""
    r, applied = Readings(), []
    g = ThreadGovernor(planned=2, interval_s=1.0, cores=2, read=r, apply=applied.append, exact=False)
    r.advance(1.1, ours=1.0, others=1.0)
    assert g.tick() == 2 and applied == [] and not g.active
    with pytest.raises(RuntimeError, match="depend on its thread count"):
        g.replan(1)
    assert g.figures()["learner_threads_follow_load"] is False and g.figures()["learner_thread_changes"] == 0


def test_replan_moves_the_planned_count_and_the_governor_follows_load_around_it():
    r, applied = Readings(), []
    g = ThreadGovernor(planned=1, interval_s=1.0, cores=2, read=r, apply=applied.append)
    assert not g.active                        # one thread: nothing to give up
    g.replan(2)                                # the planner's correction tries two
    assert (g.threads, g.planned, applied) == (2, 2, [2]) and g.active
    r.advance(1.1, ours=1.0, others=1.0)
    assert g.tick() == 1 and applied == [2, 1]   # a neighbour took a core: down, as for a planned 2
    g.replan(1)                                # the correction keeps one: nothing to apply
    assert applied == [2, 1] and g.figures()["threads"] == 1


def test_a_one_thread_learner_is_left_alone_and_proc_stat_is_read():
    g = ThreadGovernor(planned=1)
    assert not g.active and g.tick() == 1
    assert machine_busy_s() is None or machine_busy_s() > 0


def _others_now(seconds: float = 1.0) -> float:
    """Cores other processes use now (an independent reading, for the skip below)."""
    import time

    from hetrl.runtime.threads import own_cpu_s

    t0, m0, o0 = time.perf_counter(), machine_busy_s(), own_cpu_s()
    time.sleep(seconds)
    return ((machine_busy_s() - m0) - (own_cpu_s() - o0)) / (time.perf_counter() - t0)


@pytest.mark.slow
@pytest.mark.skipif(machine_busy_s() is None, reason="needs /proc/stat")
def test_a_real_competing_process_takes_the_learner_to_one_thread_and_back():
    import subprocess
    import sys
    import time

    if _others_now(0.5) > 0.5:
        pytest.skip("other work is already running on this machine")
    before = torch.get_num_threads()
    g = ThreadGovernor(planned=2, interval_s=0.3, cores=2)

    def wait_for(threads: int, limit: float) -> bool:
        end = time.perf_counter() + limit
        while time.perf_counter() < end:
            if g.tick() == threads:
                return True
            time.sleep(0.05)
        return False

    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time() + 4\nwhile time.time() < t: pass"])
    try:
        assert wait_for(1, 3.0), "the governor did not see the competing process"
        assert torch.get_num_threads() == 1
        spin.wait(timeout=10)
        if not wait_for(2, 3.0):
            if _others_now() > 0.5:
                pytest.skip("other work took the machine after the competitor left")
            raise AssertionError("the governor did not return to the planned threads")
        assert torch.get_num_threads() == 2 and g.figures()["learner_threads_min"] == 1
    finally:
        spin.kill()
        spin.wait()
        torch.set_num_threads(before)
