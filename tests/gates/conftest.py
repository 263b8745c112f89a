"""Launch GPU gates under torch's elastic agent on CPU (gloo) and read their JSON reports.

Two launchers, one agent: ``torchrun`` (``python -m torch.distributed.run``, each rank a
new ``python`` process: the documented command) and ``forked``
(``tests/gates/launch_forked.py``: the same torchrun, its ranks forked from the agent, so
torch is imported once per launch instead of once per process; a worker's forked launches
are forks of its launch server, ``tests/gates/served_launch.py``, so not even once). Each gate's clean pass
(or its command-line test) runs under ``torchrun``; the other tests, its failure modes,
run ``forked`` (the default), which costs a fraction of the CPU on a 2-core machine.

Each launch runs in its own session so a timeout can kill the whole process tree, and
every launch's command line carries a unique report path, which is how the orphan check
finds any worker that outlived its launcher (a forked rank carries its launcher's).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

from tests.gates.hang_dump import HEADER, read_output
from tests.gates.proc_table import pids_in_session, pids_mentioning
from tests.gates.served_launch import LaunchServer
from tests.session_lock import take_turns

REPO = Path(__file__).resolve().parents[2]
HOOK_ENV = "RLHARNESS_GATE_TEST_HOOK"
LAUNCHERS = ("forked", "torchrun")
#: ``RLHARNESS_GATE_LAUNCHER=torchrun`` runs every launch of the suite under torchrun
#: (to compare the two launchers, or where forking is not wanted).
LAUNCHER_ENV = "RLHARNESS_GATE_LAUNCHER"
#: Modules a gate's ranks import lazily, preloaded by the forked launcher so its ranks
#: share one import (torch.optim's optimizers import torch._dynamo on first use: ~1 CPU s).
PRELOAD = {"train_pump_parity": ("torch._dynamo",)}


def pytest_configure(config):
    config.addinivalue_line("markers", "gate: launches a GPU gate under torchrun (gloo on CPU)")
    config.addinivalue_line(
        "markers",
        "waits_out_a_deadline: the gate launch spends most of its time idle, waiting "
        "for a deadline or a grace window (tests/gates/test_gate_waits.py only)",
    )


#: The file of the gate tests that mostly wait: one xdist unit and one lock of their own.
WAITS_FILE = "test_gate_waits.py"


def pytest_collection_modifyitems(config, items):
    # The scheduler (tests/conftest.py) can only see node ids, so a waiting launch is
    # known by its file; the marker says the same and must agree with it.
    for item in items:
        marked = item.get_closest_marker("waits_out_a_deadline") is not None
        if marked != (item.path.name == WAITS_FILE):
            raise pytest.UsageError(
                f"{item.nodeid}: tests marked waits_out_a_deadline live in tests/gates/{WAITS_FILE}, and only they"
            )


def lane_of(node) -> str:
    """Which queue of gate launches a test's launches join (see :func:`_one_gate_at_a_time`)."""
    from tests.conftest import gate_lane

    return "waits" if node.get_closest_marker("waits_out_a_deadline") else gate_lane(str(node.path))


#: Where the rendezvous ports come from: below the kernel's ephemeral range (32768-60999 by
#: default on Linux) and above Ray's default worker ports (10002-19999). A port the kernel
#: hands out itself (port 0: the probe's, every gloo listener's, every outgoing
#: connection's) could be handed to another job between the probe and torchrun's bind,
#: or be an outgoing connection's own port that a rank's connect then reaches; one from
#: here is only ever taken by a job that chose it, which the bind then reports
#: (EADDRINUSE, retried on another, see :func:`_port_taken`). Several launches run at once
#: (the lanes, and the waiting launches side by side).
PORTS = (20000, 32767)


