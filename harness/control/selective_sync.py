"""RLix's selective weight sync, written once as control logic.

After ``ModelUpdateService.sync_selected_workers`` and the owner's
``selective_sync_active_cache`` (rlops/rlix, ``rlix/pipeline/model_update_service.py``
at b4534cb5c330d984a4d833e002564ade0162495d; docs/control-logic.md, "Selective sync"):

1. the comm plan (``harness.refit.comm_plan``): a target device on the cache owner's GPU
   takes the IPC path (NCCL cannot group two ranks of one GPU), every other one the
   broadcast path;
2. under the owner's cache lock: a dynamic group (owner + broadcast targets) is set up
   only when there are broadcast targets;
3. per bucket: stage it on the owner's GPU, hand the IPC payload to the same-GPU
   receivers *and* broadcast the staged bucket to the group, a barrier on both, free the
   staging;
4. after the last bucket the sender's finish (RLix: ``torch.cuda.synchronize()``), then
   the group destroyed — on every exit path, an error or the sync's timeout included —
   and the lock released.

The generator never reads a clock: the runtime's clock decides when the deadline
(:data:`SYNC_TIMEOUT_S`, RLix's ``ROLL_SELECTIVE_MODEL_UPDATE_TIMEOUT_S``) has passed, and
the interpreter (``harness.control.interpret``, with :func:`sync_deadline`) throws
:class:`SyncTimeout` into it then; a handler's exception is thrown in the same way, so
the teardown below runs as RLix's would. The sync's records
(``sync_start``, ``group_create``, ``sync_bucket``, ``group_destroy``, ``sync_end``) are
yielded here as :class:`Emit` effects, so every runtime writes the same ones in the same
order. Receivers' finalize (``finalize_weight_update``) is the pipeline's ``Finalize``
effect after the sync (ROLL's branch: the pipeline owns finalize), not part of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generator, Iterable, Sequence, Tuple

from harness.control.interpret import Deadline

#: RLix ``ROLL_SELECTIVE_MODEL_UPDATE_TIMEOUT_S`` default: one whole sync, fail-fast after.
SYNC_TIMEOUT_S = 150.0
#: RLix ``ROLL_SELECTIVE_MODEL_UPDATE_PG_TIMEOUT_S`` default: the dynamic group's own timeout.
GROUP_TIMEOUT_S = 120.0

IPC = "ipc"
BROADCAST = "broadcast"
PATHS = (IPC, BROADCAST)

Ranks = Tuple[int, ...]


class SyncTimeout(TimeoutError):
    """The sync's deadline expired (thrown into the generator by its interpreter)."""


@dataclass(frozen=True)
class SyncPlan:
    """One sync: the version, each bucket's bytes, and the target dp ranks on each path
    (a dp rank with devices on both sides of the owner's GPU is on both paths)."""

    version: int
    bucket_bytes: Tuple[int, ...]
    ipc: Ranks
    broadcast: Ranks
    group_name: str
    group_members: Tuple[int, ...]  # the runtime's ids, owner first (GPUs, or global ranks)

    @property
    def targets(self) -> Ranks:
        return tuple(sorted(set(self.ipc) | set(self.broadcast)))


def plan_sync(
    version: int,
    bucket_bytes: Sequence[int],
    ipc: Iterable[int],
    broadcast: Iterable[int],
    group_name: str,
    group_members: Sequence[int],
) -> SyncPlan:
    """The one way to build a :class:`SyncPlan`: the target dp ranks on each path come
    from a comm plan (``build_comm_plan``: its ``ipc`` and ``broadcast``), the group's
    members are the runtime's ids, owner first."""
    if not bucket_bytes:
        raise ValueError("a sync needs at least one bucket")
    return SyncPlan(
        int(version),
        tuple(int(b) for b in bucket_bytes),
        tuple(sorted(ipc)),
        tuple(sorted(broadcast)),
        group_name,
        tuple(group_members),
    )


# ------------------------------------------------------------------ effects
@dataclass(frozen=True)
class LockCache:
    version: int


@dataclass(frozen=True)
class UnlockCache:
    version: int


@dataclass(frozen=True)
class CreateSyncGroup:
    """Set the dynamic group up; the result is its actual member list (or None: as asked)."""

    name: str
    members: Tuple[int, ...]
    timeout_s: float = GROUP_TIMEOUT_S


@dataclass(frozen=True)
class StageBucket:
    bucket: int
    nbytes: int


@dataclass(frozen=True)
class SendIpc:
    """Hand the staged bucket's IPC payload to the same-GPU receivers (does not wait)."""

    bucket: int
    nbytes: int
    dp_ranks: Ranks


@dataclass(frozen=True)
class Broadcast:
    """Broadcast the staged bucket to the group's members."""

    bucket: int
    nbytes: int
    dp_ranks: Ranks


