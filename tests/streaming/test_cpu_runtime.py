"""The single controller in real time on CPU: asyncio pumps, the torch split trainer and
a long-tailed fake generator. The same invariants read its log; training overlaps the
long tail of generation when it streams; the trained parameters equal a synchronous
step on the very groups each step consumed."""

from __future__ import annotations

import asyncio
import copy
from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")

from gpu_gates.streaming.split_trainer import Batch, SplitTrainer, TinyPolicy, make_optimizer, sync_train_step  # noqa: E402
from gpu_gates.streaming.runtime import FakeGenerator, GeneratorSpec, StreamingRuntime, intervals, overlap_s  # noqa: E402
from harness.logs.invariants import check_log  # noqa: E402
from harness.streaming.controller import StreamingConfig  # noqa: E402


def run_runtime(min_groups, window=1, steps=3, sampler="in_order", lost_finish_at=None, **gen):
    cfg = StreamingConfig(
        groups_per_step=4,
        generations_per_prompt=2,
        sampler=sampler,
        window=window,
        min_groups_for_streaming_train=min_groups,
        max_buffered_rollouts=4 * (window + 1),
        watchdog_interval_s=0.5,
        stall_timeout_s=30.0,
    )
    model = TinyPolicy(seed=3)
    initial = copy.deepcopy(model)
    trainer = SplitTrainer(model, "token")
    spec = GeneratorSpec(seed=11, median_s=0.03, sigma=1.2, max_s=0.4, **gen)
    rt = StreamingRuntime(cfg, steps, trainer, FakeGenerator(spec, 2), lost_finish_at=lost_finish_at)
    reason = asyncio.run(rt.run(timeout_s=60))
    return rt, reason, initial


def train_overlap(records):
    """(microbatch calls that ran while a rollout was generating, all of them, seconds of
    training overlapped by generation, seconds of training)."""
    train = intervals(records, "TrainMicrobatches")
    gen = intervals(records, "Generate")
    hidden = sum(1 for iv in train if overlap_s([iv], gen) > 0)
    return hidden, len(train), overlap_s(train, gen), sum(e - s for s, e in train)


def test_streaming_runtime_is_clean_and_matches_the_synchronous_steps_on_the_groups_it_consumed():
    rt, reason, initial = run_runtime(min_groups=1)
    assert reason == "done" and rt.trainer.version == 3
    recs = rt.log.records
    assert check_log(recs) == []
    # which prompts each step trained on, from the log alone
    prompt_of = {}
    for r in recs:
        if r["kind"] == "effect_end" and r["effect"] == "Reserve" and not r.get("error"):
            prompt_of[r["result"][0]] = r["args"]["prompt_id"]
    per_step = defaultdict(list)
    for r in recs:
        if r["kind"] == "trainer_step" and r["action"] == "microbatch":
            per_step[r["step"]] += [prompt_of[g] for g in r["groups"]]
    assert sorted(per_step) == [0, 1, 2] and all(len(v) == 4 for v in per_step.values())
    opt, sched = make_optimizer(initial)
    for step in range(3):
        batch = Batch.cat(rt.gen.group(p) for p in per_step[step])
        sync_train_step(initial, opt, sched, batch, "token")
    for p_ref, p in zip(initial.parameters(), rt.trainer.model.parameters()):
        torch.testing.assert_close(p, p_ref, rtol=1e-5, atol=1e-6)
    # the generator was synced to every version
    assert rt.gen.version == 3 and all(
        torch.equal(rt.gen.weights[n], p) for n, p in rt.trainer.model.named_parameters()
    )


def test_training_overlaps_the_long_tail_when_streaming_and_not_when_batching():
    warm = SplitTrainer(TinyPolicy(seed=0), "token")  # first-call costs (autograd, threads) out of the figures
    warm.begin_train_step(0)
    warm.train_microbatch(FakeGenerator(GeneratorSpec(), 2).group(0))
    stream, reason, _ = run_runtime(min_groups=1, window=0, steps=4)
    assert reason == "done" and check_log(stream.log.records) == []
    hidden, calls, both, busy = train_overlap(stream.log.records)
    batch, reason, _ = run_runtime(min_groups=4, window=0, steps=4)
    assert reason == "done" and check_log(batch.log.records) == []
    hidden_b, calls_b, both_b, busy_b = train_overlap(batch.log.records)
    print(
        f"\nstreaming: {hidden}/{calls} train calls overlapped generation, {both:.4f} of {busy:.4f} s training "
        f"({100 * both / busy:.0f} %); batch: {hidden_b}/{calls_b} calls, {both_b:.4f} of {busy_b:.4f} s "
        f"({100 * both_b / busy_b:.0f} %)"
    )
    assert hidden >= calls // 2 and both > 0  # streaming trains while the long tail still generates
    assert hidden_b == 0 and both_b == 0  # window 0, whole batch: training starts after the last rollout


def test_a_lost_finish_in_the_real_runtime_is_refused_and_named_by_the_check():
    rt, reason, _ = run_runtime(min_groups=1, lost_finish_at=1)
    assert reason.startswith("failed") and "while step 1 is open" in reason
    found = {v.invariant for v in check_log(rt.log.records)}
    assert found - {"run_outcome"} == {"streaming_step"}  # a failed run is also run_outcome's finding


def test_rollout_failures_retry_in_real_time_and_stay_clean():
    rt, reason, _ = run_runtime(min_groups=1, sampler="windowed", infra_failure_rate=0.2, data_failure_rate=0.1)
    assert reason == "done", reason
    assert check_log(rt.log.records) == []
    reasons = {
        r["args"]["reason"] for r in rt.log.records if r["kind"] == "effect_end" and r["effect"] == "RemoveGroup"
    }
    assert reasons & {"infra", "data"}
