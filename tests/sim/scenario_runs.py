"""The bundled scenarios' runs the simulation tests read, each made once per process and
kept (several test files read the same runs: the bundled-scenario sweep runs them all)."""

from __future__ import annotations

import glob
import os

from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario
from simulators.scenario.spec import default_scenario

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCENARIOS = sorted(glob.glob(os.path.join(ROOT, "examples", "scenarios", "*.yaml")))


def scenario(name):
    return load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))


_CACHE = {}


def run(name):
    """A scenario's run, once per process: "default" is default_scenario(), any other name
    the bundled file (the run :func:`run_file` keeps for it)."""
    if name != "default":
        return run_file(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))
    if name not in _CACHE:
        _CACHE[name] = Simulation(default_scenario()).run()
    return _CACHE[name]


def run_file(path):
    """A bundled scenario file's run, once per process."""
    key = ("file", os.path.abspath(path))
    if key not in _CACHE:
        _CACHE[key] = Simulation(load_scenario(path)).run()
    return _CACHE[key]


def effects(records, pid, kind="effect_start"):
    return [r for r in records if r["kind"] == kind and r.get("pipeline_id") == pid]
