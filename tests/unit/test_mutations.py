"""Mutation tests of the oracle: every check fires on a broken log, and only that check.

Each mutation takes a valid log — the simulator's default scenario (two NeMo pipelines on
2 GPUs), or a ROLL trace with its replayed decisions — breaks one thing the check is
about, and asserts that the set of checks that fire is exactly ``{check}``. A mutation
that needs a state change mid-log injects a whole cycle (plan, resizes, commit) whose net
effect on GPU ownership is nil, so the rest of the log stays consistent. Fault-hook
tests inject the bug into the simulated system instead (bottom of the file).
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import os
from typing import Callable, Dict, List

import pytest

from harness.logs.invariants import CHECKS, check_log
from harness.logs.invariants.allocations import DecisionWalk

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


# ---------------------------------------------------------------- valid logs


@pytest.fixture(scope="module")
def sim_log() -> List[dict]:
    from simulators.run import Simulation
    from simulators.scenario.spec import default_scenario

    res = Simulation(default_scenario()).run()
    assert res.reason == "done" and check_log(res.records) == []
    return res.records


@pytest.fixture(scope="module")
def roll_log() -> List[dict]:
    """The ROLL trace's inputs and replayed decisions, with exact planned releases (valid)."""
    from harness.logs.check import oracle_log
    from harness.logs.records import read_records

    path = os.path.join(ROOT, "examples", "traces", "roll_dual_4gpu.jsonl")
    records = read_records(path)
    records[0].data["scheduler"] = {"ack_unplanned_releases": False}
    log = oracle_log(records, path).records
    assert check_log(log) == []
    return log


def reseq(records: List[dict]) -> List[dict]:
    for i, r in enumerate(records):
        r["seq"] = i
    return records


def index(records, pred, start=0) -> int:
    return next(i for i in range(start, len(records)) if pred(records[i]))


def holdings_at(records, i):
    return DecisionWalk(records[:i]).run().h


def inject_cycle(records, i, *, shrinks=(), signals=(), expands=()) -> List[dict]:
    """Insert a whole cycle before ``records[i]``: plan, resizes, commit (idle count as the
    decisions then leave it)."""
    t = records[i]["t"]
    c = 10_000 + i
    plan = {
        "seq": 0,
        "t": t,
        "kind": "plan",
        "cycle": c,
        "shrinks": list(shrinks),
        "signals": list(signals),
        "expands": list(expands),
    }
    h = holdings_at(records, i)
    h.apply_plan(plan, {"seq": 0, "skipped_stale": []}, lambda *a: None)
    new = [{"seq": 0, "t": t, "kind": "cycle_start", "cycle": c, "reason": "mutation"}, plan]
    for phase, ops in (("shrink", shrinks), ("expand", expands)):
        for op in ops:
            pid = op["cluster_id"][: -len("_actor_infer")]
            ranks = [b["dp_rank"] for b in op["bundles"]]
            new.append(
                {
                    "seq": 0,
                    "t": t,
                    "kind": "resize_start",
                    "cycle": c,
                    "pipeline_id": pid,
                    "phase": phase,
                    "dp_ranks": ranks,
                }
            )
            new.append(
                {
                    "seq": 0,
                    "t": t,
                    "kind": "resize_end",
                    "cycle": c,
                    "pipeline_id": pid,
                    "phase": phase,
                    "dp_ranks": ranks,
                }
            )
    new.append(
        {"seq": 0, "t": t, "kind": "commit", "cycle": c, "idle_gpus": h.num_gpus - len(h.owner), "skipped_stale": []}
    )
    return records[:i] + new + records[i:]


def after_commit_where(records, pred) -> int:
    """Index just after the first commit at which ``pred(holdings)`` holds."""
    for i, r in enumerate(records):
        if r["kind"] == "commit":
            h = DecisionWalk(records[: i + 1]).run().h
            if pred(h):
                return i + 1
    raise AssertionError("no such point in the log")


def effect_pair(records, effect, pred=lambda r: True, start=0):
    i = index(records, lambda r: r["kind"] == "effect_start" and r["effect"] == effect and pred(r), start)
    s = records[i]
    j = index(
        records,
        lambda r: (
            r["kind"] == "effect_end"
            and r["effect"] == effect
            and r["pipeline_id"] == s["pipeline_id"]
            and r.get("scope") == s.get("scope")
        ),
        i + 1,
    )
    return i, j


# ---------------------------------------------------------------- mutations, one per check


def m_gpu_ownership(log):
    c = next(r for r in log if r["kind"] == "commit")
    c["idle_gpus"] += 1  # the decisions leave one GPU fewer idle than the commit claims
    return log, "idle GPUs"


