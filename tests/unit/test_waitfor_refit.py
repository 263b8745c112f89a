"""The refit stream's ACKs as wait-for edges (harness/logs/invariants/waitfor_refit.py): crafted
logs that make ``deadlock`` and ``lost_wakeup`` fire through them, and a real stream on the
ZMQ transport whose receiver dies holding its ACK."""

from __future__ import annotations

import threading

import pytest
import torch

from harness.logs.invariants import check_log
from tests.unit.refit_pair import Log, endpoint  # noqa: F401  (fixture)

WAITS = ["deadlock", "lost_wakeup", "hot_state"]


def _log(*recs):
    out = [
        {
            "seq": 0,
            "t": 0.0,
            "kind": "header",
            "schema": "rlharness.eventlog",
            "version": 1,
            "cluster": {"nodes": 1, "gpus_per_node": 2},
            "meta": {},
        }
    ]
    for i, (kind, role, fields) in enumerate(recs, start=1):
        peer = "receiver" if role == "sender" else "sender"
        out.append({"seq": i, "t": float(i), "kind": kind, "step": 3, "role": role, "peer": peer, **fields})
    return out


S, R = "sender", "receiver"
BEGIN = [
    ("refit_stream_begin", S, {"budget_bytes": 4096, "half_bytes": 2048, "tensors": 2}),
    ("refit_stream_begin", R, {"expected": ["a", "b"]}),
]


def _slots(g):
    return {"group": g, "buffer": str(g % 2), "bytes": 512, "names": ["ab"[g]], "offsets": [0]}


def _send(g):
    return ("refit_group_send", S, {**_slots(g), "sizes": [512]})


def _recv(g):
    return ("refit_group_recv", R, _slots(g))


def _ack(g):
    return ("refit_ack", S, {"group": str(g)})


def _abort(role, error):
    return ("refit_stream_abort", role, {"error": error})


CLEAN_CHECK = ("refit_manifest_check", R, {"missing": [], "duplicate": [], "unexpected": []})
WHOLE = BEGIN + [
    _send(0),
    _recv(0),
    _ack(0),
    _send(1),
    _recv(1),
    _ack(1),
    ("refit_complete_send", S, {"groups": 2}),
    CLEAN_CHECK,
    ("refit_finalize", R, {"groups": 2}),
    _ack("complete"),
]


def test_a_whole_stream_leaves_no_wait_and_every_prefix_has_the_lockstep_waits():
    assert check_log(_log(*WHOLE), WAITS + ["refit_wire"]) == []
    from harness.logs.invariants.waitfor import wait_graph

    mid = wait_graph(_log(*WHOLE[:3]))  # group 0 sent, not yet received: both sides wait
    assert sorted((w.waiter, w.on, w.what) for w in mid.waits) == [
        ("receiver", "sender", "its first group of refit step 3"),
        ("sender", "receiver", "ACK of group 0 of refit step 3"),
    ]
    assert [(w.waiter, w.what) for w in wait_graph(_log(*WHOLE[:4])).waits] == [
        ("sender", "ACK of group 0 of refit step 3")
    ]  # the receiver holds group 0: it loads, it waits on no one


def test_a_group_that_never_arrived_is_a_cycle_through_the_ack():
    found = check_log(_log(*BEGIN, _send(0), _recv(0), _ack(0), _send(1)), WAITS)
    assert [v.invariant for v in found] == ["deadlock"]
    msg = found[0].message
    assert "receiver -[the group after 0 of refit step 3, seq 5]-> sender" in msg
    assert "sender -[ACK of group 1 of refit step 3, seq 6]-> receiver" in msg


def test_a_receiver_that_gave_up_holding_its_ack_is_a_lost_wakeup_until_the_sender_times_out():
    died = [*BEGIN, _send(0), _recv(0), _ack(0), _send(1), _recv(1), _abort(R, "SystemExit: killed in its loader")]
    found = check_log(_log(*died), WAITS)
    assert [v.invariant for v in found] == ["lost_wakeup"]
    assert (
        "sender waits (since t=6.0s, seq 6, ACK of group 1 of refit step 3) on receiver: its stream ended at seq 8 "
        "(it gave up: SystemExit: killed in its loader) without waking it"
    ) in found[0].message
    # the fix is a timeout: the sender's own abort ends its wait, and nothing is left hanging
    assert check_log(_log(*died, _abort(S, "StreamTimeout: nothing within 2 s")), WAITS) == []


