"""The SB3 facts' old import path (docs/extending.md): they live in hetrl/sb3/compat.py."""

from hetrl.sb3.compat import ACTOR_CRITIC, GENERIC, REPLAY, SDE, TAIL, SB3Compat  # noqa: F401
