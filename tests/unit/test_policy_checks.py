"""The oracle's policy parameters (harness/logs/invariants/policy_rules.py) on crafted logs: the
same log, with only the header's ``scheduler.policy`` changed, is or is not a finding, as
docs/policies.md says; and the policy figures (harness/logs/outputs/policy_figures.py) counted
by hand on a tiny log."""

from __future__ import annotations

import copy

from harness.logs.invariants import check_log
from harness.logs.outputs.policy_figures import policy_figures
from harness.scheduler.options import SchedulerOptions
from tests.unit.test_mutations import reseq, sim_log  # noqa: F401 (a fixture)

WAIT = {"pipeline_id": "p", "effect": "WaitBatch", "args": {}, "scope": "step", "step": 0}


def _log(scheduler, gpus, registrations, middle=()):
    head = {
        "seq": 0,
        "t": 0.0,
        "kind": "header",
        "schema": "rlharness.eventlog",
        "version": 1,
        "cluster": {"nodes": 1, "gpus_per_node": gpus},
        "source": "simulator",
        "scheduler": scheduler,
    }
    regs = [
        {
            "t": 0.0,
            "kind": "register",
            "pipeline_id": pid,
            "cluster_tp_configs": {"actor_train": 1, "actor_infer": 1},
            "cluster_device_mappings": {"actor_train": train, "actor_infer": infer},
        }
        for pid, train, infer in registrations
    ]
    end = {"t": 100.0, "kind": "sim_end", "reason": "done", "sim_time": 100.0, "events": 3}
    body = regs + list(middle) + [dict(WAIT, t=1.0, kind="effect_start"), dict(WAIT, t=90.0, kind="effect_end"), end]
    return reseq([head] + [dict({"seq": 0}, **r) for r in body])


def _starved(log):
    return [v.message for v in check_log(copy.deepcopy(log)) if v.invariant == "idle_bundle_starvation"]


def test_static_partition_counts_only_bundles_inside_the_part():
    """p infers on GPU 1 only, which the partition gives to q: p waiting beside it is RLix
    starving p, but under static_partition it is the policy (p may not use GPU 1)."""
    regs = [("p", [0], [1]), ("q", [1], [1])]
    assert _starved(_log({}, 2, regs))  # gap_ratio (absent): a finding
    assert _starved(_log({"policy": "static_partition", "partition": {"p": [0], "q": [1]}}, 2, regs)) == []
    # inside its own part the same wait is a finding again
    assert _starved(_log({"policy": "static_partition", "partition": {"p": [0, 1], "q": [2]}}, 3, regs))


def _q_holds_gpu(g):
    plan = {
        "t": 0.5,
        "kind": "plan",
        "cycle": 1,
        "shrinks": [],
        "signals": [],
        "expands": [
            {"cluster_id": "q_actor_infer", "has_pending_request": True, "bundles": [{"dp_rank": 0, "gpus": [g]}]}
        ],
    }
    return [plan, {"t": 0.5, "kind": "commit", "cycle": 1, "idle_gpus": 2, "skipped_stale": []}]


def test_round_robin_lets_a_pipeline_wait_while_a_group_mate_holds_the_turn():
    """q (sharing GPU 2 with p: one co-execution group) holds a GEN rank on GPU 2; p waits
    beside idle GPU 1. RLix would give p that bundle; round robin waits for q's turn to end."""
    regs = [("p", [0], [1, 2]), ("q", [3], [2])]
    middle = _q_holds_gpu(2)
    assert _starved(_log({}, 4, regs, middle))
    assert _starved(_log({"policy": "round_robin"}, 4, regs, middle)) == []
    # in groups of their own, q's turn is no reason for p to wait
    assert _starved(_log({"policy": "round_robin", "groups": [["p"], ["q"]]}, 4, regs, middle))


def test_acquire_yield_waits_for_the_whole_mapping():
    regs = [("p", [0], [1, 2]), ("q", [3], [2])]
    middle = _q_holds_gpu(2)
    assert _starved(_log({"policy": "acquire_yield"}, 4, regs, middle)) == []  # GPU 2 is not free
    assert _starved(_log({"policy": "acquire_yield"}, 4, regs))  # both free: a finding


def test_default_options_write_no_policy_keys_so_old_headers_keep_their_bytes():
    assert not {"policy", "partition", "groups"} & set(SchedulerOptions().to_mapping())
    rr = SchedulerOptions.from_mapping({"policy": "round_robin", "groups": [["a", "b"]]}).to_mapping()
    assert rr["policy"] == "round_robin" and rr["groups"] == [["a", "b"]]
    assert SchedulerOptions.from_mapping(rr) == SchedulerOptions.from_mapping(
        {"policy": "round_robin", "groups": [["a", "b"]]}
    )


