"""The wait-for graph's data: a wait, the graph, the names of its nodes.

Shared by the graph's builders (harness/logs/invariants/waitfor.py: rendezvous, broadcasts,
the coordinator lock; harness/logs/invariants/waitfor_edges.py: scheduler requests,
await-release, the scheduler's resize calls, the cache lock) and its readers (deadlock,
lost_wakeup, hot_state, liveness).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple


@dataclass(frozen=True)
class Wait:
    """One open wait: ``waiter`` waits on ``on`` because of the record ``seq``."""

    waiter: str
    on: str
    seq: int
    t: float
    what: str  # e.g. "join of p0-pp0"
    # hot_state judges it (a scheduler wait is liveness's: harness/logs/invariants/hot_states.py)
    hot: bool = True


@dataclass
class WaitGraph:
    waits: List[Wait] = field(default_factory=list)
    exited: Dict[str, int] = field(default_factory=dict)  # member -> seq of its exit
    # a lock waiter left with no holder: waiter -> (the wait, seq of the last release before it)
    unhanded: Dict[str, Tuple[Wait, int]] = field(default_factory=dict)
    # any other wait whose awaited side finished without waking it: (the wait, what happened)
    unwoken: List[Tuple[Wait, str]] = field(default_factory=list)
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


def caller_of(r: dict) -> str:
    """The wait-for graph's name of the call an effect record belongs to: ``pid/scope@cycleN``."""
    cycle = f"@cycle{r['cycle']}" if r.get("cycle") is not None else ""
    return f"{r['pipeline_id']}/{r.get('scope') or 'call'}{cycle}"


def describe(chain: List[Wait], exited: Optional[Dict[str, int]] = None) -> str:
    """``a -[join of G, seq 3]-> b -[...]-> c`` (an exited end says so)."""
    if not chain:
        return ""
    text = chain[0].waiter + "".join(f" -[{w.what}, seq {w.seq}]-> {w.on}" for w in chain)
    last = chain[-1].on
    if exited and last in exited:
        text += f" (exited at seq {exited[last]})"
    return text
