"""The refit timing model: one weight sync from the CPU bucket cache to target ranks.

The sync's order is ``harness.control.selective_sync`` (RLix's selective sync,
docs/modelled-systems.md#rlix-selective-sync, written once; the gates run the same
generator): the comm plan (``harness.refit.comm_plan``) —
a target GPU that is the cache owner's takes the IPC path (``cpu_serialize``: NCCL
cannot group two ranks of one GPU), any other joins a dynamic group (owner + targets,
created for the sync only when it has broadcast targets, destroyed after it); then per
bucket: stage it on the owner's GPU over its PCIe link (H2D), hand the IPC payload to the
same-GPU receivers (their copy + load) and broadcast it over the intra-node fabric (the
NICs across nodes; then the receivers' load), a barrier on both, free the staging. This
module only says what each effect costs in simulated time. The lifecycle moves after the
sync: expand path → ``synced``, active path (ranks serving while refreshed) → ``refreshed``.

NeMo RL's colocated ZMQ stream (``harness.refit.stream``, two ping-pong buffers,
docs/modelled-systems.md#nemo-rl-refit) is a different protocol: :func:`stream_sync` times it for ``rlharness fidelity refit``.

Links are shared simpy resources, so concurrent syncs of different pipelines contend.
Mixed into :class:`simulators.pipelines.pipeline.PipelineSim`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from harness.control import selective_sync as ss
from harness.control.interpret import interpret
from harness.control.rank_state import RankState
from harness.refit import stream as proto
from harness.refit.comm_plan import build_comm_plan
from simulators.scenario.spec import CostSpec


class RefitEffects:
    def _SyncFromCache(self, e):
        env, c = self.env, self.costs
        if e.path == "active":
            self.ctx.publish_on_ack = self._publish_on_ack_now()  # RLinf #1456's order (oracle.py)
        if e.path == "expand":
            self._maybe_fail_expand_sync()
        elif self.faults.get("active_sync_fails") is not None:
            self._maybe_fail_active_sync()
        if e.path == "expand" and self.faults.get("skip_sync_on_expand") == self.ctx.step:
            self.sim.emit("fault_fired", name="skip_sync_on_expand", pipeline_id=self.pid, step=self.ctx.step)
            yield env.timeout(0)
            return None  # the ranks keep whatever they woke with: activation must be refused
        if e.path == "expand" and self._unchecked_activation_now():
            yield env.timeout(0)
            return None  # no sync; the controller will activate anyway (oracle_faults.py)
        finished = []  # RLix wraps the whole sync in one deadline (selective_sync)
        self.deadlines.arm("selective_sync", c.selective_sync_timeout_s, lambda: bool(finished))
        partial = self._partial_reload(e)
        for r in e.ranks:  # the engines take the update (refused into sleeping weights: vllm #57853)
            self.ranks[r].engine.begin_load()
        self._memo_at_load(e.ranks)  # the load funnel drops the weights' memo (engine_effects.py)
        timing = _ColocatedIpcTiming(self, e) if self.spec.refit_path == "colocated_ipc" else _SyncTiming(self, e)
        yield from interpret(ss.selective_sync(self._sync_plan(e, partial)), timing.handle)
        for r in e.ranks:
            rank = self.ranks[r]
            if rank.life.state is RankState.ROUTABLE:
                rank.life.on("refreshed", version=e.version)
            else:
                rank.life.on("synced", version=e.version)
            self._log_rank(rank)
        self._engine_loaded(e, complete=not partial)
        finished.append(True)
        return list(e.ranks)

    def _sync_plan(self, e, partial: bool = False) -> ss.SyncPlan:
        """The sync's plan: the comm plan's dp ranks per path and the group's GPUs (owner
        first) are fixed per rank tuple, so they are worked out once per pipeline.
        ``partial`` (fault ``partial_reload``): the payload holds the first bucket only."""
        ranks = tuple(e.ranks)
        got = self._sync_plans.get(ranks)
        if got is None:
            if self.spec.refit_path == "colocated_ipc":  # every target's own GPU holds a trainer: IPC only
                got = self._sync_plans[ranks] = (tuple(sorted(ranks)), (), (self.owner_gpu,))
            else:
                cluster = self.sim.cluster
                device = lambda g: (cluster.node_of(g), g % cluster.spec.gpus_per_node)  # noqa: E731
                comm = build_comm_plan(
                    device(self.owner_gpu), {r: [device(g) for g in self.ranks[r].gpus] for r in ranks}
                )
                _, bcast = self._sync_targets(ranks)
                got = self._sync_plans[ranks] = (
                    tuple(sorted(comm.ipc)),
                    tuple(sorted(comm.broadcast)),
                    (self.owner_gpu,) + tuple(sorted(bcast)),
                )
        ipc, bcast_ranks, members = got
        buckets = self._bucket_sizes()
        return ss.plan_sync(
            e.version,
            buckets[:1] if partial else buckets,
            ipc,
            bcast_ranks,
            f"{self.pid}/sync/v{e.version}/{'-'.join(map(str, ranks))}",
            members,
        )

    def _sync_targets(self, ranks: Tuple[int, ...]) -> Tuple[List[int], List[int]]:
        """The target GPUs of a sync to ``ranks`` on each path (same-GPU IPC, broadcast):
        ``build_comm_plan`` over the ranks' devices. A rank's GPUs and the cache owner never
        change, so the answer for one rank tuple is worked out once per pipeline (the lists
        are only read)."""
        cache = self._sync_targets_of
        got = cache.get(ranks)
        if got is None and self.spec.refit_path == "colocated_ipc":
            got = cache[ranks] = ([g for r in sorted(ranks) for g in self.ranks[r].gpus], [])
        if got is None:
            cluster = self.sim.cluster
            device = lambda g: (cluster.node_of(g), g % cluster.spec.gpus_per_node)  # noqa: E731
            plan = build_comm_plan(device(self.owner_gpu), {r: [device(g) for g in self.ranks[r].gpus] for r in ranks})
            ipc = [self.ranks[r].gpus[lr] for r in sorted(plan.ipc) for lr in plan.ipc[r]]
            bcast = [self.ranks[r].gpus[lr] for r in sorted(plan.broadcast) for lr in plan.broadcast[r]]
            got = cache[ranks] = (ipc, bcast)
        return got

    def _bucket_sizes(self) -> Tuple[int, ...]:
        """The cache's buckets in order (fixed for the run: built once and kept)."""
        got = self._bucket_sizes_kept
        if got is None:
            got = self._bucket_sizes_kept = tuple(
                s.nbytes for s in cache_bucket_specs(self.weight_bytes, self.costs.bucket_bytes)
            )
        return got


