"""SB3's callbacks on hetrl's runs, at their documented import path (README, docs/sb3.md): hetrl/sb3/callbacks.py."""

from hetrl.sb3.callbacks import *  # noqa: F401,F403
from hetrl.sb3.callbacks import __all__  # noqa: F401
