"""Failure modes users reported, each reproduced by a bundled scenario (a fault hook of
``simulators/faults/field.py``): the named check or failure kind catches it from the log,
and the same scenario without the fault (the fixed behaviour) runs clean."""

from __future__ import annotations

import dataclasses
import os

import pytest

from harness.logs.invariants import check_log
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario

SCENARIOS = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "scenarios")


# checks that read a failed run's end or its OOM from the log (where the catalogue has them)
FAILED_RUN_CHECKS = {"run_outcome", "vram"}


def run(name, **replace):
    s = load_scenario(os.path.join(SCENARIOS, name + ".yaml"))
    return Simulation(dataclasses.replace(s, **replace) if replace else s).run()


def fired(res):
    return [(r["name"], r["pipeline_id"]) for r in res.records if r["kind"] == "fault_fired"]


def last_states(res, pid):
    return {r["dp_rank"]: r for r in res.records if r["kind"] == "rank_state" and r["pipeline_id"] == pid}


def liveness_messages(res):
    found = check_log(res.records)
    assert {v.invariant for v in found} == {"liveness"}, found  # that check and no unrelated one
    return [v.message for v in found]


def test_collector_dying_at_an_epoch_end_leaves_the_trainer_waiting_forever():  # NeMo RL #2899
    res = run("collector_dies_at_epoch_end")
    assert res.reason == "horizon" and ("collector_dies", "ppl1") in fired(res)
    msgs = liveness_messages(res)
    assert any(m.startswith("ppl1 stuck in WaitBatch") for m in msgs) and not any(m.startswith("ppl2") for m in msgs)
    # what the collector had drawn before it died drained out; nothing followed
    t_dead = next(r["t"] for r in res.records if r["kind"] == "fault_fired")
    last = max(r["t"] for r in res.records if r["kind"] == "request_dispatch" and r["pipeline_id"] == "ppl1")
    assert t_dead < res.sim_time - 300 and last < res.sim_time - 300


def test_engines_crashing_after_a_refit_leave_the_trainer_polling_an_empty_buffer():  # NeMo RL #3488
    res = run("engines_crash_after_refit")
    assert res.reason == "horizon" and ("engines_crash_after_refit", "ppl1") in fired(res)
    msgs = liveness_messages(res)
    assert any(m.startswith("ppl1 stuck in WaitBatch") for m in msgs)
    crash = next(r for r in res.records if r["kind"] == "fault_fired")
    stopped = [
        r for r in res.records if r["kind"] == "rank_state" and r["pipeline_id"] == "ppl1" and r["state"] == "stopped"
    ]
    assert stopped and all(r["seq"] > crash["seq"] for r in stopped)
    assert not [
        r for r in res.records if r["seq"] > crash["seq"] and r["kind"] == "request_done" and r["pipeline_id"] == "ppl1"
    ]


def test_one_stuck_straggler_wedges_a_synchronous_step():  # NeMo RL #3238
    res = run("stuck_rollout_straggler")
    assert res.reason == "horizon" and ("stuck_request", "ppl1") in fired(res)
    msgs = liveness_messages(res)
    assert any(m.startswith("ppl1 stuck in WaitBatch of step 1") for m in msgs), msgs
    # every other trajectory of ppl1's batch finished: one straggler is all it takes
    done = {r["request"] for r in res.records if r["kind"] == "request_done" and r["pipeline_id"] == "ppl1"}
    drawn = {r["request"] for r in res.records if r["kind"] == "request_dispatch" and r["pipeline_id"] == "ppl1"}
    assert len(drawn - done) == 1


def test_parameters_left_on_the_gpu_by_the_offload_make_the_next_wake_oom():  # NeMo RL #2775
    res = run("offload_keeps_params")
    # handover: the parameters left behind are seen when the GPU is granted, before the OOM
    assert res.reason == "failed" and {v.invariant for v in check_log(res.records)} == {
        "vram",
        "run_outcome",
        "handover",
        "handover_headroom",
    }
    assert ("offload_keeps_params", "ppl1") in fired(res)
    oom = next(r for r in res.records if r["kind"] == "oom")
    assert oom["gpu"] == 0 and oom["owner"] == "ppl1/dp0"
    left = sum(
        r["delta"]
        for r in res.records
        if r["kind"] == "vram" and r["gpu"] == 0 and r["owner"] == "ppl1/train" and r["mem"] == "weights"
    )
    assert left == res.scenario.pipelines[0].model.weight_bytes and oom["used"] >= left


def test_stranded_weight_sync_communicators_pile_up_until_an_allocation_fails():  # NeMo RL #3591
    res = run("stranded_sync_group")
    assert res.reason == "failed" and "OOM on GPU" in res.detail
    assert {v.invariant for v in check_log(res.records)} <= FAILED_RUN_CHECKS | {"sync_groups"}
    oom = next(r for r in res.records if r["kind"] == "oom")
    assert oom["owner"].startswith("ppl1/stranded:")
    groups = {}
    for r in res.records:
        if r["kind"] in ("group_create", "group_destroy") and r.get("purpose") == "sync":
            groups[r["name"]] = r["kind"].split("_")[1]
    assert groups and all(a == "create" for a in groups.values())  # never destroyed
    stranded = [v for v in check_log(res.records, ["sync_groups"]) if "still alive" in v.message]
    named = [v.message.split(" its group ")[1].split(" ")[0] for v in stranded]
    # the oracle names each stranded group once, at the end of the sync that left it; the
    # last one belongs to the sync the OOM cut short (a failed run is not held to "never leaked")
    assert len(named) == len(set(named)) and set(named) <= set(groups) and len(set(groups) - set(named)) == 1


