"""The disaggregated orders (harness/control/disaggregated.py), one test per order, and the
fully asynchronous admission and batch rules, against sequences and cases written out here."""

from __future__ import annotations

import pytest

from harness.control import disaggregated as d
from harness.control.effects import Compute, WaitBatch
from harness.control.streaming_effects import SyncWeights


def _effects(pairs):
    """{step: [effects]} of an order's (step, generator) pairs, every effect answered None."""
    return {step: list(gen) for step, gen in pairs}


def test_sync_generates_trains_then_syncs_each_step():
    assert _effects(d.sync(2)) == {
        0: [d.StartRollout(0, 0), WaitBatch(0), Compute("old_log_probs", 0), Compute("train", 0), SyncWeights(1)],
        1: [d.StartRollout(1, 1), WaitBatch(1), Compute("old_log_probs", 1), Compute("train", 1), SyncWeights(2)],
    }


def test_one_step_off_starts_the_next_batch_before_training_the_current_one():
    """verl's order: wait for batch k, sync the weights after k updates, start batch k+1
    with them, then train batch k; the last step starts nothing."""
    assert _effects(d.one_step_off(3)) == {
        0: [
            d.StartRollout(0, 0),
            WaitBatch(0),
            SyncWeights(0),
            d.StartRollout(1, 0),
            Compute("old_log_probs", 0),
            Compute("train", 0),
        ],
        1: [WaitBatch(1), SyncWeights(1), d.StartRollout(2, 1), Compute("old_log_probs", 1), Compute("train", 1)],
        2: [WaitBatch(2), SyncWeights(2), Compute("old_log_probs", 2), Compute("train", 2)],
    }


@pytest.mark.parametrize("mode", ["drain", "pause"])
def test_fully_async_pauses_generation_around_the_sync(mode):
    assert _effects(d.fully_async(1, mode)) == {
        0: [
            WaitBatch(0),
            Compute("old_log_probs", 0),
            Compute("train", 0),
            d.PauseGeneration(mode),
            SyncWeights(1),
            d.ResumeGeneration(1),
        ]
    }


def test_fully_async_in_flight_syncs_under_running_generation():
    assert _effects(d.fully_async(1, "in_flight")) == {
        0: [WaitBatch(0), Compute("old_log_probs", 0), Compute("train", 0), SyncWeights(1)]
    }


def test_the_age_bound_follows_the_order():
    assert [d.trajectory_age_bound(s, 3) for s in d.SHAPES] == [0, 1, 3]


@pytest.mark.parametrize(
    "started, version, total, expected",
    [
        (15, 0, 100, True),  # window (0 + 1 + 1) x 8 = 16: one more
        (16, 0, 100, False),  # the window is full until the trainer's version moves
        (16, 1, 100, True),  # (1 + 1 + 1) x 8 = 24
        (20, 5, 20, False),  # the run needs no more
    ],
)
def test_may_admit_is_the_window_of_max_age_plus_one_batches(started, version, total, expected):
    assert d.may_admit(started, version, batch=8, max_age=1, total=total) is expected


def test_select_batch_takes_the_oldest_usable_and_drops_the_too_old():
    completed = [(10, 2), (11, 0), (12, 1), (13, 2), (14, 1)]  # (trajectory, version it started with)
    taken, dropped = d.select_batch(completed, trainer_version=2, batch=3, max_age=1)
    assert taken == [12, 14, 10] and dropped == [11]
    taken, dropped = d.select_batch(completed, trainer_version=2, batch=5, max_age=1)
    assert taken is None and dropped == [11]  # too few usable: no batch, the old one still goes


@pytest.mark.parametrize(
    "started, running, version, expected",
    [
        (0, 0, 0, True),
        (3, 3, 0, True),  # target 0 x 4 prompts = groups 0-3; a slot is free (4 x 1 = 4 slots)
        (4, 4, 0, False),  # every slot is held until its group's last answer is back
        (7, 3, 0, True),  # from the initial weights targets 0 .. 1 (group 7: target 1)
        (8, 0, 0, False),  # target 2 waits for version 1
        (8, 0, 1, True),
        (12, 0, 1, False),  # version 1 makes targets up to 2
        (16, 0, 5, False),  # the run needs 16 groups
    ],
)
def test_may_start_group_is_nemo_rls_semaphore_and_target_window(started, running, version, expected):
    assert d.may_start_group(started, running, version, prompts_per_step=4, max_age=1, total=16) is expected


def test_groups_are_generated_target_by_target():
    assert [d.target_of(g, 4) for g in range(9)] == [0, 0, 0, 0, 1, 1, 1, 1, 2]
