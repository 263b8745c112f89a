"""The oracle's checks grant_order, in_flight_at_sleep, sync_targets, rank_lifecycle,
host_ram, ungrantable_preemption and idle_bundle_starvation, the NeMo trajectory age bound and the
data plane's byte-derived metadata rule: each fires, alone, on a log broken in exactly its
way (the default scenario's log, or a small hand-written one), and on a run of the
simulator where the modelled system really does it (a bundled scenario or a fault hook).
"""

from __future__ import annotations

import copy
import dataclasses
import os

import pytest

from harness.logs.invariants import check_log
from tests.unit.test_mutations import holdings_at, index, inject_cycle, reseq, sim_log  # noqa: F401 (a fixture)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def fires(log, name, text):
    found = check_log(reseq(log))
    assert {v.invariant for v in found} == {name}, [str(v) for v in found][:5]
    assert any(text in v.message for v in found), [v.message for v in found][:5]
    return found


def _first_grant_plan(log, cluster):
    """Index of the first plan granting ``cluster`` at ACTOR_TRAINING, and that plan."""
    i = index(
        log,
        lambda r: (
            r["kind"] == "plan"
            and any(s["cluster_id"] == cluster and s["priority"] == "ACTOR_TRAINING" for s in r["signals"])
        ),
    )
    return i, log[i]


def _pending(log, at, rid, cluster, cancel_after):
    """An ``enqueued`` request inserted before ``log[at]``, errored after ``log[cancel_after]``
    (so no waiter is left behind)."""
    t = log[at]["t"]
    log.insert(
        cancel_after + 1,
        {
            "seq": 0,
            "t": log[cancel_after]["t"],
            "kind": "signalled",
            "request_id": rid,
            "waiter": "request",
            "cluster_id": cluster,
            "priority": "ACTOR_TRAINING",
            "gpus": [],
            "cycle": None,
            "error": "cancelled by the test",
        },
    )
    log.insert(
        at,
        {"seq": 0, "t": t, "kind": "enqueued", "request_id": rid, "cluster_id": cluster, "priority": "ACTOR_TRAINING"},
    )
    return log


# ---------------------------------------------------------------- crafted logs


def test_grant_order_fires_when_a_later_request_overtakes_a_grantable_one(sim_log):
    """Cycle 15 grants ppl1's training [0]; ppl2's training (GPU 1, held only by
    GENERATION) enqueued just before it in the same tier was grantable and is passed over."""
    log = copy.deepcopy(sim_log)
    i, plan = _first_grant_plan(log, "ppl1_actor_train")
    assert "ppl2_actor_train" not in holdings_at(log, i).priority
    enq = max(j for j in range(i) if log[j]["kind"] == "enqueued" and log[j]["cluster_id"] == "ppl1_actor_train")
    commit = index(log, lambda r: r["kind"] == "commit" and r["cycle"] == plan["cycle"], i)
    fires(
        _pending(log, enq, 9999, "ppl2_actor_train", commit), "grant_order", "passing over the earlier ppl2_actor_train"
    )


def test_grant_order_reads_head_of_line_blocking_from_the_header(sim_log):
    """With ``head_of_line_blocking`` in the header, a grant after an earlier request that
    could not be granted (its GPU held by training) breaks the order; without it, the same
    log is clean (RLix skips the blocked request)."""
    log = copy.deepcopy(sim_log)
    i, plan = _first_grant_plan(log, "ppl2_actor_train")
    assert holdings_at(log, i).owner[0] == "ppl1_actor_train"  # ppl1's training holds GPU 0
    enq = max(j for j in range(i) if log[j]["kind"] == "enqueued" and log[j]["cluster_id"] == "ppl2_actor_train")
    commit = index(log, lambda r: r["kind"] == "commit" and r["cycle"] == plan["cycle"], i)
    # a third pipeline whose training needs GPU 0, registered with the others
    reg = copy.deepcopy(next(r for r in log if r["kind"] == "register" and r["pipeline_id"] == "ppl1"))
    reg["pipeline_id"] = "ppl3"
    log = _pending(log, enq, 9999, "ppl3_actor_train", commit)
    log.insert(index(log, lambda r: r["kind"] == "register") + 1, reg)
    assert [v for v in check_log(reseq(copy.deepcopy(log))) if v.invariant == "grant_order"] == []
    log[0]["scheduler"] = dict(log[0]["scheduler"], head_of_line_blocking=True)
    fires(log, "grant_order", "head_of_line_blocking is on")