def free_port() -> int:
    """A port of :data:`PORTS` that nothing is bound to now."""
    import random

    for _ in range(200):
        port = random.SystemRandom().randint(*PORTS)  # not the global generator a test may have seeded
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # all probed taken: any free one
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class GateRun:
    returncode: int
    elapsed_s: float
    output: str
    report_path: Path
    report: Optional[Dict] = None
    survivors: List[int] = field(default_factory=list)
    timed_out: bool = False
    port: int = 0  # the rendezvous port of the launch that produced this result
    launcher: str = "torchrun"  # which of LAUNCHERS started it
    launcher_pid: int = 0

    def rank_report(self, rank: int) -> Optional[Dict]:
        path = self.report_path.with_name(f"{self.report_path.stem}.rank{rank}.json")
        return json.loads(path.read_text()) if path.exists() else None

    def checks(self, name: str) -> List[Dict]:
        """Every rank's checks called ``name``."""
        return [c for r in self.report["ranks"] for c in r["checks"] if c["name"] == name]

    def driver_records(self) -> List[Dict]:
        """The dual-pipeline gate's harness log (its driver's records, as the checks read them)."""
        from harness.logs.records import read_records

        return [r.data for r in read_records(self.report["summary"]["outputs"]["driver_log"])]

    @property
    def event_log(self) -> Path:
        return self.report_path.with_name(self.report_path.stem + ".events.jsonl")

    def hang_diagnosis(self) -> str:
        """A killed launch's output: what it printed last, then its processes' native
        view and Python stacks (tests/gates/hang_dump.py), in full."""
        at = self.output.find(HEADER)
        return self.output[-3000:] if at < 0 else self.output[max(0, at - 3000) :]

    def ended_cleanly(self, report: bool = True) -> "GateRun":
        """What every gate launch must show, whatever its verdict: it ended before the
        test's timeout, no process outlived it, and (``report``) rank 0 wrote its report."""
        assert not self.timed_out, f"gate launch exceeded its test timeout:\n{self.hang_diagnosis()}"
        assert not self.survivors, f"orphan processes survived the gate: {self.survivors}"
        if report:
            assert self.report is not None, f"no report written:\n{self.output[-3000:]}"
        return self


#: Seconds a launch may take beyond its ranks' deadline (``--timeout-s`` plus rank 0's
#: grace, at most 5 s): the agent's and the ranks' start on a loaded machine, rank 0's
#: report after its watchdog fired, the other ranks' exits and the agent's teardown.
DEADLINE_MARGIN_S = 15.0
MAX_GRACE_S = 5.0  # gpu_gates/runtime/gate.py: grace = max(2, min(5, timeout_s / 10))


def with_gate_deadline(args: Sequence[str], timeout_s: float) -> List[str]:
    """The gate's arguments with a per-rank deadline that ends the launch with a report
    before the test's ``timeout_s``: the test's kill is for a launch stuck where no gate
    code runs, never for a rank that would have timed out and reported (the gate's
    default, 120 s, is longer than most tests' timeout). A test that sets ``--timeout-s``
    itself must leave the same margin."""
    args = list(args)
    if "--timeout-s" in args:
        gate_s = float(args[args.index("--timeout-s") + 1])
        assert gate_s + MAX_GRACE_S + DEADLINE_MARGIN_S <= timeout_s, (
            f"--timeout-s {gate_s:g} does not fit in the test's timeout_s={timeout_s:g}: the gate must report before "
            f"the test kills it (leave {MAX_GRACE_S + DEADLINE_MARGIN_S:g} s)"
        )
        return args
    gate_s = timeout_s - MAX_GRACE_S - DEADLINE_MARGIN_S
    assert gate_s >= 10, f"timeout_s={timeout_s:g} leaves the gate's ranks no deadline to report by"
    return [*args, "--timeout-s", f"{gate_s:g}"]


def _port_taken(run: "GateRun") -> bool:
    """The launcher could not bind its rendezvous port: another job (a parallel test
    worker, another checkout's suite) took it between :func:`free_port` and the bind."""
    return (
        run.report is None
        and run.returncode != 0
        and ("EADDRINUSE" in run.output or "Address already in use" in run.output)
    )


def launch_gate(
    tmp_path: Path,
    gate: str,
    nproc: int,
    *args: str,
    hook: Optional[str] = None,
    timeout_s: float = 90.0,
    extra_env: Optional[Dict[str, str]] = None,
    first_ports: Sequence[int] = (),
    own_folders: bool = True,
    launcher: str = "forked",
    preload: Sequence[str] = (),
    lane: Optional[str] = "busy",
) -> GateRun:
    """Launch a gate under torch's agent on a free port; a port lost to a concurrent job
    (the probe closes it before the agent binds it) is retried on a new one.
    ``first_ports`` are tried before any free one (a test hands in a port it holds).
    ``own_folders``: this launcher creates the run's socket and staging folders and
    removes them after the job, whatever happened to its ranks (a killed rank runs no
    handler); ``False`` leaves them to the gate (as a hand-launched ``torchrun`` does).
    ``launcher``: ``"forked"`` (ranks forked from the agent, ``preload`` and
    :data:`PRELOAD` imported there first) or ``"torchrun"`` (the documented command).
    The gate's ``--timeout-s`` fits in ``timeout_s`` (:func:`with_gate_deadline`).
    ``lane``: the queue of launches this one waits its turn in (:func:`lane_of`); None:
    the caller holds its lane's turn (:class:`SideBySide`)."""
    launcher = os.environ.get(LAUNCHER_ENV) or launcher
    assert launcher in LAUNCHERS, f"{LAUNCHER_ENV}={launcher!r}: one of {LAUNCHERS}"
    args = with_gate_deadline(args, timeout_s)
    ports = iter(first_ports)
    with _one_gate_at_a_time(tmp_path, lane) if lane else contextlib.nullcontext():
        for _ in range(3):
            with _launcher_folders(own_folders, extra_env) as folder_env:
                run = _launch_once(
                    tmp_path,
                    gate,
                    nproc,
                    args,
                    next(ports, None) or free_port(),
                    hook,
                    timeout_s,
                    {**folder_env, **(extra_env or {})},
                    launcher,
                    (*PRELOAD.get(gate, ()), *preload),
                )
            if not _port_taken(run):
                break
    return run