class _SyncTiming:
    """What each effect of ``harness.control.selective_sync`` costs in simulated time."""

    def __init__(self, pipe, e) -> None:
        self.pipe, self.env, self.c, self.e = pipe, pipe.env, pipe.costs, e
        cluster = pipe.sim.cluster
        self.cluster, self.owner = cluster, pipe.owner_gpu
        _, bcast = pipe._sync_targets(tuple(e.ranks))
        node = cluster.node_of(self.owner)
        if any(cluster.node_of(g) != node for g in bcast):
            self.fabric, self.fabric_rate = cluster.links.nic[node], cluster.spec.inter_node_bytes_per_s
        else:
            self.fabric, self.fabric_rate = cluster.links.intra[node], cluster.spec.intra_node_bytes_per_s
        self.pack_rate = self.c.refit_pack_bytes_per_s or cluster.spec.pcie_bytes_per_s
        self.load_end = 0.0  # when the current bucket's last receiver load ends
        self.staged = False

    def handle(self, effect):
        return getattr(self, "_" + type(effect).__name__)(effect)

    def _LockCache(self, e):
        return self.pipe.cache_lock.acquire("sync", e.version)  # held until the group is destroyed

    def _UnlockCache(self, e):
        self._free_staging()  # on an error path the staging goes with the sync
        self.pipe.cache_lock.release(e.version)

    def _free_staging(self) -> None:
        if self.staged:
            self.staged = False
            if self.pipe._staging_kept():  # fault staging_leak (oracle_faults.py)
                return
            self.cluster.vram.free(self.owner, f"{self.pipe.pid}/sync", "staging")

    def _CreateSyncGroup(self, e):
        yield self.env.timeout(self.c.nccl_group_create_s)

    def _Emit(self, e):
        fields = e.fields
        if e.kind == "sync_bucket":  # fault sync_outside_expand (oracle_faults.py) widens the targets
            fields = dict(fields, dp_ranks=self.pipe._sync_written_ranks(self.e.path, fields["dp_ranks"]))
        self.pipe.sim.emit(e.kind, pipeline_id=self.pipe.pid, **fields)

    def _StageBucket(self, e):
        c = self.c
        if not self.staged:  # one staging buffer, reused bucket after bucket (the allocator's cache)
            self.staged = True
            self.cluster.vram.alloc(
                self.owner, f"{self.pipe.pid}/sync", "staging", self.pipe._bucket_sizes()[0], f"{self.e.path}_sync"
            )
            if c.refit_setup_s:
                yield self.env.timeout(c.refit_setup_s)
        t = e.nbytes / self.pack_rate + c.refit_tensor_overhead_s
        with self.cluster.links.h2d[self.owner].request() as req:
            yield req
            yield self.env.timeout(t)

    def _load_s(self, nbytes: int) -> float:
        c = self.c
        return nbytes / c.receiver_load_bytes_per_s + c.refit_tensor_overhead_s + c.refit_group_overhead_s

    def _SendIpc(self, e):  # the same-GPU receivers copy and load while the broadcast goes on
        self.load_end = max(self.load_end, self.env._now + self._load_s(e.nbytes))

    def _Broadcast(self, e):
        with self.fabric.request() as req:
            yield req
            yield self.env.timeout(e.nbytes / self.fabric_rate)
        self.load_end = max(self.load_end, self.env._now + self._load_s(e.nbytes))

    def _BucketBarrier(self, e):
        if self.load_end > self.env._now:
            yield self.env.timeout(self.load_end - self.env._now)

    def _FreeStaging(self, e):
        if e.last:
            self._free_staging()

    def _FinishSend(self, e):
        if self.c.refit_complete_s:
            yield self.env.timeout(self.c.refit_complete_s)
        slowdown = self.pipe._refit_slowdown_s()  # fault refit_slows (oracle_faults.py)
        if slowdown:
            yield self.env.timeout(slowdown)

    def _DestroySyncGroup(self, e):
        if self.pipe._strand_sync_group(e.name, list(e.members)):
            return False
        return self._destroy()

    def _destroy(self):
        yield self.env.timeout(self.c.nccl_group_destroy_s)
        return True