def test_in_flight_at_sleep_fires_when_a_rank_sleeps_with_a_request_running(sim_log):
    log = copy.deepcopy(sim_log)
    s = index(log, lambda r: r["kind"] == "rank_state" and r["state"] == "asleep")
    pid, dp = log[s]["pipeline_id"], log[s]["dp_rank"]
    d = max(
        j
        for j in range(s)
        if log[j]["kind"] == "request_dispatch" and log[j]["pipeline_id"] == pid and log[j]["dp_rank"] == dp
    )
    extra = dict(log[d], request=99_999)  # one more request on that rank, never finished nor aborted
    log.insert(d + 1, extra)
    fires(log, "in_flight_at_sleep", f"{pid} dp{dp} went asleep with 1 request(s) still running")


def test_in_flight_at_sleep_fires_when_a_pipeline_unregisters_with_a_request_running():
    rank = {"pipeline_id": "p", "dp_rank": 0, "gpus": [0], "kind": "rank_state"}
    states = [
        dict(rank, t=1.0, state=st, version=None if st in ("waking", "awake_unrouted") else 0)
        for st in ("waking", "awake_unrouted", "synced", "routable")
    ]
    run = {
        "t": 2.0,
        "kind": "request_dispatch",
        "pipeline_id": "p",
        "request": 7,
        "dp_rank": 0,
        "version": 0,
        "attempt": 0,
    }
    gone = {"t": 3.0, "kind": "unregister", "pipeline_id": "p"}
    done = {"t": 2.5, "kind": "request_done", "pipeline_id": "p", "request": 7, "dp_rank": 0, "tokens": 9, "version": 0}
    assert check_log(_tiny(states + [run, done, gone])) == []
    fires(
        _tiny(states + [run, gone]),
        "in_flight_at_sleep",
        "p unregistered with 1 request(s) still running, e.g. dp0 request 7",
    )


def test_sync_targets_fires_for_an_expand_sync_writing_a_rank_outside_the_expand(sim_log):
    log = copy.deepcopy(sim_log)
    s = index(
        log,
        lambda r: (
            r["kind"] == "effect_start"
            and r["effect"] == "SyncFromCache"
            and r["args"]["path"] == "expand"
            and r["pipeline_id"] == "ppl1"
        ),
    )
    b = index(log, lambda r: r["kind"] == "sync_bucket", s)
    log[b]["dp_ranks"] = log[b]["dp_ranks"] + [1]  # ppl1 dp1 is asleep and not in this expand
    found = fires(log, "sync_targets", "writes dp1, which is asleep, not awake")
    assert any("which that expand does not add" in v.message for v in found)


def test_sync_targets_fires_for_an_active_refresh_writing_a_rank_that_is_not_routable(sim_log):
    log = copy.deepcopy(sim_log)
    s = index(
        log, lambda r: r["kind"] == "effect_start" and r["effect"] == "SyncFromCache" and r["args"]["path"] == "active"
    )
    b = index(log, lambda r: r["kind"] == "sync_bucket", s)
    pid = log[b]["pipeline_id"]
    other = 1 - log[b]["dp_ranks"][0]
    states = [
        r["state"] for r in log[:b] if r["kind"] == "rank_state" and r["pipeline_id"] == pid and r["dp_rank"] == other
    ]
    assert not states or states[-1] != "routable"
    log[b]["dp_ranks"] = [other]
    fires(log, "sync_targets", f"active refresh of {pid} writes dp{other}")


def test_rank_lifecycle_fires_for_a_rank_that_wakes_with_no_waking_state(sim_log):
    log = copy.deepcopy(sim_log)
    w = index(log, lambda r: r["kind"] == "rank_state" and r["state"] == "waking", 300)
    del log[w]
    fires(log, "rank_lifecycle", "went asleep -> awake_unrouted")


