"""The plan-shape invariants on small hand-written logs: plan_validation names the RLix
condition a plan breaks, grant_shape wants whole device mappings and whole TP bundles."""

from __future__ import annotations

import pytest

from harness.logs.invariants import check_log
from tests.unit.invariant_traces import HEAD, register


REG = register({"actor_train": 1, "actor_infer": 2}, {"actor_train": [0, 1], "actor_infer": [0, 1, 2, 3]})


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