@dataclass(frozen=True)
class BucketBarrier:
    """Wait until every target of this bucket has loaded it (RLix: ``ray.get``)."""

    bucket: int
    ipc: Ranks
    broadcast: Ranks


@dataclass(frozen=True)
class FreeStaging:
    bucket: int
    last: bool


@dataclass(frozen=True)
class FinishSend:
    """After the last bucket: the sender's device work is done (``torch.cuda.synchronize``)."""

    buckets: int


@dataclass(frozen=True)
class DestroySyncGroup:
    name: str
    members: Tuple[int, ...]


@dataclass(frozen=True)
class Emit:
    """Write one event-log record (the runtime adds ``seq``, ``t`` and who wrote it)."""

    kind: str
    fields: Dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ the order
def selective_sync(plan: SyncPlan) -> Generator[Any, Any, Dict[str, int]]:
    """The sync's order (module docstring). Returns the bytes delivered per path.

    Teardown runs on every exit an interpreter can report (an error or the timeout thrown
    in); a teardown effect failing after that error does not replace it (the first error
    wins: it is the one the caller sees). A generator *closed* by its
    runtime (``GeneratorExit``: the run itself ended and drops the process) yields nothing
    more, as Python requires."""
    yield LockCache(plan.version)
    sent = {IPC: 0, BROADCAST: 0}
    try:
        yield Emit(
            "sync_start",
            {
                "version": plan.version,
                "dp_ranks": list(plan.targets),
                "ipc_dp_ranks": list(plan.ipc),
                "broadcast_dp_ranks": list(plan.broadcast),
            },
        )
        try:
            yield from _group_and_buckets(plan, sent)
        except GeneratorExit:
            raise
        except BaseException as exc:
            yield from _teardown(
                Emit("sync_end", {"version": plan.version, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
            )
            raise
        yield Emit("sync_end", {"version": plan.version, "ok": True})
    except GeneratorExit:
        raise
    except BaseException:
        yield from _teardown(UnlockCache(plan.version))
        raise
    yield UnlockCache(plan.version)
    return sent


def _teardown(effect: Any, failed: Any = None) -> Generator[Any, Any, Any]:
    """A teardown effect after an earlier error: its own failure answers ``failed`` and is
    dropped, so the error being handled is the one that goes on up."""
    try:
        return (yield effect)
    except Exception:
        return failed


def _group_and_buckets(plan: SyncPlan, sent: Dict[str, int]) -> Generator:
    members = None
    if plan.broadcast:
        actual = yield CreateSyncGroup(plan.group_name, plan.group_members)
        members = tuple(actual) if actual is not None else plan.group_members
        yield Emit("group_create", {"name": plan.group_name, "members": list(members), "purpose": "sync"})
    try:
        yield from _buckets(plan, sent)
    except GeneratorExit:
        raise
    except BaseException:
        if members is not None:
            yield from _destroy(plan, members, tearing_down=True)
        raise
    if members is not None:
        yield from _destroy(plan, members)


def _buckets(plan: SyncPlan, sent: Dict[str, int]) -> Generator:
    last = len(plan.bucket_bytes) - 1
    for b, nbytes in enumerate(plan.bucket_bytes):
        yield StageBucket(b, nbytes)
        if plan.ipc:
            yield SendIpc(b, nbytes, plan.ipc)
        if plan.broadcast:
            yield Broadcast(b, nbytes, plan.broadcast)
        yield BucketBarrier(b, plan.ipc, plan.broadcast)
        for path, ranks in ((IPC, plan.ipc), (BROADCAST, plan.broadcast)):
            if ranks:
                sent[path] += nbytes
                yield Emit(
                    "sync_bucket",
                    {"version": plan.version, "bucket": b, "path": path, "dp_ranks": list(ranks), "bytes": nbytes},
                )
        yield FreeStaging(b, b == last)
    yield FinishSend(len(plan.bucket_bytes))


def _destroy(plan: SyncPlan, members: Tuple[int, ...], tearing_down: bool = False) -> Generator:
    """Destroy the group; a destroy that failed while tearing down counts as not destroyed."""
    destroy = DestroySyncGroup(plan.group_name, members)
    record = Emit("group_destroy", {"name": plan.group_name, "members": list(members), "purpose": "sync"})
    if not tearing_down:
        if (yield destroy) is not False:  # False: the group is still alive (a fault hook, a failed destroy)
            yield record
    elif (yield from _teardown(destroy, False)) is not False:
        yield from _teardown(record)


def sync_deadline(expired: Callable[[], bool], timeout_s: float = SYNC_TIMEOUT_S) -> Deadline:
    """The sync's deadline for the interpreter: once ``expired()`` (the runtime's clock)
    says it passed, :class:`SyncTimeout` is thrown into the sync, which tears down."""
    return Deadline(expired, lambda: SyncTimeout(f"selective sync timed out after {timeout_s:g}s"))
