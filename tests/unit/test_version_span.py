"""``version_span`` (harness/logs/invariants/version_span.py) on crafted logs, and on the
simulated system where the faults of THUDM/slime #2092 and inclusionAI/AReaL #1388 make it
fire and their fixed variants keep it quiet."""

from __future__ import annotations

import os

import pytest

from harness.logs.invariants import check_log
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def header(**pipes):
    return {"seq": 0, "t": 0, "kind": "header", "meta": {"version_span": pipes}}


def traj(seq, tid, first, last, pid="p"):
    return {
        "seq": seq,
        "t": seq,
        "kind": "trajectory",
        "pipeline_id": pid,
        "trajectory": tid,
        "dp_rank": 0,
        "first_version": first,
        "version": last,
    }


def dispatch(seq, tid, trainer_version, pid="p"):
    return {
        "seq": seq,
        "t": seq,
        "kind": "trajectory_dispatch",
        "pipeline_id": pid,
        "trajectory": tid,
        "trainer_version": trainer_version,
    }


def evicted(seq, tids, trainer_version, pid="p"):
    return {
        "seq": seq,
        "t": seq,
        "kind": "trajectory_evicted",
        "pipeline_id": pid,
        "trajectories": tids,
        "trainer_version": trainer_version,
    }


def span_findings(records):
    return [(v.seq, v.message) for v in check_log(records, ["version_span"])]


def test_a_span_without_partial_rollout_is_named_with_its_versions():
    log = [header(p={"partial_rollout": False}), traj(1, 7, 2, 2), traj(2, 8, 2, 4)]
    assert span_findings(log) == [
        (2, "p trajectory 8 was generated with weight versions 2..4 although partial rollout is off")
    ]


def test_a_span_with_partial_rollout_is_allowed():
    assert span_findings([header(p={"partial_rollout": True}), traj(1, 8, 2, 6)]) == []


def test_a_dispatch_past_the_window_fires_and_evictions_free_room():
    # window at trainer version 0 with max_age 1 and batch 2: (0 + 1 + 1) * 2 = 4 trajectories
    pipe = {"partial_rollout": True, "max_age": 1, "batch": 2}
    full = [header(p=pipe)] + [dispatch(1 + i, i, 0) for i in range(4)]
    assert span_findings(full) == []
    over = span_findings(full + [dispatch(5, 4, 0)])
    assert [seq for seq, _ in over] == [5] and "5 in its window at trainer version 0" in over[0][1]
    assert span_findings(full + [evicted(5, [0], 0), dispatch(6, 4, 0)]) == []
    assert span_findings(full + [dispatch(5, 4, 1)]) == []  # the trainer's next version opens two more


def test_logs_without_the_settings_are_skipped():
    assert span_findings([{"seq": 0, "t": 0, "kind": "header"}, traj(1, 8, 2, 4), dispatch(2, 9, 0)]) == []
    assert span_findings([header(q={"partial_rollout": False}), traj(1, 8, 2, 4)]) == []  # another pipeline


@pytest.mark.parametrize(
    "name, fires",
    [
        ("slime_requeue_partial_rollout", "partial rollout is off"),
        ("slime_requeue_partial_rollout_fixed", None),
        ("areal_staleness_capacity_restart", "in its window"),
        ("areal_staleness_capacity_restart_fixed", None),
    ],
)
def test_the_field_reports_fire_and_their_fixes_hold(name, fires):
    res = Simulation(load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))).run()
    assert res.reason == "done"
    found = [v.message for v in check_log(res.records, ["version_span"])]
    if fires is None:
        assert found == []
    else:
        assert found and all(fires in m for m in found)
