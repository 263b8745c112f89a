"""Each invariant fires on a broken trace and stays quiet on a sound one."""

from __future__ import annotations

import copy
import glob
import os

import pytest

from harness.logs.invariants import CHECKS, check_log
from harness.logs.replay import replay_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TRACES = sorted(glob.glob(os.path.join(ROOT, "examples", "traces", "*.jsonl")))


def decisions(path=None):
    return copy.deepcopy(
        replay_file(path or os.path.join(ROOT, "examples", "traces", "partial_overlap_2gpu.jsonl")).log.records
    )


def reseq(records):
    for i, r in enumerate(records):
        r["seq"] = i
    return records


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


# ---------------------------------------------------------------- pipeline effects


def eff(seq, kind, pid, name, scope="expand", step=None, **args):
    r = {"seq": seq, "t": float(seq), "kind": kind, "pipeline_id": pid, "effect": name, "args": args, "scope": scope}
    if step is not None:
        r["step"] = step
    return r


def expand_trace(*, skip=None, swap=None):
    seq = iter(range(1, 1000))
    names = [
        ("BuildCache", {"version": 3}, "step"),
        ("PromoteCache", {"version": 3}, "step"),
        ("Wake", {"ranks": [1]}, "expand"),
        ("SyncFromCache", {"ranks": [1], "version": 3, "path": "expand"}, "expand"),
        ("Finalize", {"ranks": [1]}, "expand"),
        ("PublishVersion", {"version": 3, "path": "expand"}, "expand"),
        ("Activate", {"ranks": [1]}, "expand"),
    ]
    names = [n for n in names if n[0] != skip]
    if swap:
        a, b = [i for i, n in enumerate(names) if n[0] in swap]
        names[a], names[b] = names[b], names[a]
    out = []
    for name, args, scope in names:
        out.append(eff(next(seq), "effect_start", "p", name, scope, **args))
        out.append(eff(next(seq), "effect_end", "p", name, scope, **args))
    return out


def test_sound_expand_sequence_passes():
    assert check_log(expand_trace()) == []


@pytest.mark.parametrize(
    "skip,expected",
    [("SyncFromCache", "without a sync"), ("Finalize", "before finalize"), ("PublishVersion", "while published is")],
)
def test_activate_after_sync_fires_when_a_step_is_missing(skip, expected):
    found = check_log(expand_trace(skip=skip), ["activate_after_sync"])
    assert found and expected in found[0].message


def test_versions_fire_on_publish_before_sync():
    found = check_log(expand_trace(swap=("SyncFromCache", "PublishVersion")), ["versions"])
    assert found and "before the sync" in found[0].message


def test_versions_fire_on_publish_before_the_receiver_applied_it():
    # RLinf #1456: the sync acknowledged, the version published, the finalize (the apply) after it
    found = check_log(expand_trace(swap=("Finalize", "PublishVersion")), ["versions"])
    assert [v.message for v in found] == [
        "p: publishes version 3 before dp [1] applied it (its sync at seq 7 was acknowledged; "
        "those ranks had not finalized it)"
    ]
    # a failed finalize applies nothing either; a failed sync loaded nothing to apply
    recs = expand_trace()
    fin_end = next(r for r in recs if r["effect"] == "Finalize" and r["kind"] == "effect_end")
    fin_end["error"] = "finalize_weight_update failed"
    assert [v.seq for v in check_log(recs, ["versions"])] == [11]
    recs = expand_trace(skip="Finalize")
    next(r for r in recs if r["effect"] == "SyncFromCache" and r["kind"] == "effect_end")["error"] = "timeout"
    assert not [v for v in check_log(recs, ["versions"]) if "applied" in v.message]


def test_versions_fire_on_version_going_back_and_unbuilt_publish():
    recs = expand_trace()
    recs += [eff(100, "effect_end", "p", "BuildCache", "step", version=2)]
    recs += [eff(101, "effect_end", "p", "PromoteCache", "step", version=5)]
    recs += [eff(102, "effect_start", "p", "PublishVersion", "step", version=7, path="active")]
    msgs = [v.message for v in check_log(recs, ["versions"])]
    assert any("built after" in m for m in msgs) and any("latest built is 2" in m for m in msgs)
    assert any("active cache is 5" in m for m in msgs)


