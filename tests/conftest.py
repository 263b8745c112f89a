"""Suite-wide setup.

The suite runs under pytest-xdist (``-n auto`` in pyproject.toml); torchrun gate
launches of one session take turns (``tests/gates/conftest.py``), the rest runs beside
them. The rlharness pytest plugin is loaded here when the environment's install
predates its entry point.
"""

from __future__ import annotations

import fcntl
import importlib
import os

import pytest


def pytest_configure(config):
    # The plugin an install registers (entry point pytest11: rlharness); an environment
    # installed before that entry point existed gets it from this checkout instead.
    if not config.pluginmanager.has_plugin("rlharness"):
        config.pluginmanager.register(importlib.import_module("rlharness.pytest_plugin"), "rlharness")


@pytest.fixture(scope="module")
def one_ray_at_a_time(tmp_path_factory):
    """Tests that start a local Ray take turns under pytest-xdist: two Ray instances
    starting side by side on a 2-core machine push each other past their start-up
    timeouts. The lock lives in the session's temp folder (shared by its workers only);
    a module that holds Ray for all its tests holds the lock as long."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    session = tmp_path_factory.getbasetemp().parent
    with open(session / "rlharness-ray.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
