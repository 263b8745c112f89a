"""The single controller's rollout pump and stall watchdog, as control logic (NeMo RL
``_rollout_pump`` / ``generate_and_push`` / ``_stall_watchdog_pump``, docs/modelled-systems.md#nemo-rl-streaming-single-controller).

Per admitted batch (the sampler's gate; in_order stamps the target step), per prompt:
a buffer slot (``max_buffered_rollouts``), an in-flight slot (``max_inflight_prompts``),
no weight sync in progress, then the prompt's rollout runs concurrently. A rollout is
reserve (in the pump, with the permit) -> generate -> commit; a failed attempt removes
its group and is classified:
INFRA retries with capped exponential backoff, DATA retries without; past the attempt
limit the prompt is skipped (a stamped prompt's step trains on fewer groups). A rollout aborted by the
train pump (the sampler can no longer select it) just gives its slots back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generator, Optional

from harness.control.streaming_effects import (
    AcquireCapacity,
    AcquireInflight,
    AdmitBatch,
    AwaitRolloutPermitted,
    Backoff,
    BufferedFor,
    Commit,
    CountReplaced,
    DivertToReserve,
    DropReplaced,
    Generate,
    ReleaseCapacity,
    ReleaseInflight,
    RemoveGroup,
    Reserve,
    SkipPrompt,
    StallDetected,
    StartRollout,
    TakeReplacement,
    WatchdogTick,
)

if TYPE_CHECKING:  # the pumps read the config; harness.streaming runs them (no import back)
    from harness.streaming.controller import StreamingConfig


def run(cfg: StreamingConfig, first_prompt: int = 0, top_up: bool = False) -> Generator[Any, Any, None]:
    """Admit batches forever; the runtime stops the pump when the train pump is done.
    With ``on_dropped_prompt: replace`` a batch may go to the spare pool instead of being
    admitted. ``top_up`` (a run restored from a checkpoint): a stamped step dispatches
    only the groups it does not already hold."""
    prompt_id = first_prompt
    while True:
        if cfg.on_dropped_prompt == "replace":
            diverted = yield DivertToReserve(prompt_id, cfg.groups_per_step)
            if diverted:
                prompt_id += cfg.groups_per_step
                continue
        batch, target_step = yield AdmitBatch()
        count = cfg.groups_per_step
        if top_up and target_step is not None:
            count = max(0, count - (yield BufferedFor(target_step)))
        for _ in range(count):
            yield AcquireCapacity()
            yield AcquireInflight()
            yield AwaitRolloutPermitted()
            # reserved right here, in the same turn as the permit: the group's start
            # version is the one generation runs now, never one a sync is replacing
            group_id, _start_version = yield Reserve(prompt_id, target_step)
            yield StartRollout(prompt_id, batch, target_step, group_id)
            prompt_id += 1


def rollout(
    cfg: StreamingConfig, prompt_id: int, batch: int, target_step: Optional[int], group_id: int
) -> Generator[Any, Any, None]:
    """One slot of a step: the prompt's attempts; a prompt dropped after its retries is
    either replaced by a spare (which keeps the slot, maybe re-aimed at the step that lent
    this one a finished group) or skipped (its step closes short)."""
    infra = data = attempt = replacements = 0
    while True:
        if attempt:  # a retry is a new dispatch: it waits out a weight sync, then reserves afresh
            yield AwaitRolloutPermitted()
            group_id, _start_version = yield Reserve(prompt_id, target_step)
        outcome = yield Generate(group_id, prompt_id, attempt)
        attempt += 1
        if outcome == "ok":
            yield Commit(group_id)
            if replacements:
                yield CountReplaced(target_step)
            yield ReleaseInflight()  # the slot in the buffer stays held until clear/evict
            return
        yield RemoveGroup(group_id, outcome)
        if outcome == "aborted":
            break
        if outcome == "infra":
            infra += 1
            if infra < cfg.max_infra_attempts_per_prompt:
                yield Backoff(min(cfg.backoff_s * 2 ** (infra - 1), cfg.max_backoff_s))
                continue
            reason, cause = f"infra failure x{infra}", "infra"
        else:
            data += 1
            if data < cfg.max_data_attempts_per_prompt:
                continue
            reason, cause = f"data failure x{data}", "data"
        spare = None
        if cfg.on_dropped_prompt == "replace":
            spare = yield TakeReplacement(prompt_id, target_step, replacements)
        if spare is None:
            yield SkipPrompt(prompt_id, batch, reason, target_step, cause)
            break
        yield DropReplaced(prompt_id, batch, reason, target_step, cause)
        prompt_id, target_step = spare
        replacements += 1
        infra = data = attempt = 0
        yield AwaitRolloutPermitted()  # a spare is a fresh dispatch: it waits out a weight sync
        group_id, _start_version = yield Reserve(prompt_id, target_step)
    yield ReleaseInflight()
    yield ReleaseCapacity()


def stall_watchdog(cfg: StreamingConfig) -> Generator[Any, Any, str]:
    """Every interval: no progress (commit or trained group) for ``stall_timeout_s`` is a
    stall; ``warn`` logs it and goes on, ``abort`` ends the run."""
    while True:
        idle = yield WatchdogTick(cfg.watchdog_interval_s)
        if idle >= cfg.stall_timeout_s:
            yield StallDetected(idle, cfg.stall_action)
            if cfg.stall_action == "abort":
                return "stalled"
