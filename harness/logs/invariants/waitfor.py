"""The wait-for graph of a log: who waits on whom, rebuilt from the records alone.

A wait opens with a record and closes with another; while it is open its waiter waits on
the members that have not yet done their part:

* a ``rendezvous_join`` of group G by member m: m waits on every member of G that has not
  joined G, until ``rendezvous_done`` of G (or m's ``rendezvous_abort``, or m's exit);
* a ``broadcast_start`` on G by src: src waits on every dst that has no receive posted on G
  (and on a dst that exited after posting it: the transfer needs it to the end), until
  ``broadcast_end`` of G;
* a ``broadcast_recv`` on G by m from src: m waits on src, until a ``broadcast_end`` of G
  delivers it (or m exits).

* a ``LockCoordinator`` (or the shutdown's ``HoldCoordinator``) effect started and not
  ended (RLix's coordinator lock, which a pipeline's resizes, weight syncs and shutdown
  take in turn): its caller waits on every holder of that pipeline's lock -- a call whose
  acquire ended and whose ``UnlockCoordinator`` / ``FreeCoordinator`` has not. A
  waiter left with no holder at all, after the last holder released before the end of
  the log, was never handed the lock: a lost wakeup.
* the scheduler's waits (requests, await-release, its resize calls) and the cache
  owner's lock: harness/logs/invariants/waitfor_edges.py;
* the refit stream's lockstep: the sender's wait for its receiver's ACK, the receiver's
  for the next group (harness/logs/invariants/waitfor_refit.py);
* collectives on shared communicators: activities issuing on one communicator with no order
  between them, and an activity waiting for a communicator others issue on
  (harness/logs/invariants/waitfor_collectives.py).

A member that exited (``member_exit``; the scheduler's ``scheduler_failed``) waits on
nothing and wakes no one. Two findings:

* ``deadlock``: a cycle of waits, every member of it waiting on the next: none of them can
  ever move (the cycle is judged at the end of the log; a wait closes only by a record,
  so a cycle still open there never closed). It names every participant and the record
  (seq) that opened each wait.
* ``lost_wakeup``: a waiter whose awaited side finished without waking it: a member that
  exited without doing its part, a lock left free with a waiter, a request or
  await-release its pipeline's unregister or its freed cluster never answered. The wait
  can only end by a timeout, and without one it never ends.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from harness.logs.invariants.base import Records, Violation, invariant
from harness.logs.invariants.waitfor_edges import (
    CACHE_EFFECTS,
    REQUEST_EFFECTS,
    SCHED_READS,
    SCHED_SEES,
    CacheLockWaits,
    SchedulerWaits,
)
from harness.logs.invariants.waitfor_collectives import KIND as COLLECTIVES
from harness.logs.invariants.waitfor_collectives import CollectiveWaits
from harness.logs.invariants.waitfor_refit import REFIT_WAIT_KINDS, RefitWaits
from harness.logs.invariants.waitgraph import Wait, WaitGraph, caller_of, describe  # noqa: F401 (re-exported)

GROUP_KINDS = (
    "rendezvous_join",
    "rendezvous_done",
    "rendezvous_abort",
    "broadcast_start",
    "broadcast_recv",
    "broadcast_end",
    "member_exit",
)
#: every kind a wait opens or closes by (a check on the graph ``reads`` them and ``sees`` WAIT_SEES)
WAIT_KINDS = (
    GROUP_KINDS + ("effect_start", "effect_end", "cache_lock") + SCHED_READS + REFIT_WAIT_KINDS + (COLLECTIVES,)
)
WAIT_SEES = tuple(k for k in SCHED_SEES if k not in WAIT_KINDS)
_ACQUIRE = ("LockCoordinator", "HoldCoordinator")  # a resize's or sync's lock; the shutdown's hold
_LOCK_EFFECTS = frozenset(_ACQUIRE + ("UnlockCoordinator", "FreeCoordinator"))


def _node(r: dict, name: str) -> str:
    pid = r.get("pipeline_id")
    return f"{pid}/{name}" if pid else name


class _Locks:
    """The coordinator lock of each pipeline, from its Lock/UnlockCoordinator effects."""

    def __init__(self) -> None:
        self.holders: Dict[str, Dict[str, dict]] = {}  # pipeline -> caller -> the record it got the lock at
        self.waiting: Dict[str, dict] = {}  # caller -> its open LockCoordinator start
        self.released: Dict[str, Tuple[int, float]] = {}  # pipeline -> (seq, t) of its last release

    caller = staticmethod(lambda r: caller_of(r))

    def track(self, r: dict) -> None:
        me, pid = self.caller(r), r["pipeline_id"]
        if r["effect"] in _ACQUIRE:
            if r["kind"] == "effect_start":
                self.waiting[me] = r
            else:
                self.waiting.pop(me, None)
                if not r.get("error") and r.get("result") is None:
                    self.holders.setdefault(pid, {})[me] = r
        elif r["kind"] == "effect_end":
            self.holders.get(pid, {}).pop(me, None)
            self.released[pid] = (r["seq"], r["t"])

    def into(self, g: "WaitGraph") -> None:
        for me, r in self.waiting.items():
            pid = r["pipeline_id"]
            holders = self.holders.get(pid, {})
            what = f"coordinator lock of {pid}"
            for h in sorted(holders):
                g.waits.append(Wait(me, h, r["seq"], r["t"], what))
            last = self.released.get(pid)
            if not holders and last is not None and last[1] < g.end_t and last[0] > r["seq"]:
                g.unhanded[me] = (Wait(me, pid, r["seq"], r["t"], what), last[0])


class _Groups:
    """Group rendezvous and broadcasts, from their records (the module doc's first three waits)."""

    def __init__(self, g: WaitGraph) -> None:
        self.g = g
        self.joins: Dict[Tuple[str, str], dict] = {}  # (group, member) -> its open join record
        self.joined: Dict[str, Set[str]] = {}
        self.bcasts: Dict[str, dict] = {}  # group -> its open broadcast_start
        self.recvs: Dict[Tuple[str, str], dict] = {}  # (group, member) -> its open broadcast_recv

    def track(self, r: dict) -> None:
        k, joins, recvs = r["kind"], self.joins, self.recvs
        if k == "rendezvous_join":
            name, m = _node(r, r["name"]), _node(r, r["member"])
            joins[(name, m)] = r
            self.joined.setdefault(name, set()).add(m)
        elif k == "rendezvous_done":
            name = _node(r, r["name"])
            for key in [key for key in joins if key[0] == name]:
                del joins[key]
        elif k == "rendezvous_abort":
            joins.pop((_node(r, r["name"]), _node(r, r["member"])), None)
        elif k == "broadcast_start":
            self.bcasts[_node(r, r["name"])] = r
        elif k == "broadcast_recv":
            recvs[(_node(r, r["name"]), _node(r, r["member"]))] = r
        elif k == "broadcast_end":
            name = _node(r, r["name"])
            start = self.bcasts.pop(name, None)
            dsts = {_node(r, d) for d in (start or {}).get("dsts", ())}
            for key in [key for key in recvs if key[0] == name and key[1] in dsts]:
                del recvs[key]
        elif k == "member_exit":
            m = _node(r, r["member"])
            self.g.exited[m] = r["seq"]
            for table in (joins, recvs):
                for key in [key for key in table if key[1] == m]:
                    del table[key]

    def into(self, g: WaitGraph) -> None:
        for (name, m), r in self.joins.items():
            for x in r["members"]:
                x = _node(r, x)
                if x != m and x not in self.joined.get(name, ()):
                    g.waits.append(Wait(m, x, r["seq"], r["t"], f"join of {name}"))
        for name, r in self.bcasts.items():
            src = _node(r, r["src"])
            for d in r["dsts"]:
                d = _node(r, d)
                if (name, d) not in self.recvs or d in g.exited:
                    g.waits.append(Wait(src, d, r["seq"], r["t"], f"broadcast on {name}"))
        for (name, m), r in self.recvs.items():
            g.waits.append(Wait(m, _node(r, r["src"]), r["seq"], r["t"], f"receive on {name}"))


_GROUP_KINDS = frozenset(GROUP_KINDS)
_SCHED_KINDS = frozenset(SCHED_READS + SCHED_SEES) - {"header"}
_REFIT_KINDS = frozenset(REFIT_WAIT_KINDS)
_LAST: list = [None, None]  # the last records object a graph was built from, and that graph


def wait_graph(records: Records) -> WaitGraph:
    """The waits still open at the end of ``records`` (see the module docs). The graph of
    the same records object is built once (deadlock, lost_wakeup and hot_state share it)."""
    if (
        isinstance(records, list)
        and _LAST[0] is records
        and _LAST[1].end_seq == (records[-1].get("seq", 0) if records else 0)
    ):
        return _LAST[1]
    walk = GraphWalk(records[0] if records else None)
    on = walk.on
    for r in records:
        on(r)
    g = walk.graph(records[-1] if records else None)  # (after the pass: an online view knows its end then)
    _LAST[:] = [records, g]
    return g


def on_graph(check, graph: WaitGraph, first: dict, last: dict) -> List[Violation]:
    """``check`` (deadlock, lost_wakeup or hot_state: each reads its records only through
    :func:`wait_graph` and the header) of a log whose graph is ``graph``, built already in
    one pass (harness/logs/invariants/online.py): the check is handed the log's first and last
    record, with the graph they end cached as theirs."""
    ends = [first] if last is first else [first, last]
    _LAST[:] = [ends, graph]
    return check(ends)


class GraphWalk:
    """:func:`wait_graph` a record at a time: :meth:`on` each record of the log (the
    log's first is ``first``), then :meth:`graph` with the log's last record. A check
    that reads its records once (online) builds the graph in its own pass this way."""

    def __init__(self, first: Optional[dict]) -> None:
        self.g = g = WaitGraph()
        header = first if first is not None and first.get("kind") == "header" else None
        self.locks, self.groups, self.sched = _Locks(), _Groups(g), SchedulerWaits(header)
        self.cache, self.refit = CacheLockWaits(), RefitWaits()
        self.collectives = CollectiveWaits()

    def on(self, r: dict) -> None:
        k = r["kind"]
        if k == "effect_start" or k == "effect_end":  # most of a log's wait-kind records
            e = r["effect"]
            if e in _LOCK_EFFECTS:
                self.locks.track(r)
            elif e in REQUEST_EFFECTS:
                self.sched.effect(r)
            elif e in CACHE_EFFECTS:
                self.cache.effect(r)
        elif k in _GROUP_KINDS:
            self.groups.track(r)
        elif k in _SCHED_KINDS:
            self.sched.track(r)
        elif k == "cache_lock":
            self.cache.lock(r)
        elif k in _REFIT_KINDS:
            self.refit.track(r)
        elif k == COLLECTIVES:
            self.collectives.track(r)

    def graph(self, last: Optional[dict]) -> WaitGraph:
        g = self.g
        if last is not None:
            g.end_seq, g.end_t = last.get("seq", 0), last.get("t", 0.0)
        for part in (self.groups, self.locks, self.sched, self.cache, self.refit, self.collectives):
            part.into(g)
        g.waits.sort(key=lambda w: (w.seq, w.waiter, w.on))
        return g


@invariant("deadlock", reads=WAIT_KINDS, sees=WAIT_SEES)
def deadlock(records: Records) -> List[Violation]:
    g = wait_graph(records)
    out = []
    for cyc in g.cycles():
        members = ", ".join(w.waiter for w in cyc)
        seqs = ", ".join(str(w.seq) for w in cyc)
        out.append(
            Violation(
                "deadlock",
                g.end_seq,
                f"a cycle of waits among {members} (records {seqs}), still open at t={g.end_t:.1f}s: {describe(cyc)}",
            )
        )
    return out


@invariant("lost_wakeup", reads=WAIT_KINDS, sees=WAIT_SEES)
def lost_wakeup(records: Records) -> List[Violation]:
    g = wait_graph(records)
    out = []
    for w in g.waits:
        if w.on in g.exited:
            out.append(
                Violation(
                    "lost_wakeup",
                    g.end_seq,
                    f"{w.waiter} waits (since t={w.t:.1f}s, seq {w.seq}, {w.what}) on {w.on}, which "
                    f"exited at seq {g.exited[w.on]} without waking it; chain of waits: "
                    f"{describe(g.chain(w.waiter), g.exited)}",
                )
            )
    for me, (w, seq) in sorted(g.unhanded.items()):
        out.append(
            Violation(
                "lost_wakeup",
                g.end_seq,
                f"{me} waits (since t={w.t:.1f}s, seq {w.seq}) for the {w.what}, which its last "
                f"holder released at seq {seq} without handing it on: free, and the waiter never woken",
            )
        )
    for w, why in g.unwoken:
        chain = describe(g.chain(w.waiter), g.exited)
        out.append(
            Violation(
                "lost_wakeup",
                g.end_seq,
                f"{w.waiter} waits (since t={w.t:.1f}s, seq {w.seq}, {w.what}) on {w.on}: {why}"
                f"{f'; chain of waits: {chain}' if chain else ''}",
            )
        )
    return out
