"""Fork hangs: forked ranks never fork while the agent's store thread is busy, a gate's
deadline ends its launch (with a report) before the test's timeout, and a launch the
test still has to kill leaves a diagnosis of where each process was stuck.

The hung process of the diagnosis test is the classic fork deadlock made certain: a thread holds a lock
while the main thread forks, and the child (which inherited the lock held, and not the
thread that would release it) waits for it forever. The parent then waits for the child.
Nothing of it is printed by the program; the diagnosis must name both processes, where
each is (the Python frames), and the threads' native state, and leave nothing running."""

import os
import re
import subprocess
import sys
import time

import pytest

from tests.gates.conftest import GateRun, with_gate_deadline
from tests.gates.hang_dump import HEADER, read_output
from tests.gates.launch_forked import ranks_start_together
from tests.gates.proc_table import live_processes

PROGRAM = r"""
import os, sys, threading, time

held, release = threading.Lock(), threading.Event()

def lock_holder():
    with held:
        print("held", flush=True)
        release.wait()

def child_waits_for_a_lock_held_at_fork():
    print("child blocking", flush=True)
    held.acquire()  # never returns: its holder is a thread of the parent

def parent_waits_for_its_child(pid):
    os.waitpid(pid, 0)

threading.Thread(target=lock_holder, name="lock-holder", daemon=True).start()
while not held.locked():
    time.sleep(0.01)
pid = os.fork()
if pid == 0:
    child_waits_for_a_lock_held_at_fork()
parent_waits_for_its_child(pid)
"""


def _until(fd: int, text: bytes, limit_s: float = 60.0) -> bytes:
    """Read the program's output until ``text`` has appeared (the hang is in place)."""
    got, end = b"", time.monotonic() + limit_s
    while text not in got and time.monotonic() < end:
        got += os.read(fd, 4096)
    assert text in got, got
    return got


def _child_asleep(parent: int, limit_s: float = 60.0) -> None:
    """Wait until the parent's child sleeps: "child blocking" is printed just *before* it
    blocks, and a snapshot taken in between sees it running (state R, no wait channel)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if any(int(fields[1]) == parent and fields[0] == "S" for _, fields in live_processes()):
            return
        time.sleep(0.01)
    raise AssertionError(f"the child of {parent} never blocked")


def test_a_hung_launch_is_killed_with_every_process_stacks_and_threads_in_its_output(tmp_path):
    mark = str(tmp_path / "hung-launch-marker")
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-c", PROGRAM, mark],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    with proc.stdout:
        fd = proc.stdout.fileno()
        _until(fd, b"child blocking")
        _child_asleep(proc.pid)
        output, timed_out = read_output(fd, 0.0, proc.pid, mark)  # due at once: diagnose now
    assert timed_out and proc.wait(timeout=10) != 0
    assert HEADER in output and "its 2 process(es)" in output, output
    sections = dict(re.findall(r"---- pid (\d+): Python stacks.*?\n(.*?)(?=\n---- pid |\n==== end)", output, re.S))
    child = next(pid for pid in sections if int(pid) != proc.pid)
    assert set(sections) == {str(proc.pid), child}, output
    assert "child_waits_for_a_lock_held_at_fork" in sections[child], output
    parent = sections[str(proc.pid)]
    assert "parent_waits_for_its_child" in parent and "lock_holder" in parent, output  # every thread
    # the native view: each process, its parent, each thread's name and what it waits in
    assert f"pid {child} (parent {proc.pid}, state " in output, output
    assert re.search(rf"\n  thread {child} '\S+' state S waiting in \S+\n", output), output
    # and the session is gone, the (would-be) killed launch's test failure shows it all
    assert not [pid for pid, fields in live_processes() if int(fields[3]) == proc.pid]
    run = GateRun(-9, 0.0, "x" * 5000 + output, tmp_path / "r.json", timed_out=True)
    assert run.hang_diagnosis().endswith(output[output.index(HEADER) :])


class _Agent:
    """torch's ``MultiprocessContext`` as far as the start line sees it: ``_start`` forks
    one process per rank running ``entrypoint(rank)``. Here it lingers after the forks,
    long enough for an unheld rank to get going (a fork runs at once)."""

    def __init__(self, entrypoint, nprocs: int) -> None:
        self.entrypoint, self.nprocs, self.pids, self.forked_all = entrypoint, nprocs, [], 0.0

    def _start(self) -> None:
        for rank in range(self.nprocs):
            pid = os.fork()
            if pid == 0:
                try:
                    self.entrypoint(rank)
                finally:
                    os._exit(0)
            self.pids.append(pid)
        time.sleep(0.3)
        self.forked_all = time.monotonic()


def test_forked_ranks_wait_for_the_last_fork_before_running():
    """tests/gates/launch_forked.py: no rank runs (connects to the agent's store, whose
    thread must be idle whenever the agent forks) before the agent has forked them all."""
    out_r, out_w = os.pipe()

    def rank_entry(rank):
        """What a rank runs: the gate (here: say when it started)."""
        os.write(out_w, f"{rank} {time.monotonic()}\n".encode())

    class Agent(_Agent):
        pass

    ranks_start_together(Agent)
    agent = Agent(rank_entry, 3)
    agent._start()
    os.close(out_w)
    for pid in agent.pids:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    with os.fdopen(out_r) as fh:
        started = {int(rank): float(at) for rank, at in (line.split() for line in fh)}
    assert sorted(started) == [0, 1, 2]
    assert all(at > agent.forked_all for at in started.values()), (started, agent.forked_all)
    assert Agent.__dict__["_start"].__name__ == "_start" and agent.entrypoint.__name__ == "rank_entry"


def test_the_gate_deadline_always_ends_a_launch_before_the_test_kills_it():
    """A gate launch gets a per-rank deadline that leaves rank 0 time to report before
    the test's timeout (the gate's default 120 s had been past the default 90 s)."""
    assert with_gate_deadline(["--cycles", "2"], 90.0) == ["--cycles", "2", "--timeout-s", "70"]
    assert with_gate_deadline(["--timeout-s", "50"], 90.0) == ["--timeout-s", "50"]
    with pytest.raises(AssertionError, match="--timeout-s 120 does not fit in the test's timeout_s=90"):
        with_gate_deadline(["--timeout-s", "120"], 90.0)
    with pytest.raises(AssertionError, match="leaves the gate's ranks no deadline"):
        with_gate_deadline([], 25.0)
