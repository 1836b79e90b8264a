"""`--schedule ray` without an address on a machine where a Ray cluster is already running (`ray start`
left one): hetrl starts and stops a Ray of its own and leaves that cluster alone."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")


@pytest.mark.ray
def test_a_local_run_next_to_a_running_cluster():
    import hetrl

    if ray.is_initialized():
        ray.shutdown()
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        # before: ray.init(num_cpus=...) found that cluster and failed with a traceback
        # ("When connecting to an existing cluster, num_cpus and num_gpus must not be provided")
        run = hetrl.train("dqn", "CartPole-v1", plan="none", steps=1200, seed=0, schedule="ray", actors=1, learning_starts=500,
                          progress=False, evaluate_episodes=0)
        assert run.result["env_steps"] >= 1200 and run.result["ray_nodes"] == 1
        assert not ray.is_initialized()                 # hetrl stopped the Ray it started
        ray.init(address=cluster.address, logging_level="warning")   # the other cluster still runs
        assert ray.cluster_resources().get("CPU") == 1
    finally:
        ray.shutdown()
        cluster.shutdown()
