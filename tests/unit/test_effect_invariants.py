"""The pipeline-effect invariants fire on a broken effect sequence and stay quiet on a sound
one: activate_after_sync, versions, release_after_publish, step_order, data_plane."""

from __future__ import annotations

import pytest

from harness.logs.invariants import check_log
from tests.unit.invariant_traces import reseq


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
