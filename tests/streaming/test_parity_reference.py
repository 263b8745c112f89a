"""The parity gate's reference (gpu_gates/streaming/parity_reference.py) is independent of the trainer:
it shares no code with gpu_gates/streaming/split_trainer.py, it equals the trainer when the trainer is
right, and it sees a bug in the trainer's loss helper that a reference calling that helper
(the gate's reference before) does not."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpu_gates.streaming import parity_reference  # noqa: E402
from gpu_gates.streaming import split_trainer  # noqa: E402
from gpu_gates.streaming.split_trainer import (  # noqa: E402
    Batch,
    SplitTrainer,
    TinyPolicy,
    make_batch,
    make_optimizer,
    sync_train_step,
)
from gpu_gates.train_pump_parity import maskless_loss_sum_and_counts  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RTOL, ATOL = 1e-5, 1e-6


def groups_of(seed: int, count: int = 4, generations: int = 2, length: int = 9):
    out = [make_batch(seed * 101 + g, generations, length) for g in range(count)]
    out[1].mask[0] = 0.0  # a sequence with no valid token
    return out


def streamed(model, groups, loss_type, steps=2, cls=SplitTrainer):
    trainer = cls(model, loss_type)
    for step in range(steps):
        trainer.begin_train_step(step)
        for g in reversed(groups[step]):  # another order than the reference's
            trainer.train_microbatch(g)
        trainer.finish_train_step()
    return model


def close(a, b) -> bool:
    return all(torch.allclose(p, q, rtol=RTOL, atol=ATOL) for p, q in zip(a.parameters(), b.parameters()))


def test_the_reference_imports_nothing_of_the_trainer_or_the_gates():
    tree = ast.parse((ROOT / "gpu_gates" / "streaming" / "parity_reference.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [n for n in names if n.split(".")[0] in ("gpu_gates", "harness", "simulators")], names


@pytest.mark.parametrize("loss_type", ["token", "sequence"])
def test_the_reference_equals_a_correct_trainer(loss_type):
    groups = [groups_of(1), groups_of(2)]
    ref = parity_reference.ReferenceStep(TinyPolicy(seed=3))
    model = streamed(copy.deepcopy(ref.model), groups, loss_type)
    for step in range(2):
        loss, tokens, sequences = ref.step(groups[step], loss_type)
        masks = torch.cat([g.mask for g in groups[step]])
        assert tokens == int(masks.sum()) and sequences == int((masks.sum(dim=1) > 0).sum()) and loss is not None
    assert close(model, ref.model)
    assert not close(model, TinyPolicy(seed=3))  # the steps moved the parameters


@pytest.mark.parametrize("loss_type", ["token", "sequence"])
def test_a_wrong_loss_helper_cancels_out_against_itself_but_not_against_the_reference(monkeypatch, loss_type):
    """The bug sits in the trainer's shared helper: the old reference (sync_train_step, which
    calls that helper) agrees with the broken trainer; the independent one does not."""
    groups = [groups_of(5), groups_of(6)]
    start = TinyPolicy(seed=4)
    monkeypatch.setattr(split_trainer, "loss_sum_and_counts", maskless_loss_sum_and_counts)
    broken = streamed(copy.deepcopy(start), groups, loss_type)
    shared = copy.deepcopy(start)
    opt, sched = make_optimizer(shared)
    for step in range(2):
        sync_train_step(shared, opt, sched, Batch.cat(groups[step]), loss_type)
    assert close(broken, shared)  # a reference sharing the helper sees nothing
    ref = parity_reference.ReferenceStep(copy.deepcopy(start))
    for step in range(2):
        ref.step(groups[step], loss_type)
    assert not close(broken, ref.model)


def test_nothing_valid_is_no_step():
    group = make_batch(0, 2, 5)
    group.mask.zero_()
    ref = parity_reference.ReferenceStep(TinyPolicy(seed=1))
    before = [p.detach().clone() for p in ref.model.parameters()]
    assert ref.step([group], "token") == (None, 0, 0)
    assert all(torch.equal(a, b) for a, b in zip(before, ref.model.parameters()))
    assert ref.scheduler.last_epoch == 0
    with pytest.raises(ValueError, match="loss_type"):
        parity_reference.reference_loss(ref.model, [group], "tokens")
