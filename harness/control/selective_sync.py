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

The generator never reads a clock: the runtime arms the deadline (:data:`SYNC_TIMEOUT_S`,
RLix's ``ROLL_SELECTIVE_MODEL_UPDATE_TIMEOUT_S``) and throws :class:`SyncTimeout` into it
when it expires (:func:`run_blocking`); a handler's exception is thrown in the same way,
so the ``finally`` below runs as RLix's teardown would. The sync's records
(``sync_start``, ``group_create``, ``sync_bucket``, ``group_destroy``, ``sync_end``) are
yielded here as :class:`Emit` effects, so every runtime writes the same ones in the same
order. Receivers' finalize (``finalize_weight_update``) is the pipeline's ``Finalize``
effect after the sync (ROLL's branch: the pipeline owns finalize), not part of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import GeneratorType
from typing import Any, Callable, Dict, Generator, Optional, Sequence, Tuple

from harness.refit.comm_plan import CommPlan

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


def plan_sync(version: int, bucket_bytes: Sequence[int], comm_plan: CommPlan, group_name: str,
              group_members: Sequence[int]) -> SyncPlan:
    """A :class:`SyncPlan` from a comm plan (``build_comm_plan``)."""
    if not bucket_bytes:
        raise ValueError("a sync needs at least one bucket")
    return SyncPlan(int(version), tuple(int(b) for b in bucket_bytes), tuple(sorted(comm_plan.ipc)),
                    tuple(sorted(comm_plan.broadcast)), group_name, tuple(group_members))


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
    in); a generator *closed* by its runtime (``GeneratorExit``: the run itself ended and
    drops the process) yields nothing more, as Python requires."""
    yield LockCache(plan.version)
    sent = {IPC: 0, BROADCAST: 0}
    try:
        yield Emit("sync_start", {"version": plan.version, "dp_ranks": list(plan.targets),
                                  "ipc_dp_ranks": list(plan.ipc), "broadcast_dp_ranks": list(plan.broadcast)})
        try:
            yield from _group_and_buckets(plan, sent)
        except GeneratorExit:
            raise
        except BaseException as exc:
            yield Emit("sync_end", {"version": plan.version, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
            raise
        yield Emit("sync_end", {"version": plan.version, "ok": True})
    except GeneratorExit:
        raise
    except BaseException:
        yield UnlockCache(plan.version)
        raise
    yield UnlockCache(plan.version)
    return sent


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
            yield from _destroy(plan, members)
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
                yield Emit("sync_bucket", {"version": plan.version, "bucket": b, "path": path,
                                           "dp_ranks": list(ranks), "bytes": nbytes})
        yield FreeStaging(b, b == last)
    yield FinishSend(len(plan.bucket_bytes))


def _destroy(plan: SyncPlan, members: Tuple[int, ...]) -> Generator:
    destroyed = yield DestroySyncGroup(plan.group_name, members)
    if destroyed is not False:  # False: the group is still alive (a fault hook, a failed destroy)
        yield Emit("group_destroy", {"name": plan.group_name, "members": list(members), "purpose": "sync"})


# ------------------------------------------------------------------ the interpreters
def interpret(gen: Generator, handle: Callable[[Any], Any], expired: Optional[Callable[[], bool]] = None,
              timeout_s: float = SYNC_TIMEOUT_S) -> Generator:
    """Run the sync: each effect goes to ``handle`` (a value, or a generator the loop runs
    with ``yield from``: the simulator's handlers take simulated time). A handler's
    exception, or :class:`SyncTimeout` once ``expired()`` says the deadline passed, is
    thrown into the sync, so its teardown effects still run; the first error is re-raised
    at the end (a teardown effect failing after it does not replace it, and a group whose
    destroy failed is not recorded as destroyed). Returns the sync's value."""
    error: Optional[BaseException] = None
    result: Any = None
    while True:
        try:
            effect = gen.throw(error) if error is not None and result is _THROW else gen.send(result)
        except StopIteration as stop:
            if error is not None:
                raise error
            return stop.value
        result = None
        try:
            if error is None and expired is not None and expired():
                raise SyncTimeout(f"selective sync timed out after {timeout_s:g}s")
            result = handle(effect)
            if type(result) is GeneratorType:
                result = yield from result
        except Exception as exc:
            if error is None:
                error, result = exc, _THROW
            else:  # a teardown effect failing after the first error: the first error wins
                result = False if isinstance(effect, DestroySyncGroup) else None


_THROW = object()  # "throw the error in" marker for the loop above


def run_blocking(gen: Generator, handle: Callable[[Any], Any], expired: Optional[Callable[[], bool]] = None,
                 timeout_s: float = SYNC_TIMEOUT_S) -> Any:
    """:func:`interpret` with handlers that block and return (a gate's): none may yield."""
    loop = interpret(gen, handle, expired, timeout_s)
    try:
        item = next(loop)
    except StopIteration as stop:
        return stop.value
    loop.close()
    raise RuntimeError(f"a blocking runtime's sync handler yielded {item!r}: it must complete before returning")