def test_release_after_publish_fires_when_train_released_early():
    recs = [
        eff(1, "effect_end", "p", "BuildCache", "step", 0, version=1),
        eff(2, "effect_start", "p", "ReleaseGpus", "step", 0, cluster="actor_train", global_step=0),
        eff(3, "effect_start", "p", "PublishVersion", "step", 0, version=1, path="active"),
        eff(4, "effect_end", "p", "PublishVersion", "step", 0, version=1, path="active"),
    ]
    found = check_log(recs, ["release_after_publish"])
    assert found and "before active refresh" in found[0].message
    good = [recs[0], recs[2], recs[3], recs[1]]
    assert check_log(reseq(good), ["release_after_publish"]) == []


def test_step_order_fires_when_next_step_starts_early():
    recs = [
        eff(1, "effect_start", "p", "Compute", "step", 0, what="train", global_step=0),
        eff(2, "effect_start", "p", "WaitBatch", "step", 1, global_step=1),
        eff(3, "effect_end", "p", "Compute", "step", 0, what="train", global_step=0),
    ]
    found = check_log(recs, ["step_order"])
    assert found and "unfinished" in found[0].message


def test_data_plane_fires_on_driver_bulk_and_second_writer():
    """More cases, on logs written by real clients: tests/dataplane/test_invariant_dataplane.py."""
    hop = lambda seq, actor, role, hop, n: {
        "seq": seq,
        "t": seq,
        "kind": "dp_transfer",
        "actor": actor,
        "role": role,  # noqa: E731
        "partition": "p",
        "hop": hop,
        "samples": ["a"],
        "fields": ["x"],
        "bytes": n,
    }
    recs = [
        hop(1, "rollout", "producer", "producer_to_store", 8),
        hop(2, "driver", "driver", "driver_meta", 90),
        hop(3, "driver", "driver", "store_to_driver", 8),
        hop(4, "dp0/tp1", "worker", "worker_to_store", 8),
    ]
    found = check_log(recs, ["data_plane"])
    assert [v.seq for v in found] == [3, 4] and "driver held bulk" in found[0].message and "-601" in found[1].message
    assert check_log(recs[:2], ["data_plane"]) == []


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
    here = open(__file__).read()
    for name in CHECKS:
        if name in (
            "gpu_ownership",
            "resize_order",
            "no_readd_in_cycle",
            "activate_after_sync",
            "versions",
            "release_after_publish",
            "step_order",
            "routing",
            "stale_serving",
            "planned_release_ack",
            "liveness",
            "data_plane",
            "routing_policy",
            "handover",
            "gpu_tenancy",
        ):
            assert f'["{name}"]' in here, name
        elif name in OWN_SUITES:
            assert f'"{name}"' in open(os.path.join(ROOT, OWN_SUITES[name])).read(), name
        else:
            assert name.startswith("gate_") or name.startswith("sim_"), (
                f"{name} needs a firing test (here or in its own suite)"
            )


def routing_trace():
    rs = lambda seq, st, v=3: {
        "seq": seq,
        "t": seq,
        "kind": "rank_state",
        "pipeline_id": "p",
        "dp_rank": 0,
        "state": st,
        "gpus": [0],
        "version": v,
    }
    d = lambda seq, req, v=3: {
        "seq": seq,
        "t": seq,
        "kind": "request_dispatch",
        "pipeline_id": "p",
        "request": req,
        "dp_rank": 0,
        "version": v,
    }
    done = lambda seq, req: {
        "seq": seq,
        "t": seq,
        "kind": "request_done",
        "pipeline_id": "p",
        "request": req,
        "dp_rank": 0,
        "tokens": 5,
    }
    ab = lambda seq, req: {
        "seq": seq,
        "t": seq,
        "kind": "request_abort",
        "pipeline_id": "p",
        "request": req,
        "dp_rank": 0,
    }
    return rs, d, done, ab


