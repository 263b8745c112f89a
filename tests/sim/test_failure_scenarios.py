"""Failure modes that bundled scenarios reproduce with a fault (or a scheduler option), and
the check or failure that catches each: OOMs from a wake before the offload, from NCCL
buffers kept on sleep and from a whole-model sync bucket; stale serving from premature
release acks; starvation without the generation watchdog or by a finished pipeline; a
cache built after the offload. The same scenario without the fault runs clean."""

from __future__ import annotations

import dataclasses

from harness.logs.invariants import check_log
from simulators.runtime.simulation import Simulation
from simulators.scenario.spec import CostSpec, FaultSpec
from tests.sim.scenario_runs import effects, run, scenario


def test_oom_detected_when_wake_meets_resident_training_memory():
    res = run("oom_wake_before_offload")
    assert res.reason == "failed" and "OOM on GPU" in res.detail
    oom = [r for r in res.records if r["kind"] == "oom"]
    assert len(oom) == 1 and oom[0]["mem"] in ("kv_cache", "weights")
    fired = next(r for r in res.records if r["kind"] == "fault_fired")
    assert fired["name"] == "wake_before_offload" and fired["seq"] < oom[0]["seq"]
    # the leaked training state is still on the GPU that ran out
    train = [
        r
        for r in res.records
        if r["kind"] == "vram" and r["gpu"] == oom[0]["gpu"] and r["mem"] in ("params", "grads", "optimizer")
    ]
    assert sum(r["delta"] for r in train) > 0


def test_without_the_fault_the_same_topology_does_not_oom():
    s = dataclasses.replace(scenario("oom_wake_before_offload"), faults=())
    res = Simulation(s).run()
    assert res.reason == "done" and not [r for r in res.records if r["kind"] == "oom"]


def test_keep_nccl_on_sleep_fails_the_post_sleep_check():
    base = scenario("tp2_broadcast")
    costs = dataclasses.replace(base.costs, post_sleep_threshold_bytes=768 << 20)  # below two kept communicators
    s = dataclasses.replace(base, costs=costs, faults=(FaultSpec("keep_nccl_on_sleep", "ppl1", 0),))
    res = Simulation(s).run()
    assert res.reason == "failed" and "post-sleep VRAM" in res.detail and "dp0" in res.detail
    clean = Simulation(dataclasses.replace(base, costs=costs)).run()
    assert clean.reason == "done"  # the same threshold passes when sleep frees the communicators


def test_nccl_buffers_kept_on_sleep_accumulate_until_training_runs_out_of_memory():
    res = run("nccl_kept_on_sleep")
    assert res.reason == "failed" and "OOM on GPU 0" in res.detail, res.detail
    oom = next(r for r in res.records if r["kind"] == "oom")
    assert (oom["gpu"], oom["owner"]) == (0, "ppl1/train")  # training loading its state next to the leak
    fired = [r for r in res.records if r["kind"] == "fault_fired" and r["name"] == "keep_nccl_on_sleep"]
    assert len(fired) >= 1 and fired[-1]["seq"] < oom["seq"]
    # what the sleeping rank still holds on GPU 0: one set of buffers per sleep that kept them
    leaked = sum(
        r["delta"]
        for r in res.records
        if r["kind"] == "vram" and r["gpu"] == 0 and r["owner"] == "ppl1/dp0" and r["mem"] == "nccl"
    )
    nccl = res.scenario.costs.nccl_buffer_bytes
    assert leaked == len(fired) * nccl
    assert oom["used"] + oom["requested"] > oom["capacity"] >= oom["used"] - leaked + oom["requested"]
    clean = Simulation(dataclasses.replace(res.scenario, faults=())).run()
    assert clean.reason == "done" and check_log(clean.records) == []


def test_stale_serving_disappears_with_exact_planned_releases():
    s = scenario("mixed_64gpu")
    fixed = dataclasses.replace(s, scheduler={**s.scheduler, "ack_unplanned_releases": False})
    res = Simulation(fixed).run()
    # what is left is the other finding of this scenario: NeMo's init keeps its trainers'
    # groups (docs/residency.md), unrelated to planned releases
    assert res.reason == "done" and {v.invariant for v in check_log(res.records)} == {"handover"}


