"""The RLix x ROLL handover hazard and its two fixes, end to end (examples/scenarios/
handover_*.yaml), the per-phase residency they rest on (harness/control/residency.py,
docs/residency.md), and mutations of real logs that the ``handover`` and ``gpu_tenancy``
checks must catch."""

from __future__ import annotations

import copy
import os

from harness.control.residency import residency_markdown
from harness.logs.invariants import check_log
from harness.logs.outputs.summary import summarize
from harness.logs.outputs.summary_text import format_summary
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CACHE = {}


def run(name):
    if name not in _CACHE:
        _CACHE[name] = Simulation(load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))).run()
    return _CACHE[name]


def mean_step(res, pid):
    return next(p.mean_step_s for p in summarize(res.records).pipelines if p.pipeline_id == pid)


def test_the_docs_table_is_the_residency_module():
    with open(os.path.join(ROOT, "docs", "residency.md")) as f:
        assert residency_markdown() in f.read()


def test_old_log_probs_charges_the_parameters_only():
    res = run("handover_old_log_probs_fits")
    kinds = {r["mem"] for r in res.records if r["kind"] == "vram" and r.get("phase") == "old_log_probs"}
    assert kinds == {"params", "nccl"}  # nccl: ROLL reloads the process groups (offload_nccl)
    loads = [r for r in res.records if r["kind"] == "vram" and r["owner"] == "roll/train" and r["delta"] > 0]
    assert {r["mem"] for r in loads if r.get("phase") == "train"} == {"grads", "optimizer"}


def test_a_the_hazard_where_the_bytes_fit_is_seen_by_handover_only():
    res = run("handover_old_log_probs_fits")
    assert res.reason == "done" and not [r for r in res.records if r["kind"] == "oom"]
    found = check_log(res.records)
    assert {v.invariant for v in found} == {"handover"}
    msg = found[0].message
    assert msg.startswith("GPU 1 granted to nemo_actor_train (signalled seq")
    assert "roll_actor_train's nccl 536870912 B, params 500000000 B" in msg and msg.endswith(
        "left by phase old_log_probs"
    )


def test_b_where_the_bytes_do_not_fit_the_summary_says_the_handover_came_first():
    res = run("handover_old_log_probs_oom")
    assert res.reason == "failed"
    oom = next(r for r in res.records if r["kind"] == "oom")
    found = check_log(res.records, ["handover"])
    assert found and found[0].seq < oom["seq"] and "left by phase old_log_probs" in found[0].message
    text = format_summary(summarize(res.records))
    assert f"came before the first OOM (t={oom['t']:.3f} s, seq {oom['seq']}, GPU 1)" in text


def test_c_offloading_before_release_then_request_is_clean_and_costs_step_time():
    res = run("handover_fix_offload")
    assert res.reason == "done" and check_log(res.records) == []
    assert mean_step(res, "roll") > mean_step(run("handover_old_log_probs_fits"), "roll")


def test_d_reserving_the_released_gpus_is_clean_and_makes_the_peer_wait():
    res = run("handover_fix_reserve")
    assert res.reason == "done" and check_log(res.records) == []
    assert res.records[0]["scheduler"]["reserve_same_cluster_release"] is True
    assert mean_step(res, "nemo") > mean_step(run("handover_old_log_probs_fits"), "nemo")


def test_handover_fires_when_a_clean_log_loses_an_offload():
    """Mutation: drop the frees of roll's parameters after its OLD_LOG_PROBS offload."""
    records = copy.deepcopy(run("handover_fix_offload").records)
    assert check_log(records, ["handover"]) == []
    olp = {
        r["seq"]
        for r in records
        if r["kind"] == "effect_end" and r["effect"] == "Compute" and r["args"]["what"] == "old_log_probs"
    }
    first_end = min(olp)
    mutated = [
        r
        for r in records
        if not (
            r["kind"] == "vram"
            and r["owner"] == "roll/train"
            and r["delta"] < 0
            and r["seq"] < first_end
            and r["t"] > 0
        )
    ]
    found = check_log(mutated, ["handover"])
    assert found and "roll_actor_train's" in found[0].message


def test_gpu_tenancy_fires_when_a_trainer_allocates_on_a_gpu_it_does_not_hold():
    """Mutation: a training load of nemo moved onto GPU 0, which roll holds then."""
    records = copy.deepcopy(run("handover_fix_offload").records)
    assert check_log(records, ["gpu_tenancy"]) == []
    load = next(
        r
        for r in records
        if r["kind"] == "vram" and r["owner"] == "nemo/train" and r["mem"] == "params" and r["delta"] > 0 and r["t"] > 0
    )
    load["gpu"] = 0
    found = check_log(records, ["gpu_tenancy"])
    assert found and found[0].message.startswith("nemo_actor_train allocates params on GPU 0")


def test_gpu_tenancy_fires_when_a_rank_serves_or_a_trainer_runs_on_a_gpu_its_cluster_does_not_hold():
    """Mutations: the GPUs of a routable nemo rank, then those of a training Compute, moved
    to GPU 99, which nobody holds (each reported once, however many records follow)."""
    clean = run("handover_fix_offload").records
    records = copy.deepcopy(clean)
    dispatch = next(r for r in records if r["kind"] == "request_dispatch" and r["pipeline_id"] == "nemo")
    state = [
        r
        for r in records
        if r["kind"] == "rank_state"
        and r["seq"] < dispatch["seq"]
        and (r["pipeline_id"], r["dp_rank"]) == ("nemo", dispatch["dp_rank"])
    ][-1]
    state["gpus"] = [99]
    found = check_log(records, ["gpu_tenancy"])
    assert found and found[0].seq == dispatch["seq"], found
    assert found[0].message == "nemo_actor_infer serves a request on GPU 99, which nobody holds"
    assert len([v for v in found if "serves a request on GPU 99" in v.message]) == 1

    records = copy.deepcopy(clean)
    compute = next(
        r
        for r in records
        if r["kind"] == "effect_start" and r["pipeline_id"] == "nemo" and r["effect"] == "Compute" and r.get("gpus")
    )
    compute["gpus"] = [99]
    found = check_log(records, ["gpu_tenancy"])
    assert [v.message for v in found] == ["nemo_actor_train runs Compute on GPU 99, which nobody holds"]