@contextlib.contextmanager
def _launcher_folders(own: bool, extra_env: Optional[Dict[str, str]]):
    """The run's private folders for ``ipc://`` sockets and staging files, owned by this
    launcher: removed on every exit path of the job, a SIGKILLed rank's files included.
    A folder the test passes in ``extra_env`` is the test's to check and remove."""
    from gpu_gates.transports import private_dirs

    made: Dict[str, str] = {}
    if own:
        if private_dirs.IPC_DIR_ENV not in (extra_env or {}):
            made[private_dirs.IPC_DIR_ENV] = private_dirs.make_private("gate-ipc")
        if "RLHARNESS_SHM_DIR" not in (extra_env or {}):
            made["RLHARNESS_SHM_DIR"] = private_dirs.make_private("gate-shm", private_dirs.shm_base())
    try:
        yield made
    finally:
        for path in made.values():
            private_dirs.remove(path)


@contextlib.contextmanager
def _one_gate_at_a_time(tmp_path: Path, lane: str):
    """Under pytest-xdist, gate launches of one test session take turns, per lane.

    A gate job is 2-6 processes; too many side by side on a 2-core machine push each other
    past their deadlines. So the launches of each lane run one at a time: one lane of
    CPU-bound launches (``busy``: every other gate file, one xdist unit, see
    ``tests/conftest.py``) and the launches that mostly sit waiting for a deadline or a
    grace window (lane ``waits``: tests/gates/test_gate_waits.py, which runs its own
    launches side by side within its turn, :class:`SideBySide`); one launch of each lane
    may run at once, on two xdist workers, the waits overlapping real work. The other
    workers go on with the rest of the suite meanwhile. (xdist's own ``--dist loadgroup`` cannot do this here: with pytest
    9.2 its group suffix on the node id no longer takes effect.) The locks live in the
    session's base temp folder, shared by its workers only, so other sessions on the
    machine are not serialized with this one. A test's own deadline clock starts after
    its lock is taken.
    """
    session = next((p for p in tmp_path.parents if p.parent.name.startswith("pytest-of-")), None)
    with take_turns(session, f"rlharness-gates-{lane}.lock"):
        yield


def _launcher_command(launcher: str, preload: Sequence[str]) -> List[str]:
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run"]
    return [
        sys.executable,
        str(REPO / "tests" / "gates" / "launch_forked.py"),
        *(arg for module in preload for arg in ("--preload", module)),
    ]


def _launch_once(
    tmp_path: Path,
    gate: str,
    nproc: int,
    args,
    port: int,
    hook: Optional[str],
    timeout_s: float,
    extra_env: Optional[Dict[str, str]],
    launcher: str,
    preload: Sequence[str],
) -> GateRun:
    report = tmp_path / f"{gate}-report.json"
    # --log-dir: without it torchrun's agent makes a torchelastic_* folder in the system
    # temp folder for every launch and never removes it (thousands over a day of runs)
    cmd = [
        *_launcher_command(launcher, preload),
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "--log-dir",
        str(tmp_path / "torchrun-logs"),
        str(REPO / "gpu_gates" / f"{gate}.py"),
        "--backend",
        "gloo",
        "--report",
        str(report),
        *args,
    ]
    # PYTHONFAULTHANDLER: a launch killed at the test's timeout prints every process's stacks first
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    env.pop(HOOK_ENV, None)
    server_env = dict(env)  # what every launch of this worker shares (the launch server's)
    if hook:
        env[HOOK_ENV] = hook
    env.update(extra_env or {})
    start = time.monotonic()
    server = LaunchServer.for_launch(env, REPO, server_env) if launcher == "forked" else None
    if server is not None:  # the same launch, forked from the worker's launch server
        returncode, output, timed_out, launcher_pid = server.run(cmd[2:], env, REPO, timeout_s, str(report))
    else:
        returncode, output, timed_out, launcher_pid = _run_program(cmd, env, report, timeout_s)
    elapsed = time.monotonic() - start
    survivors: List[int] = []
    for _ in range(40):  # workers may need a moment to be reaped after the launcher exits
        survivors = sorted(set(pids_mentioning(str(report)) + pids_in_session(launcher_pid)))
        if not survivors:
            break
        time.sleep(0.05)
    run = GateRun(
        returncode,
        elapsed,
        output,
        report,
        survivors=survivors,
        timed_out=timed_out,
        port=port,
        launcher=launcher,
        launcher_pid=launcher_pid,
    )
    if report.exists():
        run.report = json.loads(report.read_text())
    return run