def m_resize_order(log):
    i = index(log, lambda r: r["kind"] == "resize_end" and r["phase"] == "expand")
    c = log[i]["cycle"]
    j = index(log, lambda r: r["kind"] == "commit" and r["cycle"] == c, i)
    log.insert(i, log.pop(j))  # commit before the expand returned
    return log, "committed while resize calls are still running"


def m_no_readd_in_cycle(log):
    i = after_commit_where(log, lambda h: any(h.ranks.get(c) for c in h.ranks))
    h = holdings_at(log, i)
    cid = next(c for c in sorted(h.ranks) if h.ranks[c])
    r, gpus = sorted(h.ranks[cid].items())[0]
    bundle = [{"dp_rank": r, "gpus": gpus}]
    log = inject_cycle(
        log,
        i,
        shrinks=[{"cluster_id": cid, "bundles": bundle}],
        expands=[{"cluster_id": cid, "has_pending_request": False, "bundles": bundle}],
    )
    return log, "removed and re-added"


def m_plan_validation(log):
    i = after_commit_where(log, lambda h: any(h.ranks.get(c) for c in h.ranks))
    cid = next(c for c in sorted(holdings_at(log, i).ranks))
    wake = {"cluster_id": cid, "priority": "GENERATION", "gpus": []}
    log = inject_cycle(log, i, signals=[wake, dict(wake)])  # one cluster twice in one op list
    return log, "condition 1"


def _inactive_rank_and_foreign_idle_gpu(h):
    for cid in sorted(h.priority):
        reg = h.registration(cid)
        if not cid.endswith("_actor_infer") or reg is None or reg.tp(cid) != 1:
            continue
        for r in range(reg.max_dp(cid)):
            if r in h.ranks.get(cid, {}):
                continue
            foreign = sorted(h.idle() - set(reg.bundle(cid, r)))
            if foreign:
                return cid, r, foreign[0]
    return None


def m_grant_shape(log):
    # an inactive tp-1 rank is expanded onto an idle GPU that is not its bundle, and a later
    # cycle shrinks it back: ownership, plan conditions and ranks stay consistent, only the
    # bundle is wrong. The expand serves a GENERATION request queued just before it: the
    # cluster may be one its pipeline gave back with await_release, and an expand of that with
    # no request since is reactivated_after_release's business.
    i = after_commit_where(log, lambda h: _inactive_rank_and_foreign_idle_gpu(h) is not None)
    cid, r, g = _inactive_rank_and_foreign_idle_gpu(holdings_at(log, i))
    wrong = [{"dp_rank": r, "gpus": [g]}]
    log = (
        log[:i]
        + [
            {
                "seq": 0,
                "t": log[i - 1]["t"],
                "kind": "enqueued",
                "request_id": 99_999,
                "cluster_id": cid,
                "priority": "GENERATION",
            }
        ]
        + log[i:]
    )
    log = inject_cycle(log, i + 1, expands=[{"cluster_id": cid, "has_pending_request": True, "bundles": wrong}])
    j = index(log, lambda x: x["kind"] == "commit" and x["cycle"] == 10_000 + i + 1, i) + 1
    log.insert(
        j,
        {
            "seq": 0,
            "t": log[j - 1]["t"],
            "kind": "signalled",
            "request_id": 99_999,
            "waiter": "request",
            "cluster_id": cid,
            "priority": "GENERATION",
            "gpus": [g],
            "cycle": 10_000 + i + 1,
            "error": None,
        },
    )
    j += 1
    log = inject_cycle(log, j, shrinks=[{"cluster_id": cid, "bundles": wrong}])
    return log, "its TP bundle is"


def m_planned_release_ack(log):
    i = index(log, lambda r: r["kind"] == "release_pending")
    j = index(
        log,
        lambda r: (
            r["kind"] == "signalled" and r["waiter"] == "planned_release" and r["request_id"] == log[i]["request_id"]
        ),
        i,
    )
    ack = log.pop(j)
    ack["cycle"] = None  # acked at once, while the cluster still holds its ranks
    log.insert(i + 1, ack)
    return log, "acked at once while it still holds"


def m_activate_after_sync(log):
    i, j = effect_pair(log, "Finalize", lambda r: r.get("scope") == "expand")
    del log[j], log[i]
    return log, "before finalize"


def m_versions(log):
    i = index(log, lambda r: r["kind"] == "effect_end" and r["effect"] == "PromoteCache" and r["args"]["version"] >= 1)
    log[i]["args"] = {**log[i]["args"], "version": log[i]["args"]["version"] + 7}
    return log, "but the latest built is"