def test_rank_lifecycle_fires_for_a_stopped_rank_that_comes_back(sim_log):
    log = copy.deepcopy(sim_log)
    first = index(log, lambda r: r["kind"] == "rank_state")
    stop = dict(log[first], state="stopped")
    log.insert(first, stop)  # the rank stops, then wakes as if nothing happened
    fires(log, "rank_lifecycle", "went stopped -> waking")


def test_trajectory_age_fires_for_a_batch_older_than_the_bound(sim_log):
    log = copy.deepcopy(sim_log)
    assert log[0]["meta"]["max_trajectory_age_steps"] == {"ppl1": 1, "ppl2": 1}
    b = index(log, lambda r: r["kind"] == "batch_consumed")
    n = sum(log[b]["staleness"].values())
    log[b]["staleness"] = {"0": n - 2, "3": 2}
    fires(log, "trajectory_age", "trained 2 trajectory(ies) of age [3] steps; max_trajectory_age_steps is 1")


@pytest.mark.parametrize(
    "mutate, text",
    [
        (lambda log, i: log[i].update(used=log[i]["used"] + 1), "the ledger reports"),
        (
            lambda log, i: log.insert(
                i + 1, dict(log[i], delta=-2 * log[i]["delta"], used=log[i]["used"] - 2 * log[i]["delta"])
            ),
            "frees 2000000000 B holding 1000000000 B",
        ),
        (lambda log, i: log[0]["cluster"].update(host_ram_bytes=log[i]["used"] - 1), "with no host_oom record"),
    ],
)
def test_host_ram_fires_on_ledger_breaks(sim_log, mutate, text):
    log = copy.deepcopy(sim_log)
    assert log[0]["cluster"]["host_ram_bytes"] > 0
    i = index(log, lambda r: r["kind"] == "host_ram" and r["delta"] > 0)
    mutate(log, i)
    fires(log, "host_ram", text)


def test_ungrantable_preemption_fires_for_a_shrink_its_cycle_does_not_grant(sim_log):
    """A cycle shrinks ppl2's GENERATION rank on GPU 1 for ppl2's waiting training request
    and grants nothing: the GPU idles (a second cycle gives the rank back)."""
    log = copy.deepcopy(sim_log)
    i, _ = _first_grant_plan(log, "ppl1_actor_train")
    h = holdings_at(log, i)
    assert h.ranks["ppl2_actor_infer"] == {1: [1]}
    bundles = [{"dp_rank": 1, "gpus": [1]}]
    log = inject_cycle(log, i, shrinks=[{"cluster_id": "ppl2_actor_infer", "bundles": bundles}])
    j = index(log, lambda r: r["kind"] == "commit" and r["cycle"] == 10_000 + i) + 1
    log = inject_cycle(
        log, j, expands=[{"cluster_id": "ppl2_actor_infer", "has_pending_request": False, "bundles": bundles}]
    )
    k = index(log, lambda r: r["kind"] == "commit" and r["cycle"] == 10_000 + j)
    log = _pending(log, i, 9999, "ppl2_actor_train", k)
    fires(log, "ungrantable_preemption", "shrinks ppl2_actor_infer dp1 (GPUs [1]) for ppl2_actor_train (request 9999)")


def _tiny(records):
    head = {
        "seq": 0,
        "t": 0.0,
        "kind": "header",
        "schema": "rlharness.eventlog",
        "version": 1,
        "cluster": {"nodes": 1, "gpus_per_node": 2},
        "source": "simulator",
    }
    return reseq([head] + [dict({"seq": 0}, **r) for r in records])


def test_idle_bundle_starvation_fires_for_a_pipeline_starved_beside_an_idle_bundle():
    reg = {
        "t": 0.0,
        "kind": "register",
        "pipeline_id": "p",
        "cluster_tp_configs": {"actor_train": 1, "actor_infer": 1},
        "cluster_device_mappings": {"actor_train": [0], "actor_infer": [0, 1]},
    }
    wait = {"pipeline_id": "p", "effect": "WaitBatch", "args": {}, "scope": "step", "step": 0}
    end = {"t": 100.0, "kind": "sim_end", "reason": "done", "sim_time": 100.0, "events": 3}
    short = _tiny([reg, dict(wait, t=1.0, kind="effect_start"), dict(wait, t=50.0, kind="effect_end"), end])
    assert check_log(short) == []  # 49 s: within the bound
    log = _tiny([reg, dict(wait, t=1.0, kind="effect_start"), dict(wait, t=90.0, kind="effect_end"), end])
    fires(
        log, "idle_bundle_starvation", "p has waited for its batch with no routable rank since t=1.0 s while GPUs [0]"
    )
    # the header's per-pipeline bound (a simulator log's: derived from the scenario) replaces the 60 s
    short[0]["meta"] = {"idle_bundle_bound_s": {"p": 16.0}}
    fires(short, "idle_bundle_starvation", "more than 16 s")
    log[0]["meta"] = {"idle_bundle_bound_s": {"p": 120.0}}
    assert check_log(log) == []


