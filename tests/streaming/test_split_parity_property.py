"""The split train API's gradient math: streamed microbatch sums rescaled once by 1/N at
finish equal the synchronous full-batch step (gradients and post-step parameters), over
batch sizes, sequence lengths, masks, microbatch splits, arrival orders and both loss
types (Hypothesis)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings, strategies as st  # noqa: E402

from gpu_gates.streaming.split_trainer import (  # noqa: E402
    SplitTrainer,
    TinyPolicy,
    WorkerMetrics,
    combine_leader_metrics,
    make_batch,
    make_optimizer,
    sync_train_step,
)
from harness.streaming.split_step import SplitApiError  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6  # fp32: only the summation order differs


@st.composite
def cases(draw):
    b = draw(st.integers(1, 6))
    t = draw(st.integers(1, 7))
    seed = draw(st.integers(0, 10_000))
    masks = draw(st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=b, max_size=b))
    order = draw(st.permutations(list(range(b))))  # arrival order of the sequences
    cuts = sorted(draw(st.sets(st.integers(1, max(1, b - 1)), max_size=b - 1))) if b > 1 else []
    loss_type = draw(st.sampled_from(["token", "sequence"]))
    steps = draw(st.integers(1, 2))
    return b, t, seed, masks, order, cuts, loss_type, steps


def split(order, cuts):
    bounds = [0, *cuts, len(order)]
    return [order[a:z] for a, z in zip(bounds, bounds[1:]) if z > a]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(cases())
def test_streamed_rescaled_step_equals_the_synchronous_step(case):
    b, t, seed, masks, order, cuts, loss_type, steps = case
    ref = TinyPolicy(seed=seed % 7)
    streamed = copy.deepcopy(ref)
    opt, sched = make_optimizer(ref)
    trainer = SplitTrainer(streamed, loss_type, keep_grads=True)
    for step in range(steps):
        batch = make_batch(seed + step, b, t)
        batch.mask = torch.tensor(masks, dtype=torch.float32)
        want = sync_train_step(ref, opt, sched, batch, loss_type)
        trainer.begin_train_step(step)
        for rows in split(order, cuts):
            trainer.train_microbatch(batch.rows(rows))
        result, metrics = trainer.finish_train_step()
        if want is None:  # nothing valid: both sides are a no-op
            assert not result.applied and metrics.global_loss is None
        else:
            assert result.applied
            for g_ref, g in zip(want, trainer.last_grads):
                torch.testing.assert_close(g, g_ref, rtol=RTOL, atol=ATOL)
        for p_ref, p in zip(ref.parameters(), streamed.parameters()):
            torch.testing.assert_close(p, p_ref, rtol=RTOL, atol=ATOL)
        assert trainer.optimizer.param_groups[0]["lr"] == opt.param_groups[0]["lr"]  # one scheduler step each


def test_a_missing_rescale_or_a_per_microbatch_mean_would_be_caught():
    """The comparison is sharp enough to see the bugs it exists for."""
    batch = make_batch(3, 4, 6, min_valid=1)
    ref = TinyPolicy(seed=1)
    opt, sched = make_optimizer(ref)
    want = sync_train_step(ref, opt, sched, batch, "token")
    m = TinyPolicy(seed=1)
    from gpu_gates.streaming.split_trainer import loss_sum_and_counts

    mean_of_means = [torch.zeros_like(p) for p in m.parameters()]
    for rows in ([0], [1, 2, 3]):
        m.zero_grad()
        total, tokens, _ = loss_sum_and_counts(m, batch.rows(rows), "token")
        (total / tokens / 2).backward()  # normalized per microbatch: the classic streaming bug
        for acc, p in zip(mean_of_means, m.parameters()):
            acc += p.grad
    assert any(not torch.allclose(a, w, rtol=RTOL, atol=ATOL) for a, w in zip(mean_of_means, want))


def test_version_ticks_only_at_an_applied_finish_and_abort_is_idempotent():
    trainer = SplitTrainer(TinyPolicy(seed=2), "sequence")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.begin_train_step(0)
    trainer.train_microbatch(make_batch(1, 2, 4, min_valid=1))
    with pytest.raises(SplitApiError, match="while step 0 is open"):
        trainer.begin_train_step(1)
    assert trainer.abort_train_step() is True and trainer.abort_train_step() is False
    assert trainer.version == 0
    assert all(torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))  # no step
    assert all(float(p.grad.abs().sum()) == 0 for p in trainer.model.parameters())  # dropped
    trainer.begin_train_step(0)
    trainer.train_microbatch(make_batch(1, 2, 4, min_valid=1))
    result, metrics = trainer.finish_train_step()
    assert result.applied and trainer.version == 1
    with pytest.raises(SplitApiError, match="no open step"):
        trainer.finish_train_step()


def test_an_empty_step_is_a_no_op_even_with_microbatches_of_masked_tokens():
    trainer = SplitTrainer(TinyPolicy(seed=4), "token")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    lr = trainer.optimizer.param_groups[0]["lr"]
    trainer.begin_train_step(0)
    result, _ = trainer.finish_train_step()  # nothing at all
    assert (result.applied, result.version) == (False, 0)
    trainer.begin_train_step(0)
    empty = make_batch(5, 3, 4)
    empty.mask.zero_()
    trainer.train_microbatch(empty)  # only masked tokens: N = 0
    result, metrics = trainer.finish_train_step()
    assert (result.applied, result.version, metrics.global_loss) == (False, 0, None)
    assert all(torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))
    assert trainer.optimizer.param_groups[0]["lr"] == lr  # no scheduler step either


def test_only_replica_leaders_metrics_count():
    lead = WorkerMetrics(True, 3.0, 10.0, 2.0, 0.3)
    copy_of_lead = WorkerMetrics(False, 3.0, 10.0, 2.0, 0.3)  # the tp=1 rank of the same replica
    other = WorkerMetrics(True, 1.0, 5.0, 1.0, 0.3)
    got = combine_leader_metrics([lead, copy_of_lead, other, WorkerMetrics(False, 1.0, 5.0, 1.0, 0.3)])
    assert got == {"loss_sum": 4.0, "tokens": 15.0, "sequences": 3.0, "workers": 4, "leaders": 2}
