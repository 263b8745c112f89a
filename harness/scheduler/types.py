"""Value types of the scheduler model: priorities, cluster ids, allocations, plans.

These mirror the shapes RLix uses (docs/modelled-systems.md#rlix-components-and-request-types) so that a decision made by
the model can be compared field by field with one recorded from a real run. They carry
no behaviour beyond small helpers; the policy lives in ``planner``, ``cycle`` and
``model``.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

ACTOR_TRAIN = "actor_train"
GENERATION_CLUSTER = "actor_infer"
CRITIC = "critic"
REFERENCE = "reference"
REWARD = "reward"
ALL_CLUSTER_NAMES: Tuple[str, ...] = (ACTOR_TRAIN, GENERATION_CLUSTER, CRITIC, REFERENCE, REWARD)
GPU_CLUSTER_NAMES: Tuple[str, ...] = (ACTOR_TRAIN, GENERATION_CLUSTER, CRITIC, REFERENCE)

_CLUSTER_ID_RE = re.compile(r"^[A-Za-z0-9_-]+$")
_MAX_CLUSTER_ID_LEN = 256


class Priority(enum.IntEnum):
    """Lower value = served first. Only GENERATION is elastic and preemptable."""

    INITIALIZATION = 0
    ACTOR_TRAINING = 1
    CRITIC_TRAINING = 2
    OLD_LOG_PROBS = 3
    REF_LOG_PROBS = 4
    VALUE_COMPUTE = 5
    GENERATION = 6

    @classmethod
    def parse(cls, value: object) -> "Priority":
        """Accept a name ("GENERATION"), a short key ("GEN") or the integer value."""
        if isinstance(value, bool):
            raise ValueError(f"priority must be a name or 0..6, got {value!r}")
        if isinstance(value, int):
            try:
                return cls(value)
            except ValueError:
                raise ValueError(f"priority must be 0..6, got {value}") from None
        if isinstance(value, str):
            key = value.strip().upper()
            if key in cls.__members__:
                return cls[key]
            if key in SHORT_KEYS:
                return SHORT_KEYS[key]
        raise ValueError(f"unknown priority {value!r}; expected one of {', '.join(cls.__members__)}")

    @property
    def short(self) -> str:
        return _SHORT_BY_PRIORITY[self]


SHORT_KEYS: Dict[str, Priority] = {
    "INIT": Priority.INITIALIZATION,
    "TRN": Priority.ACTOR_TRAINING,
    "CRT": Priority.CRITIC_TRAINING,
    "OLD": Priority.OLD_LOG_PROBS,
    "REF": Priority.REF_LOG_PROBS,
    "VAL": Priority.VALUE_COMPUTE,
    "GEN": Priority.GENERATION,
}
_SHORT_BY_PRIORITY = {v: k for k, v in SHORT_KEYS.items()}


def cluster_id_of(pipeline_id: str, cluster_name: str) -> str:
    return f"{pipeline_id}_{cluster_name}"


def generation_cluster_id(pipeline_id: str) -> str:
    return f"{pipeline_id}_{GENERATION_CLUSTER}"


def validate_cluster_id(cluster_id: object) -> None:
    if not isinstance(cluster_id, str) or not cluster_id:
        raise ValueError("cluster_id must be a non-empty string")
    if len(cluster_id) > _MAX_CLUSTER_ID_LEN:
        raise ValueError(f"cluster_id longer than {_MAX_CLUSTER_ID_LEN} characters")
    if not _CLUSTER_ID_RE.match(cluster_id):
        raise ValueError(f"cluster_id {cluster_id!r} must match [A-Za-z0-9_-]+")


def parse_cluster_id(cluster_id: str) -> Tuple[str, str]:
    """Split ``{pipeline_id}_{cluster_name}`` by its known suffix (pipeline ids contain '_').

    Every cycle parses the same few ids, so strings go through a memo (a pure function of
    the string; an invalid id raises every time, as exceptions are not cached).
    """
    if type(cluster_id) is str:
        return _parse_cluster_id_memo(cluster_id)
    return _parse_cluster_id(cluster_id)


def _parse_cluster_id(cluster_id: str) -> Tuple[str, str]:
    for name in GPU_CLUSTER_NAMES:
        suffix = "_" + name
        if cluster_id.endswith(suffix) and len(cluster_id) > len(suffix):
            return cluster_id[: -len(suffix)], name
    raise ValueError(f"cluster_id {cluster_id!r} does not end in a GPU cluster name ({', '.join(GPU_CLUSTER_NAMES)})")


_parse_cluster_id_memo = functools.lru_cache(maxsize=4096)(_parse_cluster_id)


def is_generation_cluster(cluster_id: str) -> bool:
    return cluster_id.endswith("_" + GENERATION_CLUSTER)


def build_dp_rank_mapping(gpu_ids: List[int], tp_size: int) -> Dict[int, List[int]]:
    """DP rank r owns sorted(gpus)[r*tp:(r+1)*tp] — positional, as in RLix."""
    if tp_size <= 0:
        raise ValueError(f"tp_size must be > 0, got {tp_size}")
    ordered = sorted(gpu_ids)
    return {i // tp_size: ordered[i : i + tp_size] for i in range(0, len(ordered), tp_size)}


@dataclass(frozen=True)
class ClusterConfig:
    """One registered cluster of a pipeline, canonicalized (sorted mapping)."""

    name: str
    tp_size: int
    device_mapping: Tuple[int, ...]

    @property
    def is_generation(self) -> bool:
        return self.name == GENERATION_CLUSTER

    @property
    def max_dp_workers(self) -> int:
        return len(self.device_mapping) // self.tp_size

    def bundle(self, dp_rank: int) -> List[int]:
        start = dp_rank * self.tp_size
        return list(self.device_mapping[start : start + self.tp_size])

    @functools.cached_property
    def mapping_set(self) -> frozenset:
        return frozenset(self.device_mapping)

    @functools.cached_property
    def rank_of_gpu(self) -> Dict[int, int]:
        """GPU id -> the dp rank whose bundle holds it (positional, as in RLix)."""
        return {g: i // self.tp_size for i, g in enumerate(self.device_mapping)}


@dataclass
class PipelineEntry:
    pipeline_id: str
    namespace: str
    clusters: Dict[str, ClusterConfig]
    admitted: bool = False

    @property
    def infer(self) -> ClusterConfig:
        return self.clusters[GENERATION_CLUSTER]


@dataclass
class ClusterAllocation:
    cluster_id: str
    gpu_ids: List[int]
    priority: Priority
    active_dp_ranks: Set[int] = field(default_factory=set)
    dp_rank_to_gpus: Dict[int, List[int]] = field(default_factory=dict)
    global_step: Optional[int] = None
    timestamp: Optional[float] = None

    def copy(self) -> "ClusterAllocation":
        # positional, in field order (plan validation copies every allocation a plan touches)
        return ClusterAllocation(
            self.cluster_id,
            list(self.gpu_ids),
            self.priority,
            set(self.active_dp_ranks),
            {k: list(v) for k, v in self.dp_rank_to_gpus.items()},
            self.global_step,
            self.timestamp,
        )


@dataclass
class ShrinkOp:
    cluster_id: str
    dp_ranks_to_remove: List[int]


@dataclass
class SignalOp:
    """Grant to a pending request. ``gpus`` empty = wake-only GENERATION signal."""

    cluster_id: str
    gpus: List[int]
    priority: Priority
    lora_name: Optional[str] = None
    tp_size: int = 1


@dataclass
class ExpandOp:
    cluster_id: str
    dp_rank_to_gpus: Dict[int, List[int]]
    has_pending_request: bool = False
    tp_size: int = 1


@dataclass
class ExecutionPlan:
    shrinks: List[ShrinkOp] = field(default_factory=list)
    signals: List[SignalOp] = field(default_factory=list)
    expands: List[ExpandOp] = field(default_factory=list)
    # RLix declares this list but never fills it; kept so validation covers it.
    clusters_to_remove: Set[str] = field(default_factory=set)

    def is_empty(self) -> bool:
        return not (self.shrinks or self.signals or self.expands or self.clusters_to_remove)

    def shrink_op(self, cluster_id: str) -> Optional[ShrinkOp]:
        for op in self.shrinks:
            if op.cluster_id == cluster_id:
                return op
        return None


@dataclass
class PendingRequest:
    request_id: int
    cluster_id: str
    priority: Priority
    seq: int  # FIFO order within a priority tier (RLix: Request.timestamp)
    global_step: Optional[int] = None
    step_target_estimate: Optional[int] = None
    lora_name: Optional[str] = None


@dataclass
class PlannedRelease:
    request_id: int
    cluster_id: str
    dp_ranks_to_remove: List[int]
    global_step: Optional[int] = None


class PlanValidationError(RuntimeError):
    """A plan broke one of the 11 numbered validation conditions (docs/modelled-systems.md#rlix-plan-validation)."""

    def __init__(self, message: str, condition: int, context: Optional[dict] = None):
        super().__init__(message)
        self.message = message
        self.condition = condition
        self.context = dict(context or {})

    def __str__(self) -> str:
        return (
            f"condition {self.condition}: {self.message} {self.context}"
            if self.context
            else f"condition {self.condition}: {self.message}"
        )


class Rejected(RuntimeError):
    """An input RLix would refuse (it raises to the caller; the model reports it)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
