"""Suite-wide setup.

The suite runs under pytest-xdist (``-n auto`` in pyproject.toml); torchrun gate
launches of one session take turns (``tests/gates/conftest.py``), the rest runs beside
them. The rlharness pytest plugin is loaded here when the environment's install
predates its entry point.
"""

from __future__ import annotations

import importlib


def pytest_configure(config):
    # The plugin an install registers (entry point pytest11: rlharness); an environment
    # installed before that entry point existed gets it from this checkout instead.
    if not config.pluginmanager.has_plugin("rlharness"):
        config.pluginmanager.register(importlib.import_module("harness.pytest_plugin"), "rlharness")