def test_one_shot_generation_starves_without_the_watchdog_and_completes_with_it():
    s = scenario("starve_one_shot_generation")
    res = run("starve_one_shot_generation")
    stuck = [v.message for v in check_log(res.records, ["liveness"])]
    assert res.reason == "horizon" and any("stuck in WaitBatch" in m for m in stuck), stuck
    with_watchdog = dataclasses.replace(s, faults=tuple(f for f in s.faults if f.name != "no_gen_watchdog"))
    res = Simulation(with_watchdog).run()
    assert res.reason == "done" and check_log(res.records) == []
    # the watchdog is what re-requested GENERATION: estimate-1 requests after the first
    gen = [r for r in res.records if r["kind"] == "request" and r["priority"] == "GENERATION"]
    assert len(gen) > 2 and all(r.get("step_target_estimate") == 1 for r in gen)
    assert not [r for r in res.records if r["kind"] == "progress"]  # demand came from requests alone


def test_a_cache_built_after_the_offload_crashes_the_pipeline():
    res = run("cache_built_after_offload")
    assert res.reason == "failed" and "ppl1: cache v2 built after offload" in res.detail, res.detail
    fired = next(r for r in res.records if r["kind"] == "fault_fired")
    assert (fired["name"], fired["pipeline_id"], fired["step"]) == ("cache_after_offload", "ppl1", 1)
    build = [r for r in effects(res.records, "ppl1") if r["effect"] == "BuildCache"]
    assert len(build) == 3 and build[-1]["seq"] < fired["seq"]  # init, step 0, then the failing one
    freed = [
        r
        for r in res.records
        if r["kind"] == "vram"
        and r["owner"] == "ppl1/train"
        and r["mem"] in ("params", "grads", "optimizer")
        and r["seq"] > fired["seq"]
    ]
    assert freed and all(r["delta"] < 0 for r in freed)  # the offload ran before the build read anything
    clean = Simulation(dataclasses.replace(res.scenario, faults=())).run()
    assert clean.reason == "done" and check_log(clean.records) == []


def test_a_whole_model_sync_bucket_runs_out_of_memory_next_to_the_live_kv_cache():
    res = run("whole_model_sync_bucket")
    assert res.reason == "failed" and "OOM on GPU 0" in res.detail, res.detail
    oom = next(r for r in res.records if r["kind"] == "oom")
    weights = res.scenario.pipelines[0].model.weight_bytes
    assert (oom["owner"], oom["mem"], oom["requested"]) == ("ppl1/sync", "staging", weights)
    resident = {}
    for r in res.records:
        if r["kind"] == "vram" and r["gpu"] == oom["gpu"]:
            resident[(r["owner"], r["mem"])] = resident.get((r["owner"], r["mem"]), 0) + r["delta"]
    kv = sum(v for (owner, mem), v in resident.items() if mem == "kv_cache")
    assert kv > 0 and oom["used"] + 2 * CostSpec().bucket_bytes <= oom["capacity"]
    # the default bucket size (two ping-pong buffers of 256 MiB) fits beside the same KV cache
    clean = Simulation(dataclasses.replace(res.scenario, costs=CostSpec())).run()
    assert clean.reason == "done" and check_log(clean.records) == []


def test_a_finished_pipeline_that_keeps_its_gen_ranks_starves_its_tp2_peer():
    res = run("finished_pipeline_keeps_gen")
    stuck = [v.message for v in check_log(res.records, ["liveness"])]
    assert res.reason == "horizon" and any(m.startswith("ppl2 stuck in RequestGpus") for m in stuck), stuck
    assert not any(m.startswith("ppl1") for m in stuck)  # ppl1 itself finished all its steps
    # ppl1 never released nor unregistered, and still holds GEN ranks in both of ppl2's bundles
    assert not [
        r for r in res.records if r.get("pipeline_id") == "ppl1" and r["kind"] in ("await_release", "unregister")
    ]
    last = {r["dp_rank"]: r for r in res.records if r["kind"] == "rank_state" and r["pipeline_id"] == "ppl1"}
    held = {g for r in last.values() if r["state"] == "routable" for g in r["gpus"]}
    assert held & {0, 1} and held & {2, 3}, last  # ppl2's TP=2 bundles are [0, 1] and [2, 3]
    s = scenario("finished_pipeline_keeps_gen")
    clean = Simulation(dataclasses.replace(s, faults=())).run()
    assert clean.reason == "done" and check_log(clean.records) == []
