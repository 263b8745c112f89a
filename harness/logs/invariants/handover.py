"""Clean handover of GPUs between clusters (``handover``, ``gpu_tenancy``), read from the log alone.

Who holds a GPU is rebuilt from the scheduler's records: a non-GENERATION grant holds its
GPUs from the ``signalled`` record that hands them over until the cluster's ``released``
record; a GENERATION expand holds its planned bundles from the ``resize_start`` of that
expand (its ranks wake on them from then on) until a shrink of those ranks returns
(``resize_end``) or a release. Resident bytes come from the ``vram`` records: an owner
``P/train`` (or ``P/sync``, the cache owner's staging buffers) is cluster ``P_actor_train``,
``P/dpN`` is ``P_actor_infer``; ``P/ctx`` (the process's CUDA context) is residue and
belongs to no cluster.

``handover``: when a GPU is granted, every *other* cluster's bytes on it must be at most
that cluster's documented residue — an inference rank that went to sleep may keep up to
the post-sleep threshold (1 GiB, docs/modelled-systems.md#rlix-partial-overlap-shrink-expand-and-routing F2), a training cluster nothing once it
offloaded and destroyed its groups. A violation names the GPU, both clusters, the bytes
by kind, the phase that left them (the ``phase`` of the ``vram`` records) and the
granting record.

``gpu_tenancy`` (its mirror): no cluster allocates on, or runs a training effect or a
request on, a GPU it does not hold (pipelines that registered with the scheduler; a
single controller holds its GPUs outside it). One allocation is exempt: the cache owner stages each
bucket of a weight sync on its own GPU whoever holds it (RLix's sender, docs/modelled-systems.md#rlix-selective-sync; the
documented transient is bucket + scratch <= 0.9 x free, RLix's bucket-cache size guard) — an expand's sync runs
after ``actor_train`` was released. ``handover`` still counts those bytes if a GPU changes
hands while they are there.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Dict, List, Optional, Set, Tuple

from harness.logs.invariants.base import Records, Violation, invariant

GiB = 1 << 30
# Documented residue a cluster may leave on a GPU it no longer holds, by cluster name.
INFER_RESIDUE_BYTES = 1 * GiB  # post-sleep VRAM assertion (RLix F2 plan, MILES threshold 1.0 GB)
TRAIN_RESIDUE_BYTES = 0  # offload + group destroy leave no training bytes (docs/modelled-systems.md#rlix-partial-overlap-shrink-expand-and-routing F11)


@lru_cache(maxsize=4096)  # a run has a few hundred owners and ~600 thousand VRAM records
def cluster_of(owner: str) -> Optional[str]:
    """The cluster an allocation owner belongs to; None for a process's CUDA context. The
    cache owner's staging buffers (``P/sync``) are the training worker's (RLix's sender
    stages every bucket on its own GPU, docs/modelled-systems.md#rlix-selective-sync), whichever sync they serve."""
    pid, _, what = owner.rpartition("/")
    if not pid:
        return None
    if what in ("train", "sync"):
        return f"{pid}_actor_train"
    if what.startswith("dp"):
        return f"{pid}_actor_infer"
    return None  # "ctx": CUDA context residue of the pipeline's processes


def _residue(cluster: str) -> int:
    return INFER_RESIDUE_BYTES if cluster.endswith("_actor_infer") else TRAIN_RESIDUE_BYTES


class _Holders:
    """GPU -> holding cluster, rebuilt from scheduler records (shared by both checks)."""

    def __init__(self) -> None:
        self.holder: Dict[int, str] = {}
        self.plans: Dict[int, dict] = {}

    def bundle_gpus(self, r: dict, ops: str) -> List[int]:
        """GPUs of the ranks a resize record names, from its cycle's plan (``ops`` =
        "expands" or "shrinks")."""
        plan = self.plans.get(r["cycle"])
        if plan is None:
            return []
        cid, ranks = f"{r['pipeline_id']}_actor_infer", set(r["dp_ranks"])
        return sorted(
            g
            for op in plan[ops]
            if op["cluster_id"] == cid
            for b in op["bundles"]
            if b["dp_rank"] in ranks
            for g in b["gpus"]
        )

    def grant_of(self, r: dict) -> Optional[Tuple[str, List[int]]]:
        """(cluster, GPUs) if ``r`` hands GPUs to a cluster, after updating the holders."""
        k = r["kind"]
        if k == "plan":
            self.plans[r["cycle"]] = r
        elif k == "resize_start" and r["phase"] == "expand":
            gpus = self.bundle_gpus(r, "expands")
            cid = f"{r['pipeline_id']}_actor_infer"
            for g in gpus:
                self.holder[g] = cid
            return (cid, gpus) if gpus else None
        elif k == "resize_end" and r["phase"] == "shrink":
            cid = f"{r['pipeline_id']}_actor_infer"
            for g in self.bundle_gpus(r, "shrinks"):
                if self.holder.get(g) == cid:
                    del self.holder[g]
        elif (
            k == "signalled"
            and r["waiter"] == "request"
            and r["gpus"]
            and not r.get("error")
            and r.get("priority") != "GENERATION"
        ):
            for g in r["gpus"]:
                self.holder[g] = r["cluster_id"]
            return r["cluster_id"], list(r["gpus"])
        elif k == "released":
            for g in r["gpus"]:
                if self.holder.get(g) == r["cluster_id"]:
                    del self.holder[g]
        return None


def _other_bytes(on: Dict[Tuple[str, str], int], cid: str) -> bool:
    """Whether a GPU's resident bytes (``(owner, kind) -> bytes``) include some of a
    cluster other than ``cid``."""
    for (owner, _kind), nbytes in on.items():
        if nbytes > 0:
            other = cluster_of(owner)
            if other is not None and other != cid:
                return True
    return False


@invariant("handover", reads=("vram", "plan", "resize_start", "resize_end", "signalled", "released"))
def handover(records: Records) -> List[Violation]:
    out: List[Violation] = []
    holders = _Holders()
    resident: Dict[int, Dict[Tuple[str, str], int]] = {}  # gpu -> (owner, kind) -> bytes
    left_by: Dict[Tuple[int, str, str], Optional[str]] = {}  # (gpu, owner, kind) -> phase of its last load
    for r in records:
        if r["kind"] == "vram":
            key = (r["owner"], r["mem"])
            on = resident.setdefault(r["gpu"], {})
            on[key] = on.get(key, 0) + r["delta"]
            if r["delta"] > 0:
                left_by[(r["gpu"], r["owner"], r["mem"])] = r.get("phase")
            continue
        grant = holders.grant_of(r)
        if grant is None:
            continue
        cid, gpus = grant
        for g in gpus:
            on = resident.get(g)
            if not on or not _other_bytes(on, cid):
                continue  # nothing of another cluster's on it (most grants): nothing to report
            others: Dict[str, Dict[str, int]] = {}
            phases: Dict[str, Set[str]] = {}
            for (owner, kind), nbytes in sorted(on.items()):
                phase = left_by.get((g, owner, kind))
                other = cluster_of(owner)
                if nbytes <= 0 or other is None or other == cid:
                    continue
                by_kind = others.setdefault(other, {})
                by_kind[kind] = by_kind.get(kind, 0) + nbytes
                phases.setdefault(other, set()).add(phase or "unknown")
            for other, by_kind in sorted(others.items()):
                total = sum(by_kind.values())
                if total > _residue(other):
                    kinds = ", ".join(f"{k} {v} B" for k, v in sorted(by_kind.items()))
                    out.append(
                        Violation(
                            "handover",
                            r["seq"],
                            f"GPU {g} granted to {cid} ({r['kind']} seq {r['seq']}) still holds {other}'s "
                            f"{kinds} ({total} B > residue {_residue(other)} B), left by phase "
                            f"{'/'.join(sorted(phases[other]))}",
                        )
                    )
    return out


_TRAINER_EFFECTS = ("Compute", "BuildCache", "ReloadTrainComm", "OffloadTraining", "DestroyTrainComm")


@invariant(
    "gpu_tenancy",
    reads=(
        "vram",
        "effect_start",
        "rank_state",
        "request_dispatch",
        "plan",
        "resize_start",
        "resize_end",
        "signalled",
        "released",
        "register",
    ),
)
def gpu_tenancy(records: Records) -> List[Violation]:
    out: List[Violation] = []
    holders = _Holders()
    rank_gpus: Dict[Tuple[str, int], List[int]] = {}
    reported: Set[Tuple[str, int, str]] = set()

    registered: Set[str] = set()  # a pipeline the scheduler never saw holds its GPUs outside it (single controller)

    def check(seq: int, cluster: str, gpus, what: str) -> None:
        if cluster.rpartition("_actor_")[0] not in registered:
            return
        for g in gpus:
            held = holders.holder.get(g)
            if held != cluster and (cluster, g, what) not in reported:
                reported.add((cluster, g, what))
                out.append(
                    Violation(
                        "gpu_tenancy",
                        seq,
                        f"{cluster} {what} on GPU {g}, which {'is held by ' + held if held else 'nobody holds'}",
                    )
                )

    # The two kinds of most records (an allocation, a dispatch) take a fast path: ``check``
    # is only called once some GPU is not held by the cluster, and it then looks at all.
    held_by = holders.holder.get  # (the holders' dict is updated in place, never replaced)
    infer_cluster: Dict[str, str] = {}
    for r in records:
        k = r["kind"]
        if k == "vram":
            if r["delta"] > 0:
                cluster = cluster_of(r["owner"])
                if cluster is not None and held_by(r["gpu"]) != cluster and r["mem"] != "staging":
                    check(r["seq"], cluster, [r["gpu"]], f"allocates {r['mem']}")
        elif k == "request_dispatch":
            pid = r["pipeline_id"]
            gpus = rank_gpus.get((pid, r["dp_rank"]))
            if gpus:
                cluster = infer_cluster.get(pid) or infer_cluster.setdefault(pid, f"{pid}_actor_infer")
                for g in gpus:
                    if held_by(g) != cluster:
                        check(r["seq"], cluster, gpus, "serves a request")
                        break
        elif k == "rank_state":
            rank_gpus[(r["pipeline_id"], r["dp_rank"])] = r["gpus"]
        elif k == "register":
            registered.add(r["pipeline_id"])
        elif k == "effect_start":
            if r["effect"] in _TRAINER_EFFECTS and r.get("gpus") and r.get("scope") != "expand":
                check(r["seq"], f"{r['pipeline_id']}_actor_train", r["gpus"], f"runs {r['effect']}")
        else:
            holders.grant_of(r)
    return out
