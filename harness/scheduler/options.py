"""Scheduler options: RLix's behaviour by default, documented hazards fixable by flag.

RLix has a few behaviours that docs/modelled-systems.md#rlix-known-bugs-the-scenarios-reproduce lists as hazards. The model
reproduces each by default, because the point of the harness is to find what the real
system does; a fixed variant exists behind an explicit option so a scenario can show the
difference. Field names are the names used in trace headers and scenario files.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Mapping, Optional, Tuple

from harness.scheduler.planner import MAX_GAP_ACTIVATIONS, MAX_GAP_ITERATIONS
from harness.scheduler.policies import GAP_RATIO, check_policy

#: the policy's own fields: written to a header only when they differ from the default, so a
#: gap_ratio log (every log written before policies existed) keeps its bytes
POLICY_FIELDS = ("policy", "partition", "groups")
#: RLix's MILES variants: likewise written only when set
MILES_FIELDS = ("demand_floor", "release_after_offload")


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
    # Not an RLix behaviour: a fault for the oracle (``grant_order``). True =
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
    # Which policy shares the GPUs (docs/policies.md): gap_ratio (RLix), static_partition,
    # round_robin or acquire_yield.
    policy: str = GAP_RATIO
    # static_partition only: pipeline -> its fixed GPUs (disjoint). Default: every pipeline
    # keeps its training GPUs, and each other GPU goes to the first pipeline (scenario order)
    # whose inference mapping holds it.
    partition: Optional[Dict[str, Tuple[int, ...]]] = None
    # round_robin only: co-execution groups, lists of pipeline names. Default: pipelines
    # connected by shared GPUs form one group.
    groups: Optional[Tuple[Tuple[str, ...], ...]] = None
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
            if key in POLICY_FIELDS:
                kwargs[key] = _policy_field(key, value)
                continue
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
        out = asdict(self)
        for key in MILES_FIELDS:  # the same for RLix's MILES variants (docs/rlix-variants.md)
            if out[key] == getattr(SchedulerOptions, key):
                del out[key]
        for key in POLICY_FIELDS:
            if out[key] == getattr(SchedulerOptions, key):
                del out[key]
            elif key == "partition":
                out[key] = {pid: list(gpus) for pid, gpus in out[key].items()}
            elif key == "groups":
                out[key] = [list(g) for g in out[key]]
        return out


def _policy_field(key: str, value: Any) -> Any:
    """``policy`` / ``partition`` / ``groups`` from a scenario or header; ValueError says
    what is wrong in one line."""
    if key == "policy":
        return check_policy(value)
    if value is None:
        return None
    if key == "partition":
        if not isinstance(value, Mapping) or not value:
            raise ValueError(f"scheduler option 'partition' must map pipeline names to GPU lists, got {value!r}")
        out: Dict[str, Tuple[int, ...]] = {}
        for pid, gpus in value.items():
            if (
                not isinstance(gpus, (list, tuple))
                or not gpus
                or any(not isinstance(g, int) or isinstance(g, bool) or g < 0 for g in gpus)
            ):
                raise ValueError(
                    f"scheduler option 'partition' of {pid!r} must be a non-empty list of GPU ids, got {gpus!r}"
                )
            out[str(pid)] = tuple(sorted(gpus))
        return out
    if (
        not isinstance(value, (list, tuple))
        or not value
        or any(not isinstance(g, (list, tuple)) or not g or any(not isinstance(p, str) for p in g) for g in value)
    ):
        raise ValueError(f"scheduler option 'groups' must be a list of lists of pipeline names, got {value!r}")
    return tuple(tuple(g) for g in value)
