"""A pytest plugin that fails the session if it left project files in ``/dev/shm`` or the
temp folder.

The project's files there all carry known names: the refit stream's staging files
(``rlharness_refit_<pid>_…``) and the private folders of sockets and staging files
(``rlh-<pid>-…``, ``gpu_gates/transports/private_dirs.py``). At the start of the session (in the
controller process under xdist, before any worker starts) the guard sets a fresh
``RLHARNESS_TMP_TAG``; every worker, gate rank and child process inherits it and puts it
in every such name. At the end (after every worker finished) a name that still carries
the tag is this session's leak, and the session fails, whatever other sessions on the
same machine create or leave meanwhile (those names carry their own tag, or none, and
are only listed as information).
"""

from __future__ import annotations

import os
import tempfile
from typing import List, Set

import pytest

from gpu_gates.transports import private_dirs

PREFIXES = ("rlh-", private_dirs.STAGING_PREFIX)
_state = {}


def project_names() -> Set[str]:
    """Paths in the temp folder and ``/dev/shm`` that carry a project prefix."""
    found = set()
    for base in dict.fromkeys([tempfile.gettempdir(), private_dirs.shm_base()]):
        try:
            found.update(os.path.join(base, n) for n in os.listdir(base) if n.startswith(PREFIXES))
        except OSError:
            continue
    return found


def carries(path: str, tag: str) -> bool:
    name = os.path.basename(path)
    return f"-{tag}-" in name or f"_{tag}_" in name


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # an xdist worker: the controller guards the session
        return
    tag = f"t{os.getpid()}"
    os.environ[private_dirs.TAG_ENV] = tag  # fresh per session: a nested session gets its own
    _state.update(tag=tag, before=project_names(), leaks=[], others=[])


def pytest_sessionfinish(session, exitstatus):
    if "tag" not in _state:
        return
    now = project_names()
    leaks: List[str] = sorted(p for p in now if carries(p, _state["tag"]))
    _state["leaks"] = leaks
    _state["others"] = sorted(p for p in now - _state["before"] if p not in leaks)
    if leaks:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _state.get("leaks"):
        terminalreporter.section("files left behind", red=True)
        terminalreporter.write_line(
            f"this session (tag {_state['tag']}) left {len(_state['leaks'])} project file(s) "
            "in /dev/shm or the temp folder: the session fails"
        )
        for path in _state["leaks"]:
            terminalreporter.write_line(f"  {path}")
    if _state.get("others"):
        terminalreporter.write_line(
            f"new project names without this session's tag (other sessions on this machine?): "
            f"{', '.join(_state['others'][:10])}"
        )
