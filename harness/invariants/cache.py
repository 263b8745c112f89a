"""Cache lock (invariant 12): no cache build or promote while a transport reads the cache.

Every access to a cache owner's CPU bucket cache is an interval of ``seq``s, keyed by
the owner that wrote it (``pipeline_id``, or a gate's ``rank`` where no pipeline is
named): a ``cache_lock`` hold (acquire .. release) by ``build``, ``promote`` or
``sync``; a selective sync (``sync_start`` .. ``sync_end``, a read); a ``cache_build`` /
``cache_promote`` record (a write at that point); a ``BuildCache``, ``PromoteCache`` or
``SyncFromCache`` effect with no hold of its own inside it (it accessed the cache
without the lock, so its whole effect interval counts). A write that overlaps a read of
the same owner is a violation, reported once per write; reads may overlap each other.
Order is the log's ``seq`` (what happened first), not time, so same-instant records are
judged as they were sequenced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from harness.invariants.base import Records, Violation, invariant

NAME = "cache_lock"
_EFFECT_ACCESS = {"BuildCache": "build", "PromoteCache": "promote", "SyncFromCache": "sync"}
_WRITES = ("build", "promote")


@dataclass
class Access:
    pipeline: str
    what: str  # build | promote | sync
    start: int  # seq
    end: int  # seq (the log's last seq if it never ended)
    version: Optional[int]
    locked: bool


def _accesses(records: Records) -> List[Access]:
    """Every access of the log: the lock holds and unlocked effects (:class:`_LockWalk`),
    then the syncs and point writes (:class:`_RecordWalk`), in one pass (the check runs
    online, harness/invariants/online.py): the two read disjoint kinds."""
    locks, syncs = _LockWalk(), _RecordWalk()
    for r in records:
        k = r["kind"]
        if k == "cache_lock" or k == "effect_start" or k == "effect_end":
            locks.on(r, k)
        else:
            syncs.on(r, k)
    last = records[-1]["seq"] if records else 0  # (after the pass: an online view knows its end then)
    return locks.end(last) + syncs.end(last)


class _LockWalk:
    """Cache lock holds, and the cache effects that ran without a hold of their own."""

    def __init__(self) -> None:
        self.out: List[Access] = []
        self.holds: Dict[Tuple[str, str], List[Tuple[int, Optional[int]]]] = {}  # (pipeline, holder) -> [(acquire seq, version)]
        self.effects: Dict[Tuple[str, str], List[Tuple[int, Optional[int], int]]] = {}  # (pipeline, what) -> [(start, version, holds seen)]
        self.held_count: Dict[Tuple[str, str], int] = {}

    def on(self, r: dict, k: str) -> None:
        holds, held_count = self.holds, self.held_count
        if k == "cache_lock":
            pid = r["pipeline_id"]
            key = (pid, r["holder"])
            if r["action"] == "acquire":
                holds.setdefault(key, []).append((r["seq"], r.get("version")))
                held_count[key] = held_count.get(key, 0) + 1
            elif holds.get(key):
                seq, version = holds[key].pop()
                self.out.append(Access(pid, r["holder"], seq, r["seq"], version, True))
        elif r["effect"] in _EFFECT_ACCESS:
            pid, what = r["pipeline_id"], _EFFECT_ACCESS[r["effect"]]
            stack = self.effects.setdefault((pid, what), [])
            if k == "effect_start":
                stack.append((r["seq"], r["args"].get("version"), held_count.get((pid, what), 0)))
            elif stack:
                start, version, seen = stack.pop()
                if held_count.get((pid, what), 0) == seen and not r.get("error"):
                    self.out.append(Access(pid, what, start, r["seq"], version, False))  # no hold of its own

    def end(self, last: int) -> List[Access]:
        out = self.out
        for (pid, holder), stack in self.holds.items():
            for seq, version in stack:
                out.append(Access(pid, holder, seq, last, version, True))
        for (pid, what), stack in self.effects.items():
            for start, version, seen in stack:
                if self.held_count.get((pid, what), 0) == seen:
                    out.append(Access(pid, what, start, last, version, False))
        return out


def _describe(a: Access) -> str:
    lock = "" if a.locked else " without the cache lock"
    return f"{a.what} of v{a.version} (seq {a.start}..{a.end}{lock})"


@invariant(NAME, reads=("cache_lock", "effect_start", "effect_end", "cache_build", "cache_promote", "sync_start", "sync_end"))
def cache_lock(records: Records) -> List[Violation]:
    out: List[Violation] = []
    by_pipeline: Dict[str, List[Access]] = {}
    for a in _accesses(records):
        by_pipeline.setdefault(a.pipeline, []).append(a)
    for pid, accesses in sorted(by_pipeline.items()):
        reads = [a for a in accesses if a.what == "sync"]
        for w in (a for a in accesses if a.what in _WRITES):
            for rd in reads:
                if w.start <= rd.end and rd.start <= w.end and (w.start < rd.end and rd.start < w.end or w.start == w.end):
                    out.append(Violation(NAME, max(w.start, rd.start),
                                         f"{pid}: cache {_describe(w)} while the {_describe(rd)} reads the cache"))
                    break  # once per write
    return sorted(out, key=lambda v: v.seq)


def owner_of(r: dict) -> str:
    """Whose cache a record is about: its pipeline, or the gate rank that wrote it."""
    pid = r.get("pipeline_id")
    return pid if pid is not None else f"rank {r.get('rank')}"


class _RecordWalk:
    """Syncs (``sync_start`` .. ``sync_end``) and point writes (``cache_build`` /
    ``cache_promote``)."""

    def __init__(self) -> None:
        self.out: List[Access] = []
        self.open_sync: Dict[str, List[dict]] = {}

    def on(self, r: dict, k: str) -> None:
        if k == "sync_start":
            self.open_sync.setdefault(owner_of(r), []).append(r)
        elif k == "sync_end" and self.open_sync.get(owner_of(r)):
            s = self.open_sync[owner_of(r)].pop()
            self.out.append(Access(owner_of(r), "sync", s["seq"], r["seq"], s["version"], True))
        elif k in ("cache_build", "cache_promote"):
            what = "build" if k == "cache_build" else "promote"
            self.out.append(Access(owner_of(r), what, r["seq"], r["seq"], r["version"], True))

    def end(self, last: int) -> List[Access]:
        out = self.out
        for who, stack in self.open_sync.items():
            out += [Access(who, "sync", s["seq"], last, s["version"], True) for s in stack]
        return out
