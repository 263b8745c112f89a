"""The machine's live processes, read from ``/proc``: how the gate tests find what a
launch left running (by its unique report path on a command line, or by its session)."""

from __future__ import annotations

import os
from typing import Iterator, List, Tuple


def live_processes() -> Iterator[Tuple[int, List[str]]]:
    """``(pid, stat fields after the command name)`` of every live (non-zombie) process
    but this one: state, ppid, pgrp, session, ..."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if fields[0] != "Z":
            yield int(entry), fields


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def pids_mentioning(text: str) -> List[int]:
    """Live processes whose command line contains ``text``."""
    return [pid for pid, _ in live_processes() if text in command_line(pid)]


def pids_in_session(sid: int) -> List[int]:
    """Live processes of session ``sid``: a served launch and all it started."""
    return [pid for pid, fields in live_processes() if int(fields[3]) == sid]
