"""The split training API on a real torch model: begin -> microbatch* -> finish | abort.

What NeMo RL's Megatron worker does (docs/modelled-systems.md#nemo-rl-split-training-api), on a tiny policy:

* ``begin_train_step`` (the harness's :class:`SplitStepMachine` refuses it while a step
  is open) zeroes the gradients and the step's counters;
* ``train_microbatch`` computes the *un-normalized* loss sum of its sequences (the
  placeholder normalizer N = 1) and back-propagates it inside DDP's ``no_sync()``, so no
  data-parallel reduce fires per microbatch; it counts the valid tokens and sequences;
* ``finish_train_step`` all-reduces the counts across data parallelism, all-reduces the
  accumulated gradients once (DDP's deferred reduce, Megatron's ``finalize_model_grads``),
  rescales them once by 1/N (N = valid tokens for ``token`` loss, valid sequences for
  ``sequence`` loss), then takes one optimizer step and one scheduler step. A step whose
  global N is 0 (nothing valid anywhere) is a no-op: no step, no tick;
* ``abort_train_step`` drops the step (idempotent, no tick).

Because every microbatch contributes a plain sum, the result equals the synchronous
step on the whole global batch (:func:`sync_train_step`), whatever the microbatch split
and arrival order: the property test holds it to that, and ``train_pump_parity.py`` holds it
to a reference written apart from this module (``gpu_gates/streaming/parity_reference.py``).

Each finish returns this rank's metrics with ``is_replica_leader``;
:func:`combine_leader_metrics` counts leaders only, or a TP x CP x PP replica's copies
would be counted several times.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from harness.streaming.split_step import FinishResult, SplitStepMachine

LOSS_TYPES = ("token", "sequence")


class TinyPolicy(nn.Module):
    """Embedding -> tanh -> vocabulary head: enough to have real per-token log-probs."""

    def __init__(self, seed: int = 0, vocab: int = 32, width: int = 16, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.embed = nn.Parameter((torch.randn(vocab, width, generator=gen) * 0.5).to(dtype))
        self.hidden = nn.Parameter((torch.randn(width, width, generator=gen) / width**0.5).to(dtype))
        self.head = nn.Parameter((torch.randn(vocab, width, generator=gen) / width**0.5).to(dtype))
        self.vocab = vocab

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed[tokens] @ self.hidden)
        return h @ self.head.t()


@dataclass
class Batch:
    """Sequences of one or more prompt groups: ``mask`` marks the valid (response) tokens."""

    tokens: torch.Tensor  # [B, T] int64
    targets: torch.Tensor  # [B, T] int64
    mask: torch.Tensor  # [B, T] float (0/1)
    advantages: torch.Tensor  # [B] float

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    def rows(self, idx: Sequence[int]) -> "Batch":
        i = torch.as_tensor(list(idx), dtype=torch.long)
        return Batch(self.tokens[i], self.targets[i], self.mask[i], self.advantages[i])

    @staticmethod
    def cat(parts: Iterable["Batch"]) -> "Batch":
        parts = list(parts)
        width = max(p.tokens.shape[1] for p in parts)

        def pad(t: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, width - t.shape[1]))

        return Batch(
            torch.cat([pad(p.tokens) for p in parts]),
            torch.cat([pad(p.targets) for p in parts]),
            torch.cat([pad(p.mask) for p in parts]),
            torch.cat([p.advantages for p in parts]),
        )


def make_batch(seed: int, sequences: int, length: int, vocab: int = 32, min_valid: int = 0) -> Batch:
    """A deterministic batch: random tokens, a random valid-token mask with at least
    ``min_valid`` valid tokens per row, random advantages."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (sequences, length), generator=gen)
    targets = torch.randint(0, vocab, (sequences, length), generator=gen)
    mask = (torch.rand(sequences, length, generator=gen) < 0.7).float()
    if min_valid:
        mask[:, :min_valid] = 1.0
    advantages = torch.randn(sequences, generator=gen)
    return Batch(tokens, targets, mask, advantages)


def loss_sum_and_counts(model: nn.Module, batch: Batch, loss_type: str):
    """(un-normalized loss sum, valid tokens, valid sequences) of ``batch``.

    Token level: the sum of every valid token's loss (normalized later by all valid tokens).
    Sequence level: each valid sequence's mean token loss, summed (normalized later by the
    number of valid sequences). A sequence with no valid token contributes nothing."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    logits = model(batch.tokens).float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
    mask = batch.mask.float()
    per_token = -batch.advantages.float().unsqueeze(-1) * logp * mask
    tokens = mask.sum()
    per_seq_tokens = mask.sum(dim=1)
    valid = per_seq_tokens > 0
    if loss_type == "token":
        total = per_token.sum()
    else:
        total = (per_token.sum(dim=1)[valid] / per_seq_tokens[valid]).sum()
    return total, tokens, valid.sum().to(mask.dtype)


def make_optimizer(model: nn.Module, lr: float = 0.1):
    """SGD with momentum and weight decay plus a decaying LR schedule: unlike Adam, an
    SGD step is proportional to the gradient, so a wrong 1/N shows in the parameters."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1.0 + 0.5 * step))
    return opt, sched


