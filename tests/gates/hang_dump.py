"""What a gate launch that ran past its test's timeout was doing, in the test's output.

A gate never hangs by design: every rank has a deadline (``--timeout-s``) that ends it
with a report well before the test's own timeout (tests/gates/conftest.py makes the two
fit). So a launch the test has to kill is stuck where no gate code runs: torch's agent,
a rank that never reached its watchdog, a thread holding the GIL in C. Killed with
SIGKILL, such a launch leaves nothing to read (a CI run once failed with ``output=''``).
Before the kill, :func:`read_output` therefore adds a diagnosis to the launch's output:

* the native view of every process of the launch's session, read from ``/proc``
  (parent, state, and each thread's name, state and kernel wait channel: a thread
  parked on a futex that nothing will wake shows up as ``futex_wait...`` there);
* each process's Python stacks, every thread: the processes are frozen together
  (SIGSTOP, so none reacts to another's end), then one at a time sent SIGABRT and let
  go; Python's ``faulthandler`` (enabled in every rank and agent: torch's ``record``
  does it in the agent, ``PYTHONFAULTHANDLER=1`` in the program launches) prints the
  stacks on the launch's own output pipe, and the process ends. Reading the pipe between
  processes keeps each dump whole and labelled with its pid.

Python's fault handler writes without taking any lock, so this works for a process
deadlocked on a lock it inherited across ``fork`` too.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import time
from typing import Callable, List, Tuple

from tests.gates.proc_table import command_line, pids_in_session, pids_mentioning

#: How long one process gets to print its stacks and end after SIGABRT.
DUMP_WAIT_S = 3.0
HEADER = "==== gate launch ran past the test's timeout"


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return "?"


def _stat(path: str) -> List[str]:
    """The fields of a ``/proc/.../stat`` file after the command name (state, ppid, ...)."""
    text = _read(path)
    return text.rsplit(")", 1)[1].split() if ")" in text else ["?", "?"]


def native_view(pids: List[int]) -> str:
    """One block per process: pid, parent, state, command line, then one line per thread
    (tid, name, state, kernel wait channel)."""
    lines = []
    for pid in pids:
        stat = _stat(f"/proc/{pid}/stat")
        lines.append(f"pid {pid} (parent {stat[1]}, state {stat[0]}): {' '.join(command_line(pid).split())[:200]}")
        try:
            tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
        except OSError:
            tids = []
        for tid in tids:
            task = f"/proc/{pid}/task/{tid}"
            lines.append(
                f"  thread {tid} {_read(task + '/comm')!r} state {_stat(task + '/stat')[0]} "
                f"waiting in {_read(task + '/wchan') or '-'}"
            )
    return "\n".join(lines)


def _gone(pid: int) -> bool:
    return _stat(f"/proc/{pid}/stat")[0] in ("Z", "X", "?")


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def python_stacks(pids: List[int], drain: Callable[[float], bytes]) -> str:
    """Have each of the (frozen) ``pids`` print its Python stacks (SIGABRT, faulthandler)
    and end, one at a time; ``drain(seconds)`` returns what the launch printed meanwhile."""
    parts = []
    for pid in pids:
        try:  # no core file: the stacks are all we want from it
            resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
        except (OSError, ValueError):
            pass
        _signal(pid, signal.SIGABRT)
        _signal(pid, signal.SIGCONT)
        printed, until = b"", time.monotonic() + DUMP_WAIT_S
        while not _gone(pid) and time.monotonic() < until:
            printed += drain(0.05)
        printed += drain(0.05)
        text = printed.decode(errors="replace").rstrip() or "(printed nothing: no Python fault handler, or stuck)"
        parts.append(f"---- pid {pid}: Python stacks (faulthandler, on SIGABRT)\n{text}")
    return "\n".join(parts)


def diagnose(pids: List[int], timeout_s: float, drain: Callable[[float], bytes]) -> str:
    """The diagnosis of a launch whose processes are ``pids`` (see the module's text).
    Leaves them dead or frozen; the caller SIGKILLs them after it."""
    view = native_view(pids)  # before the freeze: where each thread waits
    for pid in pids:
        _signal(pid, signal.SIGSTOP)
    before = drain(0.05)  # printed before the freeze: the launch's own output, not a dump
    stacks = python_stacks(pids, drain)
    return (
        before.decode(errors="replace") + f"\n{HEADER} ({timeout_s:g} s): its {len(pids)} process(es) ====\n"
        f"{view}\n{stacks}\n==== end of the hung launch's diagnosis ====\n"
    )


def launch_processes(session: int, mark: str) -> List[int]:
    """A launch's live processes: its session (a served launch's ranks are forks in it)
    and any process whose command line carries ``mark`` (torchrun starts each program
    rank in a session of its own; its command line has the launch's report path)."""
    return sorted(set(pids_in_session(session)) | set(pids_mentioning(mark)))


def read_output(fd: int, timeout_s: float, session: int, mark: str) -> Tuple[str, bool]:
    """Read a launch's output (``fd``, the read end of its pipe) until every writer has
    closed it: (output, timed out). At ``timeout_s`` the diagnosis of its processes
    (:func:`launch_processes`) is added and they are SIGKILLed; the output then ends at
    once, or 10 s later if something else still holds the pipe."""
    chunks: List[bytes] = []
    deadline, timed_out, closed = time.monotonic() + timeout_s, False, []

    def drain(wait: float) -> bytes:
        """What the launch printed within ``wait`` s (less if it printed at once)."""
        got = b""
        while not closed and select.select([fd], [], [], wait)[0]:
            data = os.read(fd, 1 << 16)
            if not data:
                closed.append(True)
            got, wait = got + data, 0.0
        if closed and wait:
            time.sleep(wait)
        return got

    while True:
        left = deadline - time.monotonic()
        if left <= 0 and not timed_out:
            timed_out = True
            chunks.append(diagnose(launch_processes(session, mark), timeout_s, drain).encode())
            try:
                os.killpg(session, signal.SIGKILL)
            except ProcessLookupError:
                pass
            for pid in launch_processes(session, mark):
                _signal(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10.0
            continue
        if left <= 0 or closed:
            break
        if select.select([fd], [], [], left)[0]:
            data = os.read(fd, 1 << 16)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace"), timed_out
