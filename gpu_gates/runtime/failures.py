"""How a gate tells its failures: which of many ranks' failures is the headline, and a
multi-line message written whole on the launcher's stderr that every rank shares.
"""

from __future__ import annotations

import os
from typing import List

#: said of a check failure found while tearing down a run that had already failed (a
#: process group a hung peer still holds): a consequence, never the headline
AFTER_FAILURE_MARKER = "found after the run had already failed"
SECONDARY_MARKERS = (
    "terminated by SIGTERM",
    "GateAbort",
    "never reported",
    "closed by peer",
    "reset by peer",
    AFTER_FAILURE_MARKER,
)
TIMEOUT_MARKER = "timed out: deadline passed while"


def primary_failure(failures: List[str]) -> str:
    """The failure to headline: a rank's own problem, not a peer's knock-on abort or teardown."""
    # With only knock-on failures, the ranks that never reported name the likely culprit
    # (a rank that timed out and exited before its result reached rank 0 made the launcher
    # SIGTERM the rest); a rank's own SIGTERM says only that the job was torn down.
    fallback = next((f for f in failures if "never reported" in f), failures[0])
    primary = next((f for f in failures if not any(m in f for m in SECONDARY_MARKERS)), fallback)
    timeouts = [f for f in failures if TIMEOUT_MARKER in f]
    if TIMEOUT_MARKER in primary and len(timeouts) > 1:  # show where every stuck rank was
        where = "; ".join(" ".join(f.split(": ", 1)[-1].replace(TIMEOUT_MARKER, "").split()) for f in timeouts)
        return f"{len(timeouts)} rank(s) timed out ({where})"
    return primary


def write_at_once(stream, text: str) -> None:
    """Write a multi-line message with one write(2) on the stream's file descriptor.

    Every rank shares the launcher's stderr; printed line by line, a rank's traceback gets
    other ranks' lines inside it when they fail at the same moment. A pipe keeps a write of
    up to PIPE_BUF (4 KiB on Linux) whole, which a headline and its traceback fit in. A
    stream without a descriptor (captured by a test runner) gets an ordinary write."""
    stream.flush()
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        stream.write(text)
        stream.flush()
        return
    data = text.encode(getattr(stream, "encoding", None) or "utf-8", "backslashreplace")
    while data:
        data = data[os.write(fd, data) :]
