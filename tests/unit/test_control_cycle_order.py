"""The scheduler cycle's execution order (harness/control/cycle.py), driven by a scripted
scheduler runtime whose resizes run the real resize orders: plan, shrinks, expands, commit,
signals, and what a failure in a shrink or an expand, a failed plan or commit, or a gone
pipeline leaves undone (a cycle whose shrink failed starts no expand and commits nothing)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, List, Optional

import pytest

from harness.control.cycle import execute_cycle, resize_call
from harness.control.interpret import run_blocking
from harness.control.rank_state import RankState
from tests.unit.control_script import Injected, Script, nemo_ctx, promoted, run


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
