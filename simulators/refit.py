"""The refit timing model: one weight sync from the CPU bucket cache to target ranks.

Per sync (docs/modelled-systems.md#rlix-selective-sync, docs/modelled-systems.md#nemo-rl-refit):
1. comm plan (``harness.refit.comm_plan``, the same one the gates use) — a target GPU
   that is the cache owner's GPU takes the same-GPU path (``cpu_serialize``: NCCL cannot
   group two ranks of one GPU); any other target GPU joins a dynamic NCCL group (owner +
   targets; created per sync, destroyed after it);
2. per bucket: stage on the owner's GPU over its PCIe link (H2D), transport (same-GPU:
   a receiver copy; broadcast: over the intra-node fabric, or the NICs across nodes),
   load on the receiver. Two staging buffers ping-pong (docs/modelled-systems.md#nemo-rl-refit): bucket b+1 is
   staged while the receivers load bucket b, and at most one bucket is un-ACKed — b+1 is
   sent only after b's ACK;
3. destroy the dynamic group; the lifecycle moves: expand path → ``synced``, active path
   (ranks serving while they are refreshed) → ``refreshed``.

Links are shared simpy resources, so concurrent syncs of different pipelines contend.
Mixed into :class:`simulators.pipeline.PipelineSim`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from harness.control.rank_state import RankState
from harness.refit import stream as proto
from harness.refit.comm_plan import build_comm_plan
from simulators.spec import CostSpec


class RefitEffects:
    def _SyncFromCache(self, e):
        env, sim, c = self.env, self.sim, self.costs
        cluster = sim.cluster
        if e.path == "expand":
            self._maybe_fail_expand_sync()
        if e.path == "expand" and self.faults.get("skip_sync_on_expand") == self.ctx.step:
            sim.emit("fault_fired", name="skip_sync_on_expand", pipeline_id=self.pid, step=self.ctx.step)
            yield env.timeout(0)
            return None  # the ranks keep whatever they woke with: activation must be refused
        finished = []  # RLix wraps the whole sync in one deadline (selective_sync)
        self.deadlines.arm("selective_sync", c.selective_sync_timeout_s, lambda: bool(finished))
        yield from self.cache_lock.acquire("sync", e.version)  # held until the group is destroyed
        owner = self.owner_gpu
        ipc, bcast = self._sync_targets(tuple(e.ranks))
        group = None
        if bcast:
            group = f"{self.pid}/sync/v{e.version}/{'-'.join(map(str, e.ranks))}"
            yield env.timeout(c.nccl_group_create_s)
            sim.emit("nccl_group", pipeline_id=self.pid, action="create", name=group, gpus=[owner] + sorted(bcast), purpose="sync")
        staging_owner = f"{self.pid}/sync"
        node = cluster.node_of(owner)
        cross_node = any(cluster.node_of(g) != node for g in bcast)
        if cross_node:
            fabric, fabric_rate = cluster.links.nic[node], cluster.spec.inter_node_bytes_per_s
        else:
            fabric, fabric_rate = cluster.links.intra[node], cluster.spec.intra_node_bytes_per_s
        specs, costs = self._stream_inputs()
        yield from stream_sync(
            env, specs, 2 * proto.align_up(max(c.bucket_bytes, proto.ALIGNMENT_BYTES)), costs,  # a full bucket fits one half
            staging_link=cluster.links.h2d[owner], fabric=fabric if bcast else None, fabric_rate=fabric_rate,
            on_alloc=lambda nbytes: cluster.vram.alloc(owner, staging_owner, "staging", c.bucket_bytes * min(len(specs), 2), f"{e.path}_sync"),
            on_ack=lambda group, size: self._bucket_acked(e, ipc, bcast, group, size),
            on_release=lambda: cluster.vram.free(owner, staging_owner, "staging"))
        if group is not None and not self._strand_sync_group(group, [owner] + sorted(bcast)):
            yield env.timeout(c.nccl_group_destroy_s)
            sim.emit("nccl_group", pipeline_id=self.pid, action="destroy", name=group, gpus=[owner] + sorted(bcast), purpose="sync")
        self.cache_lock.release(e.version)
        for r in e.ranks:
            rank = self.ranks[r]
            if rank.life.state is RankState.ROUTABLE:
                rank.life.on("refreshed", version=e.version)
            else:
                rank.life.on("synced", version=e.version)
            self._log_rank(rank)
        finished.append(True)
        return list(e.ranks)

    def _sync_targets(self, ranks: Tuple[int, ...]) -> Tuple[List[int], List[int]]:
        """The target GPUs of a sync to ``ranks`` on each path (same-GPU IPC, broadcast):
        ``build_comm_plan`` over the ranks' devices. A rank's GPUs and the cache owner never
        change, so the answer for one rank tuple is worked out once per pipeline (the lists
        are only read)."""
        cache = self._sync_targets_of
        got = cache.get(ranks)
        if got is None:
            cluster = self.sim.cluster
            device = lambda g: (cluster.node_of(g), g % cluster.spec.gpus_per_node)  # noqa: E731
            plan = build_comm_plan(device(self.owner_gpu), {r: [device(g) for g in self.ranks[r].gpus] for r in ranks})
            ipc = [self.ranks[r].gpus[lr] for r in sorted(plan.ipc) for lr in plan.ipc[r]]
            bcast = [self.ranks[r].gpus[lr] for r in sorted(plan.broadcast) for lr in plan.broadcast[r]]
            got = cache[ranks] = (ipc, bcast)
        return got

    def _stream_inputs(self) -> Tuple[List[proto.TensorSpec], "StreamCosts"]:
        """The cache's buckets and the stream's costs: fixed for the run (the costs, the
        model and the PCIe rate do not change), so built on the first sync and kept."""
        got = self._stream_inputs_kept
        if got is None:
            c = self.costs
            got = self._stream_inputs_kept = (cache_bucket_specs(self.weight_bytes, c.bucket_bytes),
                                              StreamCosts.from_costs(c, self.sim.cluster.spec.pcie_bytes_per_s))
        return got

    def _bucket_acked(self, e, ipc, bcast, bucket: int, size: int) -> None:
        for transport, targets in (("cpu_serialize", ipc), ("nccl", bcast)):
            if targets:  # sim.emit() minus its None filter: only version may be None, and it is kept
                self.sim.log.add({"seq": 0, "t": self.env._now, "kind": "refit_bucket", "pipeline_id": self.pid,
                                  "version": e.version, "bucket": bucket, "transport": transport,
                                  "dp_ranks": list(e.ranks), "bytes": size, "path": e.path})


# ------------------------------------------------------------------ the stream, in simulated time
@dataclass(frozen=True)
class StreamCosts:
    """What each effect of the refit stream costs (``CostSpec``'s refit fields, resolved)."""

    pack_bytes_per_s: float
    load_bytes_per_s: float
    group_overhead_s: float = 0.0
    tensor_overhead_s: float = 0.0
    setup_s: float = 0.0
    staging_bytes_per_s: float = 0.0
    complete_s: float = 0.0

    @classmethod
    def from_costs(cls, c: CostSpec, link_bytes_per_s: float) -> "StreamCosts":
        return cls(pack_bytes_per_s=c.refit_pack_bytes_per_s or link_bytes_per_s,
                   load_bytes_per_s=c.receiver_load_bytes_per_s, group_overhead_s=c.refit_group_overhead_s,
                   tensor_overhead_s=c.refit_tensor_overhead_s, setup_s=c.refit_setup_s,
                   staging_bytes_per_s=c.refit_staging_bytes_per_s, complete_s=c.refit_complete_s)


def cache_bucket_specs(weight_bytes: int, bucket_bytes: int) -> List[proto.TensorSpec]:
    """The simulator's weights as the stream sees them: the cache's buckets in order, each
    a bucket-sized unit (the last one shorter), so each is one group of the stream."""
    n = max(1, math.ceil(weight_bytes / bucket_bytes))
    sizes = [min(bucket_bytes, weight_bytes - b * bucket_bytes) for b in range(n)]
    return [proto.TensorSpec(f"bucket{b}", (size,), "uint8", size) for b, size in enumerate(sizes)]


def stream_sync(env, specs, budget_bytes: int, costs: StreamCosts, *, staging_link=None, fabric=None,
                fabric_rate: float = 0.0, on_alloc: Optional[Callable[[int], None]] = None,
                on_ack: Optional[Callable[[int, int], None]] = None, on_release: Optional[Callable[[], None]] = None):
    """Interpret :func:`harness.refit.stream.sender` in simulated time (a simpy process body).

    Pack holds the staging link (PCIe H2D on a GPU: concurrent syncs of one owner contend);
    a sent group is loaded by the receiver while the next one is packed; an ACK arrives
    when the receiver's load (plus the per-group round trip) is done. Zero costs add no
    events, so a scenario without the refit cost fields times exactly as before they existed.
    Returns the number of data groups."""
    gen = proto.sender(specs, budget_bytes)
    load_end = {}
    sizes = {}
    timeout = env.timeout
    while True:
        try:
            e = next(gen)
        except StopIteration as stop:
            return stop.value
        if isinstance(e, proto.AllocBuffers):  # the pair comes from the allocator's cache: a fixed cost
            if on_alloc is not None:
                on_alloc(2 * e.half_bytes)
            if costs.setup_s:
                yield timeout(costs.setup_s)
        elif isinstance(e, proto.Pack):
            t = e.span_bytes / costs.pack_bytes_per_s
            if costs.tensor_overhead_s:
                t += len(e.slots) * costs.tensor_overhead_s
            if staging_link is not None:
                with staging_link.request() as req:  # staging overlaps the previous group's load
                    yield req
                    yield timeout(t)
            else:
                yield timeout(t)
        elif isinstance(e, proto.SendGroup):
            if fabric is not None:
                with fabric.request() as req:
                    yield req
                    yield timeout(e.span_bytes / fabric_rate)
            load = e.span_bytes / costs.load_bytes_per_s
            if costs.tensor_overhead_s:
                load += len(e.slots) * costs.tensor_overhead_s
            if costs.group_overhead_s:
                load += costs.group_overhead_s
            load_end[e.group] = env.now + load
            sizes[e.group] = e.span_bytes
        elif isinstance(e, proto.AwaitAck) and e.group == proto.COMPLETE:
            if costs.complete_s:
                yield timeout(costs.complete_s)
        elif isinstance(e, proto.AwaitAck):
            if load_end[e.group] > env.now:
                yield timeout(load_end[e.group] - env.now)
            if on_ack is not None:
                on_ack(e.group, sizes[e.group])
        elif isinstance(e, proto.AllocDedicated) and costs.staging_bytes_per_s:  # fresh, faulted in
            yield timeout(e.nbytes / costs.staging_bytes_per_s)
        elif isinstance(e, proto.ReleaseBuffers) and on_release is not None:
            on_release()


def predict_sync_seconds(specs, budget_bytes: int, costs: StreamCosts) -> float:
    """Simulated wall time of one stream alone (no contention): what ``rlharness fidelity
    refit`` compares with the real transport's measured sync time."""
    import simpy

    env = simpy.Environment()
    env.process(stream_sync(env, specs, budget_bytes, costs))
    env.run()
    return env.now
