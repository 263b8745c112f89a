"""Each invariant fires on a broken trace and stays quiet on a sound one: the catalogue as a
whole (the replayed example traces, unknown names, a firing test for every registered
check) and the checks of the scheduler's decisions and the run's liveness, on replayed
traces. The other checks' firing tests: the sibling ``test_*_invariants.py`` files
(:data:`FIRING_SUITES`) and their subsystems' suites (:data:`OWN_SUITES`)."""

from __future__ import annotations

import copy
import glob
import os

import pytest

from harness.logs.invariants import CHECKS, check_log
from harness.logs.replay import replay_file
from tests.unit.invariant_traces import reseq

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TRACES = sorted(glob.glob(os.path.join(ROOT, "examples", "traces", "*.jsonl")))


def decisions(path=None):
    return copy.deepcopy(
        replay_file(path or os.path.join(ROOT, "examples", "traces", "partial_overlap_2gpu.jsonl")).log.records
    )


# The gap-ratio trace lands an await_release in a lock gap on purpose: RLix acks it
# prematurely. In the ROLL trace RLix acks ft_000000000002's await_release in the cycle
# whose gap-ratio plan re-expands the same cluster onto GPUs 0-1 (cycles 10, 23, 36):
# the pipeline is not at zero when await_release returns.
TRACE_FINDINGS = {
    "gap_ratio_3pipelines.jsonl": {"planned_release_ack"},
    "roll_dual_4gpu.jsonl": {"planned_release_ack"},
}


@pytest.mark.parametrize("trace", TRACES, ids=os.path.basename)
def test_replayed_examples_satisfy_every_invariant_but_their_documented_finding(trace):
    found = {v.invariant for v in check_log(decisions(trace))}
    assert found == TRACE_FINDINGS.get(os.path.basename(trace), set())


def test_planned_release_ack_fires_on_premature_ack_and_not_with_exact_releases(tmp_path):
    from harness.logs.replay import replay_records
    from harness.logs.records import read_records

    path = os.path.join(ROOT, "examples", "traces", "gap_ratio_3pipelines.jsonl")
    found = check_log(decisions(path), ["planned_release_ack"])
    assert len(found) == 1 and "pb_actor_infer" in found[0].message
    records = read_records(path)
    records[0].data["scheduler"] = {"ack_unplanned_releases": False}
    fixed = replay_records(records, path).log.records
    assert check_log(fixed, ["planned_release_ack"]) == []


def test_planned_release_ack_fires_at_cycle_23_of_the_roll_trace_and_not_with_exact_releases():
    from harness.logs.records import read_records
    from harness.logs.replay import replay_records

    path = os.path.join(ROOT, "examples", "traces", "roll_dual_4gpu.jsonl")
    found = check_log(decisions(path), ["planned_release_ack"])
    assert any("acked in cycle 23 while it still holds dp ranks [0, 1]" in v.message for v in found), found
    records = read_records(path)
    records[0].data["scheduler"] = {"ack_unplanned_releases": False}
    assert check_log(replay_records(records, path).log.records) == []


def test_planned_release_ack_ignores_the_models_own_flag():
    """The check reads holdings, never ``shrink_executed``: flipping the flag the model
    writes about itself changes nothing either way."""
    path = os.path.join(ROOT, "examples", "traces", "roll_dual_4gpu.jsonl")
    recs = decisions(path)
    acks = [r for r in recs if r["kind"] == "signalled" and r["waiter"] == "planned_release"]
    for r in acks:
        r["shrink_executed"] = True
    assert len(check_log(recs, ["planned_release_ack"])) == 3
    sound = decisions()
    for r in sound:
        if r["kind"] == "signalled" and r["waiter"] == "planned_release":
            r["shrink_executed"] = False
    assert check_log(sound, ["planned_release_ack"]) == []


def test_unknown_invariant_name_is_an_error():
    with pytest.raises(KeyError, match="unknown invariant"):
        check_log([], ["no_such_check"])


