"""RLix's MILES variants (docs/rlix-variants.md): the demand floor changes RLix's decisions
only where it applies, logs that do not use the variants keep their bytes, and the check
the floor's re-activation breaks (``reactivated_after_release``) fires on a crafted log."""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Dict, List, Optional, Set

import pytest

from harness.logs.invariants.release_reuse import reactivated_after_release
from harness.eventlog.kinds import category
from harness.logs.records import Record
from harness.logs.replay import _Feeder
from harness.scheduler.model import SchedulerModel
from harness.scheduler.options import SchedulerOptions
from harness.scheduler.types import Rejected
from harness.scheduler.topology import ClusterTopology
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario
from simulators.scenario.spec import default_scenario

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _scenario(name: str):
    if name == "default":
        return default_scenario()
    return load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))


class FloorWitness:
    """Where the MILES floor applies, read from the log's records (not from the model): a
    registered pipeline's GENERATION cluster is in the allocations (granted or expanded and
    committed, not released since, not unregistered; a shrink to zero keeps the entry), the
    pipeline has no stored progress report (none since its last clear), and the cluster has
    no pending GENERATION request with an estimate > 0."""

    def __init__(self) -> None:
        self.registered: Set[str] = set()
        self.progress: Set[str] = set()
        self.pending: Dict[str, Optional[int]] = {}
        self.held: Set[str] = set()
        self.expanding: Dict[int, Set[str]] = {}

    def see(self, r: dict) -> None:
        k = r["kind"]
        if k == "register":
            self.registered.add(r["pipeline_id"])
        elif k == "unregister":
            pid = r["pipeline_id"]
            self.registered.discard(pid)
            self.progress.discard(pid)
            self.held.discard(f"{pid}_actor_infer")
            self.pending.pop(f"{pid}_actor_infer", None)
        elif k == "progress":
            self.progress.add(r["pipeline_id"])
        elif k == "clear_progress":
            self.progress.discard(r["pipeline_id"])
        elif k == "request" and r["priority"] == "GENERATION":
            self.pending[r["cluster_id"]] = r.get("step_target_estimate")
        elif k == "release_then_request":
            self.held.discard(r["release_cluster_id"])
            if r["request_priority"] == "GENERATION":
                self.pending[r["request_cluster_id"]] = r.get("request_step_target_estimate")
        elif k == "release":
            self.held.discard(r["cluster_id"])
        elif k == "signalled" and r["waiter"] == "request" and r["priority"] == "GENERATION":
            self.pending.pop(r["cluster_id"], None)
            if r["gpus"] and not r["error"]:
                self.held.add(r["cluster_id"])
        elif k == "plan":
            self.expanding[r["cycle"]] = {e["cluster_id"] for e in r["expands"]}
        elif k == "commit":
            self.held |= self.expanding.pop(r["cycle"], set())

    def applies(self) -> List[str]:
        out = []
        for pid in sorted(self.registered):
            cid = f"{pid}_actor_infer"
            est = self.pending.get(cid)
            if cid in self.held and pid not in self.progress and not (est is not None and est > 0):
                out.append(cid)
        return out


def _compare_cycle_by_cycle(records: List[dict], change: Optional[dict] = None):
    """Feed the log's inputs to RLix's default model; before each cycle, plan the same
    cycle on a copy with the floor on. Returns (cycles compared, differing cycles, cycles
    where the witness says the floor applies)."""
    head = records[0]
    model = SchedulerModel(
        ClusterTopology(head["cluster"]["nodes"], head["cluster"]["gpus_per_node"]),
        SchedulerOptions.from_mapping(head.get("scheduler", {})),
    )
    feeder = _Feeder(model, "log")
    witness = FloorWitness()
    compared, differing, floor_cycles = 0, [], set()
    for i, r in enumerate(records[1:], start=1):
        if r["kind"] == "cycle" and r.get("phase", "full") in ("full", "plan") and model.failed is None:
            variant = copy.deepcopy(model)
            variant.options = dataclasses.replace(variant.options, **(change or {"demand_floor": True}))
            try:
                variant.plan_cycle(r.get("reason", "wakeup"))
            except Rejected:
                pass
            got = [d for d in variant.drain() if d["kind"] == "plan"]
            feeder.feed(Record(i, r))
            want = [d for d in model.drain() if d["kind"] == "plan"]
            compared += 1
            cycle = want[0]["cycle"] if want else None
            if witness.applies():
                floor_cycles.add(cycle)
            if got != want:
                differing.append((cycle, witness.applies()))
        elif category(r["kind"]) == "input":
            try:
                feeder.feed(Record(i, r))
            except Rejected:
                pass
            model.drain()
        witness.see(r)
    return compared, differing, floor_cycles


