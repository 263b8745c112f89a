"""Scheduler options: RLix's behaviour by default, documented hazards fixable by flag.

RLix has a few behaviours that docs/modelled-systems.md#rlix-known-bugs-the-scenarios-reproduce lists as hazards. The model
reproduces each by default, because the point of the harness is to find what the real
system does; a fixed variant exists behind an explicit option so a scenario can show the
difference. Field names are the names used in trace headers and scenario files.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Mapping

from harness.scheduler.planner import MAX_GAP_ACTIVATIONS, MAX_GAP_ITERATIONS


@dataclass(frozen=True)
class SchedulerOptions:
    # Phase 6 acks every pending planned release, including one that arrived in the lock
    # gap and whose shrink was never planned ("premature planned-release ack").
    # False = exact planned releases: the ranks to shrink are re-read at planning time,
    # a releasing cluster is never expanded meanwhile, and the ack comes only once the
    # cluster has no active rank left.
    ack_unplanned_releases: bool = True
    # Phase 2 keeps GEN shrinks it added for a non-GEN request that still cannot be
    # granted (GEN preempted for nothing). True = roll those shrinks back.
    rollback_ungrantable_preemption: bool = False
    # Phase 2 skips an unsatisfiable request and grants later/smaller ones (no
    # head-of-line blocking, so a large request can starve). True = stop granting
    # non-GEN requests in this cycle after the first one that cannot be granted.
    head_of_line_blocking: bool = False
    # Not an RLix behaviour (RLix adds the GPUs a release_then_request releases to the
    # idle pool, where an earlier same-tier request or a GENERATION expand can take them
    # while the releasing cluster's memory is still on them). True = when a cluster
    # releases and re-requests itself (ROLL's OLD_LOG_PROBS -> ACTOR_TRAINING), the
    # released GPUs stay reserved for that request until it is granted.
    reserve_same_cluster_release: bool = False
    # Not an RLix behaviour: a fault for the oracle (invariant 21, ``grant_order``). True =
    # Phase 2 walks each tier's pending requests newest first, so a later request can take
    # the GPUs an earlier one of the same tier could have had.
    grant_newest_first: bool = False
    # Gap-ratio planner parameters and RLix's safety bounds (exceeding them fails fast).
    epsilon: float = 0.0
    max_gap_iterations: int = MAX_GAP_ITERATIONS
    max_gap_activations: int = MAX_GAP_ACTIVATIONS
    # Background rebalance (docs/modelled-systems.md#rlix-scheduling-loop-and-background-rebalance): deviation threshold in percentage points and
    # the share of pipelines (worst completion first) compared.
    rebalance_threshold_pp: float = 10.0
    rebalance_worst_fraction: float = 0.5
    # RLix's MILES line, off = RLix main/nemo (rlops/rlix PR #12, d455b0c; docs/rlix-variants.md):
    # the gap-ratio planner gives a GENERATION cluster still in the allocations, with no
    # progress report and no pending estimate, a demand of 1.0 instead of skipping it
    # (a receiver of one bundle and a donor down to one).
    demand_floor: bool = False
    # RLix's MILES line, off = RLix main/nemo (rlops/rlix PRs #10 and #13, 59ecc9a and a8460a9;
    # docs/rlix-variants.md): once the training offload ran, the training GPUs are released in
    # a finally, even when the weight sync after it fails. Read by the pipeline's step order
    # (harness/control), not by the planner.
    release_after_offload: bool = False

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "SchedulerOptions":
        """Build from a header/scenario mapping; unknown or mistyped fields raise ValueError."""
        known = {f.name: f for f in fields(cls)}
        kwargs: Dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                raise ValueError(f"unknown scheduler option {key!r}; known: {', '.join(sorted(known))}")
            default = getattr(cls(), key)
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise ValueError(f"scheduler option {key!r} must be true or false, got {value!r}")
            elif isinstance(default, int):
                if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                    raise ValueError(f"scheduler option {key!r} must be a positive integer, got {value!r}")
            elif isinstance(default, float):
                if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                    raise ValueError(f"scheduler option {key!r} must be a non-negative number, got {value!r}")
                value = float(value)
            kwargs[key] = value
        return cls(**kwargs)

    def to_mapping(self) -> Dict[str, Any]:
        """The header's ``scheduler`` mapping. Options added after the log format was fixed
        (:data:`OPTIONAL_IN_HEADER`) appear only when set, so a log that does not use them
        keeps its bytes."""
        out = asdict(self)
        for key in OPTIONAL_IN_HEADER:
            if out[key] == getattr(_DEFAULTS, key):
                del out[key]
        return out


#: options written to a log header only when they differ from the default
OPTIONAL_IN_HEADER = ("demand_floor", "release_after_offload")
_DEFAULTS = SchedulerOptions()