class _ColocatedIpcTiming(_SyncTiming):
    """The effects' costs on the ``colocated_ipc`` refit path (standalone NeMo RL): every
    target takes the same-GPU IPC path, so a bucket is one of NeMo RL's refit groups —
    packed into a consolidated tensor on the trainer's GPU, then copied into place by the
    vLLM worker on that GPU, both over that GPU's HBM; before the pack, the group's share of
    ``refit_gather_s`` (every GPU gathering its tensors whole from the training layout,
    ``refit_formulas.refit_gather_s``). Every GPU does the same at once, so one timeline stands
    for all; no host link and no fabric is held (the gather's collectives are the
    training's own groups, charged as time).
    ``refit_formulas.colocated_ipc_refit_s`` is the closed form (a test checks the two agree)."""

    def __init__(self, pipe, e) -> None:
        super().__init__(pipe, e)
        from simulators.costmodel.hardware import GPU_PRESETS

        self.copy_s_per_byte = 2.0 / (GPU_PRESETS[self.cluster.spec.gpu].hbm_bytes_per_s * self.c.hbm_efficiency)

    def _StageBucket(self, e):  # pack the group on the trainer's GPU (read + write in HBM)
        c = self.c
        if not self.staged:
            self.staged = True
            self.cluster.vram.alloc(
                self.owner, f"{self.pipe.pid}/sync", "staging", self.pipe._bucket_sizes()[0], f"{self.e.path}_sync"
            )
            if c.refit_setup_s:
                yield self.env.timeout(c.refit_setup_s)
        gather = c.refit_gather_s * e.nbytes / self.pipe.weight_bytes if c.refit_gather_s else 0.0
        yield self.env.timeout(gather + e.nbytes * self.copy_s_per_byte + c.refit_tensor_overhead_s)

    def _load_s(self, nbytes: int) -> float:  # the worker copies it into place, same HBM
        c = self.c
        return nbytes * self.copy_s_per_byte + c.refit_tensor_overhead_s + c.refit_group_overhead_s


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
        return cls(
            pack_bytes_per_s=c.refit_pack_bytes_per_s or link_bytes_per_s,
            load_bytes_per_s=c.receiver_load_bytes_per_s,
            group_overhead_s=c.refit_group_overhead_s,
            tensor_overhead_s=c.refit_tensor_overhead_s,
            setup_s=c.refit_setup_s,
            staging_bytes_per_s=c.refit_staging_bytes_per_s,
            complete_s=c.refit_complete_s,
        )


