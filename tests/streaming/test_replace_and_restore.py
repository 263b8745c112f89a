"""NeMo RL's ``on_dropped_prompt: replace`` (a spare pool filled by diverting whole
batches; a dropped stamped prompt replaced by a spare, after a later step lends its
finished group to the short step) and the rollout buffer's checkpoint/restore with top-up
of a restored step: in the sans-IO controller, the simulator and the asyncio runtime.

The accounting the runs are held to (NeMo RL's): every finished step trains
``groups_per_step`` groups less the drops credited to it *in the process that trained it*
(a shortfall is not checkpointed, so a resumed run tops the step up again); a replaced
drop credits nothing."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Dict, List

import pytest

from harness.logs.invariants import check_log
from harness.logs.outputs.streaming_summary import streaming_rows
from harness.streaming.checkpoint import RestoreError, restore, snapshot
from harness.streaming.controller import ControllerState, StreamingConfig
from simulators.run import with_seed
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import ScenarioError, load_scenario
from tests.streaming.test_single_controller_sim import sc_scenario

EXAMPLE = "examples/scenarios/in_order_drop_replace.yaml"


def _cfg(**kw) -> StreamingConfig:
    base = dict(
        groups_per_step=3,
        generations_per_prompt=2,
        sampler="in_order",
        window=2,
        max_buffered_rollouts=9,
        on_dropped_prompt="replace",
        replacement_reserve_prompts=2,
    )
    base.update(kw)
    return StreamingConfig(**base)


def _commit(st: ControllerState, prompt: int, step: int) -> int:
    st.capacity_held += 1
    gid, _ = st.reserve(prompt, step)
    st.commit(gid)
    return gid


# ---------------------------------------------------------------- setup refusals
@pytest.mark.parametrize(
    "kw, field",
    [
        ({"max_replacement_attempts": 0}, "max_replacement_attempts"),
        ({"replacement_reserve_prompts": 0}, "replacement_reserve_prompts"),
        ({"on_dropped_prompt": "retry"}, "on_dropped_prompt"),
    ],
)
def test_a_replace_setting_that_could_only_shrink_is_refused(kw, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        _cfg(**kw)
    with pytest.raises(ScenarioError, match=rf"streaming\.{field}"):
        sc_scenario(**{"on_dropped_prompt": "replace", **kw})


def test_replace_under_a_sampler_that_never_stamps_and_a_restore_past_the_run_are_refused():
    with pytest.raises(ValueError, match="stamps no target step"):
        _cfg(sampler="weight_fifo", max_buffered_rollouts=64)
    with pytest.raises(ScenarioError, match=r"streaming\.checkpoint_restore_after_steps.*not below"):
        sc_scenario(checkpoint_restore_after_steps=50)


# ---------------------------------------------------------------- the spare pool and the borrow
def test_a_batch_is_diverted_only_after_a_stamp_and_only_below_the_mark():
    st = ControllerState(_cfg())
    assert st.divert(0, 3) is False  # nothing stamped yet: the first batch is admitted
    assert st.try_admit().target_step == 0
    assert st.divert(3, 3) is True and st.spares == [3, 4, 5]
    assert st.divert(6, 3) is False  # 3 spares >= the mark of 2
    assert ControllerState(_cfg(on_dropped_prompt="shrink")).divert(0, 3) is False


def test_a_drop_borrows_the_furthest_later_steps_finished_group_and_the_spare_repays_it():
    st = ControllerState(_cfg())
    st.spares = [40, 41]
    _commit(st, 1, 1)
    far = _commit(st, 2, 2)
    inflight, _ = st.reserve(3, 2)  # reserved, not finished: never lent
    assert st.take_replacement(0, 0) == (40, 2)  # step 0 gets step 2's finished group; the spare goes to step 2
    assert st.buffer.get(far).target_step == 0 and st.buffer.get(inflight).target_step == 2
    assert st.promoted == {0: 1}
    assert st.take_replacement(0, 0) == (41, 1)  # the next furthest lender
    assert st.take_replacement(0, 0) is None  # pool empty: shrink


def test_no_borrow_for_a_step_already_trained_and_no_spare_past_the_attempts():
    st = ControllerState(_cfg(max_replacement_attempts=1))
    st.spares = [9, 10]
    _commit(st, 1, 2)
    st.trainer_version = 1
    assert st.take_replacement(0, 0) == (9, 0)  # step 0 is done: the spare fills it directly, nothing borrowed
    assert st.take_replacement(1, 1) is None  # this slot already took its one spare
    assert st.take_replacement(None, 0) is None  # an unstamped prompt is owed to no step


# ---------------------------------------------------------------- checkpoint and restore
def test_a_checkpoint_keeps_finished_groups_and_the_pool_and_a_restored_step_is_topped_up():
    st = ControllerState(_cfg())
    for _ in range(3):
        st.try_admit()
    a, b = _commit(st, 0, 1), _commit(st, 1, 2)
    st.reserve(2, 1)  # still generating: lost with the process
    st.spares = [7]
    st.trainer_version = st.weight_version = 1
    snap = snapshot(st)
    back = restore(st.cfg, snap)
    assert [e.group_id for e in back.buffer.ready()] == [a, b] and not back.buffer.inflight()
    assert back.capacity_held == 2 and back.spares == [7] and back.trainer_version == 1
    assert back.try_admit().target_step == 1  # the dispatch cursor resumes at the trainer's step
    assert back.buffered_for(1) == 1 and back.buffered_for(2) == 1  # each gets groups_per_step - 1 more
    gid, _ = back.reserve(99, 1)
    assert gid > max(a, b, snap["next_group"] - 1)  # no id of the saved run is reused


def test_a_restore_refuses_a_wrong_group_size_duplicates_and_stamped_groups_over_capacity():
    st = ControllerState(_cfg())
    st.try_admit()
    for p in range(3):
        _commit(st, p, 0)
    snap = snapshot(st)
    with pytest.raises(RestoreError, match="holds 2 trajectories, this run generates 4"):
        restore(_cfg(generations_per_prompt=4), snap)
    dup = dict(snap, groups=snap["groups"] + snap["groups"][:1])
    with pytest.raises(RestoreError, match="appears twice"):
        restore(st.cfg, dup)
    with pytest.raises(RestoreError, match="3 stamped groups, above max_buffered_rollouts 2"):
        restore(_cfg(max_buffered_rollouts=2, window=0, groups_per_step=2), snap)


def test_unstamped_groups_over_capacity_keep_the_freshest_and_another_sampler_restores_none():
    cfg = _cfg(sampler="weight_fifo", on_dropped_prompt="shrink", window=1)
    st = ControllerState(cfg)
    for p, v in enumerate([0, 2, 1]):
        st.weight_version = v
        _commit(st, p, None)
    st.spares = [5]
    small = restore(
        _cfg(sampler="weight_fifo", on_dropped_prompt="shrink", window=1, max_buffered_rollouts=2, groups_per_step=1),
        snapshot(st),
    )
    assert [e.prompt_id for e in small.buffer.ready()] == [1, 2]  # versions 2 and 1 kept, in their order
    other = restore(_cfg(sampler="in_order", groups_per_step=1), snapshot(st))
    assert other.buffer.used == 0 and other.capacity_held == 0 and other.spares == [5]


# ---------------------------------------------------------------- the runs
def _accounting(records: List[dict], groups_per_step: int) -> Dict[int, int]:
    """step -> groups trained minus what it should have trained (0 everywhere = exact)."""
    cut = next((r["seq"] for r in records if r["kind"] == "buffer_restore"), None)
    resume = next((r["step"] for r in records if r["kind"] == "buffer_restore"), None)
    trained: Dict[int, int] = {}
    owed: Dict[int, int] = {}
    finished = set()
    for r in records:
        if r["kind"] == "trainer_step" and r["action"] == "finish":
            finished.add(r["step"])
        if r["kind"] != "effect_end" or r.get("error"):
            continue
        if r["effect"] == "ClearSamples":
            trained[r["args"]["step"]] = trained.get(r["args"]["step"], 0) + len(r["args"]["groups"])
        elif r["effect"] == "SkipPrompt" and r["args"]["target_step"] is not None:
            s = r["args"]["target_step"]
            after = cut is not None and r["seq"] > cut
            if cut is None or (s >= resume) == after:  # credited in the process that trains step s
                owed[s] = owed.get(s, 0) + 1
    return {s: trained.get(s, 0) - (groups_per_step - owed.get(s, 0)) for s in sorted(finished)}


def _effects(records, name):
    return [r for r in records if r["kind"] == "effect_end" and r["effect"] == name]


def _topped_up_exactly(records, groups_per_step: int, steps: int) -> int:
    """After the restore, each admitted step dispatched exactly the groups it lacked
    (groups_per_step - buffered); returns the groups the restore saved re-dispatching."""
    cut = next(r["seq"] for r in records if r["kind"] == "buffer_restore")
    started: Dict[int, int] = {}
    for r in records:
        if r["seq"] > cut and r["kind"] == "effect_end" and r["effect"] == "StartRollout":
            started[r["args"]["target_step"]] = started.get(r["args"]["target_step"], 0) + 1
    saved = 0
    for r in _effects(records, "BufferedFor"):
        if r["args"]["target_step"] >= steps:  # admitted as the run ended: its rollouts never started
            continue
        assert started.get(r["args"]["target_step"], 0) == groups_per_step - r["result"], (r, started)
        saved += r["result"]
    return saved


def test_the_example_replaces_borrows_restores_and_tops_up_with_exact_accounting():
    sc = load_scenario(EXAMPLE)
    seen = {"replaced": 0, "borrowed": 0, "topped_up": 0}
    for seed in range(4):
        res = Simulation(with_seed(sc, seed)).run()
        assert res.reason == "done" and check_log(res.records) == [], seed
        acc = _accounting(res.records, 4)
        assert sorted(acc) == list(range(6)) and set(acc.values()) == {0}, (seed, acc)
        restored = next(r for r in res.records if r["kind"] == "buffer_restore")
        cleared = {g for r in _effects(res.records, "ClearSamples") for g in r["args"]["groups"]}
        evicted = {g for r in _effects(res.records, "Evict") for g in r.get("result") or []}
        assert set(restored["groups"]) <= cleared | evicted  # no restored group is lost
        seen["replaced"] += len(_effects(res.records, "CountReplaced"))
        seen["borrowed"] += sum(
            1
            for r in _effects(res.records, "TakeReplacement")
            if r.get("result") and r["result"][1] != r["args"]["target_step"]
        )
        seen["topped_up"] += _topped_up_exactly(res.records, 4, 6)
        row = streaming_rows(res.records, {})[0]  # the summary's counts, from the same log
        assert row.replaced == len(_effects(res.records, "DropReplaced"))
        assert row.dropped == row.replaced + len(_effects(res.records, "SkipPrompt"))
    assert all(seen.values()), seen


def test_replace_leaves_fewer_steps_short_than_shrink_on_the_same_workload():
    sc = load_scenario(EXAMPLE)
    pipe = sc.pipelines[0]
    shrink_stream = dataclasses.replace(pipe.streaming, on_dropped_prompt="shrink", checkpoint_restore_after_steps=0)
    shrink = dataclasses.replace(sc, pipelines=[dataclasses.replace(pipe, streaming=shrink_stream)])
    short = {"replace": 0, "shrink": 0}
    for seed in range(4):
        for mode, s in (("replace", sc), ("shrink", shrink)):
            res = Simulation(with_seed(s, seed)).run()
            trained: Dict[int, int] = {}
            for r in _effects(res.records, "ClearSamples"):
                trained[r["args"]["step"]] = trained.get(r["args"]["step"], 0) + len(r["args"]["groups"])
            short[mode] += sum(1 for v in trained.values() if v < 4)
    assert short["replace"] < short["shrink"], short


torch = pytest.importorskip("torch")
from gpu_gates.streaming.split_trainer import SplitTrainer, TinyPolicy  # noqa: E402
from gpu_gates.streaming.runtime import FakeGenerator, GeneratorSpec, StreamingRuntime  # noqa: E402


def test_in_the_asyncio_runtime_drops_are_replaced_and_a_restored_run_is_topped_up_and_exact():
    cfg = StreamingConfig(
        groups_per_step=4,
        generations_per_prompt=2,
        sampler="in_order",
        window=2,
        min_groups_for_streaming_train=1,
        max_buffered_rollouts=12,
        max_data_attempts_per_prompt=1,
        watchdog_interval_s=0.5,
        stall_timeout_s=30.0,
        on_dropped_prompt="replace",
        replacement_reserve_prompts=2,
    )
    spec = GeneratorSpec(seed=5, median_s=0.03, sigma=1.2, max_s=0.3, data_failure_rate=0.3)
    rt = StreamingRuntime(cfg, 5, SplitTrainer(TinyPolicy(seed=3), "token"), FakeGenerator(spec, 2), checkpoint_after=2)
    reason = asyncio.run(rt.run(timeout_s=60))
    assert reason == "done", reason
    assert check_log(rt.log.records) == []
    acc = _accounting(rt.log.records, 4)
    assert sorted(acc) == list(range(5)) and set(acc.values()) == {0}, acc
    assert _effects(rt.log.records, "DropReplaced") and _effects(rt.log.records, "CountReplaced")
    kinds = [r["kind"] for r in rt.log.records]
    assert kinds.count("buffer_checkpoint") == kinds.count("buffer_restore") == 1
    assert _effects(rt.log.records, "BufferedFor")
    _topped_up_exactly(rt.log.records, 4, 5)
    assert all(t.done() for t in rt._tasks)
