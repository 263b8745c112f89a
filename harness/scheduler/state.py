"""Scheduler state: everything a cycle reads, nothing about how it is driven.

Dict insertion order is part of the behaviour: RLix scans allocations and pending
planned releases in insertion order (Phase 2 donor search, Phase 0.5), so this state
keeps plain insertion-ordered dicts and mutates them exactly where RLix does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from harness.scheduler.progress import ProgressStore
from harness.scheduler.types import (
    ClusterAllocation,
    ClusterConfig,
    PendingRequest,
    PipelineEntry,
    PlannedRelease,
    Priority,
    generation_cluster_id,
)


@dataclass
class SchedulerState:
    num_gpus: int
    idle_gpus: Set[int] = field(default_factory=set)
    registry: Dict[str, PipelineEntry] = field(default_factory=dict)
    allocations: Dict[str, ClusterAllocation] = field(default_factory=dict)
    pending: Dict[Priority, List[PendingRequest]] = field(default_factory=lambda: {p: [] for p in Priority})
    planned_releases: Dict[str, PlannedRelease] = field(default_factory=dict)
    # option reserve_same_cluster_release: cluster -> GPUs its own release_then_request
    # released, held back from every other request until that cluster is granted again
    held_for: Dict[str, Set[int]] = field(default_factory=dict)
    progress: ProgressStore = field(default_factory=ProgressStore)
    cycle_counter: int = 0
    request_seq: int = 0
    next_request_id: int = 1
    universe_cache: Optional[Set[int]] = None
    gpu_pipelines_cache: Optional[Dict[int, List[str]]] = None
    neighbours_cache: Optional[Dict[str, Set[str]]] = None
    gen_clusters_cache: Optional[List[Tuple[str, str, ClusterConfig]]] = None
    # what a policy other than gap_ratio remembers between cycles (round_robin's turns,
    # acquire_yield's lock queue: harness/scheduler/policies.py); empty under gap_ratio
    policy_memo: Dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.idle_gpus:
            self.idle_gpus = set(range(self.num_gpus))

    def universe(self) -> Set[int]:
        """Union of registered device mappings (cached until the registry changes)."""
        if self.universe_cache is None:
            u: Set[int] = set()
            for entry in self.registry.values():
                for cfg in entry.clusters.values():
                    u.update(cfg.device_mapping)
            self.universe_cache = u
        return self.universe_cache

    def registry_changed(self) -> None:
        self.universe_cache = None
        self.gpu_pipelines_cache = None
        self.neighbours_cache = None
        self.gen_clusters_cache = None

    def gpu_pipelines(self) -> Dict[int, List[str]]:
        """GPU -> pipelines whose actor_infer maps it, in registry order (cached)."""
        if self.gpu_pipelines_cache is None:
            index: Dict[int, List[str]] = {}
            for pid, entry in self.registry.items():
                for g in entry.infer.device_mapping:
                    index.setdefault(g, []).append(pid)
            self.gpu_pipelines_cache = index
        return self.gpu_pipelines_cache

    def gen_clusters(self) -> List[Tuple[str, str, ClusterConfig]]:
        """(pipeline id, actor_infer cluster id, its config) in registry order.

        Cached like the indexes above: it depends only on the registry's keys and entries,
        and ``register``/``unregister`` (the only registry writers) call
        :meth:`registry_changed`, which drops it.
        """
        if self.gen_clusters_cache is None:
            self.gen_clusters_cache = [
                (pid, generation_cluster_id(pid), entry.infer) for pid, entry in self.registry.items()
            ]
        return self.gen_clusters_cache

    def neighbours(self) -> Dict[str, Set[str]]:
        """Pipeline -> pipelines whose actor_infer mapping shares a GPU with it (cached)."""
        if self.neighbours_cache is None:
            index = self.gpu_pipelines()
            self.neighbours_cache = {
                pid: {q for g in entry.infer.device_mapping for q in index.get(g, ())}
                for pid, entry in self.registry.items()
            }
        return self.neighbours_cache

    def pending_for(self, cluster_id: str) -> Optional[PendingRequest]:
        for bucket in self.pending.values():
            for p in bucket:
                if p.cluster_id == cluster_id:
                    return p
        return None

    def pending_in(self, priority: Priority, cluster_id: str) -> Optional[PendingRequest]:
        for p in self.pending[priority]:
            if p.cluster_id == cluster_id:
                return p
        return None

    def has_waiters(self) -> bool:
        return any(self.pending.values()) or bool(self.planned_releases)

    def allocated_gpus(self) -> Set[int]:
        out: Set[int] = set()
        for a in self.allocations.values():
            out.update(a.gpu_ids)
        return out
