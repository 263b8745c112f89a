"""Progress reporting (docs/modelled-systems.md#rlix-progress-reports) and its effect on gap-ratio demand (docs/modelled-systems.md#rlix-gap-ratio-planner).

ProgressStore is the scheduler ingress; CoordinatorProgress is the per-pipeline
aggregator with 2 % bucket throttling. The model tests show that demand really comes
from ``completed`` (clamped) and that only a pending GENERATION request inflates it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.scheduler.model import SchedulerModel
from harness.scheduler.progress import (
    COORDINATOR_FULL_FT_KEY,
    FULL_FINETUNE_STREAM,
    CoordinatorProgress,
    ProgressReport,
    ProgressStore,
)
from harness.scheduler.types import Priority, Rejected
from harness.scheduler.topology import ClusterTopology

# --------------------------------------------------------------------------- ProgressStore


@pytest.mark.parametrize(
    "target,completed,remaining",
    [
        (10, 0, 10.0),
        (10, 4, 6.0),
        (10, 2.5, 7.5),
        (10, 10, 0.0),
        (10, 15, 0.0),  # overshoot clamps to target: never negative demand
        (10, -5, 10.0),  # negative completed clamps to 0
        (1, 0, 1.0),
    ],
)
def test_remaining_is_target_minus_clamped_completed(target, completed, remaining):
    store = ProgressStore()
    store.report(ProgressReport("p", target, completed))
    assert store.totals("p") == (remaining, float(target))


def test_no_reports_means_zero_totals():
    store = ProgressStore()
    assert store.totals("p") == (0.0, 0.0)
    assert not store.has_reports("p")


def test_ingress_rejects_wire_remaining_and_stores_nothing():
    store = ProgressStore()
    with pytest.raises(Rejected) as info:
        store.report(ProgressReport("p", 10, 3), wire_fields={"completed": 3, "remaining": 7})
    assert "remaining" in info.value.reason
    assert not store.has_reports("p")
    store.report(ProgressReport("p", 10, 3), wire_fields={"completed": 3})  # 'completed' alone is fine
    assert store.totals("p") == (7.0, 10.0)


@pytest.mark.parametrize("target", [0, -1, 2.0, None])
def test_ingress_rejects_non_positive_or_non_int_step_target(target):
    store = ProgressStore()
    with pytest.raises(Rejected):
        store.report(ProgressReport("p", target, 0))
    assert not store.has_reports("p")


def test_lora_after_full_finetune_is_rejected():
    store = ProgressStore()
    store.report(ProgressReport("p", 10, 0, mode="train"))
    with pytest.raises(Rejected) as info:
        store.report(ProgressReport("p", 10, 0, mode="val", adapter="a1"))  # other mode: still a mismatch
    assert "source-type mismatch" in info.value.reason
    assert store.totals("p") == (10.0, 10.0)


def test_full_finetune_after_lora_is_rejected():
    store = ProgressStore()
    store.report(ProgressReport("p", 10, 0, mode="train", adapter="a1"))
    with pytest.raises(Rejected) as info:
        store.report(ProgressReport("p", 10, 0, mode="val"))
    assert "source-type mismatch" in info.value.reason
    assert store.totals("p") == (10.0, 10.0)


def test_stream_types_are_per_pipeline():
    store = ProgressStore()
    store.report(ProgressReport("p", 10, 0))
    store.report(ProgressReport("q", 10, 0, adapter="a1"))  # another pipeline may use LoRA
    assert store.totals("q") == (10.0, 10.0)


def test_reserved_adapter_id_is_rejected():
    store = ProgressStore()
    with pytest.raises(Rejected) as info:
        store.report(ProgressReport("p", 10, 0, adapter=FULL_FINETUNE_STREAM))
    assert "reserved" in info.value.reason
    assert not store.has_reports("p")


def test_multi_stream_sums_across_modes_and_adapters_with_per_stream_clamping():
    store = ProgressStore()
    store.report(ProgressReport("p", 10, 3, mode="train", adapter="a"))
    store.report(ProgressReport("p", 20, 25, mode="train", adapter="b"))  # overshoot: 0, not -5
    store.report(ProgressReport("p", 5, 1, mode="val", adapter="a"))
    store.report(ProgressReport("p", 8, -2, mode="val", adapter="c"))  # negative: full 8
    assert store.totals("p") == (7.0 + 0.0 + 4.0 + 8.0, 43.0)


def test_full_finetune_train_and_val_streams_sum():
    store = ProgressStore()
    store.report(ProgressReport("p", 32, 8, mode="train"))
    store.report(ProgressReport("p", 16, 16, mode="val"))
    assert store.totals("p") == (24.0, 48.0)


def test_latest_report_per_stream_wins_and_totals_refresh():
    store = ProgressStore()
    store.report(ProgressReport("p", 10, 2))
    assert store.totals("p") == (8.0, 10.0)  # cached now
    store.report(ProgressReport("p", 10, 9))
    assert store.totals("p") == (1.0, 10.0)
    store.report(ProgressReport("p", 40, 0))  # new batch with a new target replaces the stream
    assert store.totals("p") == (40.0, 40.0)


def test_clear_removes_the_pipeline_contribution_only():
    store = ProgressStore()
    store.report(ProgressReport("p", 10, 2))
    store.report(ProgressReport("q", 10, 5))
    assert store.totals("p") == (8.0, 10.0)
    store.clear("p")
    assert store.totals("p") == (0.0, 0.0)
    assert not store.has_reports("p")
    assert store.totals("q") == (5.0, 10.0)
    # After a clear the pipeline may switch stream type (fresh start).
    store.report(ProgressReport("p", 10, 0, adapter="a1"))
    assert store.totals("p") == (10.0, 10.0)


# --------------------------------------------------------------------------- CoordinatorProgress


def test_stream_key_format():
    assert CoordinatorProgress.stream_key("train", None) == f"train:{COORDINATOR_FULL_FT_KEY}"
    assert CoordinatorProgress.stream_key("val", "lora1") == "val:lora1"


def test_bucket_cadence_emits_only_on_2_percent_bucket_change():
    coord = CoordinatorProgress("p")
    emitted = []
    for collected in range(0, 101):
        rep = coord.update(mode="train", adapter=None, step_target=100, collected=collected)
        if rep is not None:
            emitted.append(collected)
            assert rep.pipeline_id == "p" and rep.step_target == 100
            assert rep.completed == collected and rep.mode == "aggregated" and rep.adapter is None
    # The first update always emits (bucket 0), then one per bucket: 50 more up to 100 %.
    assert len(emitted) == 51
    # RLix computes floor(min(completed/required, 1) * 50) in floats, so 58/100*50 is
    # 28.999... and bucket 29 is first reached at 59; the model must match that exactly.
    expected = []
    last = None
    for c in range(0, 101):
        b = int((min(c / 100, 1.0) * 50) // 1)
        if b != last:
            expected.append(c)
            last = b
    assert emitted == expected
    assert 58 not in emitted and 59 in emitted


def test_first_99_updates_emit_50_times():
    coord = CoordinatorProgress("p")
    n = sum(coord.update(mode="train", adapter=None, step_target=100, collected=c) is not None for c in range(100))
    assert n == 50  # buckets 0..49


def test_same_bucket_is_throttled_but_new_batch_forces_emit():
    coord = CoordinatorProgress("p")
    assert coord.update(mode="train", adapter=None, step_target=100, collected=10) is not None
    assert coord.update(mode="train", adapter=None, step_target=100, collected=11) is None
    forced = coord.update(mode="train", adapter=None, step_target=100, collected=11, new_batch=True)
    assert forced is not None and forced.completed == 11
    assert coord.update(mode="train", adapter=None, step_target=100, collected=11) is None


def test_coordinator_rejects_wire_remaining_and_bad_target():
    coord = CoordinatorProgress("p")
    with pytest.raises(Rejected):
        coord.update(mode="train", adapter=None, step_target=10, collected=1, wire_fields={"remaining": 9})
    with pytest.raises(Rejected):
        coord.update(mode="train", adapter=None, step_target=0, collected=0)
    assert coord.aggregate() == (0, 0, 0, 0)


def test_coordinator_per_stream_clamping_and_sums():
    coord = CoordinatorProgress("p")
    coord.update(mode="train", adapter=None, step_target=10, collected=15)  # overshoot counts 10
    rep = coord.update(mode="val", adapter=None, step_target=10, collected=5)
    assert coord.aggregate() == (20, 15, 20, 37)  # floor(0.75 * 50)
    assert rep.step_target == 20 and rep.completed == 15


def test_clear_stream_forces_emit_then_clear_when_none_remain():
    coord = CoordinatorProgress("p")
    coord.update(mode="train", adapter="a", step_target=10, collected=10)
    coord.update(mode="train", adapter="b", step_target=10, collected=0)
    rep = coord.clear_stream(mode="train", adapter="a")
    assert isinstance(rep, ProgressReport)
    assert rep.step_target == 10 and rep.completed == 0  # only stream b remains
    assert coord.clear_stream(mode="train", adapter="b") == "clear"
    # Emission state is reset: the next update emits even at the old bucket.
    assert coord.update(mode="train", adapter="b", step_target=10, collected=0) is not None


def test_coordinator_clamps_negative_collected_to_zero():
    coord = CoordinatorProgress("p")
    coord.update(mode="train", adapter="a", step_target=100, collected=-10)
    coord.update(mode="train", adapter="b", step_target=100, collected=50)
    required, completed, _collected, bucket = coord.aggregate()
    assert (required, completed, bucket) == (200, 50, 12)


def test_clearing_an_unknown_stream_is_a_no_op():
    coord = CoordinatorProgress("p")
    coord.update(mode="train", adapter=None, step_target=10, collected=3)
    assert coord.clear_stream(mode="val", adapter=None) is None


# "train" built anew is equal to the literal but not the same object (the coordinator finds
# its last reporter's stream key by identity first); (None, None) is no reporter seen yet
_STREAMS = st.sampled_from(
    [("train", None), ("val", None), ("train", "a"), ("".join(["tr", "ain"]), None), (None, None)]
)
_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("update"),
            _STREAMS,
            st.sampled_from([1, 4, 4.0, 10]),
            st.sampled_from([0, 1, 1.0, 2, 3, 3.0, -1, 12, 0.5]),
            st.booleans(),
        ),
        st.tuples(st.just("clear"), _STREAMS),
    ),
    max_size=40,
)


@given(_OPS)
@settings(max_examples=300, deadline=None)
def test_an_unchanged_update_skips_the_emit_and_sends_what_the_emit_would(ops):
    """``update`` returns None without aggregating when a stream's numbers are unchanged
    (the simulator repeats its count on every stale trajectory): the same results, reports
    with the same typed numbers (3 against 3.0), as a coordinator that aggregates every time."""
    fast, full = CoordinatorProgress("p"), CoordinatorProgress("p")
    keys = set()  # the streams held, by CoordinatorProgress.stream_key
    for op in ops:
        if op[0] == "update":
            _, (mode, adapter), target, collected, new_batch = op
            full._settled = False  # never trust the bucket held: always aggregate
            got = [
                c.update(mode=mode, adapter=adapter, step_target=target, collected=collected, new_batch=new_batch)
                for c in (fast, full)
            ]
            keys.add(CoordinatorProgress.stream_key(mode, adapter))
        else:
            _, (mode, adapter) = op
            got = [c.clear_stream(mode=mode, adapter=adapter) for c in (fast, full)]
            keys.discard(CoordinatorProgress.stream_key(mode, adapter))
        assert repr(got[0]) == repr(got[1])
        assert repr(fast.aggregate()) == repr(full.aggregate())
        assert set(fast._streams) == keys


# --------------------------------------------------------------------------- through the model

TOPO8 = ClusterTopology(1, 8)


def _two_pipelines_split_4_4():
    """A and B share infer GPUs 0..7 (tp 1) and start with 4 active ranks each."""
    m = SchedulerModel(TOPO8)
    for pid in ("A", "B"):
        m.register(pid, {"actor_infer": 1}, {"actor_infer": list(range(8))})
        m.admit(pid)
        m.request(f"{pid}_actor_infer", Priority.GENERATION, step_target_estimate=10)
    m.run_cycle()
    snap = m.snapshot()["allocations"]
    assert len(snap["A_actor_infer"]["active_dp_ranks"]) == 4
    assert len(snap["B_actor_infer"]["active_dp_ranks"]) == 4
    m.drain()
    return m


def _active(m, pid):
    return len(m.snapshot()["allocations"][f"{pid}_actor_infer"]["active_dp_ranks"])


def test_overshot_pipeline_gets_zero_weight_and_falls_to_one_bundle():
    m = _two_pipelines_split_4_4()
    m.report_progress(ProgressReport("A", 10, 15))  # overshoot: remaining 0, not -5
    m.report_progress(ProgressReport("B", 10, 0))
    cp = m.plan_cycle("progress")
    assert cp.gap.targets == {"A": 1, "B": 8}  # A: one-bundle floor; B: the whole budget
    [shrink] = cp.plan.shrinks
    assert shrink.cluster_id == "A_actor_infer" and len(shrink.dp_ranks_to_remove) == 3
    [expand] = cp.plan.expands
    assert expand.cluster_id == "B_actor_infer" and len(expand.dp_rank_to_gpus) == 3
    assert expand.has_pending_request is False
    freed = {g for r in shrink.dp_ranks_to_remove for g in m.state.allocations["A_actor_infer"].dp_rank_to_gpus[r]}
    assert {g for b in expand.dp_rank_to_gpus.values() for g in b} == freed
    m.commit_cycle(cp)
    assert (_active(m, "A"), _active(m, "B")) == (1, 7)
    assert m.state.idle_gpus == set()


def test_negative_completed_counts_as_full_demand_so_no_rebalance():
    m = _two_pipelines_split_4_4()
    m.report_progress(ProgressReport("A", 10, -5))  # clamps to 0: remaining 10, same as B
    m.report_progress(ProgressReport("B", 10, 0))
    cp = m.plan_cycle("progress")
    assert cp.gap.targets == {"A": 4, "B": 4}
    assert cp.plan.is_empty()
    m.commit_cycle(cp)


def _pending_inflation_setup():
    """A holds GPUs 0,1 (infer [0,1]); B (infer [0..3]) has a suspended allocation; 2,3 idle.

    Both pipelines then report the same progress (target 10, completed 5 -> remaining 5).
    """
    m = SchedulerModel(ClusterTopology(1, 4))
    m.register("A", {"actor_infer": 1}, {"actor_infer": [0, 1]})
    m.register("B", {"actor_infer": 1}, {"actor_infer": [0, 1, 2, 3]})
    m.admit("A")
    m.admit("B")
    m.request("B_actor_infer", Priority.GENERATION, step_target_estimate=10)
    m.run_cycle()
    m.await_release(cluster_id="B_actor_infer")
    m.run_cycle()  # B shrinks to zero; its allocation entry stays
    m.request("A_actor_infer", Priority.GENERATION, step_target_estimate=10)
    m.run_cycle()
    snap = m.snapshot()
    assert snap["allocations"]["A_actor_infer"]["active_dp_ranks"] == [0, 1]
    assert snap["allocations"]["B_actor_infer"]["active_dp_ranks"] == []
    assert snap["idle"] == [2, 3]
    m.report_progress(ProgressReport("A", 10, 5))
    m.report_progress(ProgressReport("B", 10, 5))
    m.drain()
    return m


def test_without_pending_request_equal_progress_means_equal_share():
    m = _pending_inflation_setup()
    cp = m.plan_cycle("background")
    assert cp.gap.targets == {"A": 2, "B": 2}
    assert cp.plan.shrinks == []
    [expand] = cp.plan.expands
    assert expand.cluster_id == "B_actor_infer"
    assert expand.dp_rank_to_gpus == {2: [2], 3: [3]}
    assert expand.has_pending_request is False
    m.commit_cycle(cp)
    assert (_active(m, "A"), _active(m, "B")) == (2, 2)


def test_pending_gen_request_inflates_demand_by_step_target():
    m = _pending_inflation_setup()
    ticket = m.request("B_actor_infer", Priority.GENERATION, step_target_estimate=1000)
    assert not ticket.done
    cp = m.plan_cycle("wakeup")
    # B: remaining 5 + step_target 10 = 15 vs A 5 -> 3:1 of 4 GPUs. The estimate (1000) is
    # ignored because real progress exists.
    assert cp.gap.targets == {"A": 1, "B": 3}
    [shrink] = cp.plan.shrinks
    assert shrink.cluster_id == "A_actor_infer" and shrink.dp_ranks_to_remove == [0]
    [expand] = cp.plan.expands
    assert expand.cluster_id == "B_actor_infer"
    assert expand.dp_rank_to_gpus == {2: [2], 3: [3], 0: [0]}
    assert expand.has_pending_request is True
    signals = m.commit_cycle(cp)
    assert [(s.request_id, s.gpus) for s in signals] == [(ticket.request_id, [0, 2, 3])]
    assert (_active(m, "A"), _active(m, "B")) == (1, 3)


def test_pending_non_generation_request_does_not_inflate_demand():
    m = SchedulerModel(ClusterTopology(1, 4))
    m.register("A", {"actor_infer": 1}, {"actor_infer": [0, 1]})
    m.register("B", {"actor_infer": 1, "actor_train": 1}, {"actor_infer": [0, 1, 2, 3], "actor_train": [3]})
    for pid in ("A", "B"):
        m.admit(pid)
    m.request("A_actor_infer", Priority.GENERATION, step_target_estimate=10)
    m.run_cycle()
    m.report_progress(ProgressReport("A", 10, 5))
    m.report_progress(ProgressReport("B", 10, 5))
    # B has no GEN allocation and no GEN request; a pending training request of B must
    # not make B a receiver, nor inflate its demand.
    m.request("B_actor_train", Priority.ACTOR_TRAINING)
    cp = m.plan_cycle("wakeup")
    assert [(s.cluster_id, s.gpus) for s in cp.plan.signals] == [("B_actor_train", [3])]
    assert cp.plan.expands == [] and cp.plan.shrinks == []
    m.commit_cycle(cp)


def test_report_progress_for_unregistered_pipeline_is_rejected():
    m = SchedulerModel(ClusterTopology(1, 2))
    with pytest.raises(Rejected):
        m.report_progress(ProgressReport("nope", 10, 0))


def test_model_ingress_rejects_wire_remaining():
    m = SchedulerModel(ClusterTopology(1, 2))
    m.register("A", {"actor_infer": 1}, {"actor_infer": [0, 1]})
    with pytest.raises(Rejected):
        m.report_progress(ProgressReport("A", 10, 0), wire_fields={"remaining": 10})
    assert m.state.progress.totals("A") == (0.0, 0.0)


def test_clear_progress_removes_demand_from_planning():
    m = _pending_inflation_setup()
    m.clear_progress("B")
    cp = m.plan_cycle("background")
    # B has no reports and no pending request: the planner skips it entirely, so its
    # suspended allocation gets nothing and A (alone) keeps its whole mapping.
    assert "B" not in cp.gap.targets
    assert cp.plan.is_empty()
    m.commit_cycle(cp)
