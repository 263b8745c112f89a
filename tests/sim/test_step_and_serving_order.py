"""Simulator behaviour on bundled scenarios: the step's effect order, the ranks that keep
serving during training and the transport of their refresh, versions published once per
build and in order, and routing only to ranks holding the published version."""

from __future__ import annotations

import dataclasses

from harness.logs.invariants import check_log
from simulators.runtime.simulation import Simulation
from simulators.scenario.spec import FaultSpec, default_scenario
from tests.sim.scenario_runs import effects, run


NEMO_STEP = [
    "WaitBatch",
    "RequestGpus",
    "ReloadTrainComm",
    "Compute",
    "BuildCache",
    "OffloadTraining",
    "DestroyTrainComm",
    "LockCoordinator",
    "PromoteCache",
    "ActiveRanks",
    "PublishVersion",
    "UnlockCoordinator",
    "ReleaseGpus",
    "BeginProgressBatch",
]


def test_default_scenario_completes_with_every_invariant_holding():
    res = run("default")
    assert res.reason == "done", res.detail
    assert check_log(res.records) == []


def test_partial_overlap_step_sequence_order():
    recs = run("tp2_broadcast").records
    for step in range(4):
        names = [r["effect"] for r in effects(recs, "ppl1") if r.get("scope") == "step" and r["step"] == step]
        core = [n for n in names if n not in ("SyncFromCache", "Finalize")]
        assert core == NEMO_STEP, (step, names)
        # the active refresh (sync + finalize of the ranks still serving) sits inside the lock
        i, j = names.index("ActiveRanks"), names.index("PublishVersion")
        assert names[i + 1 : j] == ["SyncFromCache", "Finalize"]
    # the overlap rank is shrunk between the ACTOR_TRAINING request and its grant
    req = next(
        r for r in effects(recs, "ppl1") if r["effect"] == "RequestGpus" and r["args"]["priority"] == "ACTOR_TRAINING"
    )
    grant = next(
        r for r in effects(recs, "ppl1", "effect_end") if r["seq"] > req["seq"] and r["effect"] == "RequestGpus"
    )
    shrinks = [
        r for r in recs if req["seq"] < r["seq"] < grant["seq"] and r["kind"] == "effect_end" and r["effect"] == "Sleep"
    ]
    assert shrinks and shrinks[0]["args"]["ranks"] == [0]


def test_non_overlap_ranks_keep_serving_during_training():
    recs = run("tp2_broadcast").records
    starts = [r for r in effects(recs, "ppl1") if r["effect"] == "Compute"]
    ends = [r for r in effects(recs, "ppl1", "effect_end") if r["effect"] == "Compute"]
    served = 0
    for s, e in zip(starts, ends):
        done = [r for r in recs if s["seq"] < r["seq"] < e["seq"] and r["kind"] == "request_done"]
        assert {r["dp_rank"] for r in done} <= {1}, "only the non-overlap rank may serve while training"
        served += len(done)
    assert served > 0
    # and it gets the active refresh over a cross-GPU broadcast (its GPUs are not the owner's)
    active = bucket_paths(recs, "active")
    assert active == {"broadcast"}
    assert bucket_paths(recs, "expand") == {
        "broadcast",
        "ipc",
    }  # rank 0 = GPU 0 (owner, same-GPU path) + GPU 1 (broadcast)


def bucket_paths(recs, lifecycle_path):
    """The transport paths of the sync buckets inside ppl1's SyncFromCache effects of one
    lifecycle path (expand | active)."""
    out, inside = set(), False
    for r in recs:
        if (
            r["kind"] in ("effect_start", "effect_end")
            and r.get("effect") == "SyncFromCache"
            and r["pipeline_id"] == "ppl1"
        ):
            inside = r["kind"] == "effect_start" and r["args"]["path"] == lifecycle_path
        elif inside and r["kind"] == "sync_bucket" and r.get("pipeline_id") == "ppl1":
            out.add(r["path"])
    return out


def test_no_double_version_bump():
    for name in ("default", "tp2_broadcast", "roll_dual_4gpu"):
        recs = run(name).records
        for pid in {r["pipeline_id"] for r in recs if r["kind"] == "effect_end"}:
            published = [r["result"] for r in effects(recs, pid, "effect_end") if r["effect"] == "PublishVersion"]
            built = [r["args"]["version"] for r in effects(recs, pid, "effect_end") if r["effect"] == "BuildCache"]
            bumps = sum(1 for a, b in zip([None] + published, published) if a is None or b > a)
            assert published == sorted(published), (name, pid, published)
            assert bumps <= len(built), (name, pid, published, built)


def test_expand_never_routes_before_publish():
    for name in ("default", "gap_ratio_3pipelines", "tp2_broadcast", "mixed_64gpu"):
        recs = run(name).records
        assert check_log(recs, ["activate_after_sync", "routing"]) == [], name
        # a rank becomes routable only holding the version its pipeline has just published
        # (a routable rank refreshed in flight publishes after its sync: not an activation)
        last_pub, state = {}, {}
        for r in recs:
            if r["kind"] == "effect_end" and r["effect"] == "PublishVersion":
                last_pub[r["pipeline_id"]] = r["result"]
            elif r["kind"] == "rank_state":
                key = (r["pipeline_id"], r["dp_rank"])
                if r["state"] == "routable" and state.get(key) != "routable":
                    published = last_pub.get(r["pipeline_id"])
                    assert published in (r["version"], max(r["version"], 0)), (name, r, published)
                state[key] = r["state"]


def test_level2_rank_never_serves_before_a_sync():
    base = default_scenario()
    s = dataclasses.replace(base, faults=(FaultSpec("skip_sync_on_expand", "ppl1", 1),))
    res = Simulation(s).run()
    assert res.reason == "failed"
    assert "finalized" in res.detail and "ppl1 dp" in res.detail  # refused by the rank lifecycle
    fired = [r for r in res.records if r["kind"] == "fault_fired"]
    assert fired and fired[0]["name"] == "skip_sync_on_expand"
    # no request was ever served by a rank without weights
    assert check_log(res.records, ["routing"]) == []