def test_routing_sound_trace_with_abort_and_redispatch_passes():
    rs, d, done, ab = routing_trace()
    recs = [rs(1, "routable"), d(2, 7), ab(3, 7), rs(4, "draining"), rs(5, "routable"), d(6, 7), done(7, 7)]
    assert check_log(recs, ["routing"]) == []


@pytest.mark.parametrize(
    "case,expected",
    [
        ("not_routable", "in state draining"),
        ("no_weights", "holds no weights"),
        ("twice_done", "completed twice"),
        ("twice_dispatch", "dispatched twice"),
    ],
)
def test_routing_fires(case, expected):
    rs, d, done, ab = routing_trace()
    recs = {
        "not_routable": [rs(1, "draining"), d(2, 1)],
        "no_weights": [rs(1, "routable", None), d(2, 1, None)],
        "twice_done": [rs(1, "routable"), d(2, 1), done(3, 1), done(4, 1)],
        "twice_dispatch": [rs(1, "routable"), d(2, 1), d(3, 1)],
    }[case]
    found = check_log(recs, ["routing"])
    assert found and any(expected in v.message for v in found)


def test_stale_serving_fires_outside_an_active_refresh_only():
    rs, d, done, ab = routing_trace()
    pub = {
        "seq": 2,
        "t": 2,
        "kind": "effect_end",
        "pipeline_id": "p",
        "effect": "PublishVersion",
        "args": {"version": 4, "path": "expand"},
        "scope": "expand",
        "result": 4,
    }
    recs = [rs(1, "routable", 3), pub, d(3, 1, 3)]
    found = check_log(reseq(recs), ["stale_serving"])
    assert found and "serves version 3 while version 4 is published" in found[0].message
    sync = lambda kind: {
        "seq": 0,
        "t": 0,
        "kind": kind,
        "pipeline_id": "p",
        "effect": "SyncFromCache",
        "args": {"ranks": [0], "version": 4, "path": "active"},
        "scope": "step",
    }
    in_flight = [rs(1, "routable", 3), pub, sync("effect_start"), d(3, 1, 3), sync("effect_end")]
    assert check_log(reseq(in_flight), ["stale_serving"]) == []


def test_stale_serving_flags_a_roll_rank_serving_the_base_version_after_version_0():
    """ROLL's base version is -1 and its first trained version 0: no NeMo clamp."""
    rs, d, done, ab = routing_trace()
    pub = lambda seq, v: {
        "seq": seq,
        "t": seq,
        "kind": "effect_end",
        "pipeline_id": "p",
        "effect": "PublishVersion",
        "args": {"version": v, "path": "expand"},
        "scope": "expand",
        "result": v,
    }
    recs = [pub(1, -1), rs(2, "routable", -1), d(3, 1, -1), pub(4, 0), d(5, 2, -1)]
    found = check_log(reseq(recs), ["stale_serving"])
    assert [v.seq for v in found] == [4] and "serves version -1 while version 0 is published" in found[0].message


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


# ---------------------------------------------------------------- the new catalogue checks, on small logs

HEAD = {
    "seq": 0,
    "t": 0,
    "kind": "header",
    "schema": "rlharness.eventlog",
    "version": 1,
    "cluster": {"nodes": 1, "gpus_per_node": 4, "vram_gib": 1.0},
    "meta": {"post_sleep_threshold_bytes": 100},
}
REG = {
    "seq": 1,
    "t": 0,
    "kind": "register",
    "pipeline_id": "p",
    "cluster_tp_configs": {"actor_train": 1, "actor_infer": 2},
    "cluster_device_mappings": {"actor_train": [0, 1], "actor_infer": [0, 1, 2, 3]},
}


def plan(seq, cycle, shrinks=(), signals=(), expands=()):
    return {
        "seq": seq,
        "t": seq,
        "kind": "plan",
        "cycle": cycle,
        "shrinks": list(shrinks),
        "signals": list(signals),
        "expands": list(expands),
    }


def commit(seq, cycle, idle):
    return {"seq": seq, "t": seq, "kind": "commit", "cycle": cycle, "idle_gpus": idle, "skipped_stale": []}


