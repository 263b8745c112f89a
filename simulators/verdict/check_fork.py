"""The invariant oracle on a long run's log, split over two processes.

Writing a 1024-GPU run's outputs spends about 5 CPU seconds in the oracle, 3.5 in the
summary's figures and 3 in the event log, trace and picture, one after the other, on a
machine with (at least) two cores. The oracle and the event log read only the records;
the figures, trace and picture read the intervals and need of the oracle only the
``handover`` check's findings (the summary's handover table). So :func:`check_beside`
forks: the child runs most checks and writes the event log, on the records it shares
with the parent (copy on write: nothing is copied or serialised but the findings it
sends back), while the parent runs the rest of the checks and, meanwhile, the work it is
given (figures, trace, picture). The findings are merged exactly as ``check_log`` merges
them (:func:`harness.logs.invariants.merge_findings`), so every output is byte-identical to a
run in one process; the CPU time is the same, the wall time shorter by the overlap.

The split is taken only where it is safe and worth it: ``os.fork`` on Linux, no other
Python thread running (a child forked beside a thread could inherit a lock it holds), a
CPU to spare (:func:`_spare_cpu`), and a log of at least :data:`FORK_MIN_RECORDS`
records. It costs about 1 CPU second more in all on the 1024-GPU run (each process
copies the memory pages of the records it touches: copy on write), which is why a busy
machine runs the outputs in one process. A child that fails in any way
(an exception, a signal, nothing sent back) costs nothing but time: the parent then
runs the child's checks itself, so an error surfaces as it would have without the split.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from harness.logs.invariants import CHECKS, Violation, merge_findings, run_checks

T = TypeVar("T")
Found = Dict[str, List[Violation]]

#: below this many records a run's outputs take well under a second: no fork
FORK_MIN_RECORDS = 200_000
#: the checks the parent runs: ``handover`` (the summary's table reads its findings) and
#: ``cycle_trends`` (numpy's least squares: kept out of a forked child), about the share
#: that balances the summary against the child's checks on the 1024-GPU run
HERE = ("handover", "cycle_trends")


def fork_worthwhile(records: Sequence[dict]) -> bool:
    """Whether :func:`check_beside` would fork for this log (see the module doc)."""
    return (
        len(records) >= FORK_MIN_RECORDS
        and hasattr(os, "fork")
        and sys.platform.startswith("linux")
        and threading.active_count() == 1
        and _spare_cpu(len(os.sched_getaffinity(0)))
    )


def _spare_cpu(cpus: int) -> bool:
    """Whether a CPU is likely free for the child: two or more CPUs, and the last minute's
    load average (tasks running or waiting to, this one included) at most ``cpus - 1``.
    On a busy machine the split gains nothing — the scheduler shares CPU time between
    sessions (process groups), not processes, so the two halves get the one half's
    share — and costs its extra CPU time (measured: 19.0 s instead of 17.1 s at load 7)."""
    if cpus < 2:
        return False
    try:
        return os.getloadavg()[0] <= cpus - 1
    except OSError:  # no load average to read: assume the CPUs are free
        return True


def check_beside(
    records: Sequence[dict],
    work: Callable[[Found], T],
    *,
    here: Sequence[str] = HERE,
    child_work: Optional[Callable[[], None]] = None,
    fork: Optional[bool] = None,
) -> Tuple[List[Violation], T]:
    """``(check_log(records), work(found))``, where ``found`` holds the findings of the
    checks named in ``here`` (by check, in the order each found them), and
    ``child_work()`` (something that reads the records and writes a file) done as well.
    With ``fork`` (default: :func:`fork_worthwhile`) the other checks and
    ``child_work`` run in a forked child meanwhile; without, every check runs first, then
    ``child_work``, then ``work``, in this process."""
    names = list(CHECKS)
    mine = [n for n in names if n in here]
    theirs = [n for n in names if n not in here]
    if not (fork_worthwhile(records) if fork is None else fork):
        found = run_checks(records, names)
        if child_work is not None:
            child_work()
        value = work({n: found[n] for n in mine})
        return merge_findings(found, names), value
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its checks and child_work, the findings down the pipe, and out
        try:
            os.close(read_end)
            _child(records, theirs, child_work, write_end)
        finally:
            os._exit(1)  # (never reached: _child exits; nothing of the parent's runs on here)
    os.close(write_end)
    reaped = False
    try:
        found = run_checks(records, mine)
        value = work(dict(found))
        payload = _read_all(read_end)
        status = _reap(pid)
        reaped = True
    finally:
        os.close(read_end)
        if not reaped:  # this process failed first: the child's work is of no use
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _reap(pid)
    theirs_found = _findings(payload, status, theirs)
    if theirs_found is None:  # the child failed: its share runs here (an error surfaces as usual)
        theirs_found = run_checks(records, theirs)
        if child_work is not None:
            child_work()
    found.update(theirs_found)
    return merge_findings(found, names), value


def _child(records: Sequence[dict], names: List[str], work: Optional[Callable[[], None]], fd: int) -> None:
    """Run ``names`` and ``work``, write the pickled findings to ``fd``, exit (never
    returns, never runs the parent's exit handlers or flushes its buffers: ``os._exit``).
    On any error it sends nothing and the parent does its share itself."""
    code = 1
    try:
        found = run_checks(records, names)
        if work is not None:
            work()
        data = pickle.dumps(found, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        code = 0
    except BaseException:  # noqa: BLE001 - anything at all: the parent redoes the work
        pass
    finally:
        os._exit(code)


def _reap(pid: int) -> Optional[int]:
    """The child's wait status (``None`` where it was reaped already: SIGCHLD ignored)."""
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return None


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _findings(payload: bytes, status: Optional[int], names: List[str]) -> Optional[Found]:
    """The child's findings, or ``None`` when it did not exit cleanly with all of them
    (with no status to read, a whole payload is the proof: it is written last)."""
    if not payload or (status is not None and not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)):
        return None
    try:
        found = pickle.loads(payload)
    except Exception:  # noqa: BLE001 - a truncated or corrupt payload: redo the work
        return None
    return found if isinstance(found, dict) and list(found) == names else None
