"""SchedulerModel.background_rebalance_reason(): RLix's 1 s poll trigger (docs/modelled-systems.md#rlix-scheduling-loop-and-background-rebalance).

"2.2": a GENERATION allocation with no active ranks while its pipeline has demand.
"2.1": >= 2 GEN allocations and the worst ceil(50 %) pipelines by completion have a
share of weighted remaining demand that deviates from their share of active GEN GPUs by
more than the threshold (10 pp by default). Nothing triggers while any request or
planned release is pending (the scheduler is then event-driven).
"""

from __future__ import annotations

import pytest

from harness.scheduler.model import SchedulerModel
from harness.scheduler.options import SchedulerOptions
from harness.scheduler.progress import ProgressReport
from harness.scheduler.types import Priority
from harness.scheduler.topology import ClusterTopology


def gen(pid):
    return f"{pid}_actor_infer"


def active(m, pid):
    return len(m.state.allocations[gen(pid)].active_dp_ranks)


def shared_pair(options=None):
    """A and B share infer GPUs 0..3 (tp 1) and hold 2 active ranks each; A also has actor_train [0,1]."""
    m = SchedulerModel(ClusterTopology(1, 4), options)
    m.register("A", {"actor_infer": 1, "actor_train": 1}, {"actor_infer": [0, 1, 2, 3], "actor_train": [0, 1]})
    m.register("B", {"actor_infer": 1}, {"actor_infer": [0, 1, 2, 3]})
    for pid in ("A", "B"):
        m.admit(pid)
        m.request(gen(pid), Priority.GENERATION, step_target_estimate=10)
    m.run_cycle()
    assert (active(m, "A"), active(m, "B")) == (2, 2)
    m.drain()
    return m


def one_vs_three(options=None):
    """A (infer [0]) holds 1 GEN GPU, B (infer [1,2,3]) holds 3."""
    m = SchedulerModel(ClusterTopology(1, 4), options)
    m.register("A", {"actor_infer": 1}, {"actor_infer": [0]})
    m.register("B", {"actor_infer": 1}, {"actor_infer": [1, 2, 3]})
    m.admit("A")
    m.admit("B")
    m.request(gen("B"), Priority.GENERATION, step_target_estimate=10)
    m.run_cycle()
    m.request(gen("A"), Priority.GENERATION, step_target_estimate=10)
    m.run_cycle()
    assert (active(m, "A"), active(m, "B")) == (1, 3)
    m.drain()
    return m


def report(m, pid, target, completed):
    m.report_progress(ProgressReport(pid, target, completed))


# --------------------------------------------------------------------------- 2.1


def test_no_demand_anywhere_gives_none():
    m = shared_pair()
    assert m.background_rebalance_reason() is None


def test_imbalance_triggers_2_1():
    m = shared_pair()
    report(m, "A", 100, 0)  # completion 0, all the demand, half the GPUs: 50 pp off
    report(m, "B", 100, 100)
    assert m.background_rebalance_reason() == "2.1"


def test_balanced_demand_gives_none():
    m = shared_pair()
    report(m, "A", 100, 40)
    report(m, "B", 100, 40)
    assert m.background_rebalance_reason() is None


def test_rebalance_cycle_moves_gpus_but_floor_keeps_the_trigger():
    m = shared_pair()
    report(m, "A", 100, 0)
    report(m, "B", 100, 100)
    assert m.background_rebalance_reason() == "2.1"
    m.run_cycle("background_rebalance")
    assert (active(m, "A"), active(m, "B")) == (3, 1)  # B keeps its one-bundle floor
    # A: all demand, 3/4 GPUs -> 25 pp, still above threshold; but no further move is
    # possible (B is at its floor), which is RLix's behaviour too.
    assert m.background_rebalance_reason() == "2.1"


@pytest.mark.parametrize(
    "a_completed,b_completed,expected",
    [
        (1, 83, None),  # A: 3/20 of demand = 15 %, 1/4 of GPUs = 25 % -> exactly 10.0 pp: not > 10
        (1, 82, "2.1"),  # A: 3/21 = 14.3 % -> 10.7 pp
        (1, 84, None),  # A: 3/19 = 15.8 % -> 9.2 pp
    ],
)
def test_threshold_is_strictly_greater_than_10_pp(a_completed, b_completed, expected):
    m = one_vs_three()
    report(m, "A", 4, a_completed)  # remaining 3, completion 0.25 (worst)
    report(m, "B", 100, b_completed)  # remaining 17/18/16, completion > 0.8
    assert m.background_rebalance_reason() == expected


