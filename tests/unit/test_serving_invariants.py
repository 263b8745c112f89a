"""The serving invariants fire on a broken dispatch trace and stay quiet on a sound one:
routing (where a request may go), stale_serving (which version it is served), and
routing_policy (the round-robin over the ranks one Activate made routable)."""

from __future__ import annotations

import pytest

from harness.logs.invariants import check_log
from tests.unit.invariant_traces import register, reseq


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


def policy_trace(dispatch_ranks, activate_between=False):
    """A pipeline with 4 inference ranks (tp 1); one Activate of all four, then dispatches."""
    reg = register({"actor_train": 1, "actor_infer": 1}, {"actor_train": [0], "actor_infer": [0, 1, 2, 3]})
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