# ---------------------------------------------------------------- scheduler decisions


def test_gpu_ownership_fires_on_double_grant():
    recs = decisions()
    plan = next(r for r in recs if r["kind"] == "plan" and r["expands"])
    plan["expands"][0]["bundles"].append({"dp_rank": 9, "gpus": [1]})  # GPU 1 already given in the same plan
    found = check_log(recs, ["gpu_ownership"])
    assert found and "held by" in found[0].message


def test_gpu_ownership_fires_on_idle_count_mismatch():
    recs = decisions()
    commit = next(r for r in recs if r["kind"] == "commit")
    commit["idle_gpus"] += 1
    assert any("idle GPUs" in v.message for v in check_log(recs, ["gpu_ownership"]))


def test_gpu_ownership_fires_on_release_of_someone_elses_gpu():
    recs = decisions()
    rel = next(r for r in recs if r["kind"] == "released")
    rel["cluster_id"] = "ppl2_actor_train"
    assert any("frees GPU" in v.message for v in check_log(recs, ["gpu_ownership"]))


def test_resize_order_fires_when_expand_starts_before_shrink_returns():
    recs = decisions(os.path.join(ROOT, "examples", "traces", "gap_ratio_3pipelines.jsonl"))
    i = next(i for i, r in enumerate(recs) if r["kind"] == "resize_end" and r["phase"] == "shrink")
    j = next(
        j
        for j, r in enumerate(recs)
        if r["kind"] == "resize_start" and r["phase"] == "expand" and r["cycle"] == recs[i]["cycle"]
    )
    recs.insert(i, recs.pop(j))  # expand starts before the shrink returned
    found = check_log(reseq(recs), ["resize_order"])
    assert any("still running" in v.message or "T1 < T2" in v.message for v in found)


def test_resize_order_fires_when_waiter_signalled_before_expand_returns():
    recs = decisions()
    i = next(i for i, r in enumerate(recs) if r["kind"] == "resize_end" and r["phase"] == "expand")
    j = next(j for j, r in enumerate(recs) if j > i and r["kind"] == "signalled" and r["cycle"] == recs[i]["cycle"])
    recs.insert(i, recs.pop(j))
    assert any("T2 < T3" in v.message for v in check_log(reseq(recs), ["resize_order"]))


def test_no_readd_in_cycle_fires():
    recs = decisions(os.path.join(ROOT, "examples", "traces", "gap_ratio_3pipelines.jsonl"))
    plan = next(r for r in recs if r["kind"] == "plan" and r["shrinks"] and r["expands"])
    shrunk = plan["shrinks"][0]
    plan["expands"].append(
        {"cluster_id": shrunk["cluster_id"], "has_pending_request": False, "bundles": list(shrunk["bundles"])}
    )
    assert check_log(recs, ["no_readd_in_cycle"])


def test_liveness_names_waiters_and_stuck_effects_at_the_horizon():
    recs = [
        {
            "seq": 1,
            "t": 1,
            "kind": "enqueued",
            "request_id": 7,
            "cluster_id": "p_actor_infer",
            "priority": "GENERATION",
        },
        {
            "seq": 2,
            "t": 2,
            "kind": "effect_start",
            "pipeline_id": "p",
            "effect": "WaitBatch",
            "args": {"global_step": 3},
            "scope": "step",
            "step": 3,
        },
        {"seq": 3, "t": 400, "kind": "sim_end", "reason": "horizon", "sim_time": 400.0, "events": 10},
    ]
    msgs = [v.message for v in check_log(recs, ["liveness"])]
    assert any("request 7" in m for m in msgs) and any("stuck in WaitBatch of step 3" in m for m in msgs)
    # the same waiters at a horizon only 9 s in: the run was cut, nothing has stalled yet
    early = recs[:2] + [dict(recs[2], t=9, sim_time=9.0)]
    assert check_log(early, ["liveness"]) == []
    # ... nor when the waiting pipeline was still completing requests in the last window
    moving = recs[:2] + [
        {
            "seq": 3,
            "t": 250,
            "kind": "request_done",
            "pipeline_id": "p",
            "request": 1,
            "dp_rank": 0,
            "tokens": 5,
            "version": 0,
        },
        dict(recs[2], seq=4),
    ]
    assert check_log(moving, ["liveness"]) == []
    done = recs[:2] + [
        {
            "seq": 3,
            "t": 3,
            "kind": "signalled",
            "request_id": 7,
            "waiter": "request",
            "cluster_id": "p_actor_infer",
            "priority": "GENERATION",
            "gpus": [0],
            "cycle": 1,
            "error": None,
        },
        {
            "seq": 4,
            "t": 4,
            "kind": "effect_end",
            "pipeline_id": "p",
            "effect": "WaitBatch",
            "args": {"global_step": 3},
            "scope": "step",
            "step": 3,
        },
        {"seq": 5, "t": 5, "kind": "sim_end", "reason": "done", "sim_time": 5.0, "events": 10},
    ]
    assert check_log(done, ["liveness"]) == []


