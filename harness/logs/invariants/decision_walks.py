"""One replay of the scheduler's decisions, shared by every check that reads them.

Several checks judge a record against the holdings of its moment (who holds which GPU,
each pipeline's registration): :class:`~harness.logs.invariants.allocations.DecisionWalk`
rebuilds them from the decision records. Each such check is a walk of its own kind
(its hooks and its state) registered here with :func:`walk_check`; :func:`run_walks`
applies the decisions once for all the walks of one log and calls each walk's hooks in
the order the walks were named. A walk's hooks see exactly what its own walk over its own
records would: the records of the kinds it sees (and its ``keep``), with the log's first
and last record, each before the decisions apply it, and ``after_commit`` once a plan is
applied. The holdings' inconsistencies go to every walk's ``problem``, in the order its
own walk would meet them.

The batch oracle (``run_checks``) and the online one (harness/logs/invariants/online.py)
run the walks of every selected check in one pass over the records of the kinds any of
them sees; a check called alone runs its walk alone, the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional

from harness.logs.invariants.allocations import _APPLIED, DecisionWalk
from harness.logs.invariants.base import SEES, Records, Violation


@dataclass(frozen=True)
class WalkCheck:
    """A check written as a decision walk: ``make([first])`` its walk (``first``: the log's
    first record, absent for an empty log), ``findings(walk)`` once the log has ended, and
    ``keep`` the records of its kinds its hooks look at (``None``: all of them)."""

    make: Callable[[list], DecisionWalk]
    findings: Callable[[DecisionWalk], List[Violation]]
    keep: Optional[Callable[[dict], bool]] = None


#: check name -> its walk (filled by :func:`walk_check` as the checks' modules load)
WALK_CHECKS: Dict[str, WalkCheck] = {}


def _out(walk: DecisionWalk) -> List[Violation]:
    return walk.out  # type: ignore[attr-defined]


def walk_check(
    name: str,
    make: Callable[[list], DecisionWalk],
    findings: Callable[[DecisionWalk], List[Violation]] = _out,
    keep: Optional[Callable[[dict], bool]] = None,
    doc: str = "",
) -> Callable[[Records], List[Violation]]:
    """Register ``name``'s walk; returns the check itself (its walk run alone on its
    records), documented by ``doc``."""
    WALK_CHECKS[name] = WalkCheck(make, findings, keep)

    def check(records: Records) -> List[Violation]:
        return run_walks(records, [name])[name]

    check.__name__ = check.__qualname__ = name
    # the oracle runs it in the shared walk while CHECKS holds it (not a replacement)
    check.walk_of = name  # type: ignore[attr-defined]
    check.__doc__ = doc
    return check


class _Shared(DecisionWalk):
    """The one walk that applies the decisions; what a walk of its own would hand its
    hooks (the plan applied, a commit without a plan, the holdings' problems) it hands
    to every walk, in their order."""

    def __init__(self, first: list, walks: List[DecisionWalk]) -> None:
        super().__init__(first, self._problem)
        self.walks = walks
        for w in walks:
            w.h = self.h

    def _problem(self, seq: int, message: str) -> None:
        for w in self.walks:
            w.problem(seq, message)

    def after_commit(self, plan: dict, commit: dict) -> None:
        for w in self.walks:
            w.after_commit(plan, commit)

    def missing_plan(self, commit: dict) -> None:
        for w in self.walks:
            w.missing_plan(commit)


def _hook(walk: DecisionWalk, keep: Optional[Callable[[dict], bool]]) -> Optional[Callable[[dict], None]]:
    """The walk's ``on_record`` as its own walk calls it (none for a walk without one)."""
    if type(walk).on_record is DecisionWalk.on_record:
        return None
    on_record = walk.on_record
    if keep is None:
        return on_record

    def kept_hook(r: dict) -> None:
        if keep(r):
            on_record(r)

    return kept_hook


def run_walks(records: Records, names: Iterable[str]) -> Dict[str, List[Violation]]:
    """Each named walk check's findings over ``records`` (the records of the kinds any of
    them sees, with the log's first and last: a ``kind_views`` view), the decisions
    applied once."""
    names = list(names)
    it = iter(records)
    first = next(it, None)
    head = [first] if first is not None else []
    walks = [WALK_CHECKS[n].make(head) for n in names]
    shared = _Shared(head, walks)
    hooks = [_hook(w, WALK_CHECKS[n].keep) for n, w in zip(names, walks)]
    if first is not None:
        for hook in hooks:
            if hook is not None:
                hook(first)  # every view starts with the log's first record
        if first["kind"] in _APPLIED:
            shared.apply(first)
        targets: Dict[str, tuple] = {}
        for n, hook in zip(names, hooks):
            for kind in SEES[n] or ():
                if hook is not None:
                    targets[kind] = targets.get(kind, ()) + (hook,)
        nothing = ()
        apply = shared.apply
        last = first
        for r in it:
            k = r["kind"]
            for hook in targets.get(k, nothing):
                hook(r)
            if k in _APPLIED:
                apply(r)
            last = r
        if last is not first:  # every view ends with the log's last record
            for n, hook in zip(names, hooks):
                if hook is not None and last["kind"] not in (SEES[n] or ()):
                    hook(last)
    return {n: WALK_CHECKS[n].findings(w) for n, w in zip(names, walks)}
