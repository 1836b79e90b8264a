"""Actors: env construction and the acting loop (PEARL's actor primitive)."""

from hetrl.actors.actor import Actor, ActorSpec, ExploreTable
from hetrl.actors.envs import EnvSpec, env_name, make_env, make_vector_env, probe_spaces

__all__ = ["Actor", "ActorSpec", "ExploreTable", "EnvSpec", "env_name", "make_env", "make_vector_env", "probe_spaces"]