def test_the_derived_idle_bound_follows_the_scenario_timescales():
    """Twice the hand-over a healthy scheduler makes: polls, watchdog, a donor's drain and
    sleep, the wake, a sync group and one bundle's weights (simulators/runtime/timeouts.py); a
    scenario's costs.idle_bundle_bound_s wins."""
    import dataclasses

    from simulators.scenario.spec import default_scenario
    from simulators.runtime.timeouts import idle_bundle_bounds

    s = default_scenario()
    c = s.costs
    one = (
        2 * c.scheduler_poll_s
        + c.watchdog_s
        + c.drain_s
        + c.sleep_fixed_s
        + c.sleep_s
        + c.wake_fixed_s
        + c.wake_s
        + c.nccl_group_create_s
        + s.pipelines[0].model.weight_bytes / c.receiver_load_bytes_per_s
        + c.finalize_s
    )
    assert idle_bundle_bounds(s)["ppl1"] == round(2 * one, 3) and 10 < 2 * one < 30
    slower = dataclasses.replace(s, costs=dataclasses.replace(c, scheduler_poll_s=10.0))
    assert idle_bundle_bounds(slower)["ppl1"] == round(2 * (one + 18.0), 3)
    fixed = dataclasses.replace(s, costs=dataclasses.replace(c, idle_bundle_bound_s=45.0))
    assert idle_bundle_bounds(fixed) == {"ppl1": 45.0, "ppl2": 45.0}


def test_data_plane_judges_the_metadata_hop_by_its_bytes():
    put = {
        "t": 1.0,
        "kind": "dp_transfer",
        "actor": "p/rollout",
        "role": "producer",
        "partition": "p",
        "hop": "producer_to_store",
        "samples": ["r0"],
        "fields": ["trajectory"],
        "bytes": 3000,
    }
    meta = {
        "t": 2.0,
        "kind": "dp_transfer",
        "actor": "p/driver",
        "role": "driver",
        "partition": "p",
        "hop": "driver_meta",
        "samples": ["r0"],
        "fields": ["trajectory"],
        "bytes": 20,
    }
    assert check_log(_tiny([put, meta, dict(meta, bytes=4096)])) == []  # the label alone no longer exempts it:
    fires(_tiny([put, dict(meta, bytes=4097)]), "data_plane", "driver_meta moved 4097 B for 1 row(s), above 4096 B")


# ---------------------------------------------------------------- the simulated system does it


def _scenario(name):
    from simulators.scenario.loader import load_scenario

    return load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))


def _run(s):
    from simulators.run import Simulation

    return check_log(Simulation(s).run().records)


def test_ungrantable_preemption_and_its_thrash_in_the_bundled_scenario_and_not_with_rollback():
    s = _scenario("ungrantable_preemption")
    found = [v for v in _run(s) if v.invariant == "ungrantable_preemption"]
    assert found and any("thrash: shrunk 2 times" in v.message for v in found), [str(v) for v in found]
    fixed = dataclasses.replace(s, scheduler=dict(s.scheduler, rollback_ungrantable_preemption=True))
    assert [v for v in _run(fixed) if v.invariant == "ungrantable_preemption"] == []


def test_idle_bundle_starvation_when_one_shot_generation_starves_and_not_with_the_watchdog():
    s = _scenario("starve_one_shot_generation")
    assert "idle_bundle_starvation" in {v.invariant for v in _run(s)}
    healed = dataclasses.replace(s, faults=[f for f in s.faults if f.name != "no_gen_watchdog"])
    assert _run(healed) == []


