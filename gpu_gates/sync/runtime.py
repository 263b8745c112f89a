"""The gates' interpreter of the selective sync (``harness.control.selective_sync``).

The order — group only with broadcast targets, per bucket stage → IPC hand + broadcast →
barrier → free, finish, group destroyed on every exit path — is the harness's; this
module only says what each effect does on real processes, for both refit gates
(``selective_sync.py``, ``dual_worker.py``):

* the owner runs the generator with :class:`OwnerSync`'s handlers (:func:`run_owner`);
* every other rank in the sync runs :func:`serve_receiver`: RLix's receivers are
  passive (the owner calls ``update_parameter_in_bucket`` / ``broadcast_parameter`` /
  ``destroy_collective_group`` on them), so a receiver here executes the owner's
  numbered orders (``<prefix>/op<n>`` in the store) until the owner's ``end``.

Same-GPU payloads (the IPC path) travel over NeMo RL's colocated refit stream
(``gpu_gates/sync/ipc.py``): one stream per bucket and receiver, its own protocol with its own
``refit_*`` records — a transport, not a second definition of the sync's order.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import torch

from gpu_gates.sync import ipc
from gpu_gates.runtime import pg_registry
from harness.control import selective_sync as ss
from harness.control.interpret import run_blocking
from gpu_gates.sync.bucket_cache import BucketRecord, unpack_bucket


class SyncGroup:
    """A process group for one sync only: owner + broadcast targets, on a fresh store prefix.

    ``dist.new_group`` cannot serve here: its groups are world-collective (every rank must
    call it, in the same order — impossible while two pipelines sync concurrently), and
    with ``use_local_synchronization`` its name is derived from the member set alone, so a
    second sync between the same ranks finds the first one's rendezvous keys in the store
    and connects to closed ports. A backend object on a unique ``PrefixStore`` is created
    by the members only, used bucket by bucket, and destroyed after the sync.

    ``ProcessGroupGloo.shutdown()`` is no proof of anything (on gloo a broadcast still works
    after it), so the group counts as destroyed only when the backend object is gone: it
    is tracked by ``pg_registry`` (visible to every leak check), and :meth:`close` fails the
    ``sync_group_destroyed`` check when a reference survived (the run goes on to its end,
    where ``no_group_survives`` names the group too).
    """

    _stray: List[Any] = []  # test hook leak_sync_group: the reference a buggy teardown forgets

    def __init__(self, ctx: Any, sync_id: str, members: List[int], purpose: str = "sync", emit: bool = False) -> None:
        import torch.distributed as dist

        self.members, self.ctx, self.emit = members, ctx, emit
        self.name = f"sync:{sync_id}"
        store = dist.PrefixStore(f"rlharness_sync/{sync_id}/", ctx.store)
        me = members.index(ctx.rank)
        if ctx.backend == "nccl":  # not merely CUDA tensors: gloo ranks may share one GPU (--device cuda)
            self.pg = dist.ProcessGroupNCCL(store, me, len(members))
        else:
            self.pg = dist.ProcessGroupGloo(store, me, len(members), ctx.timeout)
        pg_registry.track_direct(self.name, self.pg, members, desc=sync_id)
        if ctx.hooks.get("leak_sync_group") is not None:
            SyncGroup._stray.append(self.pg)
        if emit:  # a training group: its own records (a sync's come from the sync's order)
            ctx.emit("group_create", name=self.name, members=members, desc=sync_id, purpose=purpose)

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.pg.broadcast(tensor, self.members.index(src)).wait()

    def close(self) -> bool:
        """Shut the backend down and drop it; whether it is gone."""
        pg, self.pg = self.pg, None
        try:
            pg.shutdown()  # NCCL: releases the communicator; gloo: may do nothing
        except Exception:  # gloo may have nothing to shut down on some versions
            pass
        del pg
        gone = self.ctx.check(
            "sync_group_destroyed",
            not pg_registry.direct_alive(self.name),
            f"sync group {self.name} is still alive after its close (a reference survived)",
        )
        if gone and self.emit:
            self.ctx.emit("group_destroy", name=self.name, desc=self.name, members=self.members)
        return gone


@dataclass(frozen=True)
class SyncLink:
    """What the owner and every receiver of one sync agree on without a message."""

    sync_id: str
    prefix: str  # store key prefix of the sync's orders and ACKs
    owner: int  # global rank of the cache owner
    rank_of: Dict[int, int]  # target dp rank -> global rank
    bucket_size_bytes: int

    def ranks(self, dp_ranks) -> List[int]:
        return sorted(self.rank_of[d] for d in dp_ranks)


class OwnerSync:
    """The owner's handlers: one ``_<Effect>`` per effect of the selective sync."""

    def __init__(
        self,
        ctx: Any,
        cache: Any,
        link: SyncLink,
        *,
        damage_bucket: Optional[int] = None,
        on_group: Optional[Callable[[List[int]], None]] = None,
        group_members: Optional[Callable[[List[int]], List[int]]] = None,
    ) -> None:
        self.ctx, self.cache, self.link = ctx, cache, link
        self.damage_bucket, self.on_group, self.group_members = damage_bucket, on_group, group_members
        self.n_ops = 0
        self.group: Optional[SyncGroup] = None
        self.reading = None
        self.buckets: List[BucketRecord] = []
        self.staging: Optional[torch.Tensor] = None
        self.streams: List[threading.Thread] = []
        self.stream_errors: List[BaseException] = []
        self.sent = 0

    def handle(self, effect: Any) -> Any:
        return getattr(self, "_" + type(effect).__name__)(effect)

    def _order(self, **op: Any) -> None:
        self.ctx.put(f"{self.link.prefix}/op{self.n_ops}", json.dumps(op).encode())
        self.n_ops += 1

    def _LockCache(self, e: ss.LockCache) -> None:
        self.reading = self.cache.reading()  # build/promote are locked out until UnlockCache
        self.buckets = self.reading.__enter__()
        if self.cache.active_version != e.version:
            raise RuntimeError(f"sync of version {e.version} but the active cache is {self.cache.active_version}")

    def _UnlockCache(self, e: ss.UnlockCache) -> None:
        self._order(op="end")
        if self.reading is not None:
            self.reading.__exit__(None, None, None)
            self.reading = None

    def _Emit(self, e: ss.Emit) -> None:
        self.ctx.emit(e.kind, **e.fields)

    def _CreateSyncGroup(self, e: ss.CreateSyncGroup) -> List[int]:
        members = sorted(self.group_members(list(e.members)) if self.group_members else e.members)
        # Enter the rendezvous only once every member has started serving: the rendezvous is
        # a blocking store wait that sees no abort key; this wait polls it and the deadline.
        for r in members:
            if r != self.ctx.rank:
                self.ctx.wait_get(f"{self.link.prefix}/ready/r{r}", f"rank {r} to start receiving {self.link.sync_id}")
        self._order(op="group", members=members)
        self.group = SyncGroup(self.ctx, self.link.sync_id, members)
        if self.on_group is not None:
            self.on_group(members)
        return members

    def _StageBucket(self, e: ss.StageBucket) -> None:
        record = self.buckets[e.bucket]
        self.staging = record.buffer.to(self.ctx.device, copy=True)  # the per-bucket staging copy
        if e.bucket == self.damage_bucket:
            self.staging[record.offsets[0]] ^= 0xFF  # test hook: damage the first byte of the first tensor

    def _SendIpc(self, e: ss.SendIpc) -> None:
        """Start one refit stream per same-GPU receiver with the staged bucket; the
        barrier joins them (the broadcast goes on meanwhile, as RLix's async calls do)."""
        record = self.buckets[e.bucket]
        named = unpack_bucket(BucketRecord.from_metadata(record.metadata(), self.staging.cpu()))
        self._order(op="ipc", bucket=e.bucket, ranks=self.link.ranks(e.dp_ranks))
        budget = ipc.stream_budget(self.link.bucket_size_bytes)
        for r in self.link.ranks(e.dp_ranks):
            th = threading.Thread(target=self._stream, args=(r, e.bucket, named, budget), daemon=True)
            th.start()
            self.streams.append(th)

    def _stream(self, r: int, bucket: int, named, budget: int) -> None:
        try:
            ipc.stream_to(
                self.ctx,
                f"{self.link.sync_id}_b{bucket}",
                r,
                named,
                budget,
                self._version(),
                timeout_s=ipc.stream_timeout(self.ctx),
            )
        except BaseException as exc:  # re-raised by the barrier
            self.stream_errors.append(exc)

    def _version(self) -> int:
        return int(self.cache.active_version)

    def _Broadcast(self, e: ss.Broadcast) -> None:
        self._order(op="broadcast", bucket=e.bucket, ranks=self.link.ranks(e.dp_ranks))
        self.group.broadcast(self.staging, src=self.ctx.rank)

    def _BucketBarrier(self, e: ss.BucketBarrier) -> None:
        for th in self.streams:
            th.join()
        self.streams = []
        if self.stream_errors:
            raise self.stream_errors[0]
        for r in self.link.ranks(e.broadcast):
            self.ctx.wait_get(f"{self.link.prefix}/ack{e.bucket}/r{r}", f"ACK of bucket {e.bucket} from rank {r}")

    def _FreeStaging(self, e: ss.FreeStaging) -> None:
        self.staging = None

    def _FinishSend(self, e: ss.FinishSend) -> None:
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)

    def _DestroySyncGroup(self, e: ss.DestroySyncGroup) -> bool:
        for th in self.streams:  # an error path: no stream thread outlives the sync
            th.join()
        self.streams = []
        self._order(op="destroy")
        group, self.group = self.group, None
        return group.close() if group is not None else True  # False: no group_destroy is recorded


