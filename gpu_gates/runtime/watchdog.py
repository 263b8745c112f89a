"""Never hang: a per-rank deadline thread and a SIGTERM listener thread.

A rank stuck in a collective (a peer died, a group mismatch) blocks inside C++ where
Python signal handlers never run, so both guards are *threads*: the watchdog wakes at
the deadline, and the signal thread receives SIGTERM through ``sigwait`` (SIGTERM is
blocked in every other thread, including the backend's own threads, which inherit the
mask of the main thread that starts them). Either one calls the gate's emergency exit,
which writes the report and then ``os._exit``s non-zero.

torchrun tears a job down with SIGTERM when any worker exits non-zero, so catching it is
what keeps rank 0's report alive when another rank fails first.
"""

from __future__ import annotations

import faulthandler
import signal
import tempfile
import threading
import time
from typing import Callable, Optional


class Watchdog:
    """Calls ``on_fire(reason)`` once if not stopped before ``deadline`` (time.monotonic)."""

    def __init__(self, deadline: float, on_fire: Callable[[str], None], describe: Callable[[], str]) -> None:
        self.deadline = deadline
        self._on_fire = on_fire
        self._describe = describe
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gate-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def _run(self) -> None:
        if self._stop.wait(max(0.0, self.remaining())):
            return
        self._on_fire(f"timed out: deadline passed while {self._describe()}")


def thread_stacks() -> str:
    """Every thread's Python stack, as Python's fault handler prints it (it reads them
    without the GIL, so a thread stuck in C with the GIL held does not stop it)."""
    with tempfile.TemporaryFile() as fh:
        faulthandler.dump_traceback(fh, all_threads=True)
        fh.seek(0)
        return fh.read().decode(errors="replace")


def block_sigterm_in_this_thread() -> bool:
    """Block SIGTERM here (call from the main thread before any other thread starts)."""
    if not hasattr(signal, "pthread_sigmask"):
        return False
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    return True


def start_sigterm_listener(on_signal: Callable[[str], None]) -> Optional[threading.Thread]:
    """Start a thread that turns SIGTERM into ``on_signal(reason)``."""
    if not block_sigterm_in_this_thread():
        return None

    def wait_for_sigterm() -> None:
        signal.sigwait({signal.SIGTERM})
        on_signal("terminated by SIGTERM (the launcher tore the job down; another rank probably failed or hung)")

    thread = threading.Thread(target=wait_for_sigterm, name="gate-sigterm", daemon=True)
    thread.start()
    return thread
