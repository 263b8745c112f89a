"""Effects of the single controller's pumps (``train_pump``, ``rollout_pump``).

Same contract as ``effects.py``: frozen dataclasses a runtime interprets and logs as
``effect_start`` / ``effect_end``. Effects marked *blocking* wait on the controller
state (``harness.streaming.controller``): the runtime retries the matching ``try_*``
until it answers, which is how a semaphore or a sampler gate looks without a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

Groups = Tuple[int, ...]


# ---- train pump
@dataclass(frozen=True)
class StepTarget:
    """How many groups step ``step`` still trains on (prompts dropped shrink it)."""

    step: int


@dataclass(frozen=True)
class Evict:
    """Ask the sampler what it will never select and free those slots."""


@dataclass(frozen=True)
class SelectGroups:
    """*Blocking*: at least ``min_groups`` ready groups the sampler selects (at most
    ``max_groups``); returns their ids (reservation order as the sampler gives them).

    ``step`` and ``target`` are what the request was sized from (the step's target when
    the pump asked): a drop that lands while the select waits shrinks the step's target,
    and the select must then answer at once (empty) so the pump re-reads it and closes
    the step short (NeMo RL re-reads the target on every pass of its select loop)."""

    min_groups: int
    max_groups: int
    step: int = 0
    target: int = 0


@dataclass(frozen=True)
class ComputeLogProbs:
    """Previous-policy and reference log-probs of the selected groups."""

    groups: Groups


@dataclass(frozen=True)
class ComputeAdvantages:
    groups: Groups


@dataclass(frozen=True)
class BeginTrainStep:
    step: int


@dataclass(frozen=True)
class TrainMicrobatches:
    """``train_microbatch`` over the groups (split into microbatches by the trainer)."""

    step: int
    groups: Groups


@dataclass(frozen=True)
class ClearSamples:
    """``clear_samples``: the consumed groups leave the data plane and the buffer."""

    step: int
    groups: Groups


@dataclass(frozen=True)
class FinishTrainStep:
    """One optimizer step; returns the trainer version after it."""

    step: int


@dataclass(frozen=True)
class AbortTrainStep:
    step: int


@dataclass(frozen=True)
class PauseRollouts:
    """Clear ``_rollout_permitted``: no new dispatch (in-flight rollouts go on)."""


@dataclass(frozen=True)
class AbortStaleInflight:
    """Abort in-flight rollouts the sampler can no longer select; returns their ids."""

    version: int


@dataclass(frozen=True)
class SyncWeights:
    """Trainer -> generation weight sync of ``version``."""

    version: int


@dataclass(frozen=True)
class ResumeRollouts:
    """``set_weight_version(version)`` then set ``_rollout_permitted``."""

    version: int


# ---- rollout pump
@dataclass(frozen=True)
class AdmitBatch:
    """*Blocking*: the sampler's admission gate; returns (dispatch_index, target_step)."""


@dataclass(frozen=True)
class AcquireCapacity:
    """*Blocking*: one slot of ``max_buffered_rollouts``."""


@dataclass(frozen=True)
class AcquireInflight:
    """*Blocking*: one of ``max_inflight_prompts``."""


@dataclass(frozen=True)
class AwaitRolloutPermitted:
    """*Blocking*: no weight sync in progress."""


@dataclass(frozen=True)
class StartRollout:
    """Run ``rollout_pump.rollout`` for one prompt concurrently (a task per prompt)."""

    prompt_id: int
    batch: int
    target_step: Optional[int]
    group_id: int  # reserved by the pump for the first attempt


@dataclass(frozen=True)
class Reserve:
    """``reserve(weight_version)``: a fresh group id; returns (group_id, start_version)."""

    prompt_id: int
    target_step: Optional[int]


@dataclass(frozen=True)
class Generate:
    """Generate the group; returns ``ok`` | ``infra`` | ``data`` | ``aborted``."""

    group_id: int
    prompt_id: int
    attempt: int


@dataclass(frozen=True)
class Commit:
    group_id: int


@dataclass(frozen=True)
class RemoveGroup:
    group_id: int
    reason: str


@dataclass(frozen=True)
class Backoff:
    seconds: float


@dataclass(frozen=True)
class SkipPrompt:
    """A prompt dropped after its retries. Only a stamped prompt (``target_step`` not
    None: the in_order sampler) shrinks its step's target; an unstamped batch fills
    from whatever is ready, so a drop there costs throughput but strands no step."""

    prompt_id: int
    batch: int
    reason: str
    target_step: Optional[int] = None
    cause: str = "data"  # data | infra (the drop budget it counts against)


@dataclass(frozen=True)
class DivertToReserve:
    """on_dropped_prompt replace: the next batch's prompts go to the spare pool instead of
    being admitted, when the pool is below its low-water mark; returns True if diverted."""

    first_prompt: int
    count: int


@dataclass(frozen=True)
class TakeReplacement:
    """A dropped stamped prompt asks for a spare; returns ``(spare prompt, step it now
    fills)`` (the step differs after a borrow from a later step) or None to shrink."""

    prompt_id: int
    target_step: Optional[int]
    used: int  # spares this slot already took


@dataclass(frozen=True)
class DropReplaced:
    """A prompt dropped after its retries whose slot a spare took over: it counts against
    the drop budgets but no step shrinks."""

    prompt_id: int
    batch: int
    reason: str
    target_step: Optional[int] = None
    cause: str = "data"


@dataclass(frozen=True)
class CountReplaced:
    """A spare's group committed: its step got a dropped slot back (NeMo RL's per-step
    replaced_prompt_groups)."""

    target_step: Optional[int]


@dataclass(frozen=True)
class BufferedFor:
    """Groups already buffered for a just-admitted step (a restored run's top-up)."""

    target_step: Optional[int]


@dataclass(frozen=True)
class ReleaseInflight:
    pass


@dataclass(frozen=True)
class ReleaseCapacity:
    pass


# ---- stall watchdog
@dataclass(frozen=True)
class WatchdogTick:
    """Sleep one watchdog interval; returns seconds since the last progress."""

    interval_s: float


@dataclass(frozen=True)
class StallDetected:
    idle_s: float
    action: str


#: Effects that run on the trainer's GPUs (placed there by the runtimes' logs).
STREAMING_TRAINER_EFFECTS = (
    "ComputeLogProbs",
    "ComputeAdvantages",
    "BeginTrainStep",
    "TrainMicrobatches",
    "FinishTrainStep",
    "AbortTrainStep",
)
