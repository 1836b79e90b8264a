"""The algorithms hetrl knows, by name: registered in code or found through a package's entry point.

    hetrl.register_algorithm("myalgo", MyAlgo, presets={"default": {...}, "Pendulum-v1": {...}})

or, from a package of the user's, without importing it first (pyproject.toml)::

    [project.entry-points."hetrl.algorithms"]
    myalgo = "mypkg.myalgo:MyAlgo"        # the class (its `presets` attribute, if any, are its presets)

Then `hetrl train myalgo --env ...` finds it. A target may be the class or a "module:Class" string (imported
at first use, so listing algorithms stays cheap). Presets map an env id, "default" (every env) or "atari"
(every Atari id) to settings; a run's settings are the algorithm's defaults < "default" < "atari" < the
env's entry < what the user sets.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from hetrl.errors import UsageError

GROUP = "hetrl.algorithms"


@dataclass
class _Entry:
    name: str
    target: Any                       # the class, or "module:Class"
    presets: Any = None               # dict, a YAML path, ("package", "file.yaml"), or None: the class's `presets`
    origin: str = "register_algorithm"
    _presets: dict | None = field(default=None, repr=False)

    def load(self) -> type:
        if isinstance(self.target, str):
            module, _, attr = self.target.partition(":")
            try:
                obj = importlib.import_module(module)
                for part in attr.split("."):
                    obj = getattr(obj, part)
            except (ImportError, AttributeError) as e:
                raise UsageError(f"algorithm {self.name!r} ({self.origin}) cannot be loaded from {self.target!r} "
                                 f"({type(e).__name__}: {e}); fix or uninstall the package that declares it") from None
            self.target = obj
            self.target.name = self.name
        return self.target


_REGISTRY: dict[str, _Entry] = {}
_entry_points_loaded = False


def register_algorithm(name: str, cls: Any, presets: dict | str | Path | tuple | None = None,
                       replace: bool = False) -> None:
    """Register `cls` (an Algorithm class, or "module:Class") under `name` (case-insensitive); `presets`:
    {env id | "default" | "atari": {setting: value}}, or a YAML file of that mapping."""
    key = name.lower()
    if not key.replace("_", "").replace("-", "").isalnum():
        raise UsageError(f"algorithm name {name!r} must be letters, digits, '-' or '_'")
    if key in _REGISTRY and not replace and _REGISTRY[key].target is not cls:
        raise UsageError(f"an algorithm named {key!r} is already registered ({_REGISTRY[key].origin}); "
                         "choose another name, or pass replace=True")
    if not isinstance(cls, str):
        cls.name = key
    _REGISTRY[key] = _Entry(key, cls, presets, origin="hetrl" if _builtin(cls) else "register_algorithm")


def _builtin(target: Any) -> bool:
    module = target.partition(":")[0] if isinstance(target, str) else getattr(target, "__module__", "")
    return module.startswith("hetrl.")


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=GROUP):
        if ep.name.lower() in _REGISTRY:
            continue
        dist = getattr(ep, "dist", None)
        _REGISTRY[ep.name.lower()] = _Entry(ep.name.lower(), ep.value, None,
                                            origin=f"entry point of {dist.name if dist else ep.value}")


def _ensure_builtins() -> None:
    import hetrl.algos  # noqa: F401  (registers the built-in algorithms)


def names() -> list[str]:
    """Every registered algorithm's name, the built-ins and entry points included."""
    _ensure_builtins()
    _load_entry_points()
    return sorted(_REGISTRY)


def get(name: str) -> type:
    """The algorithm class registered as `name`; a UsageError naming the known ones otherwise."""
    _ensure_builtins()
    key = (name or "").lower()
    if key not in _REGISTRY:
        _load_entry_points()
    if key not in _REGISTRY:
        known = sorted(_REGISTRY)
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(f"unknown algorithm {name!r}; {hint}choose one of: {', '.join(known)} "
                         "(or register yours: docs/extending.md)")
    return _REGISTRY[key].load()


def presets(name: str) -> dict[str, dict[str, Any]]:
    """{env id | "default" | "atari": settings} of algorithm `name`."""
    cls = get(name)
    entry = _REGISTRY[name.lower()]
    if entry._presets is None:
        src = entry.presets if entry.presets is not None else getattr(cls, "presets", None)
        if isinstance(src, tuple):      # (package, file name): a YAML file shipped inside a package
            src = yaml.safe_load(resources.files(src[0]).joinpath(src[1]).read_text())
        elif isinstance(src, (str, Path)):
            try:
                src = yaml.safe_load(Path(src).read_text())
            except OSError as e:
                raise UsageError(f"presets file {src} of algorithm {name!r} cannot be read ({e.strerror}); "
                                 "fix the path given to register_algorithm") from None
        src = src or {}
        if not isinstance(src, dict) or not all(isinstance(v, dict) for v in src.values()):
            raise UsageError(f"the presets of algorithm {name!r} must map an env id (or 'default', 'atari') to "
                             "settings; fix what register_algorithm was given")
        entry._presets = src
    return entry._presets


def origin(name: str) -> str:
    get(name)
    return _REGISTRY[name.lower()].origin