def test_plan_validation_and_grant_shape_pass_a_sound_plan_sequence():
    recs = [
        HEAD,
        REG,
        plan(2, 1, signals=[{"cluster_id": "p_actor_train", "priority": "ACTOR_TRAINING", "gpus": [0, 1]}]),
        commit(3, 1, 2),
        plan(
            4,
            2,
            expands=[
                {
                    "cluster_id": "p_actor_infer",
                    "has_pending_request": True,
                    "bundles": [{"dp_rank": 1, "gpus": [2, 3]}],
                }
            ],
        ),
        commit(5, 2, 0),
    ]
    assert check_log(recs) == []


@pytest.mark.parametrize(
    "bad,condition",
    [
        (
            plan(
                4,
                2,
                expands=[
                    {
                        "cluster_id": "p_actor_infer",
                        "has_pending_request": True,
                        "bundles": [{"dp_rank": 0, "gpus": [0, 1]}],
                    }
                ],
            ),
            4,
        ),
        (
            plan(
                4,
                2,
                expands=[
                    {
                        "cluster_id": "p_actor_infer",
                        "has_pending_request": True,
                        "bundles": [{"dp_rank": 1, "gpus": [2]}],
                    }
                ],
            ),
            6,
        ),
        (
            plan(
                4,
                2,
                expands=[
                    {
                        "cluster_id": "p_actor_infer",
                        "has_pending_request": True,
                        "bundles": [{"dp_rank": 2, "gpus": [2, 3]}],
                    }
                ],
            ),
            7,
        ),
        (plan(4, 2, shrinks=[{"cluster_id": "p_actor_train", "bundles": [{"dp_rank": 0, "gpus": [0]}]}]), 2),
        (plan(4, 2, shrinks=[{"cluster_id": "p_actor_infer", "bundles": [{"dp_rank": 0, "gpus": [0, 1]}]}]), 11),
        (plan(4, 2, signals=[{"cluster_id": "p_actor_infer", "priority": "INITIALIZATION", "gpus": [2, 3, 5]}]), 8),
    ],
)
def test_plan_validation_names_the_condition(bad, condition):
    recs = [
        HEAD,
        REG,
        plan(2, 1, signals=[{"cluster_id": "p_actor_train", "priority": "ACTOR_TRAINING", "gpus": [0, 1]}]),
        commit(3, 1, 2),
        bad,
    ]
    found = check_log(recs, ["plan_validation"])
    assert any(f"condition {condition}:" in v.message for v in found), [v.message for v in found]


def test_grant_shape_wants_whole_mappings_and_whole_bundles():
    recs = [
        HEAD,
        REG,
        plan(2, 1, signals=[{"cluster_id": "p_actor_train", "priority": "ACTOR_TRAINING", "gpus": [0]}]),
        plan(
            3,
            2,
            expands=[
                {
                    "cluster_id": "p_actor_infer",
                    "has_pending_request": True,
                    "bundles": [{"dp_rank": 1, "gpus": [1, 2]}],
                }
            ],
        ),
    ]
    msgs = [v.message for v in check_log(recs, ["grant_shape"])]
    assert any("not its whole device mapping [0, 1]" in m for m in msgs) and any(
        "its TP bundle is [2, 3]" in m for m in msgs
    )


def vram(seq, gpu, owner, mem, delta, used):
    return {"seq": seq, "t": seq, "kind": "vram", "gpu": gpu, "owner": owner, "mem": mem, "delta": delta, "used": used}