def test_policy_figures_by_hand():
    """Two GPUs for 10 s. Training 1 GPU-s (from the summary); p's rank 0 (GPU 0) is routable
    0-8 s with request 1 in flight 2-5 s: 3 GPU-s serving. A plan at 4 s shrinks that rank
    for q's training while request 1 is in flight: one preemption; a plan at 6 s shrinks it
    again with nothing in flight: none."""
    rs = [
        {"t": 0.0, "kind": "rank_state", "pipeline_id": "p", "dp_rank": 0, "state": "routable", "gpus": [0]},
        {"t": 2.0, "kind": "request_dispatch", "pipeline_id": "p", "request": 1, "dp_rank": 0},
        {
            "t": 4.0,
            "kind": "plan",
            "cycle": 1,
            "shrinks": [{"cluster_id": "p_actor_infer", "bundles": [{"dp_rank": 0, "gpus": [0]}]}],
            "signals": [{"cluster_id": "q_actor_train", "priority": "ACTOR_TRAINING", "gpus": [0]}],
            "expands": [],
        },
        {"t": 5.0, "kind": "request_done", "pipeline_id": "p", "request": 1, "dp_rank": 0},
        {
            "t": 6.0,
            "kind": "plan",
            "cycle": 2,
            "shrinks": [{"cluster_id": "p_actor_infer", "bundles": [{"dp_rank": 0, "gpus": [0]}]}],
            "signals": [{"cluster_id": "q_actor_train", "priority": "ACTOR_TRAINING", "gpus": [0]}],
            "expands": [],
        },
        {"t": 8.0, "kind": "rank_state", "pipeline_id": "p", "dp_rank": 0, "state": "asleep", "gpus": [0]},
    ]
    head = {"kind": "header", "t": 0.0, "scheduler": {"policy": "round_robin"}}
    summary = {
        "run": {"end_s": 10.0, "simulated_s": 10.0},
        "gpus": [{"train_s": 1.0}, {"train_s": 0.0}],
        "waste": {
            "expands": 3,
            "wasted_expands": 1,
            "pipelines": [{"expand_s": 1.5, "shrink_s": 0.5}, {"expand_s": 1.0, "shrink_s": 0.0}],
        },
    }
    f = policy_figures([head] + rs, summary)
    assert f == {
        "policy": "round_robin",
        "useful_gpu_s": 4.0,
        "gpu_s": 20.0,
        "cost_efficiency_pct": 20.0,
        "preemptions": 1,
        "expands": 3,
        "wasted_expands": 1,
        "resize_s": 3.0,
    }
    assert policy_figures([{"kind": "header", "t": 0.0}] + rs, summary)["policy"] == "gap_ratio"


def test_grant_order_under_acquire_yield_does_not_count_gpus_another_pipeline_holds_for_its_phase(sim_log):
    """The crafted overtaking of test_blind_spot_checks: a training request passed over
    needed GPU 1, held by ppl2's GENERATION. For ppl2's own training that is a finding under
    every policy (a pipeline may preempt its own rollout); for a third pipeline's it is one
    under RLix (it could preempt) but not under acquire_yield (ppl2 holds GPU 1 for its phase)."""
    from tests.unit.test_blind_spot_checks import _first_grant_plan, _pending
    from tests.unit.test_mutations import holdings_at, index

    def passed_over(cluster, policy=None):
        log = copy.deepcopy(sim_log)
        i, plan = _first_grant_plan(log, "ppl1_actor_train")
        assert holdings_at(log, i).owner[1] == "ppl2_actor_infer"
        enq = max(j for j in range(i) if log[j]["kind"] == "enqueued" and log[j]["cluster_id"] == "ppl1_actor_train")
        commit = index(log, lambda r: r["kind"] == "commit" and r["cycle"] == plan["cycle"], i)
        log = _pending(log, enq, 9999, cluster, commit)
        if cluster.startswith("ppl3"):  # ppl3 trains on GPU 1 and infers on GPU 1
            reg = copy.deepcopy(next(r for r in log if r["kind"] == "register" and r["pipeline_id"] == "ppl2"))
            reg.update(pipeline_id="ppl3", cluster_device_mappings={"actor_train": [1], "actor_infer": [1]})
            log.insert(index(log, lambda r: r["kind"] == "register") + 1, reg)
        if policy:
            log[0]["scheduler"] = dict(log[0]["scheduler"], policy=policy)
        return [v.message for v in check_log(reseq(log)) if v.invariant == "grant_order"]

    assert passed_over("ppl2_actor_train") and passed_over("ppl2_actor_train", "acquire_yield")
    assert passed_over("ppl3_actor_train")
    assert passed_over("ppl3_actor_train", "acquire_yield") == []
