"""Suite-wide collection rules.

The suite runs under pytest-xdist (``-n auto --dist loadgroup`` in pyproject.toml). Every
test marked ``gate`` launches a torchrun job of 2-6 processes whose deadlines (a hung
rank must end in a failed report within its 15 s timeout) assume the job has the
machine's cores to itself; on a 2-core machine two such jobs side by side only slow
each other down and push those deadlines. So gate tests share one xdist worker and run
one after another there, while the other worker takes the rest of the suite.
"""

from __future__ import annotations

import importlib

import pytest

GATE_GROUP = "rlharness-gates"


def pytest_configure(config):
    # The plugin an install registers (entry point pytest11: rlharness); an environment
    # installed before that entry point existed gets it from this checkout instead.
    if not config.pluginmanager.has_plugin("rlharness"):
        config.pluginmanager.register(importlib.import_module("harness.pytest_plugin"), "rlharness")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("gate") is not None:
            item.add_marker(pytest.mark.xdist_group(GATE_GROUP))
