"""The selective sync's order (harness/control/selective_sync.py), driven by a scripted
interpreter: no simpy, no torch. Every order is pinned effect by effect against a list
written out here, and the teardown (group destroyed, lock released, a failed sync_end)
is checked on the error and the timeout paths."""

from __future__ import annotations

import pytest

from harness.control import selective_sync as ss
from harness.control.interpret import run_blocking


def plan(ipc=(0,), broadcast=(1,), buckets=(10, 10, 4)):
    return ss.plan_sync(7, buckets, ipc, broadcast, "g", (0,) + tuple(2 + d for d in broadcast))


def script(p, fail_at=None, expire_at=None, destroy_result=True):
    """Run the sync; return the effects seen as short strings and the error raised."""
    seen = []
    count = {"n": 0}

    def handle(e):
        name = type(e).__name__
        tag = {
            "Emit": lambda: f"Emit {e.kind}",
            "StageBucket": lambda: f"Stage {e.bucket}",
            "SendIpc": lambda: f"Ipc {e.bucket}",
            "Broadcast": lambda: f"Bcast {e.bucket}",
            "BucketBarrier": lambda: f"Barrier {e.bucket}",
            "FreeStaging": lambda: f"Free {e.bucket}",
        }
        seen.append(tag.get(name, lambda: name)())
        if fail_at is not None and seen[-1] == fail_at:
            raise RuntimeError("boom")
        if name == "DestroySyncGroup":
            return destroy_result
        return None

    def expired():
        count["n"] += 1
        return expire_at is not None and count["n"] >= expire_at

    try:
        value = run_blocking(ss.selective_sync(p), handle, deadline=ss.sync_deadline(expired))
        return seen, None, value
    except Exception as exc:  # noqa: BLE001 - the test looks at which
        return seen, exc, None


def bucket(b, ipc=True, bcast=True):
    out = [f"Stage {b}"] + ([f"Ipc {b}"] if ipc else []) + ([f"Bcast {b}"] if bcast else []) + [f"Barrier {b}"]
    out += (["Emit sync_bucket"] if ipc else []) + (["Emit sync_bucket"] if bcast else []) + [f"Free {b}"]
    return out


def test_both_paths_group_around_the_buckets_each_bucket_staged_handed_broadcast_barrier_freed():
    seen, err, value = script(plan())
    assert err is None and value == {"ipc": 24, "broadcast": 24}
    assert seen == (
        ["LockCache", "Emit sync_start", "CreateSyncGroup", "Emit group_create"]
        + bucket(0)
        + bucket(1)
        + bucket(2)
        + ["FinishSend", "DestroySyncGroup", "Emit group_destroy", "Emit sync_end", "UnlockCache"]
    )


def test_ipc_only_sync_sets_no_group_up():
    seen, err, _ = script(plan(broadcast=()))
    assert err is None
    assert "CreateSyncGroup" not in seen and "DestroySyncGroup" not in seen
    assert seen == ["LockCache", "Emit sync_start"] + bucket(0, bcast=False) + bucket(1, bcast=False) + bucket(
        2, bcast=False
    ) + ["FinishSend", "Emit sync_end", "UnlockCache"]


@pytest.mark.parametrize("fail_at", ["Bcast 1", "Ipc 0", "Barrier 2", "Stage 0", "FinishSend", "CreateSyncGroup"])
def test_a_failure_anywhere_destroys_a_created_group_ends_the_sync_failed_and_unlocks(fail_at):
    seen, err, _ = script(plan(), fail_at=fail_at)
    assert isinstance(err, RuntimeError) and str(err) == "boom"
    created = "Emit group_create" in seen
    tail = (["DestroySyncGroup", "Emit group_destroy"] if created else []) + ["Emit sync_end", "UnlockCache"]
    assert seen[seen.index(fail_at) + 1 :] == tail
    assert "FinishSend" not in seen[seen.index(fail_at) + 1 :]


def test_the_timeout_is_thrown_in_and_the_group_still_goes():
    seen, err, _ = script(plan(), expire_at=8)  # expires before the 8th effect
    assert isinstance(err, ss.SyncTimeout) and "150s" in str(err)
    assert seen[-4:] == ["DestroySyncGroup", "Emit group_destroy", "Emit sync_end", "UnlockCache"]
    assert ss.SYNC_TIMEOUT_S == 150.0  # RLix ROLL_SELECTIVE_MODEL_UPDATE_TIMEOUT_S


def test_a_group_the_runtime_kept_is_not_recorded_destroyed():
    seen, err, _ = script(plan(), destroy_result=False)
    assert err is None and "Emit group_destroy" not in seen and "DestroySyncGroup" in seen


def test_a_failing_destroy_after_an_error_keeps_the_first_error_and_records_no_destroy():
    records = []

    def handle(e):
        if isinstance(e, ss.Emit):
            records.append((e.kind, e.fields))
        if isinstance(e, ss.Broadcast):
            raise RuntimeError("first")
        if isinstance(e, ss.DestroySyncGroup):
            raise RuntimeError("second")

    with pytest.raises(RuntimeError, match="first"):
        run_blocking(ss.selective_sync(plan()), handle)
    kinds = [k for k, _ in records]
    assert "group_destroy" not in kinds and kinds[-1] == "sync_end"
    assert records[-1][1]["ok"] is False and "first" in records[-1][1]["error"]


@pytest.mark.parametrize("second", ["Emit group_destroy", "Emit sync_end", "UnlockCache"])
def test_any_teardown_effect_failing_after_an_error_keeps_the_first_error_and_the_rest_of_the_teardown(second):
    seen = []

    def handle(e):
        tag = f"Emit {e.kind}" if isinstance(e, ss.Emit) else type(e).__name__
        seen.append(tag)
        if isinstance(e, ss.Broadcast):
            raise RuntimeError("first")
        if tag == second:
            raise RuntimeError("second")

    with pytest.raises(RuntimeError, match="first"):
        run_blocking(ss.selective_sync(plan()), handle)
    assert seen[seen.index("Broadcast") + 1 :] == [
        "DestroySyncGroup",
        "Emit group_destroy",
        "Emit sync_end",
        "UnlockCache",
    ]


def test_a_yielding_handler_is_refused_by_the_blocking_runner():
    def handle(e):
        yield "time"

    with pytest.raises(RuntimeError, match="yielded"):
        run_blocking(ss.selective_sync(plan()), handle)


@pytest.mark.parametrize(
    "kind, now",
    [
        ("refit_bucket", "sync_bucket"),
        ("nccl_group", "group_create"),
        ("bucket_send", "sync_bucket"),
        ("bucket_recv", "sync_bucket"),
    ],
)
def test_a_log_in_the_retired_sync_vocabulary_is_refused_naming_the_kind(tmp_path, kind, now):
    import json

    from harness.logs.records import InputError, read_records
    from harness.logs.writer import dumps, header_record

    path = tmp_path / "old.jsonl"
    path.write_text(
        dumps({**header_record({"nodes": 1, "gpus_per_node": 2}), "seq": 0, "t": 0})
        + "\n"
        + json.dumps({"seq": 1, "t": 0.5, "kind": kind, "pipeline_id": "p"})
        + "\n"
    )
    with pytest.raises(InputError) as err:
        read_records(str(path))
    msg = str(err.value)
    assert "\n" not in msg and f"{kind!r} was retired" in msg and now in msg and "old.jsonl:2" in msg