def test_a_generation_request_without_estimate_or_progress_blocks_forever():  # RLix debug #27
    res = run("gen_request_without_demand")
    assert res.reason == "horizon" and ("no_gen_estimate", "ppl1") in fired(res)
    msgs = liveness_messages(res)
    assert any("request of ppl1_actor_infer at GENERATION" in m for m in msgs)
    assert any(m.startswith("ppl1 stuck in RequestGpus") for m in msgs)
    gen = [r for r in res.records if r["kind"] == "request" and r["cluster_id"] == "ppl1_actor_infer"]
    assert gen and all("step_target_estimate" not in r for r in gen)
    assert not [r for r in res.records if r["kind"] == "progress" and r["pipeline_id"] == "ppl1"]


def test_an_expand_that_fails_at_its_sync_strands_the_woken_ranks_and_fails_fast():
    res = run("expand_fails_midway")
    assert res.reason == "failed" and "no rollback" in res.detail
    assert {v.invariant for v in check_log(res.records)} <= FAILED_RUN_CHECKS
    last = last_states(res, "ppl1")
    stranded = [r for r in last.values() if r["state"] == "awake_unrouted"]
    assert stranded  # woken, never synced nor activated, still holding memory
    for r in stranded:
        held = sum(v["delta"] for v in res.records if v["kind"] == "vram" and v["owner"] == f"ppl1/dp{r['dp_rank']}")
        assert held > 0


@pytest.mark.parametrize(
    "name",
    [
        "collector_dies_at_epoch_end",
        "engines_crash_after_refit",
        "stuck_rollout_straggler",
        "offload_keeps_params",
        "stranded_sync_group",
        "gen_request_without_demand",
        "expand_fails_midway",
    ],
)
def test_without_its_fault_the_scenario_runs_clean(name):
    s = load_scenario(os.path.join(SCENARIOS, name + ".yaml"))
    fixed = [f for f in s.faults if f.name not in ("noop_progress_hooks",)]  # NeMo's real hooks stay
    keep = tuple(f for f in s.faults if f not in fixed)
    res = Simulation(dataclasses.replace(s, faults=keep)).run()
    assert res.reason == "done" and check_log(res.records) == [], (name, res.detail)


def test_noop_progress_hooks_leaves_a_record_where_it_first_withholds_a_report():
    # a whole-run fault still says when it acted: at the first report it withheld (a new
    # batch forces one), so a finding after it names the fault (a fuzz baseline matches it)
    res = run("gen_request_without_demand")
    first = next(r for r in res.records if r["kind"] == "fault_fired" and r["name"] == "noop_progress_hooks")
    assert first["pipeline_id"] == "ppl1" and first["step"] == 0
    assert fired(res).count(("noop_progress_hooks", "ppl1")) == 1
    begun = next(
        r
        for r in res.records
        if r["kind"] == "effect_start" and r["pipeline_id"] == "ppl1" and r["effect"] == "BeginProgressBatch"
    )
    assert begun["seq"] < first["seq"]  # fired inside the batch's opening, where the report was due
    assert not any(r["kind"] == "progress" and r["pipeline_id"] == "ppl1" for r in res.records)
    peer = [r for r in res.records if r["kind"] == "progress" and r["pipeline_id"] == "ppl2"]
    assert peer and ("noop_progress_hooks", "ppl2") not in fired(res)  # hooks intact: reports, no record


def test_no_gen_watchdog_leaves_a_record_where_the_watchdog_would_have_re_requested():
    # the reference: the same scenario with the watchdog present; its first GENERATION
    # request that the faulted run lacks is the re-request the fault withheld
    faulted = run("starve_one_shot_generation")
    s = load_scenario(os.path.join(SCENARIOS, "starve_one_shot_generation.yaml"))
    present = Simulation(dataclasses.replace(s, faults=tuple(f for f in s.faults if f.name != "no_gen_watchdog"))).run()
    requests = lambda res, pid: [
        (r["t"], r["priority"])
        for r in res.records
        if r["kind"] == "request" and r["cluster_id"] == f"{pid}_actor_infer"
    ]
    for pid in ("ppl1", "ppl2"):
        records = [
            r
            for r in faulted.records
            if r["kind"] == "fault_fired" and r["name"] == "no_gen_watchdog" and r["pipeline_id"] == pid
        ]
        assert len(records) == 1, pid
        withheld = next(req for req in requests(present, pid) if req not in requests(faulted, pid))
        assert records[0]["t"] == withheld[0] and withheld[1] == "GENERATION", (pid, records, withheld)
