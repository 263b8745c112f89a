"""``collective_order``: no cycle of waits ever forms among activities issuing collectives.

A communicator matches collectives by the order each rank issues them; two activities that
issue theirs on the same communicator at once interleave in an order that may differ
between ranks, and a rank's all-reduce then meets another rank's broadcast (a hang, or
garbage). volcengine/verl #7423: ``update_actor`` in a thread pool and ``update_weights``
on the event loop share the PP/EP communicators, and their collectives interleave out of
order. The fix orders the two (the sync waits for training, or takes a lock training
holds) — and two such orders, one per communicator, taken in opposite orders by the two
activities deadlock again.

The check reads ``collectives`` records through the wait-for edges they make
(harness/logs/invariants/waitfor_collectives.py): an activity that starts while another is
still open on the same communicator, with nothing putting one after the other, waits on it
and it on the activity (a cycle of two, named with the one it overlaps); an activity
that waits for a communicator another holds while that one waits, directly or through
others, for a communicator it holds closes a longer cycle. Each cycle is named at the
record that closed it, with the record that opened each of its waits.
"""

from __future__ import annotations

from typing import List

from harness.logs.invariants.base import Records, Violation, invariant
from harness.logs.invariants.waitfor_collectives import KIND, CollectiveWaits, node
from harness.logs.invariants.waitgraph import Wait, describe

NAME = "collective_order"


def _message(r: dict, cyc: List[Wait]) -> str:
    me = node(r)
    if r["phase"] == "start" and len(cyc) == 2:
        first = cyc[0] if cyc[0].waiter != me else cyc[1]  # the other activity's wait: its start
        return (
            f"{me} issues collectives on {r['communicator']} while {first.waiter} (since seq {first.seq}, "
            f"t={first.t:.3f}) still does: no order between them; a cycle of waits: {describe(cyc)}"
        )
    members = ", ".join(w.waiter for w in cyc)
    seqs = ", ".join(str(w.seq) for w in cyc)
    return f"a cycle of collective waits among {members} (records {seqs}), formed at t={r['t']:.3f}: {describe(cyc)}"


@invariant(NAME, reads=(KIND,))
def collective_order(records: Records) -> List[Violation]:
    """No cycle of waits forms among activities issuing collectives on communicators."""
    out: List[Violation] = []
    waits = CollectiveWaits()
    for r in records:
        if r["kind"] != KIND:
            continue
        waits.track(r)
        for cyc in waits.closed_by(r):
            out.append(Violation(NAME, r["seq"], _message(r, cyc)))
    return out
