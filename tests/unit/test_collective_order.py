"""``collective_order`` (harness/logs/invariants/collective_order.py) and the wait-for graph's
collective waits (``deadlock``) on crafted logs, and on the simulated system where the fault of
volcengine/verl #7423 makes it fire and the fixed variant keeps it quiet."""

from __future__ import annotations

import os

from harness.logs.invariants import check_log
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def coll(seq, activity, phase, comm="p/train"):
    return {
        "seq": seq,
        "t": float(seq),
        "kind": "collectives",
        "pipeline_id": "p",
        "communicator": comm,
        "activity": activity,
        "phase": phase,
    }


def findings(records):
    return [(v.seq, v.message) for v in check_log(records, ["collective_order"])]


def test_two_activities_open_on_one_communicator_are_named():
    log = [
        coll(1, "train", "start"),
        coll(2, "weight_sync", "start"),
        coll(3, "train", "end"),
        coll(4, "weight_sync", "end"),
    ]
    assert findings(log) == [
        (
            2,
            "p/weight_sync issues collectives on p/train while p/train (since seq 1, t=1.000) "
            "still does: no order between them; a cycle of waits: "
            "p/train -[collectives on p/train interleaved with p/weight_sync's, seq 1]-> p/weight_sync "
            "-[collectives on p/train interleaved with p/train's, seq 2]-> p/train",
        )
    ]
    # both ended: the wait-for graph at the log's end holds nothing (the run did not hang)
    assert check_log(log, ["deadlock"]) == []


def test_ordered_activities_and_other_communicators_hold():
    ordered = [
        coll(1, "train", "start"),
        coll(2, "train", "end"),
        coll(3, "weight_sync", "start"),
        coll(4, "weight_sync", "end"),
    ]
    assert findings(ordered) == []
    apart = [coll(1, "train", "start"), coll(2, "weight_sync", "start", comm="p/sync"), coll(3, "train", "end")]
    assert findings(apart) == []


#: two activities, each holding one communicator and waiting for the other's (an order per
#: communicator, taken in opposite orders): train holds p/pp, the sync p/ep
INVERTED = [
    coll(1, "train", "start", comm="p/pp"),
    coll(2, "weight_sync", "start", comm="p/ep"),
    coll(3, "train", "wait", comm="p/ep"),
    coll(4, "weight_sync", "wait", comm="p/pp"),
]


def test_an_order_inversion_across_communicators_is_a_cycle_named_at_its_closing_record():
    (found,) = findings(INVERTED)
    assert found == (
        4,
        "a cycle of collective waits among p/train, p/weight_sync (records 3, 4), formed at t=4.000: "
        "p/train -[collectives on p/ep, which p/weight_sync issues, seq 3]-> p/weight_sync "
        "-[collectives on p/pp, which p/train issues, seq 4]-> p/train",
    )
    end = {"seq": 5, "t": 5.0, "kind": "sim_end", "reason": "horizon", "sim_time": 5.0, "events": 5}
    (dead,) = check_log(INVERTED + [end], ["deadlock"])
    assert dead.seq == 5 and "among p/train, p/weight_sync (records 3, 4)" in dead.message


def test_the_same_order_on_both_communicators_holds():
    """The sync waits for p/pp only after train released it: an order, no cycle."""
    ordered = INVERTED[:3] + [
        coll(4, "train", "end", comm="p/pp"),
        coll(5, "weight_sync", "wait", comm="p/pp"),
        coll(6, "weight_sync", "end", comm="p/ep"),
        coll(7, "train", "start", comm="p/ep"),
        coll(8, "weight_sync", "start", comm="p/pp"),
        coll(9, "train", "end", comm="p/ep"),
        coll(10, "weight_sync", "end", comm="p/pp"),
    ]
    assert findings(ordered) == [] and check_log(ordered, ["deadlock"]) == []


def test_an_unordered_pair_still_open_at_the_end_is_a_deadlock():
    log = [coll(1, "train", "start"), coll(2, "weight_sync", "start")]
    (dead,) = check_log(log, ["deadlock"])
    assert "(records 1, 2)" in dead.message and "interleaved" in dead.message


def _run(name):
    return Simulation(load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))).run()


def test_locks_per_communicator_taken_in_opposite_orders_deadlock_and_one_order_holds():
    bug, fixed = _run("verl_comm_locks_inverted"), _run("verl_comm_locks_inverted_fixed")
    assert bug.reason == "horizon" and fixed.reason == "done"
    (order,) = check_log(bug.records, ["collective_order"])
    (dead,) = check_log(bug.records, ["deadlock"])
    waits = [r for r in bug.records if r["kind"] == "collectives" and r["phase"] == "wait"]
    assert [w["activity"] for w in waits] == ["weight_sync", "old_log_probs"]
    assert order.seq == waits[-1]["seq"]  # named at the record that closed the cycle
    for v in (order, dead):
        assert f"records {waits[1]['seq']}, {waits[0]['seq']}" in v.message, v.message
        assert "grpo/pp" in v.message and "grpo/ep" in v.message
    assert check_log(fixed.records, ["collective_order", "deadlock", "version_span"]) == []
    assert any(r["kind"] == "collectives" and r["phase"] == "wait" for r in fixed.records)  # ordered, not apart


def test_verl_7423_fires_and_its_fix_holds():
    bug, fixed = _run("verl_weight_sync_shared_comm"), _run("verl_weight_sync_shared_comm_fixed")
    found = check_log(bug.records, ["collective_order"])
    assert found and all("grpo/train" in v.message and "a cycle of waits" in v.message for v in found)
    assert check_log(fixed.records, ["collective_order"]) == []