def test_a_receiver_that_finalized_while_the_sender_waits_for_its_complete_ack_is_a_lost_wakeup():
    found = check_log(_log(*WHOLE[:-1]), ["lost_wakeup"])
    assert len(found) == 1 and "ACK of COMPLETE of refit step 3" in found[0].message
    assert "(it finalized)" in found[0].message


def test_a_failed_manifest_check_ends_the_receiver_and_a_dead_sender_strands_the_receiver():
    failed = ("refit_manifest_check", R, {"missing": ["b"], "duplicate": [], "unexpected": []})
    found = check_log(
        _log(*BEGIN, _send(0), _recv(0), _ack(0), ("refit_complete_send", S, {"groups": 1}), failed), ["lost_wakeup"]
    )
    assert len(found) == 1 and "its manifest check failed (missing ['b'])" in found[0].message
    found = check_log(
        _log(*BEGIN, _send(0), _recv(0), _ack(0), _abort(S, "StreamError: socket closed")), ["lost_wakeup"]
    )
    assert len(found) == 1 and found[0].message.startswith("receiver waits (since t=5.0s, seq 5, the group after 0")


def test_a_new_stream_of_the_same_key_is_judged_on_its_own():
    # a gate streams several buckets under one (sender, receiver, step): the first one's
    # finalize does not make the second one's open ACK a lost wakeup
    second = [("refit_stream_begin", S, {"budget_bytes": 4096, "half_bytes": 2048, "tensors": 2}), _send(0)]
    found = check_log(_log(*WHOLE, *second), WAITS)
    assert found == []
    from harness.logs.invariants.waitfor import wait_graph

    assert [(w.waiter, w.on) for w in wait_graph(_log(*WHOLE, *second)).waits] == [("sender", "receiver")]


def test_gate_ranks_name_the_nodes():
    recs = _log(*BEGIN, _send(0))
    for r in recs[1:]:
        r["rank"] = 0 if r["role"] == "sender" else 1
        r["peer"] = "rank 1" if r["role"] == "sender" else "rank 0"
    found = check_log(recs, ["deadlock"])
    assert (
        len(found) == 1
        and "rank 0 -[ACK of group 0" in found[0].message
        and "rank 1 -[its first group" in found[0].message
    )


# ---------------------------------------------------------------- a real stream
def test_a_receiver_killed_in_its_loader_leaves_the_sender_waiting_on_its_ack(endpoint):
    """The real transport: the receiver's loader exits (SystemExit) while it holds group 1,
    so it never ACKs. While the sender still waits, the log has a lost wakeup; the sender's
    timeout then ends the wait, and the whole log has no hanging wait left."""
    from gpu_gates.transports import zmq_stream as zs
    from harness.refit import stream as proto

    named = [(f"w{i}", torch.full((1024,), float(i))) for i in range(4)]  # 4 KiB each: one per group
    manifest = proto.manifest_of(zs.spec_of(n, t) for n, t in named)
    log, loaded = Log(), []

    def load(slot, view):
        loaded.append(slot.name)
        if len(loaded) == 2:
            raise SystemExit("killed in its loader")

    def rx():
        r = zs.RefitReceiver(endpoint, timeout_s=5.0, emit=log.emit)
        try:
            r.receive(manifest, load, step=1)
        except SystemExit:  # the thread dies here, as the process would
            pass
        finally:
            r.close()

    rx_thread = threading.Thread(target=rx, daemon=True)
    rx_thread.start()
    sender = zs.RefitSender(endpoint, timeout_s=1.0, emit=log.emit)
    try:
        with pytest.raises(zs.StreamTimeout):
            sender.stream(named, 2 * 4096, step=1)
    finally:
        sender.close()
    rx_thread.join(5)
    assert not rx_thread.is_alive()
    aborts = [(i, r["role"]) for i, r in enumerate(log.records) if r["kind"] == "refit_stream_abort"]
    assert [role for _, role in aborts] == ["receiver", "sender"]
    hung = log.records[: aborts[1][0]]  # the log while the sender still waited, before its timeout
    found = check_log(hung, WAITS)
    assert [v.invariant for v in found] == ["lost_wakeup"], [str(v) for v in found]
    assert "sender waits" in found[0].message and "ACK of group 1 of refit step 1" in found[0].message
    assert "it gave up: SystemExit: killed in its loader" in found[0].message
    assert check_log(log.records, WAITS) == []  # the sender's timeout ended its wait
