"""``collective_order``: two activities never issue collectives on one communicator without
an order between them.

A communicator matches collectives by the order each rank issues them; two activities that
issue theirs on the same communicator at once interleave in an order that may differ
between ranks, and a rank's all-reduce then meets another rank's broadcast (a hang, or
garbage). volcengine/verl #7423: ``update_actor`` in a thread pool and ``update_weights``
on the event loop share the PP/EP communicators, and their collectives interleave out of
order. The fix orders the two (the sync waits for training, or takes a lock training
holds).

The check reads ``collectives`` records: an activity starts (``phase: start``) and stops
(``end``) issuing collectives on a communicator. An activity that starts while another is
still open on the same communicator is named with the one it overlaps: nothing in the log
put one after the other.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from harness.logs.invariants.base import Records, Violation, invariant

NAME = "collective_order"


@invariant(NAME, reads=("collectives",))
def collective_order(records: Records) -> List[Violation]:
    """No two activities are open on one communicator at once."""
    out: List[Violation] = []
    open_: Dict[str, Dict[str, Tuple[int, float]]] = {}  # communicator -> activity -> (seq, t) of its start
    for r in records:
        if r["kind"] != "collectives":
            continue
        comm, activity = r["communicator"], r["activity"]
        active = open_.setdefault(comm, {})
        if r["phase"] == "end":
            active.pop(activity, None)
            continue
        for other, (seq, t) in sorted(active.items()):
            if other != activity:
                out.append(
                    Violation(
                        NAME,
                        r["seq"],
                        f"{activity} issues collectives on {comm} while {other} "
                        f"(since seq {seq}, t={t:.3f}) still does: no order between them",
                    )
                )
        active[activity] = (r["seq"], r["t"])
    return out