#: the invariant firing suites: each check's firing test calls ``check_log(..., ["name"])`` there
FIRING_SUITES = {
    **{
        name: "tests/unit/test_invariants.py"
        for name in ("gpu_ownership", "resize_order", "no_readd_in_cycle", "planned_release_ack", "liveness")
    },
    **{
        name: "tests/unit/test_effect_invariants.py"
        for name in ("activate_after_sync", "versions", "release_after_publish", "step_order", "data_plane")
    },
    **{name: "tests/unit/test_serving_invariants.py" for name in ("routing", "stale_serving", "routing_policy")},
    **{name: "tests/unit/test_gpu_memory_invariants.py" for name in ("handover", "gpu_tenancy")},
}

# checks whose firing tests live with their subsystem
OWN_SUITES = {
    "staleness_window": "tests/streaming/test_streaming_invariants.py",
    "streaming_step": "tests/streaming/test_streaming_invariants.py",
    "pump_parked": "tests/streaming/test_pump_parked.py",
    **{name: "tests/sim/test_waitfor_liveness.py" for name in ("deadlock", "lost_wakeup", "hot_state", "livelock")},
    "refit_wire": "tests/unit/test_refit_stream_protocol.py",
    "handover_headroom": "tests/unit/test_handover_headroom.py",
    "reactivated_after_release": "tests/unit/test_rlix_variants.py",
    "refit_payload": "tests/unit/test_refit_completeness.py",
    "cycle_trends": "tests/sim/test_cycle_trends.py",
    **{
        name: "tests/unit/test_blind_spot_checks.py"
        for name in (
            "grant_order",
            "in_flight_at_sleep",
            "sync_targets",
            "rank_lifecycle",
            "host_ram",
            "trajectory_age",
            "ungrantable_preemption",
            "idle_bundle_starvation",
        )
    },
    **{
        name: "tests/unit/test_engine_checks.py"
        for name in ("kv_cache_asleep", "engine_resume", "engine_weights", "version_at_dispatch", "pause_lost_work")
    },
    "engine_transition": "tests/unit/test_engine_transition.py",
    "engine_stood_down": "tests/unit/test_engine_transition.py",
    "version_span": "tests/unit/test_version_span.py",
    "collective_order": "tests/unit/test_collective_order.py",
    **{
        name: "tests/unit/test_mutations.py"
        for name in ("plan_validation", "grant_shape", "vram", "cache_lock", "sync_groups", "run_outcome")
    },
}


def test_every_registered_check_has_a_firing_test_here():
    for name in CHECKS:
        if name in FIRING_SUITES:
            assert f'["{name}"]' in _text(FIRING_SUITES[name]), name
        elif name in OWN_SUITES:
            assert f'"{name}"' in _text(OWN_SUITES[name]), name
        else:
            assert name.startswith("gate_") or name.startswith("sim_"), (
                f"{name} needs a firing test (here or in its own suite)"
            )


def _text(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()
