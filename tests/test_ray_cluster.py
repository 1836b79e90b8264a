"""The ray schedule on a two-node Ray cluster (ray.cluster_utils.Cluster: two raylets on loopback)."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    if ray.is_initialized():
        ray.shutdown()
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    # the second node's Python cannot import EnvPool (a node where it is not installed): an `envpool`
    # package that fails to import, first on that node's path
    blocker = tmp_path_factory.mktemp("no_envpool")
    (blocker / "envpool").mkdir()
    (blocker / "envpool" / "__init__.py").write_text("raise ImportError('EnvPool is not installed on this node')\n")
    cluster.add_node(num_cpus=1, env_vars={"PYTHONPATH": str(blocker)})
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
    run = hetrl.train("dqn", "CartPole-v1", plan="none", steps=2500, seed=0, schedule="ray", actors=2, ray_actor_cpus=1.0,
                      replay_shards=2, learning_starts=500, progress=False, evaluate_episodes=0)
    r = run.result
    assert r["ray_nodes"] == 2 and r["replay_shards"] == 2
    assert r["env_steps"] >= 2500 and r["gradient_steps"] > 0


@pytest.mark.ray
def test_a_node_without_envpool_is_found_and_named(two_nodes):
    pytest.importorskip("envpool")
    import hetrl
    from hetrl.errors import UsageError
    from hetrl.runtime.ray_schedule import cluster_env_backend, nodes_lacking

    second = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != ray.get_runtime_context().get_node_id()]
    lacking = nodes_lacking("envpool")
    assert len(lacking) == 1 and second[0][:8] in lacking[0]     # the head has it, the second node not
    assert nodes_lacking("numpy") == []
    # chosen by the planner (measured on this machine): Gymnasium on every node, and why
    backend, why = cluster_env_backend("envpool")
    assert backend == "gymnasium" and second[0][:8] in why
    assert cluster_env_backend("gymnasium") == ("gymnasium", None)
    # pinned by the user: one line naming the node and the fix, before any actor starts
    with pytest.raises(UsageError, match=r"EnvPool is not installed on the Ray node\(s\) .*"
                                         r"pip install 'hetrl\[envpool\]' there, or use --set env_backend=gymnasium"):
        hetrl.train("dqn", "CartPole-v1", plan="none", steps=600, schedule="ray", actors=2, ray_actor_cpus=1.0,
                    env_backend="envpool", progress=False, evaluate_episodes=0)
    assert ray.is_initialized()   # the caller's Ray is left as it was
