"""Cache lock (``cache_lock``): no cache build or promote while a transport reads the cache.

One kind of evidence, written the same way by every runtime
(``harness.control.cache_lock``): each access to a cache owner's CPU bucket cache is a
``cache_lock`` hold (acquire .. release, ``seq``s) by ``build``, ``promote`` or ``sync``,
keyed by the owner that wrote it (``pipeline_id``, or a gate's ``rank`` where no pipeline
is named). Where a runtime logs its effects, a ``BuildCache``, ``PromoteCache`` or
``SyncFromCache`` effect that ended with no hold of its own inside it accessed the cache
without the lock, so its whole effect interval counts (one the log ends inside is not judged:
it may not have reached the cache). A write that overlaps a read of the same owner
is a violation, reported once per write; reads may overlap each other. Order is the log's
``seq`` (what happened first), not time, so same-instant records are judged as they were
sequenced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from harness.logs.invariants.base import Records, Violation, invariant

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
    in one pass (the check runs online, harness/logs/invariants/online.py)."""
    locks = _LockWalk()
    for r in records:
        k = r["kind"]
        if k == "cache_lock" or k == "effect_start" or k == "effect_end":
            locks.on(r, k)
    last = records[-1]["seq"] if records else 0  # (after the pass: an online view knows its end then)
    return locks.end(last)


class _LockWalk:
    """Cache lock holds, and the cache effects that ran without a hold of their own."""

    def __init__(self) -> None:
        self.out: List[Access] = []
        self.holds: Dict[
            Tuple[str, str], List[Tuple[int, Optional[int]]]
        ] = {}  # (pipeline, holder) -> [(acquire seq, version)]
        self.effects: Dict[
            Tuple[str, str], List[Tuple[int, Optional[int], int]]
        ] = {}  # (pipeline, what) -> [(start, version, holds seen)]
        self.held_count: Dict[Tuple[str, str], int] = {}

    def on(self, r: dict, k: str) -> None:
        holds, held_count = self.holds, self.held_count
        if k == "cache_lock":
            pid = owner_of(r)
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
        """The holds still open at the end run to the last seq. An effect still open when the
        log ends, with no hold of its own, is not counted: the runtimes take the hold before
        they touch the cache, so such an effect had not reached it (it waited for the lock,
        or the run failed inside it before the access: a build that finds its parameters gone
        never writes the cache)."""
        out = self.out
        for (pid, holder), stack in self.holds.items():
            for seq, version in stack:
                out.append(Access(pid, holder, seq, last, version, True))
        return out


def _describe(a: Access) -> str:
    lock = "" if a.locked else " without the cache lock"
    return f"{a.what} of v{a.version} (seq {a.start}..{a.end}{lock})"


@invariant(NAME, reads=("cache_lock", "effect_start", "effect_end"))
def cache_lock(records: Records) -> List[Violation]:
    out: List[Violation] = []
    by_pipeline: Dict[str, List[Access]] = {}
    for a in _accesses(records):
        by_pipeline.setdefault(a.pipeline, []).append(a)
    for pid, accesses in sorted(by_pipeline.items()):
        reads = [a for a in accesses if a.what == "sync"]
        for w in (a for a in accesses if a.what in _WRITES):
            for rd in reads:
                if (
                    w.start <= rd.end
                    and rd.start <= w.end
                    and (w.start < rd.end and rd.start < w.end or w.start == w.end)
                ):
                    out.append(
                        Violation(
                            NAME,
                            max(w.start, rd.start),
                            f"{pid}: cache {_describe(w)} while the {_describe(rd)} reads the cache",
                        )
                    )
                    break  # once per write
    return sorted(out, key=lambda v: v.seq)


def owner_of(r: dict) -> str:
    """Whose cache a record is about: its pipeline, or the gate rank that wrote it."""
    pid = r.get("pipeline_id")
    return pid if pid is not None else f"rank {r.get('rank')}"
