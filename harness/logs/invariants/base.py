"""Invariant plumbing: a violation type and the registry every check joins.

A check is a function ``records -> [Violation]`` registered under a stable name with
:func:`invariant`. It may declare the record kinds it ``reads``: ``rlharness check``
then reports how many records it examined and calls it "not applicable" on a log that
has none of them (a gate log has no scheduler plans, a replay output no VRAM ledger).
A check registered without ``reads`` is taken to read every record.

A check may also name, in ``sees``, the kinds its code looks at only to keep its state
(registrations, plans, the run's end) beyond those it ``reads``: ``check_log`` then hands
it only the records of those kinds (plus the log's first and last record, which some
checks read for the header and the last seq), in log order. Records of any other kind
cannot change its findings, and skipping them is most of the oracle's speed on a
million-record log. ``reads`` + ``sees`` must name every kind the code looks at; the
oracle's tests run each check both ways on every bundled scenario to hold them to it. A
check without ``reads`` (counted as examining every record) may still name in ``sees``
the only kinds it looks at: it is handed those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, cast

Records = Sequence[dict]


@dataclass(frozen=True)
class Violation:
    invariant: str
    seq: int
    message: str

    def __str__(self) -> str:
        return f"[{self.invariant}] seq {self.seq}: {self.message}"


CHECKS: Dict[str, Callable[[Records], List[Violation]]] = {}
READS: Dict[str, Optional[FrozenSet[str]]] = {}  # check name -> record kinds it reads (None: all)
SEES: Dict[str, Optional[FrozenSet[str]]] = {}  # check name -> every kind its code looks at (None: all)


def invariant(name: str, reads: Optional[Iterable[str]] = None, sees: Iterable[str] = ()):
    """Register a check under a stable name (used in reports and ``--check`` filters)."""

    def wrap(fn: Callable[[Records], List[Violation]]):
        CHECKS[name] = fn
        READS[name] = frozenset(reads) if reads is not None else None
        if reads is not None:
            SEES[name] = READS[name] | frozenset(sees)
        else:  # reads every record (its count of examined records is the log's) but looks at these kinds only
            SEES[name] = frozenset(sees) if sees else None
        fn.invariant_name = name  # type: ignore[attr-defined]
        return fn

    return wrap


def known_whole(records: Records) -> bool:
    """Whether ``records`` is all there in memory (a list or tuple), so a check may read
    its end first to skip a walk that would find nothing. An online view
    (harness/logs/invariants/online.py) is read once, as the log is made: the walk runs."""
    return isinstance(records, (list, tuple))


def kept(records: Records, keep: Callable[[dict], bool]) -> Records:
    """The records ``keep`` keeps, for a walk that reads ``records[0]`` (the header, which
    ``keep`` must keep) then iterates once: a list of a whole log (a later walk is faster
    on it), a filter applied as the records arrive for an online view — a list would hold
    every kept record of a long run."""
    if known_whole(records):
        return [r for r in records if keep(r)]
    return cast(Records, _Kept(records, keep))  # a Sequence to the walk: [0], then one iteration


class _Kept:
    """:func:`kept` of an online view: one pass; truth and ``[0]`` are the view's. The
    walks read ``[0]`` only to find the header (kept, and first when there is one), so
    the view's first record answers as the filtered list's would: it is the header
    exactly when the list's first is."""

    def __init__(self, records: Records, keep: Callable[[dict], bool]) -> None:
        self.records, self.keep = records, keep

    def __bool__(self) -> bool:
        return bool(self.records)

    def __getitem__(self, index: int) -> dict:
        if index != 0:
            raise IndexError(index)
        return self.records[0]

    def __iter__(self):
        return filter(self.keep, self.records)


def examined(name: str, records: Records) -> int:
    """How many records of ``records`` the check ``name`` reads (all, if it declared none)."""
    kinds = READS.get(name)
    if kinds is None:
        return len(records)
    return sum(1 for r in records if r["kind"] in kinds)


def effects(records: Records, kind: str, name: str):
    """Effect records of one effect name, in log order."""
    return [r for r in records if r["kind"] == kind and r["effect"] == name]