def _with(s, *, faults=(), **scheduler):
    return dataclasses.replace(s, faults=tuple(s.faults) + tuple(faults), scheduler=dict(s.scheduler, **scheduler))


def _named(found, name):
    return [v for v in found if v.invariant == name]


def test_grant_order_when_the_scheduler_grants_newest_first():
    """Fault switch grant_newest_first: Phase 2 walks a tier newest first, so pb's training
    takes GPU 1 ahead of pa's earlier request for [0, 1]."""
    s = _scenario("ungrantable_preemption")
    assert _named(_run(s), "grant_order") == []
    found = _named(_run(_with(s, grant_newest_first=True)), "grant_order")
    assert found and "passing over the earlier pa_actor_train" in found[0].message, [str(v) for v in found]


def test_in_flight_at_sleep_follows_rlix_premature_release_ack():
    """RLix's premature planned-release ack lets a finished pipeline unregister while its
    never-shrunk ranks still serve; with exact releases the ranks drain first."""
    s = _scenario("mixed_64gpu")
    found = _run(s)
    assert {"in_flight_at_sleep", "planned_release_ack"} <= {v.invariant for v in found}
    acked = [v for v in found if v.invariant == "planned_release_ack"]
    for v in _named(found, "in_flight_at_sleep"):  # each follows its own pipeline's premature ack
        pid = v.message.split()[0]
        assert any(a.seq < v.seq and f"await_release of {pid}_actor_infer acked" in a.message for a in acked), v
    exact = _run(_with(s, ack_unplanned_releases=False))
    assert _named(exact, "in_flight_at_sleep") == [] and _named(exact, "planned_release_ack") == []


def test_sync_targets_when_an_expand_sync_writes_every_rank():
    from simulators.scenario.spec import FaultSpec, default_scenario

    found = _run(_with(default_scenario(), faults=[FaultSpec("sync_outside_expand", "ppl1", 1)]))
    assert {v.invariant for v in found} == {"sync_targets"}, [str(v) for v in found][:5]
    assert "expand sync of ppl1 writes dp1, which is asleep, not awake" in found[0].message


def test_rank_lifecycle_when_the_controller_activates_an_engine_that_never_synced():
    from simulators.scenario.spec import FaultSpec, default_scenario

    found = _run(_with(default_scenario(), faults=[FaultSpec("unchecked_activation", "ppl1", 1)]))
    lifecycle = [v for v in found if v.invariant == "rank_lifecycle"]
    assert lifecycle and "awake_unrouted -> routable" in lifecycle[0].message, [str(v) for v in found][:5]
    assert not [v for v in _run(default_scenario()) if v.invariant == "rank_lifecycle"]


def test_trajectory_age_when_the_trainer_takes_a_stale_batch():
    from simulators.scenario.spec import FaultSpec

    s = _scenario("gap_ratio_3pipelines")
    found = _named(_run(_with(s, faults=[FaultSpec("stale_batch", "pa", 1)])), "trajectory_age")
    assert found and "max_trajectory_age_steps is 1" in found[0].message, [str(v) for v in found]
    assert _named(_run(s), "trajectory_age") == []


def test_host_ram_when_the_cache_build_skips_its_guard():
    from simulators.scenario.spec import FaultSpec, default_scenario

    d = default_scenario()
    small = dataclasses.replace(d, cluster=dataclasses.replace(d.cluster, host_ram_bytes=1_500_000_000))
    guarded = _run(small)  # two 1 GB caches on a 1.5 GB node: host_oom, the run fails
    assert {v.invariant for v in guarded} == {"run_outcome"}
    found = _run(_with(small, faults=[FaultSpec("no_host_ram_guard", p, 0) for p in ("ppl1", "ppl2")]))
    assert _named(found, "host_ram") and "with no host_oom record" in _named(found, "host_ram")[0].message


def test_data_plane_when_the_driver_packs_tensors_into_the_metadata():
    from simulators.scenario.spec import FaultSpec

    s = _scenario("dataplane_one_hop")
    assert _named(_run(s), "data_plane") == []
    found = _named(_run(_with(s, faults=[FaultSpec("bulk_in_driver_meta", "ppl1", 1)])), "data_plane")
    assert found and "driver_meta moved" in found[0].message, [str(v) for v in found]