def _run_program(cmd: List[str], env: Dict[str, str], report: Path, timeout_s: float):
    """The launcher as a program of its own session: (exit code, output, timed out, pid).
    At the timeout the output gets a diagnosis of the launch's processes and they are
    SIGKILLed (tests/gates/hang_dump.py)."""
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    with proc.stdout:
        output, timed_out = read_output(proc.stdout.fileno(), timeout_s, proc.pid, str(report))
    return proc.wait(), output, timed_out, proc.pid


class SideBySide:
    """Gate launches that mostly wait, run side by side in one lane's turn.

    A test module hands in its jobs (name -> (function of a launcher, heavy)); they start
    at once on ``parallel`` threads while the module holds its lane's lock, and a test
    reads its job's result with ``batch[name]`` (waiting for it; a job's exception is
    raised there). A job's launcher is :func:`launch_gate` in a folder of its own. The
    jobs sit out deadlines and grace windows, so their waits overlap; the ``heavy`` ones
    (a six-rank run working through its steps) go one at a time, so no two of them
    compete for the cores while a deadline is running. The forked launches share the
    worker's launch server, which serves overlapping launches."""

    def __init__(self, tmp_path_factory, lane: str, jobs: Dict[str, "tuple"], parallel: int = 3) -> None:
        import concurrent.futures
        import threading

        self._factory, self._heavy = tmp_path_factory, threading.Semaphore(1)
        self._pool = concurrent.futures.ThreadPoolExecutor(parallel, thread_name_prefix=f"gates-{lane}")
        self.futures = {name: self._pool.submit(self._run, name, job, heavy) for name, (job, heavy) in jobs.items()}

    def _run(self, name: str, job, heavy: bool):
        def launch(gate: str, nproc: int, *args: str, **kwargs) -> GateRun:
            folder = "".join(c if c.isalnum() else "_" for c in name)[:40]
            return launch_gate(self._factory.mktemp(folder), gate, nproc, *args, lane=None, **kwargs)

        with self._heavy if heavy else contextlib.nullcontext():
            return job(launch)

    def __getitem__(self, name: str):
        return self.futures[name].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@pytest.fixture
def gate_runner(tmp_path, request):
    def run(gate: str, nproc: int, *args: str, **kwargs) -> GateRun:
        return launch_gate(tmp_path, gate, nproc, *args, lane=lane_of(request.node), **kwargs).ended_cleanly()

    return run


@pytest.fixture
def gate_launch(tmp_path, request):
    """``gate_runner`` for runs that may end without a report (usage errors, a report
    that cannot be written): no hang and no orphan process is still a must."""

    def run(gate: str, nproc: int, *args: str, **kwargs) -> GateRun:
        return launch_gate(tmp_path, gate, nproc, *args, lane=lane_of(request.node), **kwargs).ended_cleanly(
            report=False
        )

    return run


@pytest.fixture(scope="module")
def module_gate_launch(tmp_path_factory, request):
    """``launch_gate`` for a module-scoped fixture whose one launch several tests assert
    on (each test calls ``run.ended_cleanly()`` itself)."""

    def run(gate: str, nproc: int, *args: str, **kwargs) -> GateRun:
        return launch_gate(tmp_path_factory.mktemp(gate), gate, nproc, *args, lane=lane_of(request.node), **kwargs)

    return run


@contextlib.contextmanager
def private_shm_folder():
    """A private folder for the gates' staging files (``RLHARNESS_SHM_DIR``), so a test
    sees exactly the files its own run left behind. It lives where the refit stream puts
    its buffers (``private_dirs.shm_base``: /dev/shm, or the temp folder on a system
    without one), so the leak checks run on every platform."""
    from gpu_gates.transports import private_dirs

    folder = private_dirs.make_private("test-shm", private_dirs.shm_base())  # tagged: the leak guard knows it
    try:
        yield folder
    finally:
        private_dirs.remove(folder)


@pytest.fixture
def private_shm():
    with private_shm_folder() as folder:
        yield folder


@pytest.fixture(scope="module")
def module_private_shm():
    with private_shm_folder() as folder:
        yield folder