def run_owner(ctx: Any, handlers: OwnerSync, plan: ss.SyncPlan) -> Dict[str, int]:
    """The owner's side of one sync: the harness's order with these handlers, under
    RLix's timeout (a hung peer past it is thrown into the sync, which tears down)."""
    deadline = time.monotonic() + ss.SYNC_TIMEOUT_S
    return run_blocking(
        ss.selective_sync(plan), handlers.handle, deadline=ss.sync_deadline(lambda: time.monotonic() > deadline)
    )


def serve_receiver(
    ctx: Any,
    link: SyncLink,
    buckets_meta: List[Dict[str, Any]],
    model: Any,
    version: int,
    on_group: Optional[Callable[[List[int]], None]] = None,
) -> List[int]:
    """A receiver's side: execute the owner's orders until ``end``. Returns the buckets
    this rank loaded (a group member that is no target joins each broadcast — a
    collective needs every member — and drops what it got)."""
    ctx.put(f"{link.prefix}/ready/r{ctx.rank}", b"1")
    group: Optional[SyncGroup] = None
    loaded: List[int] = []
    n = 0
    try:
        while True:
            op = json.loads(ctx.wait_get(f"{link.prefix}/op{n}", f"order {n} of {link.sync_id} from rank {link.owner}"))
            n += 1
            if op["op"] == "end":
                return loaded
            if op["op"] == "group" and ctx.rank in op["members"]:
                group = SyncGroup(ctx, link.sync_id, op["members"])
                if on_group is not None:
                    on_group(op["members"])
            elif op["op"] == "ipc" and ctx.rank in op["ranks"]:
                _receive_stream(ctx, link, op["bucket"], buckets_meta[op["bucket"]], model, version)
                loaded.append(op["bucket"])
            elif op["op"] == "broadcast" and group is not None:
                meta = buckets_meta[op["bucket"]]
                ctx.set_phase(f"{link.sync_id}: receive bucket {op['bucket']}")
                buffer = torch.empty(meta["used_bytes"], dtype=torch.uint8, device=ctx.device)
                group.broadcast(buffer, src=link.owner)
                if ctx.rank in op["ranks"]:
                    model.load_named(unpack_bucket(BucketRecord.from_metadata(meta, buffer.cpu())))
                    loaded.append(op["bucket"])
                    ctx.put(f"{link.prefix}/ack{op['bucket']}/r{ctx.rank}", b"1")
            elif op["op"] == "destroy" and group is not None:
                group, closing = None, group
                closing.close()
    finally:
        if group is not None:  # an error mid-sync: this rank's side goes with it
            group.close()


def _receive_stream(ctx: Any, link: SyncLink, bucket: int, meta: Dict[str, Any], model: Any, version: int) -> None:
    ctx.set_phase(f"{link.sync_id}: receive bucket {bucket} over the refit stream")
    res = ipc.receive_from(
        ctx,
        f"{link.sync_id}_b{bucket}",
        ipc.manifest_of_buckets([meta]),
        ipc.load_into(model),
        ipc.stream_budget(link.bucket_size_bytes),
        version,
        link.owner,
        timeout_s=ipc.stream_timeout(ctx),
    )
    if not res.finalized:
        raise RuntimeError(f"{link.sync_id}: the refit stream ended without finalizing")
