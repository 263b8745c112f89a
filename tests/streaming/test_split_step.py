"""The split train API's state machine and the train pump's control flow (no runtime)."""

from __future__ import annotations

import pytest

from harness.control import streaming_effects as fx
from harness.control import train_pump
from harness.streaming.controller import StreamingConfig
from harness.streaming.split_step import SplitApiError, SplitStepMachine


def test_begin_raises_while_open_and_version_ticks_only_at_finish():
    m = SplitStepMachine()
    m.begin(0)
    with pytest.raises(SplitApiError, match="while step 0 is open"):
        m.begin(1)
    m.microbatch()
    m.microbatch()
    assert m.version == 0
    res = m.finish()
    assert (res.version, res.applied, res.microbatches) == (1, True, 2) and not m.is_open
    for call in (m.microbatch, m.finish):
        with pytest.raises(SplitApiError, match="no open step"):
            call()
    assert m.version == 1


def test_abort_is_idempotent_and_never_ticks():
    m = SplitStepMachine(version=4)
    assert m.abort() is False  # nothing open: a no-op
    m.begin(4)
    m.microbatch()
    assert m.abort() is True and m.abort() is False
    assert m.version == 4 and not m.is_open
    m.begin(4)  # a new step can open after an abort
    assert m.is_open


def test_an_empty_step_finishes_as_a_no_op():
    m = SplitStepMachine(version=2)
    m.begin(2)
    res = m.finish()
    assert (res.version, res.applied) == (2, False) and not m.is_open


def drive(gen, answers, seen=None):
    """Run a control generator, answering effects by type from ``answers`` (callables)."""
    seen = [] if seen is None else seen
    result = None
    while True:
        try:
            effect = gen.send(result)
        except StopIteration:
            return seen
        seen.append(effect)
        result = answers.get(type(effect), lambda e: None)(effect)


def test_train_step_order_lazy_begin_and_one_finish():
    cfg = StreamingConfig(groups_per_step=3, min_groups_for_streaming_train=1)
    batches = iter([(7,), (8, 9)])
    seen = drive(
        train_pump.train_step(cfg, 0),
        {
            fx.StepTarget: lambda e: 3,
            fx.SelectGroups: lambda e: next(batches),
            fx.FinishTrainStep: lambda e: 1,
        },
    )
    names = [type(e).__name__ for e in seen]
    assert names == [
        "StepTarget",
        "Evict",
        "SelectGroups",
        "ComputeLogProbs",
        "ComputeAdvantages",
        "BeginTrainStep",
        "TrainMicrobatches",
        "ClearSamples",
        "StepTarget",
        "Evict",
        "SelectGroups",
        "ComputeLogProbs",
        "ComputeAdvantages",
        "TrainMicrobatches",
        "ClearSamples",
        "StepTarget",
        "FinishTrainStep",
        "PauseRollouts",
        "AbortStaleInflight",
        "SyncWeights",
        "ResumeRollouts",
    ]
    sel = [e for e in seen if isinstance(e, fx.SelectGroups)]
    assert [(e.min_groups, e.max_groups) for e in sel] == [(1, 3), (1, 2)]
    assert [e.groups for e in seen if isinstance(e, fx.ClearSamples)] == [(7,), (8, 9)]
    assert next(e for e in seen if isinstance(e, fx.SyncWeights)).version == 1


def test_train_step_with_every_prompt_dropped_opens_nothing_and_fails():
    seen = []
    with pytest.raises(train_pump.EmptyStep, match="step 5: every prompt group was dropped"):
        drive(train_pump.train_step(StreamingConfig(), 5), {fx.StepTarget: lambda e: 0}, seen)
    assert [type(e).__name__ for e in seen] == ["StepTarget"]


def test_a_target_that_shrinks_while_selecting_is_looked_at_again():
    targets = iter([2, 1])
    batches = iter([(), (4,)])
    seen = drive(
        train_pump.train_step(StreamingConfig(groups_per_step=2), 0),
        {
            fx.StepTarget: lambda e: next(targets, 1),
            fx.SelectGroups: lambda e: next(batches),
            fx.FinishTrainStep: lambda e: 1,
        },
    )
    assert [e.groups for e in seen if isinstance(e, fx.TrainMicrobatches)] == [(4,)]
    assert sum(isinstance(e, fx.BeginTrainStep) for e in seen) == 1


def rollout_effects(outcomes, **cfg):
    from harness.control import rollout_pump

    out = iter(outcomes)
    gids = iter(range(1, 100))
    return drive(
        rollout_pump.rollout(StreamingConfig(**cfg), 0, 0, None, 0),
        {
            fx.Reserve: lambda e: (next(gids), 0),
            fx.Generate: lambda e: next(out),
        },
    )


def test_rollout_commits_and_keeps_its_buffer_slot():
    names = [type(e).__name__ for e in rollout_effects(["ok"])]
    assert names == ["Generate", "Commit", "ReleaseInflight"]  # capacity freed by clear/evict


def test_infra_failures_back_off_exponentially_then_skip():
    seen = rollout_effects(["infra"] * 3, max_infra_attempts_per_prompt=3, backoff_s=0.5, max_backoff_s=0.8)
    assert [e.seconds for e in seen if isinstance(e, fx.Backoff)] == [0.5, 0.8]  # capped
    removes = [e for e in seen if isinstance(e, fx.RemoveGroup)]
    assert [(e.group_id, e.reason) for e in removes] == [
        (0, "infra"),
        (1, "infra"),
        (2, "infra"),
    ]  # a fresh group per attempt
    assert [type(e).__name__ for e in seen[-3:]] == ["SkipPrompt", "ReleaseInflight", "ReleaseCapacity"]


def test_data_failures_retry_without_backoff_and_an_abort_gives_slots_back():
    seen = rollout_effects(["data", "ok"], max_data_attempts_per_prompt=2)
    assert not any(isinstance(e, (fx.Backoff, fx.SkipPrompt)) for e in seen)
    assert [type(e).__name__ for e in seen][-2:] == ["Commit", "ReleaseInflight"]
    seen = rollout_effects(["aborted"])
    assert [type(e).__name__ for e in seen] == ["Generate", "RemoveGroup", "ReleaseInflight", "ReleaseCapacity"]
    seen = rollout_effects(["data", "ok"])  # a retry waits out a sync and reserves a fresh group
    assert [type(e).__name__ for e in seen][2:5] == ["AwaitRolloutPermitted", "Reserve", "Generate"]
