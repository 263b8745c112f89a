"""Wait-for edges of the refit stream, rebuilt from its wire records (``refit_wire``'s).

The refit stream is a lockstep between a producer and a consumer
(gpu_gates/transports/zmq_stream.py): the sender sends a data group and blocks until the
receiver ACKs it, the receiver blocks until the next group (or COMPLETE) arrives. Each
block is a wait, so the ACKs belong in the wait-for graph beside the rendezvous, locks and
requests: ``refit_wire`` judges the wire's shape (one un-ACKed group, the slots, the ACK
count), this module who waits on whom.

A side is the node ``rank R`` when its records carry a rank (a gate), else its role
(``sender`` / ``receiver``: the transport's default names for its peer), so a record's
``peer`` names the other side's node. A stream is (sender, receiver, step).

* **ACK**: a ``refit_group_send`` of group g (or ``refit_complete_send``) opens the
  sender's wait on the receiver, until the sender's ``refit_ack`` of g (or of COMPLETE),
  or the sender's own ``refit_stream_abort`` (it gave up: a timeout, a socket error).
* **next message**: the receiver waits on the sender from its ``refit_stream_begin``, and
  again once the sender collected its ACK of the last group (``refit_ack``: the receiver
  sent it and went back to receive), until its next ``refit_group_recv``, its
  ``refit_manifest_check`` (COMPLETE arrived), ``refit_finalize`` or ``refit_stream_abort``.

Both waits open at the end of a log are a cycle (``deadlock``): a group or an ACK that would
have closed one of them never arrived. A side's stream that ended (``refit_finalize``, the
receiver's failed ``refit_manifest_check``, a ``refit_stream_abort``; either side's next
``refit_stream_begin`` of the same key starts a new stream) while the other side still
waits on it at the end of the log never woke it (``lost_wakeup``): only a timeout can end
that wait. A wait its own timeout ended (the waiter's ``refit_stream_abort``) is
closed, as a broadcast's timeout closes its wait: failing fast is the fix, not the bug.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from harness.logs.invariants.waitgraph import Wait, WaitGraph

#: every record kind the refit stream's waits open and close by
REFIT_WAIT_KINDS = (
    "refit_stream_begin",
    "refit_group_send",
    "refit_complete_send",
    "refit_ack",
    "refit_group_recv",
    "refit_manifest_check",
    "refit_finalize",
    "refit_stream_abort",
)
_PROBLEMS = ("missing", "duplicate", "unexpected", "mismatched", "layout", "load_errors")

Stream = Tuple[str, str, int]  # (sender node, receiver node, step)


def side(r: dict) -> str:
    """The node of the side that wrote ``r``."""
    return f"rank {r['rank']}" if r.get("rank") is not None else r["role"]


def stream_of(r: dict) -> Stream:
    me, peer = side(r), str(r["peer"])
    return (me, peer, r["step"]) if r["role"] == "sender" else (peer, me, r["step"])


class RefitWaits:
    """Fed the refit records in log order (:meth:`track`), then :meth:`into` a graph."""

    def __init__(self) -> None:
        self.acks: Dict[Stream, dict] = {}  # stream -> the open send the sender waits to have ACKed
        self.recvs: Dict[Stream, dict] = {}  # stream -> the record since which the receiver waits for a message
        self.ended: Dict[Tuple[Stream, str], Tuple[int, str]] = {}  # (stream, role) -> (seq, how it ended)
        self.received: Dict[Stream, int] = {}  # stream -> the last group its receiver recorded

    def track(self, r: dict) -> None:
        k, s = r["kind"], stream_of(r)
        sender = r["role"] == "sender"
        if k in ("refit_group_send", "refit_complete_send"):
            self.acks[s] = r
        elif k == "refit_ack":
            self.acks.pop(s, None)
            # the receiver sent this ACK and waits for the next message (unless a merged log
            # already shows it holding the next group, or its records are not in this log)
            if str(self.received.get(s)) == r["group"] and (s, "receiver") not in self.ended:
                self.recvs[s] = r
        elif k == "refit_stream_begin":  # a new stream of this key: the ends of an earlier one are past
            self.ended.pop((s, "sender"), None)
            self.ended.pop((s, "receiver"), None)
            if not sender:
                self.recvs[s] = r
        elif k == "refit_group_recv":
            self.recvs.pop(s, None)
            self.received[s] = r["group"]
        elif k == "refit_manifest_check":
            self.recvs.pop(s, None)
            problems = [f"{p} {r[p]}" for p in _PROBLEMS if r.get(p)]
            if problems:
                self._end(s, "receiver", r, f"its manifest check failed ({'; '.join(problems)})")
        elif k == "refit_finalize":
            self.recvs.pop(s, None)
            self._end(s, "receiver", r, "it finalized")
        elif k == "refit_stream_abort":
            (self.acks if sender else self.recvs).pop(s, None)
            self._end(s, r["role"], r, f"it gave up: {r['error']}")

    def _end(self, s: Stream, role: str, r: dict, how: str) -> None:
        self.ended[(s, role)] = (r["seq"], how)

    def into(self, g: WaitGraph) -> None:
        for s, r in self.acks.items():
            what = "COMPLETE" if r["kind"] == "refit_complete_send" else f"group {r['group']}"
            self._wait(
                g,
                Wait(s[0], s[1], r["seq"], r["t"], f"ACK of {what} of refit step {s[2]}"),
                self.ended.get((s, "receiver")),
            )
        for s, r in self.recvs.items():
            after = "its first group" if r["kind"] == "refit_stream_begin" else f"the group after {r['group']}"
            self._wait(
                g, Wait(s[1], s[0], r["seq"], r["t"], f"{after} of refit step {s[2]}"), self.ended.get((s, "sender"))
            )

    @staticmethod
    def _wait(g: WaitGraph, w: Wait, ended: Optional[Tuple[int, str]]) -> None:
        """An open wait: on a live side, an edge; on a side whose stream ended, a lost wakeup
        (in a merged gate log the end may even come first: the sender records a group once
        its send returned, and the receiver may have died on it meanwhile)."""
        if ended is None:
            g.waits.append(w)
        else:
            g.unwoken.append((w, f"its stream ended at seq {ended[0]} ({ended[1]}) without waking it"))
