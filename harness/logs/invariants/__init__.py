"""The invariant oracle: named checks over an event log, shared by every runtime.

``check_log(records)`` runs every registered check (or the named ones) over a list of
record dicts and returns the violations; each check has a test that feeds it a broken
trace and sees it fire (tests/unit/test_invariants.py and its sibling
``test_*_invariants.py`` files, or the check's subsystem's suite).
"""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Tuple

from harness.logs.invariants import (  # noqa: F401  (registration)
    cache,
    collective_order,
    dataplane,
    engine,
    engine_transition,
    groups,
    handover,
    handover_headroom,
    host_memory,
    lifecycle,
    memory,
    ordering,
    outcome,
    ownership,
    plans,
    pump_liveness,
    refit_payload,
    refit_wire,
    release_reuse,
    routing,
    scheduling,
    streaming,
    trajectory_age,
    trends,
    version_span,
    versions,
    waitfor,
    hot_states,
)
from harness.logs.invariants.base import CHECKS, SEES, Records, Violation
from harness.logs.invariants.decision_walks import WALK_CHECKS, run_walks


def check_log(records: Records, names: Optional[Iterable[str]] = None) -> List[Violation]:
    selected = list(CHECKS) if names is None else list(names)
    return merge_findings(run_checks(records, selected), selected)


def run_checks(records: Records, names: Iterable[str]) -> Dict[str, List[Violation]]:
    """Each named check's violations, in the order it found them (one view per set of
    kinds, built in one pass). ``check_log`` is :func:`merge_findings` of this; the two
    halves of a split run (simulators/verdict/check_fork.py) are merged the same way."""
    selected = list(names)
    unknown = [n for n in selected if n not in CHECKS]
    if unknown:
        raise KeyError(f"unknown invariant(s) {unknown}; known: {', '.join(sorted(CHECKS))}")
    sees = [SEES.get(name) for name in selected]  # a check put in CHECKS by hand sees every record
    walked, walked_kinds = shared_walks(selected)
    views = kind_views(records, sees + [walked_kinds] if walked else sees)
    found = run_walks(views[walked_kinds], walked) if walked else {}
    return {name: found[name] if name in found else CHECKS[name](views[SEES.get(name)]) for name in selected}


def shared_walks(names: Iterable[str]) -> Tuple[List[str], FrozenSet[str]]:
    """The named checks that are decision walks (harness/logs/invariants/decision_walks.py),
    to run as one walk, and every kind they see together (a check replaced in
    ``CHECKS`` by hand runs as itself)."""
    walked = [n for n in names if n in WALK_CHECKS and getattr(CHECKS[n], "walk_of", None) == n]
    kinds: FrozenSet[str] = frozenset().union(*(SEES[n] or () for n in walked))
    return walked, kinds


def merge_findings(found: Mapping[str, List[Violation]], order: Iterable[str]) -> List[Violation]:
    """Every check's violations, in ``order`` of the checks, sorted by (seq, check): a
    stable sort, so one check's findings at one seq keep the order it found them in."""
    out: List[Violation] = []
    for name in order:
        out.extend(found[name])
    return sorted(out, key=lambda v: (v.seq, v.invariant))


def kind_views(
    records: Records, kind_sets: Iterable[Optional[FrozenSet[str]]]
) -> Dict[Optional[FrozenSet[str]], Records]:
    """For each set of kinds, the records of those kinds in log order, with the log's
    first and last record (``None``: the whole log). One pass over the log fills every
    view: each record is appended to the views of its kind, so a check that keeps state
    from 30 thousand scheduler records no longer walks a million request records."""
    views: Dict[Optional[FrozenSet[str]], Any] = {}  # the whole log, or a list of its records
    appenders: Dict[str, list] = {}
    for kinds in set(kind_sets):
        if kinds is None:
            views[None] = records
            continue
        view: List[dict] = []
        views[kinds] = view
        for kind in kinds:
            appenders.setdefault(kind, []).append(view.append)
    if appenders and records:
        targets = {kind: tuple(fns) for kind, fns in appenders.items()}
        nothing = ()
        for r in records:
            for append in targets.get(r.get("kind"), nothing):
                append(r)
        first, last = records[0], records[-1]
        for kinds, view in views.items():
            if kinds is None:
                continue
            if not view or view[0] is not first:
                view.insert(0, first)
            if view[-1] is not last:
                view.append(last)
    return views


__all__ = ["CHECKS", "Violation", "check_log", "kind_views", "merge_findings", "run_checks"]