@pytest.mark.parametrize("name", ["roll_dual_4gpu", "finished_pipeline_keeps_gen", "default"])
def test_the_floor_changes_decisions_only_in_cycles_where_it_applies(name):
    records = Simulation(_scenario(name)).run().log.records
    compared, differing, floor_cycles = _compare_cycle_by_cycle(records)
    assert compared > 20
    for cycle, held_without_demand in differing:
        assert held_without_demand, f"{name}: cycle {cycle} differs with the floor, where it does not apply"
    assert differing, f"{name}: the floor changed nothing (the comparison cannot fail)"
    assert {c for c, _ in differing} <= floor_cycles


def test_the_comparison_catches_a_variant_that_differs_where_the_floor_does_not_apply():
    """Not vacuous: a planner change unrelated to the floor (epsilon) differs in cycles the
    witness does not mark."""
    records = Simulation(_scenario("gap_ratio_3pipelines")).run().log.records
    _n, differing, _f = _compare_cycle_by_cycle(records, {"epsilon": 0.2})
    assert any(not applies for _c, applies in differing)


def test_defaults_keep_the_header_and_the_options_appear_only_when_set():
    assert "demand_floor" not in SchedulerOptions().to_mapping()
    assert "release_after_offload" not in SchedulerOptions().to_mapping()
    on = SchedulerOptions.from_mapping({"demand_floor": True, "release_after_offload": True}).to_mapping()
    assert on["demand_floor"] is True and on["release_after_offload"] is True
    with pytest.raises(ValueError, match="demand_floor"):
        SchedulerOptions.from_mapping({"demand_floor": 1})


# ---------------------------------------------------------------- reactivated_after_release


def _log(*recs: dict) -> List[dict]:
    out = [{"seq": 0, "t": 0.0, "kind": "header"}]
    for i, r in enumerate(recs, start=1):
        out.append({"seq": i, "t": float(i), **r})
    return out


ACK = {
    "kind": "signalled",
    "request_id": 7,
    "waiter": "planned_release",
    "cluster_id": "p_actor_infer",
    "priority": "GENERATION",
    "gpus": [],
    "cycle": 3,
    "error": None,
}
EXPAND = {
    "kind": "plan",
    "cycle": 4,
    "shrinks": [],
    "signals": [],
    "expands": [
        {"cluster_id": "p_actor_infer", "has_pending_request": False, "bundles": [{"dp_rank": 1, "gpus": [1]}]}
    ],
}
COMMIT = {"kind": "commit", "cycle": 4}
REQUEST = {"kind": "enqueued", "request_id": 8, "cluster_id": "p_actor_infer", "priority": "GENERATION"}


def test_reactivated_after_release_fires_on_an_expand_between_the_ack_and_the_next_request():
    found = reactivated_after_release(_log(ACK, EXPAND, COMMIT, REQUEST))
    assert [(v.invariant, v.seq) for v in found] == [("reactivated_after_release", 2)]
    assert "p_actor_infer dp [1]" in found[0].message and "ack seq 1" in found[0].message


