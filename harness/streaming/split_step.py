"""The split train API's state machine: begin -> microbatch* -> finish | abort.

NeMo RL's Megatron worker (docs/modelled-systems.md#nemo-rl-split-training-api) splits one optimizer step into
``begin_train_step`` (raises if a step is open), any number of ``train_microbatch``
calls, and ``finish_train_step`` (one optimizer step); ``abort_train_step`` drops the
step. The trainer version ticks at finish and only there. Every trainer (the torch one
in ``gpu_gates/streaming/split_trainer.py``, the simulator's modelled one) holds one of these and
calls it first, so an illegal call fails the same way in every runtime.

An *empty* step (opened, no microbatch) finishes as a no-op: there is no gradient to
apply and no token to normalize by, so no optimizer step and no version tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


class SplitApiError(RuntimeError):
    """A call out of order (begin while open, microbatch or finish with no open step)."""


@dataclass(frozen=True)
class FinishResult:
    version: int  # trainer version after the call
    applied: bool  # an optimizer step ran (False: the step was empty)
    microbatches: int


class SplitStepMachine:
    def __init__(self, version: int = 0) -> None:
        self.version = version
        self.open_step: Optional[int] = None
        self.microbatches = 0

    @property
    def is_open(self) -> bool:
        return self.open_step is not None

    def begin(self, step: int) -> None:
        if self.open_step is not None:
            raise SplitApiError(f"begin_train_step({step}) while step {self.open_step} is open")
        self.open_step = step
        self.microbatches = 0

    def microbatch(self) -> None:
        if self.open_step is None:
            raise SplitApiError("train_microbatch with no open step (begin_train_step first)")
        self.microbatches += 1

    def finish(self, applied: Optional[bool] = None) -> FinishResult:
        """Close the step. ``applied`` says whether an optimizer step ran; by default
        when any microbatch was trained (a data-parallel trainer passes whether the
        *global* count of valid tokens was non-zero, which every rank agrees on)."""
        if self.open_step is None:
            raise SplitApiError("finish_train_step with no open step")
        if applied is None:
            applied = self.microbatches > 0
        if applied:
            self.version += 1
        out = FinishResult(self.version, applied, self.microbatches)
        self.open_step = None
        self.microbatches = 0
        return out

    def abort(self) -> bool:
        """Drop the open step (no optimizer step, no tick). Idempotent: False when there
        was nothing to abort."""
        was_open = self.open_step is not None
        self.open_step = None
        self.microbatches = 0
        return was_open