def sync_train_step(
    model: nn.Module, optimizer, scheduler, batch: Batch, loss_type: str
) -> Optional[List[torch.Tensor]]:
    """The reference: one synchronous step on the whole (global) batch; returns the
    normalized gradients it applied (None when nothing was valid: no step)."""
    optimizer.zero_grad(set_to_none=False)
    total, tokens, seqs = loss_sum_and_counts(model, batch, loss_type)
    n = tokens if loss_type == "token" else seqs
    if float(n) == 0:
        return None
    (total / n).backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    optimizer.step()
    scheduler.step()
    return grads


@dataclass
class WorkerMetrics:
    is_replica_leader: bool
    loss_sum: float  # this rank's un-normalized sum
    tokens: float  # this rank's valid tokens
    sequences: float
    global_loss: Optional[float]  # the step's normalized loss (all ranks agree)


def combine_leader_metrics(results: Sequence[WorkerMetrics]) -> Dict[str, float]:
    """Driver side: sum the per-replica figures of replica leaders only."""
    leaders = [r for r in results if r.is_replica_leader]
    return {
        "loss_sum": sum(r.loss_sum for r in leaders),
        "tokens": sum(r.tokens for r in leaders),
        "sequences": sum(r.sequences for r in leaders),
        "workers": len(results),
        "leaders": len(leaders),
    }


class SplitTrainer:
    def __init__(
        self,
        model: nn.Module,
        loss_type: str = "token",
        lr: float = 0.1,
        group: Optional[Any] = None,
        is_replica_leader: bool = True,
        keep_grads: bool = False,
    ) -> None:
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
        self.model = model
        self.loss_type = loss_type
        self.group = group
        self.distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
        self.ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group) if self.distributed else None
        self.optimizer, self.scheduler = make_optimizer(model, lr)
        self.machine = SplitStepMachine()
        self.is_replica_leader = is_replica_leader
        self.keep_grads = keep_grads
        self.last_grads: Optional[List[torch.Tensor]] = None  # the rescaled gradients of the last applied step
        self._reset()

    @property
    def version(self) -> int:
        return self.machine.version

    def _reset(self) -> None:
        self._loss_sum = 0.0
        self._tokens = 0.0
        self._seqs = 0.0

    def begin_train_step(self, step: int) -> None:
        self.machine.begin(step)
        self.optimizer.zero_grad(set_to_none=False)
        self._reset()

    def train_microbatch(self, batch: Batch) -> Dict[str, float]:
        self.machine.microbatch()
        forward = self.ddp if self.ddp is not None else self.model
        sync_off = self.ddp.no_sync() if self.ddp is not None else contextlib.nullcontext()
        with sync_off:
            total, tokens, seqs = self.loss_sum_and_counts(forward, batch)
            total.backward()  # placeholder normalizer N = 1: a plain sum, rescaled once at finish
        self._loss_sum += float(total.detach())
        self._tokens += float(tokens)
        self._seqs += float(seqs)
        return {"loss_sum": float(total.detach()), "tokens": float(tokens), "sequences": float(seqs)}

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        """The log-prob pass between chunks of a step (NeMo RL's ``get_logprobs`` on the
        next chunk while the step is open): a forward without autograd, which must leave
        the step's accumulated gradients alone."""
        with torch.no_grad():
            logits = self.model(batch.tokens)
            return torch.log_softmax(logits.float(), dim=-1).gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)

    def finish_train_step(self):
        """(FinishResult, WorkerMetrics). Collective: every DP rank must call it."""
        if not self.machine.is_open:
            self.machine.finish()  # raises: no open step
        params = [p for p in self.model.parameters()]
        counts = torch.tensor([self._tokens, self._seqs, self._loss_sum], dtype=torch.float64)
        if self.distributed:
            dev = params[0].device
            counts = counts.to(dev)
            dist.all_reduce(counts, group=self.group)
            counts = counts.cpu()
        tokens, seqs, loss_sum = (float(x) for x in counts)
        n = self.normalizer(tokens, seqs)
        applied = n > 0
        if applied:
            for p in params:
                if self.distributed:  # the one deferred data-parallel reduce of the step
                    dist.all_reduce(p.grad, group=self.group)
                p.grad.div_(n)
            if self.keep_grads:
                self.last_grads = [p.grad.detach().clone() for p in params]
            self.optimizer.step()
            self.scheduler.step()
        result: FinishResult = self.machine.finish(applied=applied)
        metrics = WorkerMetrics(
            self.is_replica_leader, self._loss_sum, self._tokens, self._seqs, loss_sum / n if applied else None
        )
        self.optimizer.zero_grad(set_to_none=False)
        self._reset()
        return result, metrics

    def loss_sum_and_counts(self, forward: nn.Module, batch: Batch):
        """This trainer's loss (:func:`loss_sum_and_counts`); a method so the parity gate's
        fault hook can give a trainer a wrong one."""
        return loss_sum_and_counts(forward, batch, self.loss_type)

    def normalizer(self, tokens: float, sequences: float) -> float:
        """N of the 1/N rescale: the global valid-token count for token-level loss, the
        global valid-sequence count for sequence-level loss."""
        return tokens if self.loss_type == "token" else sequences

    def abort_train_step(self) -> bool:
        had = self.machine.abort()
        self.optimizer.zero_grad(set_to_none=False)
        self._reset()
        return had