def test_exact_10_pp_boundary_is_exactly_representable():
    # Guard for the test above: the deviation is exactly 10.0 in floats, so it really
    # tests '>' versus '>='.
    assert abs(3.0 / 20.0 - 1 / 4.0) * 100.0 == 10.0


@pytest.mark.parametrize("threshold,expected", [(9.9, "2.1"), (10.0, None), (25.0, None)])
def test_threshold_option_is_respected_at_10_pp(threshold, expected):
    m = one_vs_three(SchedulerOptions(rebalance_threshold_pp=threshold))
    report(m, "A", 4, 1)
    report(m, "B", 100, 83)
    assert m.background_rebalance_reason() == expected


@pytest.mark.parametrize("threshold,expected", [(49.0, "2.1"), (50.0, None), (60.0, None)])
def test_threshold_option_is_respected_at_50_pp(threshold, expected):
    m = shared_pair(SchedulerOptions(rebalance_threshold_pp=threshold))
    report(m, "A", 100, 0)
    report(m, "B", 100, 100)
    assert m.background_rebalance_reason() == expected


def _three_singles(options=None):
    """A, B, C each hold one GEN GPU. Completions 0.2 / 0.8 / 0.9, remaining 8 / 2 / 5."""
    m = SchedulerModel(ClusterTopology(1, 3), options)
    for i, pid in enumerate("ABC"):
        m.register(pid, {"actor_infer": 1}, {"actor_infer": [i]})
        m.admit(pid)
        m.request(gen(pid), Priority.GENERATION, step_target_estimate=10)
    m.run_cycle()
    assert [active(m, p) for p in "ABC"] == [1, 1, 1]
    report(m, "A", 10, 2)
    report(m, "B", 10, 8)
    report(m, "C", 50, 45)
    return m


def test_worst_half_rounds_up():
    # ceil(3 * 0.5) = 2 worst pipelines (A, B): demand (8+2)/15 = 2/3, GPUs 2/3 -> no trigger.
    # Had only the single worst (A) been compared: 8/15 vs 1/3 = 20 pp -> trigger.
    assert _three_singles().background_rebalance_reason() is None


def test_worst_fraction_option_is_respected():
    m = _three_singles(SchedulerOptions(rebalance_worst_fraction=0.3))  # ceil(0.9) = 1 -> A alone
    assert m.background_rebalance_reason() == "2.1"


def _three_with(progress):
    m = SchedulerModel(ClusterTopology(1, 3))
    for i, pid in enumerate("XYZ"):
        m.register(pid, {"actor_infer": 1}, {"actor_infer": [i]})
        m.admit(pid)
        m.request(gen(pid), Priority.GENERATION, step_target_estimate=10)
    m.run_cycle()
    assert [active(m, p) for p in "XYZ"] == [1, 1, 1]
    for pid, (target, completed) in progress.items():
        report(m, pid, target, completed)
    return m


def test_worst_is_by_completion_not_by_remaining():
    # Remaining X=150, Y=50, Z=100 in both cases; only the completions differ.
    # Worst two by completion X (0.0), Y (0.5): 200/300 of demand vs 2/3 of GPUs -> none.
    # (Largest-remaining X, Z would be 250/300 -> 16.7 pp; smallest Y, Z 150/300 -> 16.7 pp.)
    m = _three_with({"X": (150, 0), "Y": (100, 50), "Z": (1000, 900)})
    assert m.background_rebalance_reason() is None
    # Now Y is the most complete (0.99): worst two are X, Z -> 250/300 vs 2/3 -> 16.7 pp.
    m = _three_with({"X": (150, 0), "Y": (5000, 4950), "Z": (1000, 900)})
    assert m.background_rebalance_reason() == "2.1"


def test_remaining_is_weighted_by_tp():
    # A: tp 2 holding 2 GPUs, B: tp 1 holding 2 GPUs. Equal remaining 10 -> weights 20 vs 10.
    m = SchedulerModel(ClusterTopology(1, 4))
    m.register("A", {"actor_infer": 2}, {"actor_infer": [0, 1]})
    m.register("B", {"actor_infer": 1}, {"actor_infer": [2, 3]})
    m.admit("A")
    m.admit("B")
    m.request(gen("A"), Priority.GENERATION, step_target_estimate=10)
    m.request(gen("B"), Priority.GENERATION, step_target_estimate=30)  # so B gets both its ranks
    m.run_cycle()
    assert (active(m, "A"), active(m, "B")) == (1, 2)
    report(m, "A", 10, 0)  # completion 0 (worst): weighted share 20/30 = 66.7 % vs 50 % GPUs
    report(m, "B", 20, 10)
    assert m.background_rebalance_reason() == "2.1"
    # Unweighted it would be 10/20 = 50 % vs 50 % -> none; check the weighting matters:
    m.report_progress(ProgressReport("A", 10, 5))  # A weighted 10/20 = 50 %, completion 0.5 (B too)
    assert m.background_rebalance_reason() is None


