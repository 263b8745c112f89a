"""The project's stand-in for the parts of Ray that RLix's scheduler touches.

RLix imports ``ray`` at module level and, in its scheduler, calls only: ``ray.get_actor``
(through ``rlix.utils.ray.get_actor_or_raise``) to find a pipeline's coordinator,
``.remote(...)`` on the resource manager's and the coordinators' methods (awaited), and
``ray.exceptions`` in ``except`` clauses. :class:`StandInRay` answers those with
in-process objects: an actor registry keyed by (name, namespace) whose methods'
``.remote`` return awaitables resolved at once (simulated time belongs to the simulator,
not to the RPC). Any other attribute is an inert placeholder, so importing RLix's other
modules (its orchestrator, its client) does not need Ray either; calling one raises.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Callable, Dict, Tuple


class _Inert:
    """A placeholder for a Ray name the scheduler never calls (importable, inert)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"ray.{self._name} is not available in the simulator (a stand-in, not Ray)")

    def __getattr__(self, item: str) -> "_Inert":
        return _Inert(f"{self._name}.{item}")


class RayStandInError(Exception):
    """Base of the stand-in ``ray.exceptions`` classes."""


async def _resolved(value: Any) -> Any:
    return value


class RemoteMethod:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    def remote(self, *args: Any, **kwargs: Any):
        result = self._fn(*args, **kwargs)
        return result if hasattr(result, "__await__") else _resolved(result)


class StandInActor:
    """Wraps a plain object: each public method gets ``.remote``."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, item: str) -> RemoteMethod:
        return RemoteMethod(getattr(self._target, item))


class _Module(types.ModuleType):
    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        if item[:1].isupper() and item.endswith(("Error", "Exception")):
            cls = type(item, (RayStandInError,), {})
            setattr(self, item, cls)
            return cls
        return _Inert(f"{self.__name__[4:]}.{item}" if "." in self.__name__ else item)


class StandInRay:
    """Installs itself as ``ray`` (and ``ray.*``) while RLix is imported."""

    def __init__(self) -> None:
        self.actors: Dict[Tuple[str, str], Any] = {}
        self.root = _Module("ray")
        self.root.get_actor = self.get_actor
        self.root.remote = lambda *a, **k: a[0] if a and callable(a[0]) and not k else (lambda cls: cls)
        self.root.is_initialized = lambda: True
        self.modules: Dict[str, types.ModuleType] = {"ray": self.root}

    def get_actor(self, name: str, namespace: str = "") -> Any:
        try:
            return self.actors[(name, namespace)]
        except KeyError:
            raise ValueError(f"Failed to look up actor with name '{name}' in namespace '{namespace}'") from None

    def add_actor(self, name: str, namespace: str, target: Any) -> StandInActor:
        self.actors[(name, namespace)] = handle = StandInActor(target)
        return handle

    def module(self, fullname: str) -> types.ModuleType:
        if fullname not in self.modules:
            mod = _Module(fullname)
            mod.__path__ = []  # a package: its submodules import too
            parent, _, leaf = fullname.rpartition(".")
            setattr(self.module(parent), leaf, mod)
            self.modules[fullname] = mod
        return self.modules[fullname]


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, ray: StandInRay) -> None:
        self.ray = ray

    def find_spec(self, fullname, path, target=None):
        if fullname == "ray" or fullname.startswith("ray."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return self.ray.module(spec.name)

    def exec_module(self, module) -> None:
        module.__path__ = []


class installed:
    """``with installed(stand_in):`` — ``import ray`` gives the stand-in; the real one
    (if imported before) is put back afterwards."""

    def __init__(self, ray: StandInRay) -> None:
        self.ray = ray
        self.saved: Dict[str, Any] = {}

    def __enter__(self) -> StandInRay:
        self.saved = {k: v for k, v in sys.modules.items() if k == "ray" or k.startswith("ray.")}
        for k in self.saved:
            del sys.modules[k]
        self.finder = _Finder(self.ray)
        sys.meta_path.insert(0, self.finder)
        return self.ray

    def __exit__(self, *exc: Any) -> None:
        sys.meta_path.remove(self.finder)
        for k in [k for k in sys.modules if k == "ray" or k.startswith("ray.")]:
            del sys.modules[k]
        sys.modules.update(self.saved)
