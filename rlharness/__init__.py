"""The user's entry points: the ``rlharness`` command line and the pytest plugin.

This package sits above both runtimes. ``harness/`` (the clock-free core: spec of
records, scheduler model, control logic, replay, oracle, outputs) imports neither
``simulators/`` nor ``gpu_gates/``; ``gpu_gates/`` does not import ``simulators/``; only
this package may import all three, because a user's command (``rlharness simulate``,
``rlharness validate``) or fixture (``rlharness_run``) needs the simulator behind it.
``tests/unit/test_layering.py`` holds every package to its place.
"""

from harness import __version__

__all__ = ["__version__"]
