"""Cluster topology and pipeline registration: RLix's checks, written once.

Every rule here rejects with :class:`TopologyError`, whose message names the pipeline,
the cluster and the rule, so a bad scenario or trace fails with one readable line.
The rules are those of RLix's ``register_pipeline`` (docs/modelled-systems.md#rlix-registration) and of the
partial-overlap startup validation (F10, docs/modelled-systems.md#rlix-partial-overlap-shrink-expand-and-routing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional

from harness.scheduler.types import (
    ACTOR_TRAIN,
    ALL_CLUSTER_NAMES,
    GENERATION_CLUSTER,
    REWARD,
    ClusterConfig,
    PipelineEntry,
)


class TopologyError(ValueError):
    """A registration or topology rule was broken; ``rule`` is a short stable tag."""

    def __init__(self, pipeline_id: str, cluster: Optional[str], rule: str, problem: str):
        where = f"pipeline {pipeline_id}" + (f", cluster {cluster}" if cluster else "")
        super().__init__(f"{where}: {problem} (rule: {rule})")
        self.pipeline_id = pipeline_id
        self.cluster = cluster
        self.rule = rule
        self.problem = problem


@dataclass(frozen=True)
class ClusterTopology:
    """Nodes × GPUs per node; global GPU id g lives on node g // gpus_per_node."""

    nodes: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, int) or isinstance(self.nodes, bool) or self.nodes <= 0:
            raise ValueError(f"nodes must be a positive integer, got {self.nodes!r}")
        if not isinstance(self.gpus_per_node, int) or isinstance(self.gpus_per_node, bool) or self.gpus_per_node <= 0:
            raise ValueError(f"gpus_per_node must be a positive integer, got {self.gpus_per_node!r}")

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    def local_index(self, gpu: int) -> int:
        return gpu % self.gpus_per_node


def validate_pipeline_id(pipeline_id: object) -> str:
    if not isinstance(pipeline_id, str) or not pipeline_id:
        raise TopologyError(str(pipeline_id), None, "pipeline_id", "pipeline_id must be a non-empty string")
    if ":" in pipeline_id:
        raise TopologyError(pipeline_id, None, "pipeline_id", "pipeline_id must not contain ':'")
    for ch in pipeline_id:
        if not (ch.isalnum() or ch in "_-"):
            raise TopologyError(
                pipeline_id,
                None,
                "pipeline_id",
                f"pipeline_id has character {ch!r}; allowed: letters, digits, '_', '-'",
            )
    return pipeline_id


def canonical_device_mapping(
    pipeline_id: str, cluster: str, tp_size: int, mapping: List[int], topo: ClusterTopology
) -> List[int]:
    """Sort the mapping and check that TP groups are contiguous and node-respecting.

    tp=1 is free; tp in {2,4,8} groups must be contiguous ids inside one node; a tp that
    is a multiple of gpus_per_node must cover whole, aligned nodes; anything else is refused.
    """
    canonical = sorted(mapping)
    if tp_size == 1:
        return canonical
    gpn = topo.gpus_per_node
    if tp_size not in (2, 4, 8) and tp_size % gpn != 0:
        raise TopologyError(
            pipeline_id,
            cluster,
            "tp_size",
            f"tp_size={tp_size} must be 1, 2, 4, 8 or a multiple of gpus_per_node={gpn}",
        )
    for i in range(0, len(canonical), tp_size):
        group = canonical[i : i + tp_size]
        if group != list(range(group[0], group[0] + tp_size)):
            raise TopologyError(pipeline_id, cluster, "tp_contiguous", f"TP group {group} is not contiguous")
        if tp_size <= gpn:
            if topo.node_of(group[0]) != topo.node_of(group[-1]):
                raise TopologyError(
                    pipeline_id, cluster, "tp_node", f"TP group {group} crosses a node boundary (gpus_per_node={gpn})"
                )
        elif group[0] % gpn != 0 or group[-1] % gpn != gpn - 1:
            raise TopologyError(
                pipeline_id, cluster, "tp_node", f"TP group {group} does not cover whole nodes (gpus_per_node={gpn})"
            )
    return canonical


