"""Wait-for edges of collectives on shared communicators, rebuilt from ``collectives`` records.

A communicator matches collectives by the order each rank issues them, so two activities that
use one communicator wait on each other unless something orders them. The records: an activity
(a pipeline's ``train``, ``old_log_probs``, ``weight_sync``) ``start``s and ``end``s issuing
collectives on a communicator; ``wait`` says it asked for the communicator and waits for the
activities issuing on it now (an order: a lock or a stream that takes one activity at a time).
A node of the graph is ``pipeline/activity``.

* **unordered**: A ``start``s on C while B is open on C, with no ``wait`` putting A after B.
  The ranks may interleave the two in different orders, and one rank's collective of A then
  meets another rank's collective of B: A waits on B and B waits on A (a cycle of two), until
  either ends on C. volcengine/verl #7423: ``update_actor`` in a thread pool and
  ``update_weights`` on the event loop share the PP/EP communicators.
* **ordered**: A's ``wait`` on C while B is open on C: A waits on B, until A ``start``s on C (it
  got it) or ends there. A that holds X and waits for Y while B holds Y and waits for X is a
  cycle: an order inversion across communicators, the hang of NCCL collectives issued in
  different orders on two ranks.

``collective_order`` names each cycle when it forms, at the record that closes it: a run
of the simulator does not hang on an interleaving a real run may hang on, so the cycle is
a finding whether or not it is still open at the end. The wait-for graph
(harness/logs/invariants/waitfor.py) takes the edges still open at the end of the log, and
``deadlock`` names a cycle among them. What is kept is what is live: the activities open
and waiting on each communicator, and the unordered pairs among them.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from harness.logs.invariants.waitgraph import Wait, WaitGraph

KIND = "collectives"


def node(r: dict) -> str:
    pid = r.get("pipeline_id")
    return f"{pid}/{r['activity']}" if pid else r["activity"]


class CollectiveWaits:
    """The live waits of collectives: :meth:`track` each ``collectives`` record (then
    :meth:`closed_by` it: the cycles it closed), :meth:`into` a wait-for graph at the end."""

    def __init__(self) -> None:
        self.open: Dict[str, Dict[str, dict]] = {}  # communicator -> node -> its start record
        self.waiting: Dict[Tuple[str, str], dict] = {}  # (communicator, node) -> its wait record
        self.unordered: Dict[Tuple[str, str, str], Tuple[dict, dict]] = {}  # (comm, a, b) -> (a's, b's start)

    def track(self, r: dict) -> None:
        comm, me, phase = r["communicator"], node(r), r["phase"]
        active = self.open.setdefault(comm, {})
        if phase == "end":
            active.pop(me, None)
            self.waiting.pop((comm, me), None)
            for key in [k for k in self.unordered if k[0] == comm and me in k[1:]]:
                del self.unordered[key]
            return
        if phase == "wait":
            if any(other != me for other in active):
                self.waiting[(comm, me)] = r
        else:  # start: it issues now; whoever else still issues on comm has no order with it
            self.waiting.pop((comm, me), None)
            for other, started in sorted(active.items()):
                if other != me:
                    self.unordered[(comm, me, other)] = (r, started)
            active[me] = r

    def waits(self) -> List[Wait]:
        """Every wait open now (the module doc's two rules)."""
        out = []
        for (comm, me), r in self.waiting.items():
            for other in sorted(self.open.get(comm, ())):
                if other != me:
                    out.append(Wait(me, other, r["seq"], r["t"], f"collectives on {comm}, which {other} issues"))
        for (comm, a, b), (ra, rb) in self.unordered.items():
            out.append(Wait(a, b, ra["seq"], ra["t"], f"collectives on {comm} interleaved with {b}'s"))
            out.append(Wait(b, a, rb["seq"], rb["t"], f"collectives on {comm} interleaved with {a}'s"))
        return out

    def closed_by(self, r: dict) -> List[List[Wait]]:
        """The cycles of live waits that a wait opened by ``r`` belongs to."""
        live = self.waits()
        if not any(w.seq == r["seq"] for w in live):
            return []
        return [cyc for cyc in WaitGraph(waits=live).cycles() if any(w.seq == r["seq"] for w in cyc)]

    def into(self, g: WaitGraph) -> None:
        g.waits.extend(self.waits())
