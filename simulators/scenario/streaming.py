"""Cross-field checks of a single_controller pipeline's ``streaming`` section.

The sampler is built exactly as the run will build it, so a scenario that would deadlock
(a gated sampler whose buffer cannot hold ``window + 1`` batches) is refused at load time
with the reason, like NeMo's setup raise (docs/modelled-systems.md#nemo-rl-streaming-single-controller).
"""

from __future__ import annotations

from typing import Optional, Tuple

from harness.streaming.controller import CapacityDeadlock, check_capacity, config_problem, replace_problem
from harness.streaming.samplers import SAMPLER_NAMES, SamplerError, make_sampler
from simulators.scenario.spec import StreamingSpec, WorkloadSpec


def streaming_problem(s: StreamingSpec, w: WorkloadSpec, steps: Optional[int] = None) -> Optional[Tuple[str, str]]:
    """(field, problem) for the first thing wrong with ``s``, or None."""
    if s.sampler not in SAMPLER_NAMES:
        return "sampler", f"unknown sampler {s.sampler!r}; known: {', '.join(SAMPLER_NAMES)}"
    if s.stall_action not in ("warn", "abort"):
        return "stall_action", f"must be warn or abort, got {s.stall_action!r}"
    if s.freshest_first not in (0, 1):
        return "freshest_first", f"must be 0 or 1, got {s.freshest_first}"
    for name in ("infra_failure_rate", "data_failure_rate"):
        if getattr(s, name) >= 1:
            return name, f"must be below 1 (a rate of 1 never succeeds), got {getattr(s, name)}"
    if s.min_groups_for_streaming_train > w.prompts_per_step:
        return (
            "min_groups_for_streaming_train",
            f"{s.min_groups_for_streaming_train} exceeds workload.prompts_per_step {w.prompts_per_step}",
        )
    bad = config_problem(
        s.sampler,
        s.watchdog_interval_s,
        s.stall_timeout_s,
        s.drop_budgets,
        s.max_skipped_prompts,
        s.max_consecutive_dropped_prompts,
        s.min_step_batch_fraction,
    )
    bad = bad or replace_problem(
        s.on_dropped_prompt, s.max_replacement_attempts, s.replacement_reserve_prompts, s.sampler
    )
    if bad:
        return bad
    k = s.checkpoint_restore_after_steps
    if k and steps is not None and k >= steps:
        return (
            "checkpoint_restore_after_steps",
            f"{k} is not below the pipeline's steps {steps}: the run would end before it resumes",
        )
    try:
        sampler = make_sampler(s.sampler, s.window, freshest_first=bool(s.freshest_first), target=s.custom_target)
    except SamplerError as e:
        return ("custom_target" if s.sampler == "custom" else "sampler"), str(e)
    try:
        check_capacity(sampler, w.prompts_per_step, s.max_buffered_rollouts)
    except CapacityDeadlock as e:
        return "max_buffered_rollouts", str(e)
    return None
