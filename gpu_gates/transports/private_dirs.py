"""Private folders for a run's ``ipc://`` socket files and ``/dev/shm`` staging files, and
who removes them.

A process killed with SIGKILL runs no handler: the socket file it bound and the staging
files it created stay behind. So nothing the refit stream creates lives loose in ``/tmp``
or ``/dev/shm``: it lives in a folder of its run, and a process that survives removes
the folder on every exit path:

* a launcher that owns the folders (the test suite's gate launcher, a benchmark's parent
  process) creates them, passes them down (:data:`IPC_DIR_ENV`, ``RLHARNESS_SHM_DIR``)
  and removes them when its children are gone, however they ended;
* a gate launched by hand (``torchrun``) derives one folder per run from its launcher's
  pid and rendezvous port; each rank joins it (a pid file) and the last rank out removes
  it (:meth:`RunFolder.leave`), so a killed rank 0 is cleaned up by rank 1 and the other
  way round;
* if every process of a run was killed, the next gate or benchmark start removes folders
  and staging files whose owner process is gone (:func:`sweep_stale`).

Names: ``rlh-<owner pid>-[<tag>-]<kind>-…``. ``RLHARNESS_TMP_TAG`` (set by the test
suite for its whole session) puts a tag in every name, so a session can tell its own
leftovers from those of other sessions on a shared machine.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Iterable, List, Optional

IPC_DIR_ENV = "RLHARNESS_IPC_DIR"  # a launcher-owned folder for the run's socket files
TAG_ENV = "RLHARNESS_TMP_TAG"  # a tag in every folder name (a test session's)
STAGING_PREFIX = "rlharness_refit_"  # staging file names: <prefix><owner pid>_<random>
_OWNED = re.compile(r"^rlh-(\d{1,7})-")  # a pid (pid_max <= 4194304), then a dash
_STAGING = re.compile(r"^" + STAGING_PREFIX + r"(\d{1,7})_")
_MEMBER = ".member-"


def tag() -> str:
    return os.environ.get(TAG_ENV, "")


def folder_name(owner_pid: int, kind: str) -> str:
    """``rlh-<owner pid>-[<tag>-]<kind>``: the owner's pid lets a later sweep see it is gone."""
    t = tag()
    return f"rlh-{owner_pid}-{t + '-' if t else ''}{kind}"


def make_private(kind: str, base: Optional[str] = None) -> str:
    """A fresh private folder (mode 0700) owned by this process, e.g. a benchmark's or a
    test launcher's; the caller removes it (:func:`remove`)."""
    return tempfile.mkdtemp(prefix=folder_name(os.getpid(), kind) + "-", dir=base)


def remove(path: Optional[str]) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def shm_base() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a SIGKILLed rank stays one until torchrun
    reaps it, and must already count as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunFolder:
    """A folder shared by the processes of one run. ``owned``: the run derived it and
    removes it itself (the last member out); otherwise a launcher owns it."""

    def __init__(self, path: str, owned: bool) -> None:
        self.path, self.owned = path, owned

    def join(self) -> "RunFolder":
        os.makedirs(self.path, mode=0o700, exist_ok=True)
        if self.owned:
            open(os.path.join(self.path, f"{_MEMBER}{os.getpid()}"), "w").close()
        return self

    def leave(self) -> bool:
        """Drop this process's membership; the last live member removes the folder (a
        killed member's pid file names a dead process). True if it was removed."""
        if not self.owned:
            return False
        try:
            os.unlink(os.path.join(self.path, f"{_MEMBER}{os.getpid()}"))
        except FileNotFoundError:
            pass
        try:
            members = [int(n[len(_MEMBER) :]) for n in os.listdir(self.path) if n.startswith(_MEMBER)]
        except FileNotFoundError:
            return False
        if any(_alive(pid) for pid in members):
            return False
        remove(self.path)
        return True


def sweep_stale(bases: Iterable[str] = ()) -> List[str]:
    """Remove the project's folders (``rlh-<pid>-…``) and staging files
    (``rlharness_refit_<pid>_…``) whose owner process no longer exists, in the temp folder,
    the shared-memory folder and ``bases``. Returns what was removed."""
    removed = []
    for base in dict.fromkeys([tempfile.gettempdir(), shm_base(), *bases]):
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            m = _OWNED.match(name) or _STAGING.match(name)
            if m is None or _alive(int(m.group(1))):
                continue
            path = os.path.join(base, name)
            if os.path.isdir(path) and not os.path.islink(path):
                if not name.startswith("rlh-"):
                    continue
                remove(path)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    continue
            removed.append(path)
    return sorted(removed)
