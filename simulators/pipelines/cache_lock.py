"""RLix's ``_cache_lock`` on a pipeline's cache owner (docs/modelled-systems.md#rlix-cpu-bucket-cache-and-cache-lock).

The owner holds the lock across a whole weight sync — active-bucket lookup, every bucket
transport, the sender's group destroy — and a cache build or promote takes the same
lock, so a version is never rebuilt or re-pointed while a transport reads it. Every
acquire and release is logged through ``harness.control.cache_lock.CacheLockRecords``
(the ``cache_lock`` record every runtime writes the same way) for the cache-lock check
(``harness/logs/invariants/cache.py``).

An uncontended acquire costs no simulated event (the holder is set and the caller goes
on), so modelling the lock changes no timing unless two accesses really meet; a
contended one waits on an event the releasing holder triggers (FIFO hand-over).

Under schedule exploration (``simulators/runtime/explore.py``) RLix's lock is what it is, a
``threading.Lock`` with no order among waiters: the explorer picks the waiter it hands over
to, and a new holder may hold it a small seeded delay longer before going on.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Optional, Tuple

from harness.control.cache_lock import CacheLockRecords


class CacheLock:
    def __init__(self, sim, pipeline_id: str, owner_faults=None) -> None:
        self.sim, self.env, self.pid = sim, sim.env, pipeline_id
        self.owner_faults = owner_faults  # the owning pipeline when it carries faults (oracle_faults.py)
        self.holder: Optional[str] = None
        self.waiting: Deque[Tuple[object, str, object]] = deque()  # (event, holder, waiter's key)
        self.records = CacheLockRecords(sim.emit, pipeline_id=pipeline_id)

    def acquire(self, holder: str, version: Optional[int]):
        """Generator: ``yield from lock.acquire("build" | "promote" | "sync", version)``."""
        if self.holder is not None:
            ev = self.env.event()
            self.waiting.append((ev, holder, self._waiter_key()))
            yield ev  # the releasing holder hands the lock over (holder already set)
        else:
            self.holder = holder
        self.records.acquired(holder, version)
        explorer = self.env.explorer
        if explorer is not None:
            delay = explorer.delay()
            if delay:
                yield self.env.timeout(delay)  # the new holder holds a little longer

    def _waiter_key(self):
        proc = self.env._active_proc
        return getattr(proc, "order_key", None)

    def release(self, version: Optional[int]) -> None:
        self.records.released(self.holder, version)
        if self.waiting and self.owner_faults is not None and self.owner_faults._drop_cache_waiter():
            self.waiting.popleft()  # fault lost_cache_handoff (oracle_faults.py): the waiter is forgotten
        if self.waiting:
            explorer, i = self.env.explorer, 0
            if explorer is not None and len(self.waiting) > 1:  # no order among a threading.Lock's waiters
                i = explorer.pick([w[2] or (-1,) for w in self.waiting], self.env._now)
            ev, nxt, _key = self.waiting[i]
            del self.waiting[i]
            self.holder = nxt
            ev.succeed()
        else:
            self.holder = None