@pytest.mark.parametrize(
    "between",
    [
        REQUEST,
        {"kind": "unregister", "pipeline_id": "p"},
        {"kind": "released", "cluster_id": "p_actor_infer", "gpus": [], "reason": "unregister"},
        {**ACK, "waiter": "request", "request_id": 9, "cycle": None, "gpus": [2]},
    ],
)
def test_reactivated_after_release_is_silent_once_the_pipeline_asked_again_or_left(between):
    assert reactivated_after_release(_log(ACK, between, EXPAND, COMMIT)) == []


def test_reactivated_after_release_ignores_an_expand_the_commit_skipped():
    assert reactivated_after_release(_log(ACK, EXPAND, {**COMMIT, "skipped_stale": ["expand p_actor_infer"]})) == []
    assert reactivated_after_release(_log(ACK, {**ACK, "error": "failed"}, EXPAND, COMMIT)) != []


# ---------------------------------------------------------------- release_after_offload


def _release_run(after_offload: bool):
    s = _scenario("miles_release_after_failed_sync")
    return Simulation(dataclasses.replace(s, scheduler={"release_after_offload": after_offload})).run()


def _train_releases_after_the_fault(records):
    fired = next(r["seq"] for r in records if r["kind"] == "fault_fired" and r["name"] == "active_sync_fails")
    return [
        r for r in records if r["seq"] > fired and r["kind"] == "released" and r["cluster_id"] == "ppl1_actor_train"
    ]


def test_release_after_offload_releases_the_training_gpus_when_the_sync_fails():
    from harness.logs.invariants import check_log

    miles, main = _release_run(True), _release_run(False)
    assert miles.reason == main.reason == "failed"
    (rel,) = _train_releases_after_the_fault(miles.records)
    assert rel["gpus"] == [0]
    assert _train_releases_after_the_fault(main.records) == []
    # the effects of the failing step: offload ended, the sync started and never ended, then the release
    step = [
        (r["kind"], r["effect"])
        for r in miles.records
        if r["kind"] in ("effect_start", "effect_end")
        and r.get("pipeline_id") == "ppl1"
        and r.get("step") == 1
        and r.get("scope") == "step"
    ]
    i = step.index(("effect_end", "OffloadTraining"))
    assert step[i + 1 :][-4:] == [
        ("effect_end", "ActiveRanks"),
        ("effect_start", "SyncFromCache"),
        ("effect_start", "ReleaseGpus"),
        ("effect_end", "ReleaseGpus"),
    ]
    # the check's parameter: the release is right under the option, and only with a failed call
    assert {v.invariant for v in check_log(miles.records)} == {"run_outcome"}
    no_flag = [dict(miles.records[0], scheduler={}), *miles.records[1:]]
    assert "release_after_publish" in {v.invariant for v in check_log(no_flag)}
    no_failure = [
        r
        for r in miles.records
        if not (
            r["kind"] == "effect_start"
            and r["effect"] == "SyncFromCache"
            and r.get("step") == 1
            and r.get("pipeline_id") == "ppl1"
        )
    ]
    assert "release_after_publish" in {v.invariant for v in check_log(no_failure)}


def test_release_after_offload_without_a_failure_logs_the_same_bytes():
    s = _scenario("default")
    on = Simulation(dataclasses.replace(s, scheduler={"release_after_offload": True})).run()
    off = Simulation(s).run()
    # only the header's scheduler mapping names the option
    assert list(on.log.lines())[1:] == list(off.log.lines())[1:]


def test_reactivated_after_release_counts_an_expand_whose_cycle_never_commits():
    found = reactivated_after_release(_log(ACK, EXPAND))
    assert [v.seq for v in found] == [2]


def test_the_demand_floor_with_another_policy_is_refused_naming_the_field(tmp_path):
    from simulators.scenario.loader import ScenarioError, load_scenario as load

    text = open(os.path.join(ROOT, "examples", "scenarios", "default.yaml")).read()
    path = tmp_path / "x.yaml"
    path.write_text(text + "\nscheduler: {policy: static_partition, demand_floor: true}\n")
    with pytest.raises(ScenarioError, match=r"scheduler\.demand_floor: .*static_partition"):
        load(str(path))
