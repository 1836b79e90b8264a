"""The learner's threads follow the machine's load (decision logic on recorded readings)."""

from __future__ import annotations

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
        assert g.figures() == {"learner_threads_planned": 2, "learner_threads_min": 1, "learner_thread_changes": 2}
    finally:
        torch.set_num_threads(before)


def test_a_one_thread_learner_is_left_alone_and_proc_stat_is_read():
    g = ThreadGovernor(planned=1)
    assert not g.active and g.tick() == 1
    assert machine_busy_s() is None or machine_busy_s() > 0
