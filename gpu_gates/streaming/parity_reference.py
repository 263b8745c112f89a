"""The parity gate's reference step: the loss written from its definition, apart from the trainer.

``train_pump_parity`` holds the streamed split-API trainer (``gpu_gates/streaming/split_trainer.py``) to
one synchronous step on the whole global batch. That reference is only worth something if a
bug in the trainer cannot also be in it: a reference that called the trainer's own loss helper
(``loss_sum_and_counts``) would be wrong the same way, and the comparison would pass. So this
module imports nothing from the trainer or the rest of ``gpu_gates/`` (a test checks that), and
computes the loss another way: sequence by sequence, over the valid positions only, with
log-probabilities as ``logit - logsumexp`` rather than a masked ``log_softmax`` over the batch.

The definition (a policy-gradient loss on the valid response tokens): for sequence ``i`` with
advantage ``A_i`` and valid positions ``t`` (mask 1), ``l(i, t) = -A_i * log p(target(i, t))``;

* token level: the sum of ``l`` over every valid token of the global batch, divided by the
  number of valid tokens;
* sequence level: each sequence's mean ``l`` over its valid tokens, averaged over the
  sequences that have at least one;
* nothing valid anywhere: no step (no optimizer step, no scheduler step).

The optimizer is the trainer's documented one, restated here rather than imported, so a
change on the trainer's side shows as a parity failure: SGD with learning rate 0.1, momentum
0.9 and weight decay 0.01; the learning rate is multiplied by ``1 / (1 + 0.5 k)`` after ``k``
applied steps.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 0.01


def _decay(applied_steps: int) -> float:
    return 1.0 / (1.0 + 0.5 * applied_steps)


def sequence_losses(model: torch.nn.Module, groups: Sequence) -> List[Tuple[torch.Tensor, int]]:
    """(sum of l over the sequence's valid tokens, their number) of every sequence with at
    least one valid token, group by group (a group has ``tokens``, ``targets``, ``mask`` and
    ``advantages``, each a tensor with one row per sequence)."""
    out: List[Tuple[torch.Tensor, int]] = []
    for group in groups:
        logits = model(group.tokens).float()  # [sequences, positions, vocabulary]
        for i in range(group.tokens.shape[0]):
            valid = torch.nonzero(group.mask[i] != 0).flatten()
            if valid.numel() == 0:
                continue
            rows = logits[i, valid]  # [valid positions, vocabulary]
            chosen = rows[torch.arange(valid.numel(), device=rows.device), group.targets[i, valid]]
            log_p = chosen - torch.logsumexp(rows, dim=-1)
            out.append(((-group.advantages[i].float() * log_p).sum(), int(valid.numel())))
    return out


def reference_loss(model: torch.nn.Module, groups: Sequence, loss_type: str) -> Tuple[Optional[torch.Tensor], int, int]:
    """(normalized loss or None when nothing is valid, valid tokens, valid sequences)."""
    if loss_type not in ("token", "sequence"):
        raise ValueError(f"loss_type must be token or sequence, got {loss_type!r}")
    per_seq = sequence_losses(model, groups)
    tokens, sequences = sum(n for _, n in per_seq), len(per_seq)
    if not per_seq:
        return None, 0, 0
    if loss_type == "token":
        loss = torch.stack([s for s, _ in per_seq]).sum() / tokens
    else:
        loss = torch.stack([s / n for s, n in per_seq]).sum() / sequences
    return loss, tokens, sequences


class ReferenceStep:
    """The synchronous full-batch step the streamed trainer must equal."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _decay)

    def step(self, groups: Sequence, loss_type: str) -> Tuple[Optional[float], int, int]:
        """One step on every group of the global batch: (loss before the step or None, valid
        tokens, valid sequences)."""
        for p in self.model.parameters():
            p.grad = None
        loss, tokens, sequences = reference_loss(self.model, groups, loss_type)
        if loss is None:
            return None, 0, 0
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        return float(loss.detach()), tokens, sequences
