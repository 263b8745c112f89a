"""One lock per communicator of a disaggregated trainer, and the weight sync beside the trainer.

volcengine/verl #7423: ``update_actor`` (a thread pool) and ``update_weights`` (the event loop)
share the training side's PP and EP communicators, and nothing orders their collectives. A
fix per communicator puts each behind a lock of its own; an activity takes the lock of each
communicator it issues on and holds it until it is done. The locks order each communicator,
but not the two together: an activity that takes PP's lock and then EP's, beside one that
takes EP's and then PP's, can each hold one and wait for the other, the hang NCCL collectives
issued in different orders on two ranks give.

With ``disaggregated.comm_locks`` a one-step-off pipeline runs its weight sync beside the
trainer's next log-probs and training (the next batch generates only after it, as verl's
one-step-off trainer starts it after the sync); every activity takes PP's lock, then EP's
half-way through (its expert all-to-alls follow its pipeline stages). Fault
``comm_locks_inverted``: the sync takes EP's first (it gathers the expert shards before the
stages). Each lock is logged as ``collectives`` records (``wait`` when it has to wait, then
``start``, ``end``), which ``collective_order`` and the wait-for graph read
(harness/logs/invariants/waitfor_collectives.py).
"""

from __future__ import annotations

from typing import Dict, Generator, Optional, Tuple


class CommLocks:
    """The locks of a pipeline's PP and EP communicators (``PIPELINE/pp``, ``PIPELINE/ep``)."""

    def __init__(self, sim, pid: str) -> None:
        self.sim, self.env, self.pid = sim, sim.env, pid
        self.pp, self.ep = f"{pid}/pp", f"{pid}/ep"
        self.holder: Dict[str, Optional[str]] = {self.pp: None, self.ep: None}
        self.freed = {comm: self.env.event() for comm in self.holder}

    def order(self, inverted: bool) -> Tuple[str, str]:
        """PP's lock, then EP's; EP's first when ``inverted``."""
        return (self.ep, self.pp) if inverted else (self.pp, self.ep)

    def _emit(self, comm: str, activity: str, phase: str) -> None:
        self.sim.emit("collectives", pipeline_id=self.pid, communicator=comm, activity=activity, phase=phase)

    def acquire(self, comm: str, activity: str) -> Generator:
        if self.holder[comm] is not None:
            self._emit(comm, activity, "wait")
            while self.holder[comm] is not None:
                yield self.freed[comm]
        self.holder[comm] = activity
        self._emit(comm, activity, "start")

    def release(self, comm: str, activity: str) -> None:
        self.holder[comm] = None
        self._emit(comm, activity, "end")
        done, self.freed[comm] = self.freed[comm], self.env.event()
        done.succeed()

    def issue(self, activity: str, comms: Tuple[str, str], seconds: float) -> Generator:
        """``activity``'s collectives for ``seconds``: the first communicator's lock, half the
        time, the second's too, the other half; then both released."""
        for comm in comms:
            yield from self.acquire(comm, activity)
            yield self.env.timeout(seconds / len(comms))
        for comm in reversed(comms):
            self.release(comm, activity)