def test_vram_capacity_residue_and_ledger_consistency():
    cap = 1 << 30
    asleep = {"seq": 4, "t": 4, "kind": "rank_state", "pipeline_id": "p", "dp_rank": 0, "state": "asleep", "gpus": [0]}
    ok = [
        HEAD,
        vram(1, 0, "p/dp0", "weights", 500, 500),
        vram(2, 0, "p/dp0", "kv_cache", 600, 1100),
        vram(3, 0, "p/dp0", "kv_cache", -600, 500),
        vram(4, 0, "p/dp0", "weights", -450, 50),
        dict(asleep, seq=5),
    ]
    assert check_log(ok, ["vram"]) == []
    over = [HEAD, vram(1, 0, "p/train", "train_state", cap + 1, cap + 1)]
    assert "above its capacity" in check_log(over, ["vram"])[0].message
    residue = [HEAD, vram(1, 0, "p/dp0", "nccl", 500, 500), dict(asleep, seq=2)]
    assert "above the post-sleep threshold 100 B" in check_log(residue, ["vram"])[0].message
    lying = [HEAD, vram(1, 0, "p/dp0", "weights", 500, 400)]
    assert "reports 400 B in use" in check_log(lying, ["vram"])[0].message


def test_sync_groups_on_gate_records():
    g = lambda seq, kind, rank, name, members, purpose="sync": {
        "seq": seq,
        "t": seq,
        "kind": kind,
        "rank": rank,
        "name": name,
        "members": members,
        **({"purpose": purpose} if kind == "group_create" else {}),
    }
    start = {
        "seq": 1,
        "t": 1,
        "kind": "gate_start",
        "rank": 0,
        "gate": "x",
        "backend": "gloo",
        "world_size": 3,
        "cycles": 1,
        "device": "cpu",
    }
    ok = [
        start,
        g(2, "group_create", 0, "a", [0, 2]),
        g(3, "group_destroy", 0, "a", [0, 2]),
        {"seq": 4, "t": 4, "kind": "sync_end", "rank": 0, "version": 1, "ok": True},
    ]
    assert check_log(ok, ["sync_groups"]) == []
    world = [start, g(2, "group_create", 0, "a", [0, 1, 2]), g(3, "group_destroy", 0, "a", [0, 1, 2])]
    assert "not a proper subset" in check_log(world, ["sync_groups"])[0].message
    leaked = [
        start,
        g(2, "group_create", 0, "a", [0, 2]),
        {"seq": 3, "t": 3, "kind": "sync_end", "rank": 0, "version": 1, "ok": True},
    ]
    msgs = [v.message for v in check_log(leaked, ["sync_groups"])]
    assert len(msgs) == 1 and "still alive" in msgs[0]  # stranded by the sync: reported once, not again as a leak
    never_ended = leaked[:2]
    assert ["leaked" in v.message for v in check_log(never_ended, ["sync_groups"])] == [True]
    training = [start, g(2, "group_create", 0, "t", [0], purpose="training")]  # not a sync group
    assert check_log(training, ["sync_groups"]) == []


def test_cache_lock_on_gate_records():
    # a gate's rank log: the holds name no pipeline, so the owner is the rank that wrote them
    hold = lambda seq, action, holder, v: {
        "seq": seq,
        "t": seq,
        "kind": "cache_lock",
        "rank": 0,
        "action": action,
        "holder": holder,
        "version": v,
    }
    overlapping = [
        hold(1, "acquire", "sync", 1),
        hold(2, "acquire", "build", 2),
        hold(3, "release", "build", 2),
        hold(4, "release", "sync", 1),
    ]
    found = check_log(overlapping, ["cache_lock"])
    assert len(found) == 1
    assert "rank 0: cache build of v2 (seq 2..3) while the sync of v1 (seq 1..4) reads" in found[0].message
    in_turn = [
        hold(1, "acquire", "sync", 1),
        hold(2, "release", "sync", 1),
        hold(3, "acquire", "build", 2),
        hold(4, "release", "build", 2),
    ]
    assert check_log(in_turn, ["cache_lock"]) == []
    other_rank = [dict(r, rank=5) if r["holder"] == "build" else r for r in overlapping]
    assert check_log(other_rank, ["cache_lock"]) == []  # another owner's cache


def test_cache_lock_treats_an_unlocked_build_as_holding_the_cache_for_its_whole_effect():
    e = lambda seq, kind, name, **args: {
        "seq": seq,
        "t": seq,
        "kind": kind,
        "pipeline_id": "p",
        "effect": name,
        "args": args,
        "scope": "step",
    }
    recs = [
        e(1, "effect_start", "SyncFromCache", ranks=[1], version=1, path="expand"),
        e(2, "effect_start", "BuildCache", version=2),
        e(3, "effect_end", "BuildCache", version=2),
        e(4, "effect_end", "SyncFromCache", ranks=[1], version=1, path="expand"),
    ]
    found = check_log(recs, ["cache_lock"])
    assert found and "without the cache lock" in found[0].message