def cache_bucket_specs(weight_bytes: int, bucket_bytes: int) -> List[proto.TensorSpec]:
    """The simulator's weights as the stream sees them: the cache's buckets in order, each
    a bucket-sized unit (the last one shorter), so each is one group of the stream."""
    n = max(1, math.ceil(weight_bytes / bucket_bytes))
    sizes = [min(bucket_bytes, weight_bytes - b * bucket_bytes) for b in range(n)]
    return [proto.TensorSpec(f"bucket{b}", (size,), "uint8", size) for b, size in enumerate(sizes)]


def stream_sync(
    env,
    specs,
    budget_bytes: int,
    costs: StreamCosts,
    *,
    staging_link=None,
    fabric=None,
    fabric_rate: float = 0.0,
    on_alloc: Optional[Callable[[int], None]] = None,
    on_ack: Optional[Callable[[int, int], None]] = None,
    on_release: Optional[Callable[[], None]] = None,
):
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


class _AloneClock:
    """The one part of a simpy environment :func:`stream_sync` touches when its stream is
    alone (no staging link, no fabric): ``now`` and ``timeout``. A lone process's timeouts
    fire in the order they are yielded, each at ``now + delay`` (simpy's own arithmetic),
    so driving the body by hand gives simpy's float to the bit without its event queue
    (the refit fit predicts thousands of syncs)."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0  # simpy's initial time (an int until the first timeout)

    @staticmethod
    def timeout(delay):
        if delay < 0:
            raise ValueError(f"Negative delay {delay}")
        return delay


def predict_sync_seconds(specs, budget_bytes: int, costs: StreamCosts) -> float:
    """Simulated wall time of one stream alone (no contention): what ``rlharness fidelity
    refit`` compares with the real transport's measured sync time. :func:`stream_sync`
    itself, on :class:`_AloneClock` (the same float as a simpy environment's ``now``)."""
    clock = _AloneClock()
    body = stream_sync(clock, specs, budget_bytes, costs)
    try:
        delay = next(body)
        while True:
            clock.now = clock.now + delay
            delay = body.send(None)  # a Timeout's value
    except StopIteration:
        pass
    return clock.now
