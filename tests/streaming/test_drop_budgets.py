"""NeMo RL's drop budgets and step floor (``rollout_failure.max_skipped_prompts``,
``max_consecutive_dropped_prompts``, ``min_step_batch_fraction``), its setup refusals
(a budget under a sampler that stamps no step; a stall timeout not above the watchdog's
tick), in the controller, the simulator and the asyncio runtime; a fatal rollout error
ends the asyncio run and cancels its sibling rollouts."""

from __future__ import annotations

import asyncio

import pytest

from harness.logs.invariants import check_log
from harness.streaming.controller import ControllerState, DropBudgetExceeded, StreamingConfig
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import ScenarioError
from tests.streaming.test_single_controller_sim import sc_scenario


def test_a_stall_timeout_not_above_the_tick_is_refused():
    with pytest.raises(ValueError, match="stall_timeout_s: 30 must be above watchdog_interval_s 30"):
        StreamingConfig(watchdog_interval_s=30.0, stall_timeout_s=30.0)
    StreamingConfig(watchdog_interval_s=30.0, stall_timeout_s=30.5)
    with pytest.raises(ScenarioError, match=r"streaming\.stall_timeout_s"):
        sc_scenario(watchdog_interval_s=60.0, stall_timeout_s=10.0)


@pytest.mark.parametrize("sampler", ["weight_fifo", "windowed", "ready_first"])
def test_a_drop_budget_under_a_sampler_that_never_stamps_is_refused(sampler):
    with pytest.raises(ValueError, match="stamps no target step"):
        StreamingConfig(sampler=sampler, drop_budgets=True, max_skipped_prompts=1, max_buffered_rollouts=64)
    with pytest.raises(ScenarioError, match=r"streaming\.max_consecutive_dropped_prompts.*stamps no target step"):
        sc_scenario(sampler=sampler, drop_budgets=True, max_consecutive_dropped_prompts=2)
    StreamingConfig(
        sampler=sampler, drop_budgets=True, max_buffered_rollouts=64
    )  # zero budgets: fail on the first drop
    StreamingConfig(sampler="in_order", drop_budgets=True, max_skipped_prompts=3, max_consecutive_dropped_prompts=3)


def _state(**kw):
    return ControllerState(
        StreamingConfig(groups_per_step=4, sampler="in_order", max_buffered_rollouts=8, drop_budgets=True, **kw)
    )


def test_the_data_budget_counts_the_run_and_the_infra_budget_an_outage():
    st = _state(max_skipped_prompts=1, max_consecutive_dropped_prompts=1, min_step_batch_fraction=0.25)
    st.skip_prompt(0, "data")
    with pytest.raises(DropBudgetExceeded, match="2 prompts dropped after data failures, above max_skipped_prompts 1"):
        st.skip_prompt(1, "data")
    st = _state(max_consecutive_dropped_prompts=1, min_step_batch_fraction=0.25)
    st.skip_prompt(0, "infra")
    st.capacity_held += 1
    st.commit(st.reserve(7, 0)[0])  # a commit ends the outage
    st.skip_prompt(0, "infra")
    with pytest.raises(DropBudgetExceeded, match="2 prompts in a row dropped after infra failures"):
        st.skip_prompt(1, "infra")


def test_a_step_below_its_floor_fails_and_one_at_it_closes_short():
    st = _state(max_skipped_prompts=5, min_step_batch_fraction=0.75)  # floor ceil(3.0) = 3 of 4
    st.skip_prompt(0, "data")
    assert st.step_target(0) == 3
    st.skip_prompt(0, "data")
    with pytest.raises(DropBudgetExceeded, match="step 0 lost 2 of 4 prompt groups, below the floor of 3"):
        st.step_target(0)
    assert _state().step_target(1) == 4  # the default 0.9: a batch of 4 tolerates no drop


def _wedge(seed, **stream):
    return sc_scenario(
        steps=5, seed=seed, sampler="in_order", data_failure_rate=0.15, max_data_attempts_per_prompt=1, **stream
    )


def test_in_the_simulator_a_drop_past_the_budget_fails_the_run_and_within_it_closes_short():
    failed = 0
    for seed in range(4):
        strict = Simulation(_wedge(seed, drop_budgets=True)).run()
        loose = Simulation(_wedge(seed, drop_budgets=True, max_skipped_prompts=100, min_step_batch_fraction=0.25)).run()
        drops = [r for r in loose.records if r["kind"] == "effect_end" and r["effect"] == "SkipPrompt"]
        assert loose.reason == "done" and check_log(loose.records) == []
        if drops:
            failed += 1
            assert strict.reason == "failed" and "max_skipped_prompts 0" in strict.detail
            assert {v.invariant for v in check_log(strict.records)} == {"run_outcome"}
        else:
            assert strict.reason == "done"
    assert failed


torch = pytest.importorskip("torch")
from gpu_gates.streaming.split_trainer import SplitTrainer, TinyPolicy  # noqa: E402
from gpu_gates.streaming.runtime import FakeGenerator, GeneratorSpec, StreamingRuntime  # noqa: E402


def _runtime(**cfg_kw):
    cfg = StreamingConfig(
        groups_per_step=4,
        generations_per_prompt=2,
        sampler="in_order",
        window=1,
        min_groups_for_streaming_train=1,
        max_buffered_rollouts=8,
        max_data_attempts_per_prompt=1,
        watchdog_interval_s=0.5,
        stall_timeout_s=30.0,
        **cfg_kw,
    )
    spec = GeneratorSpec(seed=5, median_s=0.03, sigma=1.2, max_s=0.3, data_failure_rate=0.3)
    rt = StreamingRuntime(cfg, 4, SplitTrainer(TinyPolicy(seed=3), "token"), FakeGenerator(spec, 2))
    return rt, asyncio.run(rt.run(timeout_s=60))


def test_in_the_asyncio_runtime_steps_close_short_and_the_log_is_clean():
    rt, reason = _runtime()
    assert reason == "done", reason
    assert check_log(rt.log.records) == []
    drops = [r for r in rt.log.records if r["kind"] == "effect_end" and r["effect"] == "SkipPrompt"]
    trained = sum(
        len(r["args"]["groups"]) for r in rt.log.records if r["kind"] == "effect_end" and r["effect"] == "ClearSamples"
    )
    owed = sum(1 for r in drops if r["args"]["target_step"] < 4)
    assert owed and trained == 16 - owed


def test_in_the_asyncio_runtime_a_drop_past_the_budget_ends_the_run_and_cancels_its_siblings():
    rt, reason = _runtime(drop_budgets=True)
    assert reason.startswith("failed") and "max_skipped_prompts 0" in reason, reason
    assert all(t.done() for t in rt._tasks)  # no sibling rollout left running
    assert rt.steps_done < 4