def build_pipeline_entry(
    pipeline_id: object,
    namespace: object,
    cluster_tp_configs: object,
    cluster_device_mappings: object,
    topo: ClusterTopology,
) -> PipelineEntry:
    """Apply every RLix registration check and return the canonical registry entry."""
    pid = validate_pipeline_id(pipeline_id)
    if not isinstance(namespace, str) or not namespace:
        raise TopologyError(pid, None, "namespace", "namespace must be a non-empty string")
    if not isinstance(cluster_tp_configs, Mapping) or not cluster_tp_configs:
        raise TopologyError(pid, None, "tp_configs", "cluster_tp_configs must be a non-empty object")
    if not isinstance(cluster_device_mappings, Mapping) or not cluster_device_mappings:
        raise TopologyError(pid, None, "device_mappings", "cluster_device_mappings must be a non-empty object")
    if set(cluster_tp_configs) != set(cluster_device_mappings):
        no_tp = sorted(set(cluster_device_mappings) - set(cluster_tp_configs))
        no_map = sorted(set(cluster_tp_configs) - set(cluster_device_mappings))
        raise TopologyError(
            pid,
            None,
            "key_sets",
            f"tp configs and device mappings name different clusters (no tp for {no_tp}, no mapping for {no_map})",
        )
    if GENERATION_CLUSTER not in cluster_tp_configs:
        raise TopologyError(pid, None, "actor_infer_required", "an actor_infer cluster must be registered")
    clusters: Dict[str, ClusterConfig] = {}
    for name in cluster_tp_configs:
        if name not in ALL_CLUSTER_NAMES:
            raise TopologyError(
                pid, str(name), "cluster_name", f"unknown cluster name; expected one of {', '.join(ALL_CLUSTER_NAMES)}"
            )
        tp = cluster_tp_configs[name]
        if not isinstance(tp, int) or isinstance(tp, bool):
            raise TopologyError(pid, name, "tp_size", f"tp_size must be an integer, got {tp!r}")
        if tp <= 0:
            raise TopologyError(pid, name, "tp_size", f"tp_size must be > 0, got {tp}")
        mapping = cluster_device_mappings[name]
        if not isinstance(mapping, list) or any(not isinstance(g, int) or isinstance(g, bool) for g in mapping):
            raise TopologyError(pid, name, "device_mapping", "device_mapping must be a list of integer GPU ids")
        if name == REWARD:
            if mapping:
                raise TopologyError(
                    pid, name, "reward_cpu_only", "the reward cluster is CPU-only: its device_mapping must be empty"
                )
            continue  # CPU-only: never a GPU cluster, never scheduled
        if not mapping:
            raise TopologyError(pid, name, "device_mapping", "device_mapping must be non-empty")
        if len(set(mapping)) != len(mapping):
            dups = sorted({g for g in mapping if mapping.count(g) > 1})
            raise TopologyError(pid, name, "duplicate_gpu", f"device_mapping lists GPU(s) {dups} more than once")
        bad = [g for g in mapping if g < 0 or g >= topo.num_gpus]
        if bad:
            raise TopologyError(pid, name, "gpu_range", f"GPU id(s) {bad} outside [0, {topo.num_gpus - 1}]")
        if len(mapping) % tp != 0:
            raise TopologyError(
                pid, name, "tp_divides", f"len(device_mapping)={len(mapping)} is not divisible by tp_size={tp}"
            )
        canonical = canonical_device_mapping(pid, name, tp, mapping, topo)
        clusters[name] = ClusterConfig(name=name, tp_size=tp, device_mapping=tuple(canonical))
    return PipelineEntry(pipeline_id=pid, namespace=namespace, clusters=clusters)


def validate_partial_overlap(entry: PipelineEntry, *, train_parallel_size: int = 1) -> None:
    """Partial-overlap topology rules checked at NeMo pipeline startup (F10).

    ``train_parallel_size`` is Megatron's tp·pp·cp·ep product; the scheduler registers the
    training cluster with tp 1 because that parallelism lives in NCCL groups.
    """
    pid = entry.pipeline_id
    if ACTOR_TRAIN not in entry.clusters:
        raise TopologyError(pid, ACTOR_TRAIN, "overlap_train_required", "partial overlap needs an actor_train cluster")
    train = set(entry.clusters[ACTOR_TRAIN].device_mapping)
    infer_cfg = entry.infer
    infer = set(infer_cfg.device_mapping)
    if not train <= infer:
        raise TopologyError(
            pid,
            ACTOR_TRAIN,
            "overlap_subset",
            f"train GPUs {sorted(train - infer)} are not in actor_infer's mapping (train must be a subset of infer)",
        )
    if infer_cfg.max_dp_workers < 2:
        raise TopologyError(
            pid,
            GENERATION_CLUSTER,
            "overlap_infer_dp",
            f"partial overlap needs infer dp >= 2, got {infer_cfg.max_dp_workers}",
        )
    if len(train) % train_parallel_size != 0:
        raise TopologyError(
            pid,
            ACTOR_TRAIN,
            "overlap_train_divides",
            f"len(train)={len(train)} is not divisible by tp*pp*cp*ep={train_parallel_size}",
        )
    if len(infer - train) < infer_cfg.tp_size:
        raise TopologyError(
            pid,
            GENERATION_CLUSTER,
            "overlap_survivor",
            f"only {len(infer - train)} infer GPU(s) outside training; at least one full DP rank ({infer_cfg.tp_size} GPUs) must keep serving while training",
        )


def overlapping_ranks(entry: PipelineEntry, gpus: Iterable[int]) -> List[int]:
    """DP ranks of the pipeline's actor_infer whose bundle touches ``gpus``."""
    wanted = set(gpus)
    cfg = entry.infer
    return [r for r in range(cfg.max_dp_workers) if wanted.intersection(cfg.bundle(r))]
