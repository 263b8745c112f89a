"""Forked gate launches started by a launch server instead of a new program each.

``python tests/gates/launch_forked.py ARGV`` costs a Python start and an ``import torch``
(about 1.2 CPU s) for torchrun's agent alone. A test worker keeps one launch server
(``launch_forked.py --serve``: torch, torch's launcher and every gate imported once, no
thread running) and each launch is a fork of it that becomes exactly what the program
would be: its own session and process group, the launch's environment, working folder
and output, then the same ``launch(ARGV)`` (torch's agent, the ranks forked from it).
The server never launches anything itself, so every launch starts from the same state.

A launch whose environment differs from the server's in anything read at import time
(only the gate hook and the run's private folders may differ: the gates read those when
they run) is started as a program. A module a launch preloads that the server lacks
(megatron-core) the server imports before it forks that launch, once for the worker.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from tests.gates.hang_dump import read_output
from tests.gates.launch_forked import receive_message, send_message

LAUNCH_FORKED = Path(__file__).with_name("launch_forked.py")
#: Variables a launch may set differently from the server: read by the gates at run time
#: (or, for pytest's own, never read by them).
PER_LAUNCH_ENV = ("RLHARNESS_GATE_TEST_HOOK", "RLHARNESS_SHM_DIR", "RLHARNESS_IPC_DIR", "PYTEST_CURRENT_TEST")


def _base(env: Dict[str, str]) -> Dict[str, str]:
    return {k: v for k, v in env.items() if k not in PER_LAUNCH_ENV}


class LaunchServer:
    """The worker's launch server (started on first use, ended with the worker)."""

    _current: Optional["LaunchServer"] = None
    _choosing = threading.Lock()  # launches may come from several threads (test_gate_waits.py)

    def __init__(self, env: Dict[str, str], cwd: Path) -> None:
        self.env = _base(env)
        self._sending = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, str(LAUNCH_FORKED), "--serve", str(theirs.fileno())],
            cwd=cwd,
            env=self.env,
            pass_fds=[theirs.fileno()],
            start_new_session=True,
        )
        theirs.close()
        self.conn = ours
        ready, _ = receive_message(self.conn)
        if ready is None:
            raise RuntimeError(f"the gate launch server ended before it was ready (exit {self.proc.wait()})")
        atexit.register(self.close)

    @classmethod
    def for_launch(cls, env: Dict[str, str], cwd: Path, server_env: Dict[str, str]) -> Optional["LaunchServer"]:
        """The server (environment ``server_env``, started if need be) that can make this
        launch; None: start it as a program."""
        if _base(env) != _base(server_env):
            return None
        with cls._choosing:
            if cls._current is None or cls._current.proc.poll() is not None or cls._current.env != _base(server_env):
                cls._current = cls(server_env, cwd)
            return cls._current

    def close(self) -> None:
        self.conn.close()  # the server ends when its socket closes
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def run(
        self, argv: List[str], env: Dict[str, str], cwd: Path, timeout_s: float, mark: str
    ) -> Tuple[int, str, bool, int]:
        """Launch and wait, as ``Popen(...).communicate(timeout)`` would: (exit code,
        output, timed out, the launch's pid = its session). At the timeout the output
        gets a diagnosis of the launch's processes (tests/gates/hang_dump.py; ``mark``:
        what their command lines carry) and they are SIGKILLed. Launches may overlap:
        each has its own reply socket (the server's answers for it) and output pipe."""
        out_r, out_w = os.pipe()
        replies, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self._sending:
                send_message(self.conn, {"argv": argv, "env": env, "cwd": str(cwd)}, (out_w, theirs.fileno()))
        finally:
            os.close(out_w)
            theirs.close()
        with replies:
            return self._follow(replies, out_r, timeout_s, mark)

    def _follow(self, replies: socket.socket, out_r: int, timeout_s: float, mark: str) -> Tuple[int, str, bool, int]:
        started, _ = receive_message(replies)
        pid = started["pid"]
        try:
            output, timed_out = read_output(out_r, timeout_s, pid, mark)
        finally:
            os.close(out_r)
        ended, _ = receive_message(replies)
        return ended["exit_code"], output, timed_out, pid