# --------------------------------------------------------------------------- fewer than 2 GEN allocations


def test_single_gen_allocation_never_triggers_2_1():
    m = SchedulerModel(ClusterTopology(1, 4))
    m.register("A", {"actor_infer": 1}, {"actor_infer": [0, 1]})
    m.admit("A")
    m.request(gen("A"), Priority.GENERATION, step_target_estimate=10)
    m.run_cycle()
    report(m, "A", 100, 0)
    assert m.background_rebalance_reason() is None


def test_actor_infer_held_at_init_priority_is_not_a_gen_row():
    m = SchedulerModel(ClusterTopology(1, 4))
    m.register("A", {"actor_infer": 1}, {"actor_infer": [0, 1]})
    m.register("B", {"actor_infer": 1}, {"actor_infer": [2, 3]})
    m.admit("A")
    m.admit("B")
    m.request(gen("A"), Priority.GENERATION, step_target_estimate=10)
    m.request(gen("B"), Priority.INITIALIZATION)  # whole mapping, all ranks active, at INIT
    m.run_cycle()
    assert m.state.allocations[gen("B")].priority == Priority.INITIALIZATION
    assert active(m, "B") == 2
    report(m, "A", 100, 0)
    report(m, "B", 100, 100)  # would be a 50 pp imbalance if B counted
    assert m.background_rebalance_reason() is None


# --------------------------------------------------------------------------- 2.2


def suspended_a():
    """shared_pair, then A releases all its ranks (planned release) -> A's allocation has none."""
    m = shared_pair()
    m.await_release(cluster_id=gen("A"))
    m.run_cycle()
    assert active(m, "A") == 0 and gen("A") in m.state.allocations
    assert active(m, "B") == 2
    m.drain()
    return m


def test_suspended_allocation_with_demand_triggers_2_2():
    m = suspended_a()
    assert m.background_rebalance_reason() is None  # no demand yet
    report(m, "A", 10, 3)
    assert m.background_rebalance_reason() == "2.2"


def test_suspended_allocation_without_remaining_does_not_trigger_2_2():
    m = suspended_a()
    report(m, "A", 10, 10)  # finished: remaining 0
    report(m, "B", 10, 0)
    # Rows: A (completion 1, 0 demand, 0 GPUs), B (completion 0, all demand, all GPUs).
    assert m.background_rebalance_reason() is None


def test_2_2_applies_with_a_single_gen_allocation():
    m = SchedulerModel(ClusterTopology(1, 2))
    m.register("A", {"actor_infer": 1}, {"actor_infer": [0, 1]})
    m.admit("A")
    m.request(gen("A"), Priority.GENERATION, step_target_estimate=10)
    m.run_cycle()
    m.await_release(cluster_id=gen("A"))
    m.run_cycle()
    report(m, "A", 10, 0)
    assert m.background_rebalance_reason() == "2.2"


def test_2_2_takes_precedence_over_2_1():
    m = suspended_a()
    report(m, "A", 10, 3)
    report(m, "B", 100, 100)
    assert m.background_rebalance_reason() == "2.2"


# --------------------------------------------------------------------------- waiters suppress


def test_pending_request_suppresses_trigger():
    m = shared_pair()
    report(m, "A", 100, 0)
    report(m, "B", 100, 100)
    assert m.background_rebalance_reason() == "2.1"
    ticket = m.request("A_actor_train", Priority.ACTOR_TRAINING)
    assert not ticket.done
    assert m.background_rebalance_reason() is None


def test_pending_request_suppresses_2_2():
    m = suspended_a()
    report(m, "A", 10, 3)
    m.request(gen("A"), Priority.GENERATION)  # A has no active ranks: this waits
    assert m.state.has_waiters()
    assert m.background_rebalance_reason() is None


def test_pending_planned_release_suppresses_trigger():
    m = shared_pair()
    report(m, "A", 100, 0)
    report(m, "B", 100, 100)
    ticket = m.await_release(cluster_id=gen("B"))
    assert not ticket.done
    assert m.background_rebalance_reason() is None
    m.run_cycle()  # release acked; B suspended, A takes B's freed GPUs
    assert not m.state.has_waiters()
    assert (active(m, "A"), active(m, "B")) == (4, 0)
    assert m.background_rebalance_reason() is None
    report(m, "B", 100, 0)  # no longer suppressed: B suspended with demand
    assert m.background_rebalance_reason() == "2.2"
