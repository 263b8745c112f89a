"""The refit timing model: one weight sync from the CPU bucket cache to target ranks.

Per sync (reference/rlix.md §5.2, nemo_rl.md §1.2-1.3):
1. comm plan (``harness.refit.comm_plan``, the same one the gates use) — a target GPU
   that is the cache owner's GPU takes the same-GPU path (``cpu_serialize``: NCCL cannot
   group two ranks of one GPU); any other target GPU joins a dynamic NCCL group (owner +
   targets; created per sync, destroyed after it);
2. per bucket: stage on the owner's GPU over its PCIe link (H2D), transport (same-GPU:
   a receiver copy; broadcast: over the intra-node fabric, or the NICs across nodes),
   load on the receiver. Two staging buffers ping-pong (nemo_rl.md §1.2): bucket b+1 is
   staged while the receivers load bucket b, and at most one bucket is un-ACKed — b+1 is
   sent only after b's ACK;
3. destroy the dynamic group; the lifecycle moves: expand path → ``synced``, active path
   (ranks serving while they are refreshed) → ``refreshed``.

Links are shared simpy resources, so concurrent syncs of different pipelines contend.
Mixed into :class:`simulators.pipeline.PipelineSim`.
"""

from __future__ import annotations

import math

from harness.control.rank_state import RankState
from harness.refit.comm_plan import build_comm_plan


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
        owner = self.owner_gpu
        device = lambda g: (cluster.node_of(g), g % cluster.spec.gpus_per_node)  # noqa: E731
        plan = build_comm_plan(device(owner), {r: [device(g) for g in self.ranks[r].gpus] for r in e.ranks})
        ipc = [self.ranks[r].gpus[lr] for r in sorted(plan.ipc) for lr in plan.ipc[r]]
        bcast = [self.ranks[r].gpus[lr] for r in sorted(plan.broadcast) for lr in plan.broadcast[r]]
        group = None
        if bcast:
            group = f"{self.pid}/sync/v{e.version}/{'-'.join(map(str, e.ranks))}"
            yield env.timeout(c.nccl_group_create_s)
            sim.emit("nccl_group", pipeline_id=self.pid, action="create", name=group, gpus=[owner] + sorted(bcast))
        staging_owner = f"{self.pid}/sync"
        n = max(1, math.ceil(self.weight_bytes / c.bucket_bytes))
        cluster.vram.alloc(owner, staging_owner, "staging", c.bucket_bytes * min(n, 2))  # two ping-pong buffers
        node = cluster.node_of(owner)
        cross_node = any(cluster.node_of(g) != node for g in bcast)
        # per-bucket loop invariants, looked up once
        bucket_bytes, load_rate = c.bucket_bytes, c.receiver_load_bytes_per_s
        staging_link, pcie_rate = cluster.links.h2d[owner], cluster.spec.pcie_bytes_per_s
        if cross_node:
            fabric, fabric_rate = cluster.links.nic[node], cluster.spec.inter_node_bytes_per_s
        else:
            fabric, fabric_rate = cluster.links.intra[node], cluster.spec.intra_node_bytes_per_s
        acked = self._bucket_acked
        timeout = env.timeout
        unacked = None  # (bucket, size) sent and still being loaded by the receivers
        load_end = env.now
        for b in range(n):
            size = min(bucket_bytes, self.weight_bytes - b * bucket_bytes)
            with staging_link.request() as req:  # staging overlaps the previous bucket's load
                yield req
                yield timeout(size / pcie_rate)
            if unacked is not None:  # at most one un-ACKed group: wait for ACK(b-1) before sending b
                if load_end > env.now:
                    yield timeout(load_end - env.now)
                acked(e, ipc, bcast, *unacked)
            if bcast:
                with fabric.request() as req:
                    yield req
                    yield timeout(size / fabric_rate)
            load_end = env.now + size / load_rate
            unacked = (b, size)
        if load_end > env.now:
            yield timeout(load_end - env.now)
        acked(e, ipc, bcast, *unacked)  # then the final "complete" message
        cluster.vram.free(owner, staging_owner, "staging")
        if group is not None and not self._strand_sync_group(group, [owner] + sorted(bcast)):
            yield env.timeout(c.nccl_group_destroy_s)
            sim.emit("nccl_group", pipeline_id=self.pid, action="destroy", name=group, gpus=[owner] + sorted(bcast))
        for r in e.ranks:
            rank = self.ranks[r]
            if rank.life.state is RankState.ROUTABLE:
                rank.life.on("refreshed", version=e.version)
            else:
                rank.life.on("synced", version=e.version)
            self._log_rank(rank)
        finished.append(True)
        return list(e.ranks)

    def _bucket_acked(self, e, ipc, bcast, bucket: int, size: int) -> None:
        for transport, targets in (("cpu_serialize", ipc), ("nccl", bcast)):
            if targets:  # sim.emit() minus its None filter: only version may be None, and it is kept
                self.sim.log.add({"seq": 0, "t": self.env._now, "kind": "refit_bucket", "pipeline_id": self.pid,
                                  "version": e.version, "bucket": bucket, "transport": transport,
                                  "dp_ranks": list(e.ranks), "bytes": size, "path": e.path})
