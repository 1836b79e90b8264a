"""Actors: env construction and the acting loop (PEARL's actor primitive).

Its names load on first use, so that hetrl.config can import the Atari options (hetrl/actors/atari.py)
without the acting loop's imports (torch)."""

import importlib

_WHERE = {"Actor": "actor", "ActorSpec": "actor", "Episode": "actor", "ExploreTable": "actor", "EnvSpec": "envs", "env_name": "envs",
          "make_env": "envs", "make_vector_env": "envs", "probe_spaces": "envs"}

__all__ = list(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"hetrl.actors.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'hetrl.actors' has no attribute {name!r}")
