"""The single controller's shared state: what the train pump, the rollout pump and the
stall watchdog read and change (NeMo RL ``SingleControllerActor``, docs/modelled-systems.md#nemo-rl-streaming-single-controller).

One object per pipeline, owned by the runtime that interprets the pumps; the pumps never
touch it directly (they yield effects and the runtime calls the methods here), so the
same accounting runs in the simulator and in the real CPU runtime. Blocking effects are
``try_*`` methods that return ``None`` while the caller must wait; a runtime re-tries
them when something changed (:attr:`ControllerState.changes` counts changes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from harness.streaming.buffer import GroupEntry, RolloutBuffer
from harness.streaming.samplers import Admission, PromptGroupSampler, make_sampler


class CapacityDeadlock(ValueError):
    """Setup refuses a buffer too small for a gated sampler: it would deadlock."""


@dataclass(frozen=True)
class StreamingConfig:
    """The ``async_rl`` knobs of the single controller (defaults as NeMo's where it has them)."""

    groups_per_step: int = 4  # num_prompts_per_step
    generations_per_prompt: int = 2
    sampler: str = "in_order"
    window: int = 1  # max_lookahead_versions / max_staleness_versions / window
    freshest_first: bool = False
    custom_target: str = ""  # "module:Class" for sampler custom
    min_groups_for_streaming_train: int = 1  # groups_per_step: train only on a full batch
    max_inflight_prompts: int = 32
    max_buffered_rollouts: int = 64
    microbatch_groups: int = 1  # groups per train_microbatch call
    max_infra_attempts_per_prompt: int = 3
    max_data_attempts_per_prompt: int = 2
    backoff_s: float = 0.5
    max_backoff_s: float = 4.0
    watchdog_interval_s: float = 30.0
    stall_timeout_s: float = 600.0
    stall_action: str = "warn"  # warn | abort
    # NeMo RL's drop budgets (rollout_failure.*); off = drops are unlimited and a step may
    # shrink to nothing, the harness's model before budgets existed (docs/nemo-rl-parity.md)
    drop_budgets: bool = False
    max_skipped_prompts: int = 0  # data drops allowed in the run; one more fails it
    max_consecutive_dropped_prompts: int = 0  # infra drops in a row (a commit resets); one more fails it
    min_step_batch_fraction: float = 0.9  # a step closing below ceil(fraction x groups_per_step) fails the run
    # NeMo RL's rollout_failure.on_dropped_prompt: shrink (the step closes short) or replace
    # (a spare prompt from a pool stands in, after borrowing a later step's finished group)
    on_dropped_prompt: str = "shrink"
    max_replacement_attempts: int = 1  # spares tried for one lost slot before shrinking
    replacement_reserve_prompts: int = 1  # the pool's low-water mark: below it a batch is diverted
    # fault critic_warmup_no_wake (NVIDIA-NeMo/RL #3730's review): the first critic warm-up step;
    # from it on each step stands generation down for the critic and skips the refit and the resume
    warmup_no_wake_step: Optional[int] = None
    # fault refit_without_pause (NVIDIA-NeMo/RL #3839, vllm-project/vime #168): from this step on
    # the refit writes the weights without pausing generation first
    refit_without_pause_step: Optional[int] = None

    def __post_init__(self) -> None:
        bad = config_problem(
            self.sampler,
            self.watchdog_interval_s,
            self.stall_timeout_s,
            self.drop_budgets,
            self.max_skipped_prompts,
            self.max_consecutive_dropped_prompts,
            self.min_step_batch_fraction,
        ) or replace_problem(
            self.on_dropped_prompt, self.max_replacement_attempts, self.replacement_reserve_prompts, self.sampler
        )
        if bad:
            raise ValueError(f"{bad[0]}: {bad[1]}")


class DropBudgetExceeded(RuntimeError):
    """A dropped prompt past a drop budget, or a step below its floor: the run fails
    (NeMo RL's rollout failure propagates and ends the run)."""


def config_problem(
    sampler: str,
    watchdog_interval_s: float,
    stall_timeout_s: float,
    drop_budgets: bool,
    max_skipped: int,
    max_consecutive: int,
    fraction: float,
) -> Optional[Tuple[str, str]]:
    """(field, problem) for a failure/watchdog setting that cannot do what it is set for,
    as NeMo RL's setup refuses them; None when fine."""
    if stall_timeout_s <= watchdog_interval_s:
        return (
            "stall_timeout_s",
            f"{stall_timeout_s:g} must be above watchdog_interval_s {watchdog_interval_s:g}: "
            "otherwise one tick without progress already reads as a stall",
        )
    if not drop_budgets:
        return None
    if max_skipped < 0 or max_consecutive < 0:
        return ("max_skipped_prompts" if max_skipped < 0 else "max_consecutive_dropped_prompts", "must be >= 0")
    if not 0 < fraction <= 1:
        return "min_step_batch_fraction", f"must be in (0, 1], got {fraction:g}"
    if sampler not in ("in_order", "custom") and max_skipped + max_consecutive > 0:
        field = "max_skipped_prompts" if max_skipped else "max_consecutive_dropped_prompts"
        return (
            field,
            f"the {sampler} sampler stamps no target step, so a dropped prompt is owed to no step and "
            "the step waiting for it never shrinks (a stalled run): use in_order, or budgets of 0",
        )
    return None


def replace_problem(mode: str, attempts: int, reserve: int, sampler: str) -> Optional[Tuple[str, str]]:
    """(field, problem) for a drop-handling setting that cannot do what it asks, as NeMo
    RL's config refuses it: replace with no attempt or no pool would quietly shrink, and
    a sampler that stamps no step has no step to replace into."""
    if mode not in ("shrink", "replace"):
        return "on_dropped_prompt", f"must be shrink or replace, got {mode!r}"
    if mode != "replace":
        return None
    if attempts < 1:
        return "max_replacement_attempts", f"must be >= 1 with on_dropped_prompt replace, got {attempts} (0 is shrink)"
    if reserve < 1:
        return (
            "replacement_reserve_prompts",
            f"must be >= 1 with on_dropped_prompt replace, got {reserve} (the pool would never fill)",
        )
    if sampler not in ("in_order", "custom"):
        return "on_dropped_prompt", (
            f"replace does nothing with the {sampler} sampler: it stamps no target step, "
            "so no step waits for a dropped prompt"
        )
    return None


def check_capacity(sampler: PromptGroupSampler, groups_per_step: int, max_buffered_rollouts: int) -> None:
    """Reject at setup a gated sampler whose buffer cannot hold ``window + 1`` batches:
    it admits that many batches ahead, they fill every slot, and the batch the trainer
    needs next can never be reserved (NeMo RL's setup raise, docs/modelled-systems.md#nemo-rl-streaming-single-controller)."""
    need = sampler.required_buffer_capacity(groups_per_step)
    if max_buffered_rollouts < need:
        raise CapacityDeadlock(
            f"max_buffered_rollouts {max_buffered_rollouts} is below the {need} groups the {sampler.name} sampler "
            f"needs (groups_per_step {groups_per_step} x (window {sampler.window} + 1)): admitted batches would fill "
            f"the buffer and the step the trainer waits for could never be reserved (deadlock)"
        )


def setup_fields(cfg: StreamingConfig) -> Dict[str, object]:
    """Fields of the ``streaming_setup`` record every runtime writes first. ``max_age`` is
    the staleness bound ``staleness_window`` holds consumption to: the window for the samplers
    that filter on it, none for ``ready_first`` (anything not from the future) and for a
    custom sampler (its policy is its own)."""
    return {
        "sampler": cfg.sampler,
        "window": cfg.window,
        "max_age": None if cfg.sampler in ("ready_first", "custom") else cfg.window,
        "groups_per_step": cfg.groups_per_step,
        "max_buffered_rollouts": cfg.max_buffered_rollouts,
        "min_groups_for_streaming_train": cfg.min_groups_for_streaming_train,
        "max_inflight_prompts": cfg.max_inflight_prompts,
    }


class ControllerState:
    def __init__(self, cfg: StreamingConfig, sampler: Optional[PromptGroupSampler] = None) -> None:
        self.cfg = cfg
        self.sampler = sampler or make_sampler(
            cfg.sampler, cfg.window, freshest_first=cfg.freshest_first, target=cfg.custom_target
        )
        check_capacity(self.sampler, cfg.groups_per_step, cfg.max_buffered_rollouts)
        self.buffer = RolloutBuffer(cfg.max_buffered_rollouts)
        self.trainer_version = 0  # the driver's view, moved by FinishTrainStep
        self.weight_version = 0  # what generation runs, moved by ResumeRollouts
        self.rollouts_permitted = True
        self.capacity_held = 0  # prompts holding a buffer slot (semaphore max_buffered_rollouts)
        self.inflight = 0  # prompts generating (semaphore max_inflight_prompts)
        self.dropped: Dict[int, int] = {}  # stamped step -> prompts skipped after their retries
        self.aborted: List[int] = []  # group ids aborted in flight
        self.changes = 0
        self.stopped = False
        self.stale_select_target = False  # fault hook: a waiting select ignores a shrunk target
        self.skipped = 0  # data drops so far (drop budget max_skipped_prompts)
        self.consecutive_infra = 0  # infra drops since the last commit (max_consecutive_dropped_prompts)
        self.spares: List[int] = []  # spare prompt ids (on_dropped_prompt replace)
        self.stamped = False  # the sampler has stamped a batch: only then is a batch diverted to the pool
        self.replaced: Dict[int, int] = {}  # step -> slots a spare prompt filled (after a borrow: the lender)
        self.promoted: Dict[int, int] = {}  # step -> holes filled with a later step's finished group
        self.next_prompt = 0  # past every prompt dispatched or pooled (a resumed dataloader's position)
        self.restored = 0  # groups loaded from a checkpoint (harness.streaming.checkpoint)

    def changed(self) -> None:
        self.changes += 1

    # ---- rollout side
    def try_admit(self) -> Optional[Admission]:
        adm = self.sampler.admit(self.trainer_version)
        if adm is not None:
            self.stamped = self.stamped or adm.target_step is not None
            self.changed()
        return adm

    def try_acquire_capacity(self) -> Optional[bool]:
        if self.capacity_held >= self.cfg.max_buffered_rollouts:
            return None
        self.capacity_held += 1
        return True

    def release_capacity(self) -> None:
        self.capacity_held -= 1
        self.changed()

    def try_acquire_inflight(self) -> Optional[bool]:
        if self.inflight >= self.cfg.max_inflight_prompts:
            return None
        self.inflight += 1
        return True

    def release_inflight(self) -> None:
        self.inflight -= 1
        self.changed()

    def try_rollout_permitted(self) -> Optional[bool]:
        return True if self.rollouts_permitted else None

    def reserve(self, prompt_id: int, target_step: Optional[int]) -> Tuple[int, int]:
        gid = self.buffer.reserve(prompt_id, self.weight_version, target_step, size=self.cfg.generations_per_prompt)
        self.next_prompt = max(self.next_prompt, prompt_id + 1)
        if gid is None:  # the capacity semaphore is acquired first: this is a runtime bug
            raise RuntimeError(
                f"buffer full ({self.buffer.used}/{self.buffer.capacity}) at reserve: capacity accounting broken"
            )
        self.changed()
        return gid, self.weight_version

    def commit(self, group_id: int) -> GroupEntry:
        entry = self.buffer.commit(group_id, self.weight_version)
        self.consecutive_infra = 0  # any commit ends an outage
        self.changed()
        return entry

    def remove_group(self, group_id: int) -> bool:
        gone = self.buffer.remove_group(group_id)
        self.changed()
        return gone

    def skip_prompt(self, target_step: Optional[int], cause: str = "data") -> None:
        """Credit a dropped prompt to the step it was stamped for (NeMo RL's batch
        shortfall). An unstamped prompt credits nothing: the samplers that do not stamp
        fill a step from whatever is ready, so no step waits for it. With drop budgets, a
        drop past its budget fails the run (raised to the runtime)."""
        if self.cfg.drop_budgets:
            if cause == "infra":
                self.consecutive_infra += 1
                if self.consecutive_infra > self.cfg.max_consecutive_dropped_prompts:
                    raise DropBudgetExceeded(
                        f"{self.consecutive_infra} prompts in a row dropped after infra failures, "
                        f"above max_consecutive_dropped_prompts {self.cfg.max_consecutive_dropped_prompts}"
                    )
            else:
                self.skipped += 1
                if self.skipped > self.cfg.max_skipped_prompts:
                    raise DropBudgetExceeded(
                        f"{self.skipped} prompts dropped after data failures, above "
                        f"max_skipped_prompts {self.cfg.max_skipped_prompts}"
                    )
        if target_step is not None:
            self.dropped[target_step] = self.dropped.get(target_step, 0) + 1
        self.changed()

    # ---- on_dropped_prompt: replace (NeMo RL _divert_batch_to_reserve / _take_replacement / _promote_into_step)
    def divert(self, first_prompt: int, count: int) -> bool:
        """Put the next batch's prompts in the spare pool instead of admitting it, when
        replacing, once a batch was stamped, and while the pool is below its mark."""
        if self.cfg.on_dropped_prompt != "replace" or not self.stamped:
            return False
        if len(self.spares) >= self.cfg.replacement_reserve_prompts:
            return False
        self.spares.extend(range(first_prompt, first_prompt + count))
        self.next_prompt = max(self.next_prompt, first_prompt + count)
        self.changed()
        return True

    def take_replacement(self, target_step: Optional[int], used: int) -> Optional[Tuple[int, int]]:
        """(spare prompt, step it now fills) for a dropped stamped prompt, or None to
        shrink. With a spare in hand, a later step's finished group is re-stamped into the
        dropped step (it closes at once) and the spare repays that later step."""
        if (
            self.cfg.on_dropped_prompt != "replace"
            or target_step is None
            or used >= self.cfg.max_replacement_attempts
            or not self.spares
        ):
            return None
        spare = self.spares.pop(0)
        if target_step >= self.trainer_version:
            lender = self.buffer.promote_ready_group(target_step)
            if lender is not None:
                self.promoted[target_step] = self.promoted.get(target_step, 0) + 1
                target_step = lender
        self.changed()
        return spare, target_step

    def count_replaced(self, target_step: Optional[int]) -> None:
        if target_step is not None:
            self.replaced[target_step] = self.replaced.get(target_step, 0) + 1

    def buffered_for(self, target_step: Optional[int]) -> int:
        """Groups already held for a stamped step: a step restored from a checkpoint is
        topped up with only the rest of its batch."""
        return 0 if target_step is None else self.buffer.count_for_target_step(target_step)

    # ---- train side
    def step_target(self, step: int) -> int:
        """Groups step ``step`` trains on: ``groups_per_step`` less the prompts dropped
        for it; with drop budgets, below ``ceil(min_step_batch_fraction x groups_per_step)``
        the run fails (a step is what the gradient is computed from)."""
        target = self.cfg.groups_per_step - self.dropped.get(step, 0)
        if self.cfg.drop_budgets:
            floor = math.ceil(self.cfg.groups_per_step * self.cfg.min_step_batch_fraction - 1e-9)
            if target < floor:
                raise DropBudgetExceeded(
                    f"step {step} lost {self.dropped[step]} of {self.cfg.groups_per_step} prompt "
                    f"groups, below the floor of {floor} (min_step_batch_fraction "
                    f"{self.cfg.min_step_batch_fraction:g})"
                )
        return target

    def evict(self) -> List[int]:
        gone = [e.group_id for e in self.sampler.evict(self.buffer, self.trainer_version)]
        for gid in gone:
            self.buffer.remove_group(gid)
            self.capacity_held -= 1
        if gone:
            self.changed()
        return gone

    def try_select(self, min_groups: int, max_groups: int) -> Optional[List[GroupEntry]]:
        picked = self.sampler.select(self.buffer, self.trainer_version, min_groups, max_groups)
        return picked or None

    def clear(self, group_ids) -> None:
        """clear_samples: the consumed groups leave the buffer and free their slots."""
        for gid in group_ids:
            if self.buffer.remove_group(gid):
                self.capacity_held -= 1
        self.changed()

    def stale_inflight(self) -> List[int]:
        return [
            e.group_id for e in self.buffer.inflight() if self.sampler.should_abort_inflight(e, self.trainer_version)
        ]
