"""Taking turns between the xdist workers of one test session.

Some jobs (a torchrun gate, a local Ray start) assume they have the 2-core machine to
themselves; two side by side push each other past their deadlines. A file lock in the
session's base temp folder (shared by its workers only) makes them take turns without
serializing other test sessions on the same machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator, Optional


@contextlib.contextmanager
def take_turns(session: Optional[Path], name: str) -> Iterator[None]:
    """Hold the session's lock ``name`` for the block; a no-op outside pytest-xdist (one
    process runs one test at a time anyway) or when the session folder is unknown."""
    if session is None or "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    with open(session / name, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