def test_cache_lock_does_not_judge_a_build_the_log_ends_inside():
    # a build that failed before it took the lock (the run ended inside it: its parameters
    # were gone) never wrote the cache; a build that ended without a hold of its own did
    e = lambda seq, kind, name, **args: {
        "seq": seq,
        "t": seq,
        "kind": kind,
        "pipeline_id": "p",
        "effect": name,
        "args": args,
        "scope": "step",
    }
    sync_open = [
        e(1, "effect_start", "SyncFromCache", ranks=[1], version=1, path="expand"),
        {
            "seq": 2,
            "t": 2,
            "kind": "cache_lock",
            "pipeline_id": "p",
            "action": "acquire",
            "holder": "sync",
            "version": 1,
        },
    ]
    cut_off = sync_open + [
        e(3, "effect_start", "BuildCache", version=2),
        {"seq": 4, "t": 4, "kind": "sim_end", "reason": "failed", "sim_time": 4, "events": 4, "detail": "x"},
    ]
    assert check_log(cut_off, ["cache_lock"]) == []
    ended = sync_open + [e(3, "effect_start", "BuildCache", version=2), e(4, "effect_end", "BuildCache", version=2)]
    assert "without the cache lock" in check_log(ended, ["cache_lock"])[0].message


def policy_trace(dispatch_ranks, activate_between=False):
    """A pipeline with 4 inference ranks (tp 1); one Activate of all four, then dispatches."""
    reg = {
        "seq": 1,
        "t": 0,
        "kind": "register",
        "pipeline_id": "p",
        "cluster_tp_configs": {"actor_train": 1, "actor_infer": 1},
        "cluster_device_mappings": {"actor_train": [0], "actor_infer": [0, 1, 2, 3]},
    }
    act = lambda seq, k: {
        "seq": seq,
        "t": 1,
        "kind": k,
        "pipeline_id": "p",
        "effect": "Activate",
        "args": {"ranks": [0, 1, 2, 3]},
        "scope": "expand",
    }
    rs = lambda seq, dp: {
        "seq": seq,
        "t": 1,
        "kind": "rank_state",
        "pipeline_id": "p",
        "dp_rank": dp,
        "state": "routable",
        "gpus": [dp],
        "version": 0,
    }
    d = lambda seq, req, dp: {
        "seq": seq,
        "t": 1,
        "kind": "request_dispatch",
        "pipeline_id": "p",
        "request": req,
        "dp_rank": dp,
        "version": 0,
    }
    recs, seq = [reg, act(2, "effect_start")], 3
    if activate_between:  # rank 0 routable, a dispatch, then the others (one at a time)
        recs.append(rs(seq, 0))
        seq += 1
        recs.append(d(seq, 100, 0))
        seq += 1
        for dp in (1, 2, 3):
            recs.append(rs(seq, dp))
            seq += 1
    else:
        for dp in range(4):
            recs.append(rs(seq, dp))
            seq += 1
    recs.append(act(seq, "effect_end"))
    seq += 1
    for i, dp in enumerate(dispatch_ranks):
        recs.append(d(seq, i, dp))
        seq += 1
    return recs


def test_routing_policy_passes_round_robin_over_a_set_activated_together():
    assert check_log(policy_trace([0, 1, 2, 3, 0, 1]), ["routing_policy"]) == []


def test_routing_policy_fires_when_a_queue_goes_to_one_rank_of_a_fresh_set():
    found = check_log(policy_trace([0, 0, 0, 0, 0, 0]), ["routing_policy"])
    assert len(found) == 1 and "sends it to dp1" in found[0].message and "5 dispatches" in found[0].message


