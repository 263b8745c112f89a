"""The weight-sync invariants on gate and effect records: sync_groups (a sync's collective
group is a proper subset of the world and dies with its sync) and cache_lock (a cache build
never overlaps a sync reading the cache)."""

from __future__ import annotations

from harness.logs.invariants import check_log


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


def step_effect(seq, kind, name, **args):
    """An effect record of pipeline p's step scope."""
    return {"seq": seq, "t": seq, "kind": kind, "pipeline_id": "p", "effect": name, "args": args, "scope": "step"}


def test_cache_lock_treats_an_unlocked_build_as_holding_the_cache_for_its_whole_effect():
    e = step_effect
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
    e = step_effect
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
