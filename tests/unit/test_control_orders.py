"""harness/control alone, driven by a small scripted interpreter (no simpy, no torch).

Every order the control logic defines is pinned effect by effect, so a change of order
fails here first: the step sequences, the resize orders, the scheduler cycle's execution
and the pipeline's run/finish sequence. Failures are injected at each effect to pin what
must NOT happen after one (a rank whose sync failed is never activated; a cycle whose
shrink failed starts no expand and commits nothing).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional

import pytest

from harness.control import nemo_async, roll_sync
from harness.control.context import PipelineContext
from harness.control.cycle import execute_cycle, resize_call
from harness.control.effects import effect_fields
from harness.control.interpret import HALT, EffectLog, Refused, interpret, run_blocking
from harness.control.lifecycle import finish, pipeline_run
from harness.control.rank_state import RankLifecycle, RankState
from harness.control.resize import COORDINATOR_GONE, expand_order, shrink_order
from harness.control.versions import VersionBook


class Injected(RuntimeError):
    """The failure a test injects into one effect."""


class Script:
    """A scripted runtime: records every effect (name and fields) in order, answers
    queries from ``answers`` and raises :class:`Injected` at the effect named ``fail_at``
    (its ``nth`` occurrence). Rank and version effects move real ``RankLifecycle`` /
    ``VersionBook`` objects, as both runtimes do, so a test can read the state a failure
    leaves behind."""

    def __init__(
        self,
        ctx: PipelineContext,
        *,
        ranks: int = 2,
        answers: Optional[Dict[str, Any]] = None,
        fail_at: Optional[str] = None,
        nth: int = 1,
    ) -> None:
        self.ctx = ctx
        self.answers = dict(answers or {})
        self.fail_at, self.nth = fail_at, nth
        self.seen: List[str] = []
        self.trace: List[tuple] = []
        self.life = {d: RankLifecycle(ctx.pipeline_id, d) for d in range(ranks)}
        self.routable: set = set()

    def __call__(self, effect: Any) -> Any:
        name = type(effect).__name__
        fields = effect_fields(effect) if hasattr(effect, "__dataclass_fields__") else {}
        self.seen.append(name)
        self.trace.append((name, {k: v for k, v in fields.items() if k != "gen"}))
        if name == self.fail_at and self.seen.count(name) == self.nth:
            raise Injected(f"{name} failed")
        handler = getattr(self, "_" + name, None)
        if handler is not None:
            return handler(effect)
        answer = self.answers.get(name)
        return answer(effect) if callable(answer) else answer

    # the effects whose state the tests read
    def _BuildCache(self, e):
        self.ctx.versions.cache_built(e.version)

    def _PromoteCache(self, e):
        self.ctx.versions.promote(e.version)

    def _PublishVersion(self, e):
        self.ctx.versions.publish(e.version)
        return self.ctx.versions.published

    def _ActiveRanks(self, e):
        return sorted(self.routable)

    def _Wake(self, e):
        for d in e.ranks:
            self.life[d].on("wake")
            self.life[d].on("woken")

    def _SyncFromCache(self, e):
        for d in e.ranks:
            self.life[d].on("refreshed" if d in self.routable else "synced", version=e.version)

    def _Finalize(self, e):
        for d in e.ranks:
            self.life[d].on("finalized")

    def _Activate(self, e):
        for d in e.ranks:
            self.life[d].on("activated")
            self.routable.add(d)

    def _Abort(self, e):
        for d in e.ranks:
            self.routable.discard(d)
            self.life[d].on("abort")

    def _Sleep(self, e):
        for d in e.ranks:
            self.life[d].on("slept", level=e.level)

    def _RunControl(self, e):
        run_blocking(e.gen, self)


def nemo_ctx(steps: int = 2) -> PipelineContext:
    return PipelineContext(
        "p",
        "nemo_async",
        steps,
        sleep_level=2,
        step_target=4,
        gen_estimate=1,
        versions=VersionBook(clamp_bootstrap=True),
    )


def roll_ctx(steps: int = 2) -> PipelineContext:
    return PipelineContext(
        "p",
        "roll_sync",
        steps,
        sleep_level=1,
        step_target=8,
        gen_estimate=8,
        versions=VersionBook(clamp_bootstrap=False),
    )


def run(gen, script: Script) -> List[str]:
    run_blocking(gen, script)
    return script.seen


def promoted(ctx: PipelineContext, version: int = -1) -> PipelineContext:
    ctx.versions.cache_built(version)
    ctx.versions.promote(version)
    return ctx


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


# ---------------------------------------------------------------------------- the scheduler cycle
def plan(shrinks=(("a", [0]),), expands=(("b", [0, 1]),), cycle: int = 7) -> SimpleNamespace:
    return SimpleNamespace(
        cycle=cycle,
        shrink_calls=[SimpleNamespace(pipeline_id=p, dp_ranks_to_remove=list(r)) for p, r in shrinks],
        expand_calls=[SimpleNamespace(pipeline_id=p, dp_ranks_to_add=list(r)) for p, r in expands],
    )


class CycleScript:
    """A scripted scheduler runtime: RunResizes runs each call's ``resize_call`` to its
    end (a failure ends that call and makes the phase report failure, as the runtimes do)."""

    def __init__(
        self,
        the_plan,
        *,
        fail_in: Optional[str] = None,
        gone: Callable[[str], bool] = lambda pid: False,
        commit=("sig",),
    ) -> None:
        self.plan, self.fail_in, self.gone, self.commit = the_plan, fail_in, gone, commit
        self.seen: List[tuple] = []
        self.failed = False
        self.ctxs = {p: promoted(nemo_ctx()) for p in "abc"}

    def __call__(self, effect):
        name = type(effect).__name__
        if name == "PlanCycle":
            self.seen.append((name, effect.reason))
            return self.plan
        if name == "RunResizes":
            self.seen.append((name, effect.phase, effect.cycle, effect.calls))
            for pid, ranks in effect.calls:
                script = Script(self.ctxs[pid], fail_at=self.fail_in, answers={"CoordinatorAlive": not self.gone(pid)})
                if effect.phase == "shrink":  # the donor's ranks are serving
                    script.routable = {0, 1}
                    for life in script.life.values():
                        life.state, life.finalized = RankState.ROUTABLE, True
                try:
                    run(resize_call(self.ctxs[pid], effect.phase, ranks, effect.cycle), script)
                except Injected:
                    self.failed = True
                self.seen.append(("resize", pid, effect.phase, tuple(script.seen)))
            return not self.failed
        if name == "CommitCycle":
            self.seen.append((name,))
            return None if self.commit is None else list(self.commit)
        self.seen.append((name,) + tuple(getattr(effect, "signals", ())))
        return None


def test_cycle_execution_order():
    script = CycleScript(plan(shrinks=(("a", [1]), ("c", [0])), expands=(("b", [0, 1]),)))
    run_blocking(execute_cycle("wakeup"), script)
    kinds = [s[0] if s[0] != "RunResizes" else f"RunResizes:{s[1]}" for s in script.seen]
    assert kinds == [
        "PlanCycle",
        "RunResizes:shrink",
        "resize",
        "resize",
        "RunResizes:expand",
        "resize",
        "CommitCycle",
        "SignalWaiters",
    ]
    assert script.seen[1] == ("RunResizes", "shrink", 7, (("a", (1,)), ("c", (0,))))
    assert script.seen[4] == ("RunResizes", "expand", 7, (("b", (0, 1)),))
    assert script.seen[2][3] == (
        "CoordinatorAlive",
        "RunControl",
        "LockCoordinator",
        "Abort",
        "Drain",
        "Sleep",
        "UnlockCoordinator",
    )
    assert script.seen[-1] == ("SignalWaiters", "sig")


def test_cycle_with_nothing_to_resize_still_commits_and_signals():
    script = CycleScript(plan(shrinks=(), expands=()))
    run_blocking(execute_cycle("background:x"), script)
    assert [s[0] for s in script.seen] == ["PlanCycle", "RunResizes", "RunResizes", "CommitCycle", "SignalWaiters"]


@pytest.mark.parametrize("fail_in", ["Abort", "Drain", "Sleep"])
def test_a_shrink_failing_mid_cycle_starts_no_expand_and_commits_nothing(fail_in):
    script = CycleScript(plan(), fail_in=fail_in)
    run_blocking(execute_cycle("wakeup"), script)
    assert [s[0] for s in script.seen] == ["PlanCycle", "RunResizes", "resize"]
    assert script.seen[2][3][-1] == fail_in


def test_an_expand_failing_commits_nothing_and_signals_no_one():
    script = CycleScript(plan(), fail_in="SyncFromCache")
    run_blocking(execute_cycle("wakeup"), script)
    assert [s[0] for s in script.seen] == ["PlanCycle", "RunResizes", "resize", "RunResizes", "resize"]


def test_a_failed_plan_or_commit_fails_the_scheduler():
    script = CycleScript(None)
    run_blocking(execute_cycle("wakeup"), script)
    assert [s[0] for s in script.seen] == ["PlanCycle", "SchedulerFailed"]
    script = CycleScript(plan(), commit=None)
    run_blocking(execute_cycle("wakeup"), script)
    assert [s[0] for s in script.seen][-2:] == ["CommitCycle", "SchedulerFailed"]


def test_a_resize_for_a_gone_pipeline_is_a_no_op():
    script = CycleScript(plan(), gone=lambda pid: pid == "b")
    run_blocking(execute_cycle("wakeup"), script)
    assert script.seen[4] == ("resize", "b", "expand", ("CoordinatorAlive",))
    assert script.seen[-2:] == [("CommitCycle",), ("SignalWaiters", "sig")]


# ---------------------------------------------------------------------------- run and finish
RUN_HEAD = ["Register", "Admit", "StartWorkers"]


def test_nemo_pipeline_run_order():
    ctx = nemo_ctx(steps=2)
    script = Script(ctx, answers={"GenerationHeld": True})
    seen = run(pipeline_run(ctx), script)
    top = [
        n
        for n in seen
        if n
        in (
            "Register",
            "Admit",
            "StartWorkers",
            "StartWatchdog",
            "RunControl",
            "StepDone",
            "MarkFinished",
            "ClearProgress",
            "GenerationHeld",
            "AwaitRelease",
            "HoldCoordinator",
            "Unregister",
            "Teardown",
            "FreeCoordinator",
        )
    ]
    assert top == RUN_HEAD + [
        "StartWatchdog",
        "RunControl",
        "RunControl",
        "StepDone",
        "RunControl",
        "StepDone",
        "MarkFinished",
        "ClearProgress",
        "GenerationHeld",
        "AwaitRelease",
        "HoldCoordinator",
        "Unregister",
        "Teardown",
        "FreeCoordinator",
    ]
    scopes = [(f["scope"], f["step"]) for n, f in script.trace if n == "RunControl"]
    assert scopes == [("init", None), ("step", 0), ("step", 1)]


def test_roll_pipeline_run_has_no_watchdog():
    ctx = roll_ctx(steps=1)
    seen = run(pipeline_run(ctx), Script(ctx, answers={"GenerationHeld": False}))
    assert "StartWatchdog" not in seen and seen[:3] == RUN_HEAD


def test_finish_order_with_and_without_generation_ranks():
    ctx = nemo_ctx()
    assert run(finish(ctx), Script(ctx, answers={"GenerationHeld": True})) == [
        "MarkFinished",
        "ClearProgress",
        "GenerationHeld",
        "AwaitRelease",
        "HoldCoordinator",
        "Unregister",
        "Teardown",
        "FreeCoordinator",
    ]
    assert run(finish(ctx), Script(ctx, answers={"GenerationHeld": False})) == [
        "MarkFinished",
        "ClearProgress",
        "GenerationHeld",
        "HoldCoordinator",
        "Unregister",
        "Teardown",
        "FreeCoordinator",
    ]


def test_a_runtime_halt_closes_the_generator_and_nothing_after_runs():
    ctx = nemo_ctx()
    seen = run(finish(ctx), Script(ctx, answers={"GenerationHeld": HALT}))
    assert seen == ["MarkFinished", "ClearProgress", "GenerationHeld"]


@pytest.mark.parametrize("fail_at", ["Register", "Admit", "RunControl", "StepDone", "ClearProgress", "AwaitRelease"])
def test_a_failure_in_the_run_never_unregisters_silently(fail_at):
    ctx = nemo_ctx(steps=1)
    script = Script(ctx, answers={"GenerationHeld": True}, fail_at=fail_at)
    with pytest.raises(Injected):
        run(pipeline_run(ctx), script)
    assert "Unregister" not in script.seen and script.seen[-1] == fail_at


# ---------------------------------------------------------------------------- the logged loop
def test_drive_records_start_and_end_of_every_effect_and_a_refusal_as_error():
    ctx = promoted(nemo_ctx())
    records: List[Dict[str, Any]] = []
    clock = iter(range(100))
    script = Script(ctx, answers={"LockCoordinator": Refused("gone")})

    def gpus_of(e):
        return [9] if hasattr(e, "ranks") else None

    run_blocking(
        shrink_order(ctx, [0]),
        script,
        log=EffectLog(records.append, lambda: float(next(clock)), "p", "shrink", None, 3, gpus_of),
    )
    assert records == [
        {
            "seq": 0,
            "t": 0.0,
            "kind": "effect_start",
            "pipeline_id": "p",
            "effect": "LockCoordinator",
            "args": {"purpose": "shrink"},
            "scope": "shrink",
            "step": None,
            "cycle": 3,
        },
        {
            "seq": 0,
            "t": 1.0,
            "kind": "effect_end",
            "pipeline_id": "p",
            "effect": "LockCoordinator",
            "args": {"purpose": "shrink"},
            "error": "gone",
            "scope": "shrink",
            "step": None,
            "cycle": 3,
        },
    ]
    records.clear()
    script.answers.clear()
    run_blocking(nemo_async.train_step(ctx, 0), script, log=EffectLog(records.append, lambda: 0.0, "p", "step", 0))
    starts = [r["effect"] for r in records if r["kind"] == "effect_start"]
    ends = [r["effect"] for r in records if r["kind"] == "effect_end"]
    assert starts == ends == [n for n in script.seen[1:]]
    publish_end = next(r for r in records if r["kind"] == "effect_end" and r["effect"] == "PublishVersion")
    assert publish_end["result"] == 1 and "cycle" not in publish_end


def test_drive_guard_aborts_before_the_next_effect():
    ctx = promoted(nemo_ctx())
    script = Script(ctx)
    calls = []

    def guard():
        calls.append(1)
        if len(calls) > 2:
            raise Injected("aborted")

    with pytest.raises(Injected):
        run_blocking(
            expand_order(ctx, [0]), script, log=EffectLog(lambda r: None, lambda: 0.0, "p", "expand"), guard=guard
        )
    assert script.seen == ["LockCoordinator", "MarkInactive"]


def test_run_blocking_refuses_a_handler_that_yields():
    def waits(effect):
        yield "an event"

    with pytest.raises(RuntimeError, match="must complete"):
        run_blocking(nemo_async.initialize(nemo_ctx()), waits)


def test_interpret_runs_generator_handlers_with_yield_from():
    ctx = nemo_ctx()

    def handler(effect):
        yield ("wait", type(effect).__name__)
        return None

    waited = list(interpret(nemo_async.initialize(ctx), handler))
    assert [w[1] for w in waited][:3] == ["RequestGpus", "ReloadTrainComm", "BuildCache"]
