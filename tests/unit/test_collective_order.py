"""``collective_order`` (harness/logs/invariants/collective_order.py) on crafted logs, and on
the simulated system where the fault of volcengine/verl #7423 makes it fire and the fixed
variant keeps it quiet."""

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
            "weight_sync issues collectives on p/train while train (since seq 1, t=1.000) "
            "still does: no order between them",
        )
    ]


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


def _run(name):
    return Simulation(load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))).run()


def test_verl_7423_fires_and_its_fix_holds():
    bug, fixed = _run("verl_weight_sync_shared_comm"), _run("verl_weight_sync_shared_comm_fixed")
    found = check_log(bug.records, ["collective_order"])
    assert found and all("grpo/train" in v.message for v in found)
    assert check_log(fixed.records, ["collective_order"]) == []
