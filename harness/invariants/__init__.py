"""The invariant oracle: named checks over an event log, shared by every runtime.

``check_log(records)`` runs every registered check (or the named ones) over a list of
record dicts and returns the violations; each check has a test that feeds it a broken
trace and sees it fire (tests/unit/test_invariants.py).
"""

from __future__ import annotations

from typing import Iterable, List, Optional

from harness.invariants import (  # noqa: F401  (registration)
    cache, dataplane, groups, handover, memory, ordering, outcome, ownership, plans, refit_wire, routing, streaming, versions)
from harness.invariants.base import CHECKS, Records, Violation


def check_log(records: Records, names: Optional[Iterable[str]] = None) -> List[Violation]:
    selected = list(CHECKS) if names is None else list(names)
    unknown = [n for n in selected if n not in CHECKS]
    if unknown:
        raise KeyError(f"unknown invariant(s) {unknown}; known: {', '.join(sorted(CHECKS))}")
    out: List[Violation] = []
    for name in selected:
        out.extend(CHECKS[name](records))
    return sorted(out, key=lambda v: (v.seq, v.invariant))


__all__ = ["CHECKS", "Violation", "check_log"]
