"""Suite-wide setup.

The suite runs under pytest-xdist (``-n auto`` in pyproject.toml: a worker per core plus
two, see ``pytest_xdist_auto_num_workers``); gate launches of one session take turns in
two lanes (``tests/gates/conftest.py``), the rest runs beside them. The rlharness pytest plugin is loaded here when the environment's install
predates its entry point. The leak guard (``tests/leak_guard.py``) fails the session if it
left project files in ``/dev/shm`` or the temp folder.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections import OrderedDict
from typing import Optional

import pytest

from tests.session_lock import take_turns


def _cache_bytecode(config) -> None:
    """With ``PYTHONDONTWRITEBYTECODE`` set (as on the CI machines), every process the
    suite starts (its xdist workers, each gate rank under plain torchrun, each ``rlharness``
    subprocess, the launch servers, Ray's workers) compiled every module of the project
    and rewrote every test module's asserts again: about 4 of a pytest worker's 7 CPU s
    of collection. For this session and every process it starts (through the
    environment), the suite lets Python keep its bytecode in the usual ``__pycache__``
    folders, which git ignores.

    Not under a ``PYTHONPYCACHEPREFIX`` folder, as it once did: Python then reads *every*
    module's bytecode from that folder only, so the bytecode pip wrote when it installed
    torch, Ray, matplotlib and the rest was ignored, and on a fresh checkout the first
    processes, started together, each compiled torch again (about 2 CPU s apiece): a clean
    clone's suite took about 20 s longer than a second run. A prefix the user chose is
    kept."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    sys.dont_write_bytecode = False


def pytest_configure(config):
    _cache_bytecode(config)  # first: the xdist workers start after this hook, with its environment
    # The plugin an install registers (entry point pytest11: rlharness); an environment
    # installed before that entry point existed gets it from this checkout instead.
    if not config.pluginmanager.has_plugin("rlharness"):
        config.pluginmanager.register(importlib.import_module("rlharness.pytest_plugin"), "rlharness")
    # The session fails if it left project files in /dev/shm or the temp folder
    # (tests/leak_guard.py: checked in the xdist controller, by a per-session tag).
    if not config.pluginmanager.has_plugin("rlharness-leak-guard"):
        config.pluginmanager.register(importlib.import_module("tests.leak_guard"), "rlharness-leak-guard")


#: xdist work units that start first, in this order (a test file is a unit, see addopts),
#: each on a worker of its own (``-n auto`` gives one more worker than there are such units
#: on the 2-core machine, for everything else):
#:
#: - every gate test file whose launches are CPU-bound, as ONE unit: its launches take turns
#:   in one lane anyway (two lanes side by side made the dual gate's designed failures lose
#:   a rank's report on a loaded 2-core machine), so a second worker on it would only wait
#:   for the lock; this chain of launches is the longest unit of the suite;
#: - the gate launches that mostly wait for a deadline or a grace window
#:   (tests/gates/test_gate_waits.py), with a lock of its own;
#: - the files that share the session's local Ray (:data:`RAY_UNIT`), whose start-up and
#:   TransferQueue's actors mostly wait too.
#:
#: Started together, the three chains run beside each other and beside the rest (xdist's
#: own order, most tests first, on the remaining worker and on each chain's worker once it
#: is done); queued behind the gate chain, Ray's unit had been the suite's tail.
GATES, GATE_WAITS = "tests/gates/", "tests/gates/test_gate_waits.py"
GATES_BUSY = GATES + "[busy]"
FIRST_UNITS = (GATES_BUSY, GATE_WAITS, "tests/[ray]")


def gate_lane(path: str) -> str:
    """The lane of gate launches a gate test file's launches take turns in."""
    name = path.rsplit("/", 1)[-1]
    if name == GATE_WAITS.rsplit("/", 1)[-1]:
        return "waits"
    return "busy"  # one lane for every CPU-bound launch (see FIRST_UNITS)


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: its file, or the unit of its lane of CPU-bound gate tests."""
    path = nodeid.split("::", 1)[0]
    if path in RAY_FILES:
        return RAY_UNIT
    if not path.startswith(GATES) or path == GATE_WAITS:
        return path
    return GATES_BUSY


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core, plus two: the chains of :data:`FIRST_UNITS` keep
    their workers idle much of the time (process starts, rendezvous, a hung rank's
    deadline, a crashed rank's grace window, Ray's start-up), so with fewer the cores would
    idle with them.
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides when set (xdist's own rule)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return len(os.sched_getaffinity(0)) + 2 if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1) + 2


class _FirstUnitsFirst(OrderedDict):
    """xdist's queue of work units, with :data:`FIRST_UNITS` kept at its front."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if key in FIRST_UNITS:
            for first in reversed(FIRST_UNITS):
                if first in self:
                    self.move_to_end(first, last=False)


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with the CPU-bound gate tests as one unit and the long units first.

    xdist orders units by their number of tests, which put the few-but-long gate files
    last: their serialized chains then ran after everything else (the slow tail).
    """
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.workqueue = _FirstUnitsFirst()

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return Scheduling(config, log)


#: The test files that use the session's one local Ray (:func:`local_ray`): one xdist work
#: unit, so they run on one worker and Ray starts once per session, not once per file.
RAY_FILES = ("tests/dataplane/test_contract.py", "tests/sim/test_fuzz.py")
RAY_UNIT = "tests/[ray]"


def _shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


class _LocalRay:
    """The session's one local Ray: started by the first test that needs it, stopped as
    soon as the worker leaves the work unit of the files that use it (:data:`RAY_UNIT`),
    not at the end of the session: idle, Ray's processes still burn about 0.05 CPU s a
    second, and the unit ends long before the worker's other tests do. Started again if a
    later test needs it (only where its files are not one unit: ``-n 0`` runs files in
    path order)."""

    def __init__(self) -> None:
        self._stack: Optional[contextlib.ExitStack] = None
        self._shm_before: set = set()

    def start(self, lock_folder):
        """Ray, started if it is not. Its start-up costs about 15 s on the 2-core machine.
        Ray gets more logical CPUs than the machine has cores because TransferQueue's
        controller and each storage unit reserve one (with too few its init waits forever)."""
        ray = pytest.importorskip("ray")
        if self._stack is not None:
            return ray
        self._shm_before = _shm_entries()
        stack = contextlib.ExitStack()
        # a second Ray starting beside this one (another checkout's suite aside, none in this
        # session) would push both past their start-up timeouts
        stack.enter_context(take_turns(lock_folder, "rlharness-ray.lock"))
        try:
            # worker_niceness 0: Ray starts its workers at nice 15 by default, and beside the
            # suite's busy xdist workers TransferQueue's controller then got ~2 % of a core: its
            # init ran past 180 s on a loaded run (past 60 s alone against 5 busy loops; 15-19 s at 0)
            ray.init(
                num_cpus=8,
                include_dashboard=False,
                log_to_driver=False,
                namespace="rlharness-tests",
                configure_logging=False,
                _system_config={"worker_niceness": 0},
            )
        except BaseException:
            stack.close()
            raise
        stack.callback(ray.shutdown)
        self._stack = stack
        return ray

    def stop(self) -> None:
        """Shut Ray down (if it runs); nothing of Ray's may be left in /dev/shm."""
        if self._stack is None:
            return
        stack, self._stack = self._stack, None
        stack.close()
        leaked = _shm_entries() - self._shm_before
        assert not [e for e in leaked if "ray" in e.lower() or "plasma" in e.lower()], f"/dev/shm leftovers: {leaked}"


_LOCAL_RAY = _LocalRay()


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """The session's one local Ray (per xdist worker; every file that uses it is in the
    work unit :data:`RAY_UNIT`, so in practice one per session), shared by TransferQueue's
    tests and the fuzz executor's Ray test; stopped when the worker leaves that unit
    (:class:`_LocalRay`)."""
    return _LOCAL_RAY.start(tmp_path_factory.getbasetemp().parent)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of the Ray unit, once its fixtures are torn down (TransferQueue's
    actors first), Ray stops."""
    yield
    if work_unit(item.nodeid) == RAY_UNIT and (nextitem is None or work_unit(nextitem.nodeid) != RAY_UNIT):
        _LOCAL_RAY.stop()


def pytest_sessionfinish(session):
    _LOCAL_RAY.stop()  # an interrupted session, too
