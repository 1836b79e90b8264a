"""The ray schedule on a two-node Ray cluster (ray.cluster_utils.Cluster: two raylets on loopback)."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")


@pytest.fixture(scope="module")
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="warning")
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.ray
def test_actors_spread_over_two_nodes_and_the_run_finishes(two_nodes):
    import hetrl

    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    # one CPU per actor and one CPU per node: Ray must put one actor on each node
    run = hetrl.train("dqn", "CartPole-v1", steps=2500, seed=0, schedule="ray", actors=2, ray_actor_cpus=1.0,
                      replay_shards=2, learning_starts=500, progress=False, evaluate_episodes=0)
    r = run.result
    assert r["ray_nodes"] == 2 and r["replay_shards"] == 2
    assert r["env_steps"] >= 2500 and r["gradient_steps"] > 0
