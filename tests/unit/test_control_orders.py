"""harness/control alone, driven by a small scripted interpreter (no simpy, no torch;
tests/unit/control_script.py).

The step and resize orders the control logic defines are pinned effect by effect, so a
change of order fails here first: the step sequences and the expand and shrink orders.
Failures are injected at each expand effect to pin what must NOT happen after one (a rank
whose sync failed is never activated; a failed publish never activates nor releases). The
scheduler cycle's order: test_control_cycle_order.py; the pipeline's run and finish:
test_control_run_order.py; the effect log the drive writes: test_control_effect_log.py.
"""

from __future__ import annotations

import pytest

from harness.control import nemo_async, roll_sync
from harness.control.rank_state import RankState
from harness.control.resize import COORDINATOR_GONE, expand_order, shrink_order
from tests.unit.control_script import Injected, Script, nemo_ctx, promoted, roll_ctx, run


# ---------------------------------------------------------------------------- step orders
def test_initialize_order():
    ctx = nemo_ctx()
    script = Script(ctx)
    run(nemo_async.initialize(ctx), script)
    assert script.trace == [
        (
            "RequestGpus",
            {"cluster": "actor_train", "priority": "INITIALIZATION", "global_step": None, "step_target_estimate": None},
        ),
        ("ReloadTrainComm", {}),  # the training groups are created at init ...
        ("BuildCache", {"version": -1}),
        ("PromoteCache", {"version": -1}),
        ("OffloadTraining", {}),
        # ... and NeMo keeps them alive (debug #24; harness/control/residency.py)
        ("ReleaseGpus", {"cluster": "actor_train", "global_step": None}),
        ("BeginProgressBatch", {"global_step": 0}),
        (
            "RequestGpus",
            {"cluster": "actor_infer", "priority": "GENERATION", "global_step": 0, "step_target_estimate": 1},
        ),
    ]


def test_nemo_train_step_order_with_ranks_serving():
    ctx = promoted(nemo_ctx())
    script = Script(ctx)
    script.routable = {1}
    script.life[1].state = RankState.ROUTABLE
    run(nemo_async.train_step(ctx, 0), script)
    assert script.seen == [
        "WaitBatch",
        "RequestGpus",
        "ReloadTrainComm",
        "Compute",
        "BuildCache",
        "OffloadTraining",
        "DestroyTrainComm",
        "LockCoordinator",
        "PromoteCache",
        "ActiveRanks",
        "SyncFromCache",
        "Finalize",
        "PublishVersion",
        "UnlockCoordinator",
        "ReleaseGpus",
        "BeginProgressBatch",
    ]
    assert script.trace[1][1]["priority"] == "ACTOR_TRAINING"
    assert script.trace[10] == ("SyncFromCache", {"ranks": [1], "version": 1, "path": "active"})
    assert script.trace[12] == ("PublishVersion", {"version": 1, "path": "active"})
    assert script.life[1].weights_version == 1 and ctx.versions.published == 1


def test_nemo_train_step_without_serving_ranks_skips_the_sync_but_still_publishes():
    ctx = promoted(nemo_ctx())
    script = Script(ctx)
    run(nemo_async.train_step(ctx, 0), script)
    assert "SyncFromCache" not in script.seen and "Finalize" not in script.seen
    assert script.seen[script.seen.index("PromoteCache") + 1 :] == [
        "ActiveRanks",
        "PublishVersion",
        "UnlockCoordinator",
        "ReleaseGpus",
        "BeginProgressBatch",
    ]


def test_roll_train_step_order():
    ctx = promoted(roll_ctx())
    script = Script(ctx)
    run(roll_sync.train_step(ctx, 0), script)
    # the old log-probs compute reloads the groups itself (state_offload_manger) and, with RLix's
    # is_offload_states=False, offloads nothing before release_then_request (residency.py)
    assert script.seen == [
        "BeginProgressBatch",
        "RequestGpus",
        "WaitBatch",
        "EndProgressBatch",
        "AwaitRelease",
        "RequestGpus",
        "Compute",
        "ReleaseThenRequest",
        "Compute",
        "BuildCache",
        "PromoteCache",
        "OffloadTraining",
        "DestroyTrainComm",
        "ReleaseGpus",
    ]
    priorities = [f["priority"] for n, f in script.trace if n == "RequestGpus"]
    assert priorities == ["GENERATION", "OLD_LOG_PROBS"]
    assert [f["what"] for n, f in script.trace if n == "Compute"] == ["old_log_probs", "train"]


