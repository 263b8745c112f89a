"""Plan validation: the 11 numbered conditions every execution plan must satisfy.

Conditions and their numbers follow RLix (docs/modelled-systems.md#rlix-plan-validation) so a failure reads
the same in a simulator trace, a gate trace and a real run:

 1 each cluster appears at most once per op list (shrinks / signals / expands)
 2 shrink and expand ops target GENERATION clusters (and GENERATION allocations) only
 3 no cluster is both allocated and removed
 4 idle and allocated are disjoint on entry and at the end; grants consume only idle GPUs
 5 shrinks remove only active ranks; expands add only inactive ranks
 6 signal GPUs lie inside the device mapping; expand bundles have tp GPUs, none twice;
   a shrunk rank has a bundle
 7 active ranks after expand <= max_dp_workers, every added rank < max_dp_workers
 8 conservation: final allocated ∪ idle == universe (registered mappings ∪ known pool)
 9 no GPU is freed twice within one plan
10 an added dp rank is not already mapped; no GPU owned by two clusters after the plan
11 removed / shrunk clusters exist

The plan is simulated in RLix's order: shrinks → removes → signal grants → expands, and
the first broken condition is raised, checked in the same order as RLix so that the
reported condition number matches. Only the allocations a plan touches are copied.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Set

from harness.scheduler.types import (
    ClusterAllocation,
    ExecutionPlan,
    PipelineEntry,
    PlanValidationError,
    Priority,
    build_dp_rank_mapping,
    is_generation_cluster,
    parse_cluster_id,
)


def _config(registry: Mapping[str, PipelineEntry], cluster_id: str):
    pid, name = parse_cluster_id(cluster_id)
    entry = registry.get(pid)
    if entry is None or name not in entry.clusters:
        raise PlanValidationError("op names an unregistered cluster", 11, {"cluster_id": cluster_id})
    return entry.clusters[name]


def _dups(ids):
    seen, dup = set(), set()
    for i in ids:
        (dup if i in seen else seen).add(i)
    return sorted(dup)


def _first_double_owned(sim: Mapping[str, ClusterAllocation]):
    """(gpu, first owner, second owner) of the first GPU found in two allocations, or None."""
    owners: Dict[int, str] = {}
    double_owned = None
    for cid, alloc in sim.items():
        for g in alloc.gpu_ids:
            if g in owners and double_owned is None:
                double_owned = (g, owners[g], cid)
            owners[g] = cid
    return double_owned


def _union_if_disjoint(idle: Set[int], gpu_lists: List[List[int]], held: int) -> Optional[Set[int]]:
    """``idle`` ∪ every list of ``gpu_lists`` (``held`` entries in all), or None when a GPU
    is in two of them or twice in one. One C-level union, and the size tells: the union has
    ``len(idle) + held`` members exactly when no GPU is counted twice, i.e. when no idle GPU
    is allocated (condition 4) and no GPU is held twice (condition 10). Where it says None
    the general checks run and name the condition and the GPUs."""
    covered = idle.union(*gpu_lists)
    return covered if len(covered) == len(idle) + held else None


def _validate_unchanged(
    allocations: Mapping[str, ClusterAllocation], covered: Set[int], held: int, n_allocated: int, universe: Set[int]
) -> None:
    """The end-of-plan checks (8, 4, 10) for an empty plan, the common cycle.

    With no op, conditions 1, 2, 3, 5, 6, 7, 9 and 11 have nothing to check and the
    simulated state is the entry state: final allocated == the ``n_allocated`` allocated
    GPUs (whose overlap with idle, the final condition 4, was already refused on entry),
    ``covered`` is them ∪ idle, and the universe check reduces to "every universe GPU is
    idle or allocated" (nothing can be extra, as the full universe includes idle and
    allocated). Same conditions, same order, same error contexts as the general path below.
    """
    if universe and not covered.issuperset(universe):
        raise PlanValidationError(
            "GPU accounting does not cover the universe", 8, {"missing": sorted(universe - covered), "extra": []}
        )
    if held != n_allocated:
        g, a, b = _first_double_owned(allocations)
        raise PlanValidationError("GPU owned by two clusters", 10, {"gpu": g, "cluster_a": a, "cluster_b": b})


def validate_plan(
    plan: ExecutionPlan,
    *,
    registry: Mapping[str, PipelineEntry],
    allocations: Mapping[str, ClusterAllocation],
    idle_gpus: Set[int],
    universe: Set[int],
) -> None:
    """Raise :class:`PlanValidationError` for the first broken condition.

    ``universe`` is the union of all registered device mappings; the currently known
    pool (idle ∪ allocated) is added here, as RLix does, so unmapped GPUs do not trip
    condition 8.

    A transcription of RLix's ``validate_execution_plan`` (rlops/rlix,
    ``rlix/scheduler/validation.py`` at f77d913, branch nemo): the same 11 conditions,
    checked in the same order over the same simulated application of the plan, so the
    first broken condition (and its number) is the one RLix reports. What differs is cost:
    only the allocations the plan touches are copied, and an empty plan or a final state
    with nothing counted twice skips the scans that would only name a culprit. It is kept
    in one function, as upstream's is, so that it can be read check by check beside the
    upstream function; being longer than the project's ~80-line rule is deliberate.
    """
    gpu_lists = [alloc.gpu_ids for alloc in allocations.values()]
    held = sum(map(len, gpu_lists))
    empty = not (plan.shrinks or plan.signals or plan.expands or plan.clusters_to_remove)
    covered = _union_if_disjoint(idle_gpus, gpu_lists, held)  # idle ∪ allocated, if disjoint
    if covered is None:  # some GPU is counted twice: the checks that say which
        allocated: Set[int] = set().union(*gpu_lists)
        if not allocated.isdisjoint(idle_gpus):
            raise PlanValidationError("idle GPUs overlap allocated GPUs", 4, {"overlap": sorted(allocated & idle_gpus)})
        covered = allocated | idle_gpus
        n_allocated = len(allocated)
    else:
        n_allocated = held  # no GPU held twice
    if empty:
        _validate_unchanged(allocations, covered, held, n_allocated, universe)
        return

    for label, ids in (
        ("shrink", [op.cluster_id for op in plan.shrinks]),
        ("expand", [op.cluster_id for op in plan.expands]),
        ("signal", [op.cluster_id for op in plan.signals]),
    ):
        dup = _dups(ids)
        if dup:
            raise PlanValidationError(f"cluster appears twice in {label} ops", 1, {"cluster_ids": dup})

    granted = {op.cluster_id for op in plan.signals} | {op.cluster_id for op in plan.expands}
    both = granted & plan.clusters_to_remove
    if both:
        raise PlanValidationError("cluster is both allocated and removed", 3, {"cluster_ids": sorted(both)})
    for op in plan.shrinks:
        if not is_generation_cluster(op.cluster_id):
            raise PlanValidationError("shrink op on a non-generation cluster", 2, {"cluster_id": op.cluster_id})
    for op in plan.expands:
        if not is_generation_cluster(op.cluster_id):
            raise PlanValidationError("expand op on a non-generation cluster", 2, {"cluster_id": op.cluster_id})
    unknown = sorted(c for c in plan.clusters_to_remove if c not in allocations)
    if unknown:
        raise PlanValidationError("clusters_to_remove names an unknown cluster", 11, {"cluster_ids": unknown})
    for op in plan.signals:
        mapping = set(_config(registry, op.cluster_id).device_mapping)
        outside = set(op.gpus) - mapping
        if outside:
            raise PlanValidationError(
                "grant uses GPUs outside the device mapping", 6, {"cluster_id": op.cluster_id, "gpus": sorted(outside)}
            )

    # --- simulate: copy-on-write of the touched allocations only ---
    sim: Dict[str, ClusterAllocation] = dict(allocations)
    copied: Set[str] = set()

    def writable(cid: str) -> ClusterAllocation:
        if cid not in copied:
            sim[cid] = sim[cid].copy()
            copied.add(cid)
        return sim[cid]

    idle = set(idle_gpus)
    freed: Set[int] = set()

    def free(cid: str, bundle: Set[int]) -> None:
        again = freed & bundle
        if again:
            raise PlanValidationError("GPU freed twice in one plan", 9, {"cluster_id": cid, "gpus": sorted(again)})
        freed.update(bundle)
        idle.update(bundle)

    for op in plan.shrinks:
        if not op.dp_ranks_to_remove:
            continue
        if op.cluster_id not in sim:
            raise PlanValidationError(
                "shrink op targets a cluster with no allocation", 11, {"cluster_id": op.cluster_id}
            )
        alloc = writable(op.cluster_id)
        if alloc.priority != Priority.GENERATION:
            raise PlanValidationError("shrink on a non-generation allocation", 2, {"cluster_id": op.cluster_id})
        if not alloc.dp_rank_to_gpus:
            alloc.dp_rank_to_gpus = build_dp_rank_mapping(alloc.gpu_ids, _config(registry, op.cluster_id).tp_size)
        if not set(op.dp_ranks_to_remove) <= alloc.active_dp_ranks:
            raise PlanValidationError(
                "shrink removes inactive dp ranks",
                5,
                {
                    "cluster_id": op.cluster_id,
                    "active": sorted(alloc.active_dp_ranks),
                    "remove": list(op.dp_ranks_to_remove),
                },
            )
        shrunk: Set[int] = set()
        for rank in op.dp_ranks_to_remove:
            bundle = set(alloc.dp_rank_to_gpus.get(rank) or ())
            if not bundle:
                raise PlanValidationError(
                    "shrunk dp rank has no GPU bundle", 6, {"cluster_id": op.cluster_id, "dp_rank": rank}
                )
            free(op.cluster_id, bundle)
            alloc.active_dp_ranks.discard(rank)
            alloc.dp_rank_to_gpus.pop(rank, None)
            shrunk |= bundle
        # one pass with the union leaves the list that filtering rank by rank would
        alloc.gpu_ids = [g for g in alloc.gpu_ids if g not in shrunk]

    for cid in sorted(plan.clusters_to_remove):
        alloc = sim.pop(cid, None)
        if alloc is not None:
            free(cid, set(alloc.gpu_ids))

    for op in plan.signals:
        if not op.gpus:
            continue
        need = set(op.gpus)
        if not need <= idle:
            raise PlanValidationError(
                "grant consumes non-idle GPUs", 4, {"cluster_id": op.cluster_id, "gpus": sorted(need - idle)}
            )
        idle -= need
        tp = _config(registry, op.cluster_id).tp_size
        mapping = build_dp_rank_mapping(sorted(need), tp)
        sim[op.cluster_id] = ClusterAllocation(
            cluster_id=op.cluster_id,
            gpu_ids=sorted(need),
            priority=op.priority,
            active_dp_ranks=set(mapping) if is_generation_cluster(op.cluster_id) else set(),
            dp_rank_to_gpus=mapping,
        )
        copied.add(op.cluster_id)

    for op in plan.expands:
        cfg = _config(registry, op.cluster_id)
        if any(len(b) != cfg.tp_size for b in op.dp_rank_to_gpus.values()):
            raise PlanValidationError(
                "expand bundle size differs from tp_size", 6, {"cluster_id": op.cluster_id, "tp_size": cfg.tp_size}
            )
        seen: Set[int] = set()
        for rank, bundle in op.dp_rank_to_gpus.items():
            twice = seen & set(bundle)
            if twice:
                raise PlanValidationError(
                    "GPU appears twice in one expand op",
                    6,
                    {"cluster_id": op.cluster_id, "dp_rank": rank, "gpus": sorted(twice)},
                )
            seen.update(bundle)
        if not seen <= idle:
            raise PlanValidationError(
                "expand consumes non-idle GPUs", 4, {"cluster_id": op.cluster_id, "gpus": sorted(seen - idle)}
            )
        idle -= seen
        if op.cluster_id in sim:
            alloc = writable(op.cluster_id)
        else:
            alloc = ClusterAllocation(cluster_id=op.cluster_id, gpu_ids=[], priority=Priority.GENERATION)
            sim[op.cluster_id] = alloc
            copied.add(op.cluster_id)
        max_dp = cfg.max_dp_workers
        bad = [r for r in op.dp_rank_to_gpus if not isinstance(r, int) or r < 0 or r >= max_dp]
        if bad:
            raise PlanValidationError(
                "expand adds a dp rank outside [0, max_dp_workers)",
                7,
                {"cluster_id": op.cluster_id, "dp_ranks": bad, "max_dp_workers": max_dp},
            )
        if len(alloc.active_dp_ranks | set(op.dp_rank_to_gpus)) > max_dp:
            raise PlanValidationError(
                "expand exceeds max_dp_workers",
                7,
                {"cluster_id": op.cluster_id, "max_dp_workers": max_dp, "add": sorted(op.dp_rank_to_gpus)},
            )
        if set(op.dp_rank_to_gpus) & alloc.active_dp_ranks:
            raise PlanValidationError(
                "expand adds already-active dp ranks",
                5,
                {
                    "cluster_id": op.cluster_id,
                    "active": sorted(alloc.active_dp_ranks),
                    "add": sorted(op.dp_rank_to_gpus),
                },
            )
        for rank in op.dp_rank_to_gpus:
            if rank in alloc.dp_rank_to_gpus:
                raise PlanValidationError(
                    "dp rank already mapped in the cluster", 10, {"cluster_id": op.cluster_id, "dp_rank": rank}
                )
        for rank, bundle in op.dp_rank_to_gpus.items():
            alloc.dp_rank_to_gpus[rank] = list(bundle)
            alloc.active_dp_ranks.add(rank)
        alloc.gpu_ids = sorted(set(alloc.gpu_ids) | seen)

    full_universe = (universe | covered) if universe else covered  # covered: idle_gpus ∪ allocated on entry
    final_lists = [alloc.gpu_ids for alloc in sim.values()]
    held = sum(map(len, final_lists))
    final_covered = _union_if_disjoint(idle, final_lists, held)
    if final_covered is not None and final_covered == full_universe:
        return  # conditions 8, 4 and 10 below hold: nothing counted twice, the universe covered
    final_allocated: Set[int] = set().union(*final_lists)
    # a GPU is held twice iff the lists hold more entries than their union; only then is
    # the per-GPU owner scan (which names the first double-owned GPU) needed
    double_owned = _first_double_owned(sim) if held != len(final_allocated) else None
    if (final_allocated | idle) != full_universe:
        raise PlanValidationError(
            "GPU accounting does not cover the universe",
            8,
            {
                "missing": sorted(full_universe - (final_allocated | idle)),
                "extra": sorted((final_allocated | idle) - full_universe),
            },
        )
    if not final_allocated.isdisjoint(idle):
        raise PlanValidationError(
            "final idle GPUs overlap allocated GPUs", 4, {"overlap": sorted(final_allocated & idle)}
        )
    if double_owned is not None:
        g, a, b = double_owned
        raise PlanValidationError("GPU owned by two clusters", 10, {"gpu": g, "cluster_a": a, "cluster_b": b})
