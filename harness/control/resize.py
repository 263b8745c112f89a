"""The two halves of ``resize_infer``: the order of a shrink and of an expand.

Both run under the coordinator lock, which serializes them against weight syncs (RLix
``_resize_sync_lock``). A failure inside either is fatal to the run (RLix fails fast), so
there is no unwinding here: the runtime stops. A coordinator that is gone (its pipeline
unregistered while the call waited for the lock) refuses the lock: the call does nothing
(RLix's dead-coordinator case, tolerated). The expand order is RLix's "F6 atomic" expand: a woken rank is
kept off routing until it holds the published version, so no request is ever served by
stale or missing weights.
"""

from __future__ import annotations

from typing import Generator, Sequence

from harness.control.context import PipelineContext
from harness.control.effects import (
    Activate,
    Drain,
    Finalize,
    LockCoordinator,
    MarkInactive,
    PublishVersion,
    Sleep,
    SyncFromCache,
    UnlockCoordinator,
    Wake,
    WakeTags,
)
from harness.control.engine import pause_effect
from harness.control.interpret import Refused

#: What ``LockCoordinator`` answers when the pipeline unregistered while the call waited
COORDINATOR_GONE = Refused("coordinator gone (pipeline unregistered)")


def shrink_order(ctx: PipelineContext, ranks: Sequence[int]) -> Generator:
    """pause (abort in-flight requests, or the pipeline's ``wait``/``keep`` mode) → drain →
    sleep (level from the pipeline); VRAM is checked by the runtime after the sleep
    (post-sleep residue)."""
    ranks = tuple(sorted(ranks))
    if type((yield LockCoordinator("shrink"))) is Refused:
        return  # the coordinator is gone: the lock is not held, nothing happens
    yield pause_effect(ranks, ctx.engine.pause_mode)
    yield Drain(ranks)
    yield Sleep(ranks, ctx.sleep_level)
    yield UnlockCoordinator("shrink")


def expand_order(ctx: PipelineContext, ranks: Sequence[int]) -> Generator:
    """mark → wake (unrouted) → sync from cache → finalize → publish → activate.

    With the staged wake (``ctx.engine.wake``, vLLM's RL sequence) the wake is split:
    weights before the sync, the KV cache after finalize; activation is the resume."""
    ranks = tuple(sorted(ranks))
    if type((yield LockCoordinator("expand"))) is Refused:
        return  # the coordinator is gone: the lock is not held, nothing happens
    staged = ctx.engine.wake == "staged"
    yield MarkInactive(ranks)
    yield WakeTags(ranks, ("weights",)) if staged else Wake(ranks)
    version = ctx.versions.active  # the promoted cache, never a half-built latest
    if version is None:
        raise RuntimeError(f"{ctx.pipeline_id}: expand before any cache was promoted")
    yield SyncFromCache(ranks, version, "expand")
    yield Finalize(ranks)
    if staged:
        yield WakeTags(ranks, ("kv_cache",))
    yield PublishVersion(version, "expand")
    yield Activate(ranks)
    yield UnlockCoordinator("expand")