def m_stale_serving(log):
    pub = index(
        log, lambda r: r["kind"] == "effect_end" and r["effect"] == "PublishVersion" and r["args"]["version"] >= 1
    )
    v = log[pub]["args"]["version"]
    i = index(log, lambda r: r["kind"] == "request_dispatch" and r.get("version") == v, pub)
    log[i]["version"] = v - 1  # dispatched to weights one version behind the published one
    return log, f"serves version {v - 1} while version {v} is published"


def m_release_after_publish(log):
    p = index(
        log, lambda r: r["kind"] == "effect_start" and r["effect"] == "PublishVersion" and r["args"]["path"] == "active"
    )
    i = index(
        log,
        lambda r: (
            r["kind"] == "effect_start"
            and r["effect"] == "ReleaseGpus"
            and r["args"].get("cluster") == "actor_train"
            and r["pipeline_id"] == log[p]["pipeline_id"]
        ),
        p,
    )
    log.insert(p, log.pop(i))  # actor_train released before the active publish
    return log, "before active refresh"


def m_step_order(log):
    i = index(log, lambda r: r["kind"] == "effect_start" and r.get("scope") == "step" and r.get("step") == 1)
    pid = log[i]["pipeline_id"]
    j = index(
        log,
        lambda r: (
            r["kind"] == "effect_start" and r.get("scope") == "step" and r.get("step") == 0 and r["pipeline_id"] == pid
        ),
    )
    k = index(log, lambda r: r["kind"] == "effect_end" and r["pipeline_id"] == pid and r.get("step") == 0, j)
    log.insert(k, log.pop(i))  # step 1 starts while step 0's first effect is open
    return log, "unfinished"


def m_routing(log):
    i = index(log, lambda r: r["kind"] == "request_done")
    log.insert(i + 1, dict(log[i]))
    return log, "completed twice"


def m_run_outcome(log):
    end = log[-1]
    assert end["kind"] == "sim_end"
    end.update(reason="failed", detail="ppl1: injected failure")
    return log, "the run failed: ppl1: injected failure"


def m_vram(log):
    i = index(log, lambda r: r["kind"] == "vram" and r["mem"] == "kv_cache" and r["delta"] < 0)
    owner, gpu = log[i]["owner"], log[i]["gpu"]  # the ledger's own "used" figures are left as they were
    j = index(
        log,
        lambda r: (
            r["kind"] == "rank_state" and r["state"] == "asleep" and f"{r['pipeline_id']}/dp{r['dp_rank']}" == owner
        ),
        i,
    )
    del log[i]  # the KV cache is never freed: the rank sleeps with it resident
    assert any(r["kind"] == "rank_state" and r["state"] == "asleep" and r["gpus"] == [gpu] for r in log[j - 1 :])
    return log, "asleep keeps"


def m_sync_groups(log):
    i = index(log, lambda r: r["kind"] == "group_destroy" and r.get("purpose") == "sync")
    del log[i]
    return log, "still alive"


def m_cache_lock(log):
    i = index(log, lambda r: r["kind"] == "cache_lock" and r["holder"] == "sync" and r["action"] == "acquire")
    pid, v = log[i]["pipeline_id"], log[i]["version"]
    hold = [
        {
            "seq": 0,
            "t": log[i]["t"],
            "kind": "cache_lock",
            "pipeline_id": pid,
            "action": a,
            "holder": "build",
            "version": v + 5,
        }
        for a in ("acquire", "release")
    ]
    log[i + 1 : i + 1] = hold  # a build inside the sync's hold
    return log, "while the sync"


