"""Scenario checks of the scheduling policy's parameters against the pipelines.

``scheduler.partition`` and ``scheduler.groups`` name pipelines and GPUs, so they can only
be checked once the pipelines are read; every problem is one line naming the field, found
before any run (docs/policies.md). Single controllers do not register with the scheduler
and take no part in a policy.
"""

from __future__ import annotations

from typing import Callable, Dict, Sequence

from harness.scheduler.policies import partition_of
from harness.scheduler.types import ACTOR_TRAIN, GENERATION_CLUSTER, ClusterConfig, PipelineEntry


def _registry(pipelines: Sequence) -> Dict[str, PipelineEntry]:
    reg: Dict[str, PipelineEntry] = {}
    for p in pipelines:
        if p.type == "single_controller":
            continue
        reg[p.name] = PipelineEntry(
            p.name,
            p.name,
            {
                ACTOR_TRAIN: ClusterConfig(ACTOR_TRAIN, 1, tuple(sorted(p.train_gpus))),
                GENERATION_CLUSTER: ClusterConfig(GENERATION_CLUSTER, p.infer_tp, tuple(sorted(p.infer_gpus))),
            },
        )
    return reg


def check_policy_fields(fail: Callable[[str, str], Exception], scheduler: dict, pipelines: Sequence) -> None:
    """Raise ``fail(field, problem)`` for a partition or group that cannot work."""
    reg = _registry(pipelines)
    explicit = scheduler.get("partition")
    if explicit:
        owner: Dict[int, str] = {}
        for pid, gpus in explicit.items():
            if pid not in reg:
                raise fail(
                    f"scheduler.partition.{pid}",
                    f"names no pipeline that registers with the scheduler (known: {', '.join(reg) or 'none'})",
                )
            for g in gpus:
                if g in owner:
                    raise fail(
                        f"scheduler.partition.{pid}",
                        f"GPU {g} is also in the part of {owner[g]!r}: parts must be disjoint",
                    )
                owner[g] = pid
        missing = [pid for pid in reg if pid not in explicit]
        if missing:
            raise fail("scheduler.partition", f"gives no GPUs to pipeline {missing[0]!r}: every pipeline needs a part")
    if scheduler.get("policy") == "static_partition" or explicit:
        where = "scheduler.partition" if explicit else "scheduler.policy"
        for pid, part in partition_of(reg, explicit).items():
            train = reg[pid].clusters[ACTOR_TRAIN].device_mapping
            if not part.issuperset(train):
                raise fail(
                    where,
                    f"pipeline {pid!r} trains on GPUs {sorted(set(train) - part)} outside its part "
                    f"{sorted(part)}" + ("" if explicit else " (the default partition; give scheduler.partition)"),
                )
            infer = reg[pid].infer
            if not any(part.issuperset(infer.bundle(r)) for r in range(infer.max_dp_workers)):
                raise fail(
                    where,
                    f"pipeline {pid!r} has no whole inference bundle (tp {infer.tp_size}) inside its part "
                    f"{sorted(part)}" + ("" if explicit else " (the default partition; give scheduler.partition)"),
                )
    groups = scheduler.get("groups")
    if groups:
        seen: Dict[str, int] = {}
        for i, group in enumerate(groups):
            for pid in group:
                if pid not in reg:
                    raise fail(
                        f"scheduler.groups[{i}]", f"names {pid!r}, no pipeline that registers with the scheduler"
                    )
                if pid in seen:
                    raise fail(
                        f"scheduler.groups[{i}]", f"{pid!r} is also in groups[{seen[pid]}]: a pipeline is in one group"
                    )
                seen[pid] = i