def test_routing_policy_fires_when_ranks_of_one_activate_join_one_at_a_time():
    found = check_log(policy_trace([1, 2, 3, 0], activate_between=True), ["routing_policy"])
    assert found and "join routing one at a time" in found[0].message and "only [0] routable" in found[0].message


def test_routing_policy_skips_ranks_not_routable_from_the_cursor():
    recs = policy_trace([])
    recs = [r for r in recs if not (r["kind"] == "rank_state" and r["dp_rank"] in (0, 2))]
    d = lambda seq, req, dp: {
        "seq": seq,
        "t": 2,
        "kind": "request_dispatch",
        "pipeline_id": "p",
        "request": req,
        "dp_rank": dp,
        "version": 0,
    }
    ok = recs + [d(20, 1, 1), d(21, 2, 3), d(22, 3, 1)]  # NeMo's unit test: {1, 3} active -> 1, 3, 1
    assert check_log(ok, ["routing_policy"]) == []
    assert check_log(recs + [d(20, 1, 1), d(21, 2, 1)], ["routing_policy"])


def handover_trace(residue_kind, residue_owner, nbytes, granted_to="q_actor_train"):
    """p's memory on GPU 0, then GPU 0 is granted to another cluster."""
    v = lambda seq, owner, mem, delta, phase=None: dict(
        {"seq": seq, "t": seq, "kind": "vram", "gpu": 0, "owner": owner, "mem": mem, "delta": delta, "used": 0},
        **({"phase": phase} if phase else {}),
    )
    return [
        {
            "seq": 1,
            "t": 1,
            "kind": "signalled",
            "request_id": 1,
            "waiter": "request",
            "cluster_id": "p_actor_train",
            "priority": "OLD_LOG_PROBS",
            "gpus": [0],
            "cycle": 1,
            "error": None,
        },
        v(2, "p/ctx", "cuda_context", 500),
        v(3, residue_owner, residue_kind, nbytes, "old_log_probs"),
        {"seq": 4, "t": 4, "kind": "released", "cluster_id": "p_actor_train", "gpus": [0], "reason": "release"},
        {
            "seq": 5,
            "t": 5,
            "kind": "signalled",
            "request_id": 2,
            "waiter": "request",
            "cluster_id": granted_to,
            "priority": "ACTOR_TRAINING",
            "gpus": [0],
            "cycle": 2,
            "error": None,
        },
    ]


def test_handover_names_gpu_clusters_bytes_phase_and_the_grant():
    found = check_log(handover_trace("params", "p/train", 1000), ["handover"])
    assert len(found) == 1 and found[0].seq == 5
    assert found[0].message == (
        "GPU 0 granted to q_actor_train (signalled seq 5) still holds p_actor_train's params 1000 B "
        "(1000 B > residue 0 B), left by phase old_log_probs"
    )


def test_handover_allows_contexts_documented_residue_and_the_same_cluster():
    assert check_log(handover_trace("nccl", "p/dp0", 512 << 20), ["handover"]) == []  # <= 1 GiB after sleep
    assert check_log(handover_trace("params", "p/train", 1000, granted_to="p_actor_train"), ["handover"]) == []
    assert check_log(handover_trace("kv_cache", "p/dp0", 2 << 30), ["handover"])  # above the post-sleep threshold


def test_gpu_tenancy_fires_on_an_allocation_where_the_cluster_holds_nothing():
    reg = lambda pid: {
        "seq": 0,
        "t": 0,
        "kind": "register",
        "pipeline_id": pid,
        "cluster_tp_configs": {"actor_train": 1},
        "cluster_device_mappings": {"actor_train": [0]},
    }
    recs = [reg("p"), reg("q")] + handover_trace("params", "p/train", 1000)
    late = dict(recs[4], seq=6, t=6)  # p loads again after it released GPU 0 (now q's)
    found = check_log(recs + [late], ["gpu_tenancy"])
    assert (
        len(found) == 1
        and found[0].message == "p_actor_train allocates params on GPU 0, which is held by q_actor_train"
    )
    assert check_log(recs, ["gpu_tenancy"]) == []
    assert check_log(recs[2:] + [late], ["gpu_tenancy"]) == []  # never registered: holds its GPUs outside the scheduler
