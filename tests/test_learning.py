"""Every algorithm actually learns, on small budgets, judged over three seeds trained as one population.

One seed's trajectory changes with the CPU's GEMM rounding (MKL against OpenBLAS, AVX2 against AVX-512), so each test
judges the median of seeds 0-2 (a population: member i is the run of seed i, tests/test_population.py), with a
threshold well below what the median scores here and well above a random policy.

Full-budget figures (CartPole-v1 >= 475 in 50k steps, Pendulum-v1 >= -200 in 20k steps, seeds
0-2) are in README.md with the commands that produce them.
"""

import pytest

import hetrl


def median_return(pop) -> float:
    returns = sorted(r.result["eval_return_mean"] for r in pop.runs)
    assert len(returns) == 3, returns
    return returns[1]


@pytest.mark.slow
@pytest.mark.timeout(900)   # three members trained together: about a minute, several on a machine other jobs load
def test_dqn_learns_cartpole(tmp_path):
    pop = hetrl.train("dqn", "CartPole-v1", seeds=3, out=tmp_path / "pop", plan="none", steps=16_000, progress=False,
                      net_arch=[64, 64], threads=1, exploration_fraction=0.2, train_freq=128, gradient_steps=64,
                      eval_episodes=10)
    assert median_return(pop) >= 195  # the median of seeds 0-2 scores 500 here; a random policy ~22


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ddpg_learns_pendulum(tmp_path):
    pop = hetrl.train("ddpg", "Pendulum-v1", seeds=3, out=tmp_path / "pop", plan="none", steps=4_000, progress=False,
                      net_arch=[64, 64], threads=1, learning_starts=1000, batch_size=128, eval_episodes=10)
    assert median_return(pop) >= -450  # the median of seeds 0-2 scores about -230 here; a random policy ~-1200
