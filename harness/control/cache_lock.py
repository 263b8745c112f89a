"""RLix's cache lock (``_cache_lock`` on a pipeline's cache owner): its record, written here for every runtime.

The owner holds the lock across a whole selective sync (the sync's ``LockCache`` ..
``UnlockCache``), and a cache build or promote takes the same lock, so a version is never
rebuilt or re-pointed while a transport reads it (docs/modelled-systems.md, "RLix CPU
bucket cache and cache lock"). The lock itself is the runtime's — a simpy hand-over in
the simulator (``simulators/pipelines/cache_lock.py``), a thread lock in the dual-pipeline gate's
driver, the bucket cache's own guard in the selective-sync gate
(``gpu_gates/sync/bucket_cache.py``) — because only the lock knows when a waiter got it.
What every runtime shares is the evidence: each one reports its lock's acquire (once
held, after any wait) and release (before it is handed on) to :class:`CacheLockRecords`,
which writes the one ``cache_lock`` record the cache-lock check
(``harness/logs/invariants/cache.py``) reads, in every runtime's log.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

#: Who holds the lock: a cache build, a promote, or a selective sync reading the cache.
HOLDERS = ("build", "promote", "sync")


class CacheLockRecords:
    """Writes one cache owner's ``cache_lock`` records.

    ``emit(kind, **fields)`` is the runtime's append (it adds ``seq``, ``t`` and, in a
    gate's rank log, the ``rank``); ``owner`` names the owner where the runtime has a
    pipeline (``pipeline_id=...``), which the record carries first."""

    def __init__(self, emit: Callable[..., Any], **owner: Any) -> None:
        self.emit, self.owner = emit, owner

    def acquired(self, holder: Optional[str], version: Optional[int]) -> None:
        self.emit("cache_lock", **self.owner, action="acquire", holder=holder, version=version)

    def released(self, holder: Optional[str], version: Optional[int]) -> None:
        self.emit("cache_lock", **self.owner, action="release", holder=holder, version=version)
