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
  acquire ended and whose ``UnlockCoordinator`` / ``FreeCoordinator`` has not. A waiter left with no holder at all, after the last holder
  released before the end of the log, was never handed the lock: a lost wakeup.

A member that exited (``member_exit``) waits on nothing and wakes no one. Two findings:

* ``deadlock``: a cycle of waits, every member of it waiting on the next: none of them can
  ever move (the cycle is judged at the end of the log; a wait closes only by a record,
  so a cycle still open there never closed). It names every participant and the record
  (seq) that opened each wait.
* ``lost_wakeup``: a waiter whose awaited member exited without doing its part: the wait
  can only end by a timeout, and without one it never ends.

The cache lock, scheduler requests and await-release are waits too, but their records name
no waiter (a ``cache_lock`` acquire says who holds, not who queued) or no one waited on
(the scheduler's pending requests wait on the cluster as a whole), so ``liveness`` judges
them with its own window instead of this graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from harness.invariants.base import Records, Violation, invariant

WAIT_KINDS = ("rendezvous_join", "rendezvous_done", "rendezvous_abort", "broadcast_start", "broadcast_recv",
              "broadcast_end", "member_exit", "effect_start", "effect_end")
_ACQUIRE = ("LockCoordinator", "HoldCoordinator")  # a resize's or sync's lock; the shutdown's hold
_LOCK_EFFECTS = _ACQUIRE + ("UnlockCoordinator", "FreeCoordinator")


@dataclass(frozen=True)
class Wait:
    """One open wait: ``waiter`` waits on ``on`` because of the record ``seq``."""
    waiter: str
    on: str
    seq: int
    t: float
    what: str  # e.g. "join of p0-pp0"


@dataclass
class WaitGraph:
    waits: List[Wait] = field(default_factory=list)
    exited: Dict[str, int] = field(default_factory=dict)  # member -> seq of its exit
    # a lock waiter left with no holder: waiter -> (the wait, seq of the last release before it)
    unhanded: Dict[str, Tuple[Wait, int]] = field(default_factory=dict)
    end_seq: int = 0
    end_t: float = 0.0

    def out(self, node: str) -> List[Wait]:
        return [w for w in self.waits if w.waiter == node]

    def chain(self, node: str) -> List[Wait]:
        """The waits from ``node`` on, following each waiter's first wait, to a member that
        waits on nothing, one that exited, or back into the chain."""
        seen: Set[str] = {node}
        chain: List[Wait] = []
        while True:
            nxt = self.out(node)
            if not nxt:
                return chain
            w = nxt[0]
            chain.append(w)
            if w.on in seen or w.on in self.exited:
                return chain
            seen.add(w.on)
            node = w.on

    def cycles(self) -> List[List[Wait]]:
        """Every elementary cycle of waits, each once (starting at its smallest member)."""
        edges: Dict[str, List[Wait]] = {}
        for w in self.waits:
            edges.setdefault(w.waiter, []).append(w)
        found: List[List[Wait]] = []
        keys: Set[Tuple[str, ...]] = set()

        def walk(start: str, node: str, path: List[Wait], on_path: Set[str]) -> None:
            for w in edges.get(node, ()):
                if w.on == start:
                    cyc = path + [w]
                    key = tuple(x.waiter for x in cyc)
                    if min(key) == start and key not in keys:
                        keys.add(key)
                        found.append(cyc)
                elif w.on not in on_path and w.on > start and len(path) < 32:
                    walk(start, w.on, path + [w], on_path | {w.on})

        for start in sorted(edges):
            walk(start, start, [], {start})
        return found


def _node(r: dict, name: str) -> str:
    pid = r.get("pipeline_id")
    return f"{pid}/{name}" if pid else name


def caller_of(r: dict) -> str:
    """The wait-for graph's name of the call an effect record belongs to: ``pid/scope@cycleN``."""
    cycle = f"@cycle{r['cycle']}" if r.get("cycle") is not None else ""
    return f"{r['pipeline_id']}/{r.get('scope') or 'call'}{cycle}"


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


def wait_graph(records: Records) -> WaitGraph:
    """The waits still open at the end of ``records`` (see the module doc)."""
    g = WaitGraph()
    locks = _Locks()
    joins: Dict[Tuple[str, str], dict] = {}  # (group, member) -> its open join record
    joined: Dict[str, Set[str]] = {}
    bcasts: Dict[str, dict] = {}  # group -> its open broadcast_start
    recvs: Dict[Tuple[str, str], dict] = {}  # (group, member) -> its open broadcast_recv
    if records:
        g.end_seq, g.end_t = records[-1].get("seq", 0), records[-1].get("t", 0.0)
    effects, lock_effects = ("effect_start", "effect_end"), _LOCK_EFFECTS
    for r in records:
        k = r["kind"]
        if k in effects:  # most of a log's wait-kind records: only the lock's matter
            if r["effect"] in lock_effects:
                locks.track(r)
            continue
        if k not in WAIT_KINDS:
            continue
        if k == "rendezvous_join":
            name, m = _node(r, r["name"]), _node(r, r["member"])
            joins[(name, m)] = r
            joined.setdefault(name, set()).add(m)
        elif k == "rendezvous_done":
            name = _node(r, r["name"])
            for key in [key for key in joins if key[0] == name]:
                del joins[key]
        elif k == "rendezvous_abort":
            joins.pop((_node(r, r["name"]), _node(r, r["member"])), None)
        elif k == "broadcast_start":
            bcasts[_node(r, r["name"])] = r
        elif k == "broadcast_recv":
            recvs[(_node(r, r["name"]), _node(r, r["member"]))] = r
        elif k == "broadcast_end":
            name = _node(r, r["name"])
            start = bcasts.pop(name, None)
            dsts = {_node(r, d) for d in (start or {}).get("dsts", ())}
            for key in [key for key in recvs if key[0] == name and key[1] in dsts]:
                del recvs[key]
        elif k == "member_exit":
            m = _node(r, r["member"])
            g.exited[m] = r["seq"]
            for table in (joins, recvs):
                for key in [key for key in table if key[1] == m]:
                    del table[key]
    for (name, m), r in joins.items():
        for x in r["members"]:
            x = _node(r, x)
            if x != m and x not in joined.get(name, ()):
                g.waits.append(Wait(m, x, r["seq"], r["t"], f"join of {name}"))
    for name, r in bcasts.items():
        src = _node(r, r["src"])
        for d in r["dsts"]:
            d = _node(r, d)
            if (name, d) not in recvs or d in g.exited:
                g.waits.append(Wait(src, d, r["seq"], r["t"], f"broadcast on {name}"))
    for (name, m), r in recvs.items():
        g.waits.append(Wait(m, _node(r, r["src"]), r["seq"], r["t"], f"receive on {name}"))
    locks.into(g)
    g.waits.sort(key=lambda w: (w.seq, w.waiter, w.on))
    return g


def describe(chain: List[Wait], exited: Optional[Dict[str, int]] = None) -> str:
    """``a -[join of G, seq 3]-> b -[...]-> c`` (an exited end says so)."""
    if not chain:
        return ""
    text = chain[0].waiter + "".join(f" -[{w.what}, seq {w.seq}]-> {w.on}" for w in chain)
    last = chain[-1].on
    if exited and last in exited:
        text += f" (exited at seq {exited[last]})"
    return text


@invariant("deadlock", reads=WAIT_KINDS, sees=("header",))
def deadlock(records: Records) -> List[Violation]:
    g = wait_graph(records)
    out = []
    for cyc in g.cycles():
        members = ", ".join(w.waiter for w in cyc)
        seqs = ", ".join(str(w.seq) for w in cyc)
        out.append(Violation("deadlock", g.end_seq,
                             f"a cycle of waits among {members} (records {seqs}), still open at t={g.end_t:.1f}s: "
                             f"{describe(cyc)}"))
    return out


@invariant("lost_wakeup", reads=WAIT_KINDS, sees=("header",))
def lost_wakeup(records: Records) -> List[Violation]:
    g = wait_graph(records)
    out = []
    for w in g.waits:
        if w.on in g.exited:
            out.append(Violation("lost_wakeup", g.end_seq,
                                 f"{w.waiter} waits (since t={w.t:.1f}s, seq {w.seq}, {w.what}) on {w.on}, which "
                                 f"exited at seq {g.exited[w.on]} without waking it; chain of waits: "
                                 f"{describe(g.chain(w.waiter), g.exited)}"))
    for me, (w, seq) in sorted(g.unhanded.items()):
        out.append(Violation("lost_wakeup", g.end_seq,
                             f"{me} waits (since t={w.t:.1f}s, seq {w.seq}) for the {w.what}, which its last "
                             f"holder released at seq {seq} without handing it on: free, and the waiter never woken"))
    return out