MUTATIONS: Dict[str, Callable] = {
    "gpu_ownership": m_gpu_ownership,
    "resize_order": m_resize_order,
    "no_readd_in_cycle": m_no_readd_in_cycle,
    "plan_validation": m_plan_validation,
    "grant_shape": m_grant_shape,
    "planned_release_ack": m_planned_release_ack,
    "activate_after_sync": m_activate_after_sync,
    "versions": m_versions,
    "stale_serving": m_stale_serving,
    "release_after_publish": m_release_after_publish,
    "step_order": m_step_order,
    "routing": m_routing,
    "run_outcome": m_run_outcome,
    "vram": m_vram,
    "sync_groups": m_sync_groups,
    "cache_lock": m_cache_lock,
}
# liveness needs a run that stalls for its 300 s window: a fault hook (test_liveness_... below)
FAULT_HOOK_TESTED = {"liveness"}
# a mutation whose damage another check must also see: a KV cache that is never freed is
# still on its GPU when the scheduler grants that GPU to another cluster (handover), and
# the wake there has less than the margin left beside it (handover_headroom)
ALSO_FIRES = {
    "vram": {"handover", "handover_headroom"},
    # a rank activated without its finalize resumes an engine whose update never ended (the table's
    # resume_weights_not_ready, harness/control/engine_table.py), and its version was published
    # before the rank applied it (versions: RLinf #1456's order)
    "activate_after_sync": {"engine_transition", "versions"},
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_mutation_fires_exactly_its_check(name, sim_log):
    log, expected = MUTATIONS[name](copy.deepcopy(sim_log))
    found = check_log(reseq(log))
    assert {v.invariant for v in found} == {name} | ALSO_FIRES.get(name, set()), [str(v) for v in found][:5]
    assert any(expected in v.message for v in found if v.invariant == name), [v.message for v in found][:5]


def test_planned_release_ack_mutation_on_the_roll_trace(roll_log):
    """The ROLL trace with exact releases is valid; re-expanding the released cluster in
    the acking cycle (what RLix's default does at cycle 23) makes exactly this check fire."""
    log = copy.deepcopy(roll_log)
    for i, r in enumerate(log):  # an ack whose cycle leaves the first shrunk bundle idle
        if r["kind"] == "signalled" and r["waiter"] == "planned_release" and r["cycle"] is not None:
            c, cid = r["cycle"], r["cluster_id"]
            plan = next(p for p in log if p["kind"] == "plan" and p["cycle"] == c)
            shrunk = next(s for s in plan["shrinks"] if s["cluster_id"] == cid)
            j = index(log, lambda x: x["kind"] == "commit" and x["cycle"] == c) + 1
            if set(shrunk["bundles"][0]["gpus"]) <= holdings_at(log, j).idle():
                break
    else:
        raise AssertionError("no ack leaves a shrunk bundle idle")
    ack = log.pop(i)
    j -= 1
    # a cycle right after gives one shrunk rank back, and the ack moves to that cycle
    log = inject_cycle(
        log, j, expands=[{"cluster_id": cid, "has_pending_request": False, "bundles": shrunk["bundles"][:1]}]
    )
    k = index(log, lambda r: r["kind"] == "commit" and r["cycle"] == 10_000 + j)
    ack["cycle"] = 10_000 + j
    log.insert(k, ack)
    # ... and is given back by a last cycle so the rest of the trace stays consistent
    log = inject_cycle(log, k + 2, shrinks=[{"cluster_id": cid, "bundles": shrunk["bundles"][:1]}])
    found = check_log(reseq(log))
    assert {v.invariant for v in found} == {"planned_release_ack"}, [str(v) for v in found]
    assert "expanded dp [" in found[0].message


def test_every_check_has_a_mutation_test():
    others = [
        p
        for p in glob.glob(os.path.join(ROOT, "tests", "**", "*.py"), recursive=True)
        if not p.endswith("test_mutations.py")
    ]
    text = "".join(open(p, encoding="utf-8").read() for p in others)
    for name in CHECKS:
        if name in MUTATIONS or name in FAULT_HOOK_TESTED:
            continue
        assert f'"{name}"' in text, f"check {name} has no mutation test (add one here or in its own suite)"


# ---------------------------------------------------------------- fault hooks


def _scenario(name):
    from simulators.scenario.loader import load_scenario

    return load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))


def test_liveness_fires_when_one_shot_generation_starves_and_not_with_the_watchdog():
    from simulators.run import Simulation

    s = _scenario("starve_one_shot_generation")
    # the starved pipeline's bundle idles meanwhile: idle_bundle_starvation names that waste too
    assert {v.invariant for v in check_log(Simulation(s).run().records)} == {"liveness", "idle_bundle_starvation"}
    healed = dataclasses.replace(s, faults=[f for f in s.faults if f.name != "no_gen_watchdog"])
    assert check_log(Simulation(healed).run().records) == []


def test_vram_names_the_residue_of_nccl_buffers_kept_on_sleep():
    """keep_nccl_on_sleep (RLix Bug 4) with a post-sleep threshold below one communicator
    buffer: the oracle reads the residue from the ledger records."""
    from simulators.run import Simulation

    s = _scenario("nccl_kept_on_sleep")
    s = dataclasses.replace(s, costs=dataclasses.replace(s.costs, post_sleep_threshold_bytes=256 << 20))
    found = check_log(Simulation(s).run().records)
    assert any(v.invariant == "vram" and "asleep keeps" in v.message for v in found), found
    assert {v.invariant for v in found} <= {"vram", "run_outcome"}