# ---------------------------------------------------------------------------- resize orders
def test_expand_order():
    ctx = promoted(nemo_ctx())
    script = Script(ctx)
    run(expand_order(ctx, [1, 0]), script)
    assert script.trace == [
        ("LockCoordinator", {"purpose": "expand"}),
        ("MarkInactive", {"ranks": [0, 1]}),
        ("Wake", {"ranks": [0, 1]}),
        ("SyncFromCache", {"ranks": [0, 1], "version": -1, "path": "expand"}),
        ("Finalize", {"ranks": [0, 1]}),
        ("PublishVersion", {"version": -1, "path": "expand"}),
        ("Activate", {"ranks": [0, 1]}),
        ("UnlockCoordinator", {"purpose": "expand"}),
    ]
    assert all(life.state is RankState.ROUTABLE for life in script.life.values())
    assert ctx.versions.published == 0  # NeMo publishes the bootstrap -1 as 0


def test_expand_before_any_promoted_cache_is_refused():
    ctx = nemo_ctx()
    with pytest.raises(RuntimeError, match="before any cache was promoted"):
        run(expand_order(ctx, [0]), Script(ctx))


def test_shrink_order():
    ctx = promoted(nemo_ctx())
    script = Script(ctx)
    run(expand_order(ctx, [0, 1]), script)
    script.seen.clear()
    script.trace.clear()
    run(shrink_order(ctx, [1, 0]), script)
    assert script.trace == [
        ("LockCoordinator", {"purpose": "shrink"}),
        ("Abort", {"ranks": [0, 1]}),
        ("Drain", {"ranks": [0, 1]}),
        ("Sleep", {"ranks": [0, 1], "level": 2}),
        ("UnlockCoordinator", {"purpose": "shrink"}),
    ]
    assert all(life.state is RankState.ASLEEP and life.weights_version is None for life in script.life.values())


@pytest.mark.parametrize("order", [shrink_order, expand_order])
def test_a_gone_coordinator_refuses_the_lock_and_the_resize_does_nothing(order):
    ctx = promoted(nemo_ctx())
    script = Script(ctx, answers={"LockCoordinator": COORDINATOR_GONE})
    run(order(ctx, [0]), script)
    assert script.seen == ["LockCoordinator"]  # no unlock either: the lock was never held


# ---------------------------------------------------------------------------- failures in the expand
EXPAND_EFFECTS = [
    "LockCoordinator",
    "MarkInactive",
    "Wake",
    "SyncFromCache",
    "Finalize",
    "PublishVersion",
    "Activate",
    "UnlockCoordinator",
]


@pytest.mark.parametrize("fail_at", EXPAND_EFFECTS)
def test_a_failure_at_any_expand_effect_stops_the_order_there(fail_at):
    ctx = promoted(nemo_ctx())
    script = Script(ctx, fail_at=fail_at)
    with pytest.raises(Injected):
        run(expand_order(ctx, [0, 1]), script)
    assert script.seen == EXPAND_EFFECTS[: EXPAND_EFFECTS.index(fail_at) + 1]
    if EXPAND_EFFECTS.index(fail_at) <= EXPAND_EFFECTS.index("Activate"):
        assert not script.routable
        assert all(life.state is not RankState.ROUTABLE for life in script.life.values())


def test_sync_fails_ranks_stay_pre_activation_and_are_never_activated():
    ctx = promoted(nemo_ctx())
    script = Script(ctx, fail_at="SyncFromCache")
    with pytest.raises(Injected):
        run(expand_order(ctx, [0, 1]), script)
    assert [life.state for life in script.life.values()] == [RankState.AWAKE_UNROUTED] * 2
    assert "Activate" not in script.seen and ctx.versions.published is None
    # and the lifecycle itself refuses to route them: activation needs sync + finalize
    with pytest.raises(RuntimeError, match="not allowed in state awake_unrouted"):
        script.life[0].on("activated")


def test_publish_fails_ranks_are_synced_but_never_activated():
    ctx = promoted(nemo_ctx())
    script = Script(ctx, fail_at="PublishVersion")
    with pytest.raises(Injected):
        run(expand_order(ctx, [0]), script)
    assert script.life[0].state is RankState.SYNCED and script.life[0].finalized
    assert "Activate" not in script.seen and ctx.versions.published is None


def test_active_refresh_publish_fails_actor_train_is_never_released():
    ctx = promoted(nemo_ctx())
    script = Script(ctx, fail_at="PublishVersion")
    with pytest.raises(Injected):
        run(nemo_async.train_step(ctx, 0), script)
    assert "ReleaseGpus" not in script.seen and "UnlockCoordinator" not in script.seen


@pytest.mark.parametrize(
    "fail_at",
    [
        "WaitBatch",
        "RequestGpus",
        "ReloadTrainComm",
        "Compute",
        "BuildCache",
        "OffloadTraining",
        "DestroyTrainComm",
        "PromoteCache",
    ],
)
def test_a_failure_before_the_publish_never_publishes_nor_releases(fail_at):
    ctx = promoted(nemo_ctx())
    script = Script(ctx, fail_at=fail_at)
    with pytest.raises(Injected):
        run(nemo_async.train_step(ctx, 0), script)
    assert "PublishVersion" not in script.seen and "ReleaseGpus" not in script.seen
