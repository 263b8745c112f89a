"""Gate 2.5 Part 2: selective weight sync from the CPU bucket cache is bit-exact.

    torchrun --nproc-per-node 4 gpu_gates/selective_sync.py [--cycles 3] [--colocated-ranks 2]

Roles: rank 0 is the cache owner (a trainer), rank 1 a non-owner trainer, ranks 2.. are
inference receivers (dp rank = rank - 2). Every cycle:

1. both trainers take the same deterministic "train step"; the owner packs the state
   into a versioned CPU bucket cache (explicit bucket size) and promotes it;
2. the selective sync in the harness's order (``harness.control.selective_sync``, run by
   ``gpu_gates/sync/runtime.py`` exactly as the dual-pipeline gate runs it): the comm
   plan puts receivers declared colocated with the owner on the IPC path and the others
   in a dynamic group = owner + broadcast targets, a proper subset of the world, created
   for this sync only; per bucket a staging copy is handed to the IPC receivers over the
   refit stream (``gpu_gates/sync/ipc.py``; ``refit_wire`` on its records) and broadcast to the
   group, a barrier, the staging freed; the group is destroyed on every exit path;
3. targets compare per-tensor SHA-256 digests with the owner's (bit-exact or fail, the
   failure names tensor and bucket); non-targets must be untouched; targets alternate
   (all, then without the first receiver, then without the last, ...);
4. no process group and no staging file survives the cycle; on GPU device memory may not
   grow by more than ``--max-vram-growth-mib`` between the first and last cycle.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script by torchrun: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import json  # noqa: E402
from typing import Any, Dict, List, Optional, Tuple  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from gpu_gates.sync import ipc  # noqa: E402
from gpu_gates.runtime import pg_registry  # noqa: E402
from gpu_gates.sync.runtime import OwnerSync, SyncLink, run_owner, serve_receiver  # noqa: E402
from gpu_gates.runtime.memory import MIB, own_device_bytes  # noqa: E402
from gpu_gates.runtime.gate import GateContext, GateSpec, positive_int, run_gate  # noqa: E402
from gpu_gates.sync.tiny_model import TinyModel  # noqa: E402
from harness.control.cache_lock import CacheLockRecords  # noqa: E402
from harness.control.selective_sync import SyncPlan, plan_sync  # noqa: E402
from gpu_gates.sync.bucket_cache import VersionedBucketCache, build_buckets, state_digests  # noqa: E402
from gpu_gates.transports.staging import leftover_shm  # noqa: E402
from harness.refit.comm_plan import build_comm_plan  # noqa: E402

OWNER, TRAINER, FIRST_RECEIVER = 0, 1, 2
TRAIN_SEED = 1234


def _rank_list(text: str) -> List[int]:
    try:
        return sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ranks, got {text!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bucket-size-bytes",
        type=positive_int,
        default=16384,
        help="explicit bucket size (the cache has no default on purpose)",
    )
    parser.add_argument(
        "--colocated-ranks",
        type=_rank_list,
        default=[2],
        help="receiver ranks declared on the owner's device -> IPC path ('' for none)",
    )
    parser.add_argument("--max-vram-growth-mib", type=float, default=64.0)


def check_world(args: argparse.Namespace, world: int) -> Optional[str]:
    if world < 4:
        return f"needs 4+ ranks (owner, non-owner trainer, 2+ receivers), got world size {world}"
    bad = [r for r in args.colocated_ranks if r < FIRST_RECEIVER or r >= world]
    if bad:
        return f"--colocated-ranks {bad} are not receiver ranks (2..{world - 1})"
    return None


def targets_for(cycle: int, receivers: List[int]) -> List[int]:
    """All receivers first, then alternately without the first and without the last one."""
    if cycle == 0:
        return list(receivers)
    return list(receivers[1:]) if cycle % 2 == 1 else list(receivers[:-1])


def device_of(ctx: GateContext, rank: int) -> Tuple[int, int]:
    """(node, gpu) of a rank as the comm plan sees it; declared colocation wins."""
    per_node = ctx.env.local_world_size
    if rank in ctx.args.colocated_ranks:
        rank = OWNER
    return (rank // per_node, rank % per_node)


class SyncState:
    """Per-rank state that outlives a cycle."""

    def __init__(self, ctx: GateContext) -> None:
        seed = TRAIN_SEED if ctx.rank in (OWNER, TRAINER) else 100 + ctx.rank
        self.model = TinyModel(seed).to(ctx.device)
        self.cache = VersionedBucketCache(CacheLockRecords(ctx.emit)) if ctx.rank == OWNER else None  # holds logged
        self.prev_digests: Optional[Dict[str, str]] = None
        self.held_version: Optional[int] = None
        self.transport = ipc.STREAM

    def digests(self) -> Dict[str, str]:
        return state_digests((n, t.detach().cpu()) for n, t in self.model.named_state())


def owner_build(ctx: GateContext, st: SyncState, cycle: int) -> Dict[str, Any]:
    named = [(n, t.detach().cpu()) for n, t in st.model.named_state()]
    buckets = build_buckets(named, ctx.args.bucket_size_bytes)
    st.cache.build_latest(cycle, buckets)
    ctx.emit("cache_build", version=cycle, buckets=len(buckets), bytes=sum(b.used_bytes for b in buckets))
    st.cache.promote(cycle)
    ctx.emit("cache_promote", version=cycle)
    digests = state_digests(named)
    if st.prev_digests is not None:
        unchanged = [n for n, d in digests.items() if st.prev_digests.get(n) == d]
        ctx.check("weights_changed", not unchanged, f"cycle {cycle}: train step left {unchanged} unchanged")
    st.prev_digests = digests
    ctx.check(
        "cache_holds_at_most_two_versions",
        len(st.cache.versions_held()) <= 2,
        f"cycle {cycle}: cache holds versions {st.cache.versions_held()}",
    )
    manifest = {
        "version": cycle,
        "buckets": [b.metadata() for b in buckets],
        "digests": digests,
        "bucket_of": {n: i for i, b in enumerate(buckets) for n in b.param_names},
    }
    ctx.put(f"sync{cycle}/manifest", json.dumps(manifest).encode())
    return manifest


def _link(ctx: GateContext, cycle: int, receivers: List[int]) -> SyncLink:
    return SyncLink(
        f"selective_sync_c{cycle}",
        f"sync{cycle}",
        OWNER,
        {r - FIRST_RECEIVER: r for r in receivers},
        ctx.args.bucket_size_bytes,
    )


def _subset_check(ctx: GateContext, cycle: int):
    """Every member checks the group it joined: a proper subset of the world."""

    def check(members: List[int]) -> None:
        ctx.check(
            "sync_group_proper_subset",
            len(members) < ctx.world_size,
            f"cycle {cycle}: sync group {members} is the whole world",
        )

    return check


def owner_send(ctx: GateContext, st: SyncState, cycle: int, plan: SyncPlan, link: SyncLink) -> Dict[str, Any]:
    """The owner's side: ``harness.control.selective_sync`` with the gates' handlers."""
    corrupt = ctx.hooks.get("corrupt_byte")
    damaged = None
    if corrupt is not None and cycle == 0:
        damaged = min(int(corrupt.arg) if corrupt.arg else 1, len(plan.bucket_bytes) - 1)
    world_group = ctx.hooks.get("world_sync_group") is not None  # test hook: the bug the subset check must catch

    handlers = OwnerSync(
        ctx,
        st.cache,
        link,
        damage_bucket=damaged,
        on_group=_subset_check(ctx, cycle),
        group_members=(lambda m: list(range(ctx.world_size))) if world_group else None,
    )
    ctx.set_phase(f"cycle {cycle}: selective sync")
    sent = run_owner(ctx, handlers, plan)
    leftovers = leftover_shm(os.getpid())
    ctx.check("no_shm_leftovers", not leftovers, f"cycle {cycle}: staging files left behind: {leftovers}")
    return {"buckets": len(plan.bucket_bytes), "bytes": sum(sent.values())}


def compare_digests(ctx: GateContext, cycle: int, mine: Dict[str, str], manifest: Dict[str, Any], what: str) -> bool:
    expected = manifest["digests"]
    bad = sorted(n for n in expected if mine.get(n) != expected[n])
    dtypes = {n: dt for b in manifest["buckets"] for n, dt in zip(b["param_names"], b["dtypes"])}
    named = ", ".join(f"{n!r} (bucket {manifest['bucket_of'][n]}, {dtypes[n]})" for n in bad)
    ok = ctx.check(
        what,
        not bad,
        f"cycle {cycle}: {len(bad)} tensor(s) differ from the owner's version {manifest['version']}: {named}",
    )
    ctx.emit("digest_check", version=manifest["version"], ok=ok, mismatches=len(bad), target=what == "bit_exact")
    return ok


def run_cycle(ctx: GateContext, st: SyncState, cycle: int) -> Dict[str, Any]:
    receivers = list(range(FIRST_RECEIVER, ctx.world_size))
    targets = targets_for(cycle, receivers)
    comm = build_comm_plan(device_of(ctx, OWNER), {r - FIRST_RECEIVER: [device_of(ctx, r)] for r in targets})
    ipc_ranks = sorted(dp + FIRST_RECEIVER for dp in comm.ipc)
    bcast_ranks = sorted(dp + FIRST_RECEIVER for dp in comm.broadcast)
    info: Dict[str, Any] = {"cycle": cycle, "targets": targets, "ipc_ranks": ipc_ranks, "broadcast_ranks": bcast_ranks}
    failures_before = len(ctx.failures)
    ctx.set_phase(f"cycle {cycle}: train + cache")
    ctx.emit("cycle_begin", cycle=cycle, version=cycle, targets=targets)
    ctx.hook("cycle_begin")
    baseline = pg_registry.live_groups()
    before = st.digests()
    if ctx.rank in (OWNER, TRAINER):
        st.model.train_step(cycle, TRAIN_SEED)
    if ctx.rank == OWNER:
        owner_build(ctx, st, cycle)
    ctx.hook("sync")
    link = _link(ctx, cycle, receivers)
    members = list(range(ctx.world_size)) if ctx.hooks.get("world_sync_group") is not None else [OWNER] + bcast_ranks
    if ctx.rank == OWNER:
        manifest = json.loads(ctx.wait_get(f"sync{cycle}/manifest", "the cache manifest"))
        plan = plan_sync(
            cycle,
            [b["used_bytes"] for b in manifest["buckets"]],
            comm.ipc,
            comm.broadcast,
            link.sync_id,
            [OWNER] + bcast_ranks,
        )
        info.update(owner_send(ctx, st, cycle, plan, link))
    elif ctx.rank in targets or (comm.needs_group and ctx.rank in members):
        manifest = json.loads(ctx.wait_get(f"sync{cycle}/manifest", "the cache manifest"))
        serve_receiver(ctx, link, manifest["buckets"], st.model, cycle, on_group=_subset_check(ctx, cycle))
    ctx.set_phase(f"cycle {cycle}: verify")
    if ctx.rank == OWNER:
        ctx.emit("weights_publish", version=cycle, targets=targets)
    elif ctx.rank == TRAINER or ctx.rank in targets:
        manifest = json.loads(ctx.wait_get(f"sync{cycle}/manifest", "the cache manifest"))
        check = "bit_exact" if ctx.rank in targets else "trainer_matches_owner"
        if compare_digests(ctx, cycle, st.digests(), manifest, check) and ctx.rank in targets:
            st.held_version = cycle
    else:
        changed = sorted(n for n, d in st.digests().items() if before.get(n) != d)
        ctx.check(
            "non_target_untouched",
            not changed,
            f"cycle {cycle}: rank {ctx.rank} was not a target but {changed} changed",
        )
    survivors = [i.label() for n, i in sorted(pg_registry.live_groups().items()) if n not in baseline]
    ctx.check(
        "no_group_survives", not survivors, f"cycle {cycle}: process group(s) survived the sync: {', '.join(survivors)}"
    )
    info["memory"] = ctx.sample_memory(f"cycle {cycle} end")
    info.update(held_version=st.held_version, ok=len(ctx.failures) == failures_before)
    dist.barrier()
    ctx.emit("cycle_end", cycle=cycle, live_groups=len(pg_registry.live_groups()))
    return info


def run(ctx: GateContext) -> None:
    st = SyncState(ctx)
    ctx.data.update(
        role=("owner" if ctx.rank == OWNER else "trainer" if ctx.rank == TRAINER else "receiver"),
        transport=st.transport,
        device=str(device_of(ctx, ctx.rank)),
        cycles=[],
    )
    for cycle in range(ctx.args.cycles):
        ctx.data["cycles"].append(run_cycle(ctx, st, cycle))
    if ctx.device.type == "cuda" and len(ctx.data["cycles"]) > 1:
        first, last = ctx.data["cycles"][0]["memory"], ctx.data["cycles"][-1]["memory"]
        shared = ctx.env.local_world_size > torch.cuda.device_count()  # ranks share a GPU (--device cuda)
        (a, what), (b, _) = own_device_bytes(first, shared), own_device_bytes(last, shared)
        growth = (b - a) if a is not None and b is not None else 0
        ctx.check(
            "vram_growth_bounded",
            growth <= ctx.args.max_vram_growth_mib * MIB,
            f"{what} grew {growth / MIB:.1f} MiB from cycle 0 to cycle {len(ctx.data['cycles']) - 1}",
        )


def summarize(args: argparse.Namespace, results: List[Dict[str, Any]]) -> Tuple[Dict[str, Any], List[str]]:
    """One line per cycle: plan, transfer size, and which ranks verified what."""
    by_rank = {r["rank"]: r.get("data") or {} for r in results}
    owner_cycles = by_rank.get(OWNER, {}).get("cycles", [])
    cycles: Dict[str, Any] = {}
    for c, info in enumerate(owner_cycles):
        ok_ranks = [r for r, d in sorted(by_rank.items()) if c < len(d.get("cycles", [])) and d["cycles"][c]["ok"]]
        bad_ranks = [r for r, d in sorted(by_rank.items()) if c < len(d.get("cycles", [])) and not d["cycles"][c]["ok"]]
        non_targets = [r for r in sorted(by_rank) if r >= FIRST_RECEIVER and r not in info["targets"]]
        cycles[f"cycle {c}"] = {
            "status": "failed" if bad_ranks else "passed",
            "verdict": (
                f"targets {info['targets']} (ipc {info['ipc_ranks']}, broadcast {info['broadcast_ranks']}), "
                f"{info.get('buckets')} buckets / {info.get('bytes')} B, non-targets {non_targets}; "
                f"ok on ranks {ok_ranks}" + (f", FAILED on ranks {bad_ranks}" if bad_ranks else "")
            ),
            "targets": info["targets"],
            "ipc_ranks": info["ipc_ranks"],
            "broadcast_ranks": info["broadcast_ranks"],
            "buckets": info.get("buckets"),
            "bytes": info.get("bytes"),
            "failed_ranks": bad_ranks,
        }
    transports = sorted({d.get("transport") for d in by_rank.values() if d.get("transport")})
    return {"cycles": cycles, "ipc_transport": transports, "bucket_size_bytes": args.bucket_size_bytes}, []


SPEC = GateSpec(
    name="selective_sync",
    description=__doc__.splitlines()[0],
    default_world=4,
    default_cycles=3,
    add_arguments=add_arguments,
    check_world=check_world,
    run=run,
    summarize=summarize,
)


if __name__ == "__main__":
    sys.exit(run_gate(SPEC))
