"""The inference DP rank lifecycle, as one transition table both runtimes obey.

    asleep --wake--> waking --woken--> awake_unrouted --synced--> synced
    synced --finalized--> synced(finalized) --activated--> routable
    routable --abort--> draining --slept--> asleep
    routable --refreshed--> routable        (active refresh while serving)
    any state --shutdown--> stopped          (the pipeline unregistered: its engines exit)

A rank may only serve requests in ``routable``. Sleep level 1 keeps weights in host RAM
(copied back on wake: the rank wakes holding its old version); level 2 drops them (the
rank wakes holding nothing and must be synced before it can serve). Either way the
expand path syncs before activation; the state machine refuses ``activated`` before
``synced`` and ``finalized``, which is the oracle's ``activate_after_sync`` (docs/trace-format.md)
enforced at the source.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional


class RankState(enum.Enum):
    ASLEEP = "asleep"
    WAKING = "waking"
    AWAKE_UNROUTED = "awake_unrouted"
    SYNCED = "synced"
    ROUTABLE = "routable"
    DRAINING = "draining"
    STOPPED = "stopped"  # terminal: the engine process exited with its pipeline


class RankStateError(RuntimeError):
    """An illegal lifecycle transition: the control logic or a runtime broke the order."""


_TRANSITIONS = {
    (RankState.ASLEEP, "wake"): RankState.WAKING,
    (RankState.WAKING, "woken"): RankState.AWAKE_UNROUTED,
    (RankState.AWAKE_UNROUTED, "synced"): RankState.SYNCED,
    (RankState.SYNCED, "synced"): RankState.SYNCED,
    (RankState.SYNCED, "finalized"): RankState.SYNCED,
    (RankState.SYNCED, "activated"): RankState.ROUTABLE,
    (RankState.ROUTABLE, "refreshed"): RankState.ROUTABLE,
    (RankState.ROUTABLE, "finalized"): RankState.ROUTABLE,
    (RankState.ROUTABLE, "abort"): RankState.DRAINING,
    (RankState.DRAINING, "slept"): RankState.ASLEEP,
    # a woken rank that is shrunk again before activation goes straight back to sleep
    (RankState.AWAKE_UNROUTED, "abort"): RankState.DRAINING,
    (RankState.SYNCED, "abort"): RankState.DRAINING,
}


@dataclass
class RankLifecycle:
    pipeline_id: str
    dp_rank: int
    state: RankState = RankState.ASLEEP
    weights_version: Optional[int] = None  # version held in VRAM (None: no weights)
    host_version: Optional[int] = None  # level-1 sleep keeps a host copy
    finalized: bool = False

    def on(self, event: str, *, version: Optional[int] = None, level: Optional[int] = None) -> RankState:
        if event == "shutdown" and self.state is not RankState.STOPPED:
            # a finished pipeline's engines exit whatever they were doing: nothing stays
            # routable, nothing stays resident (RLix: run() returns, the actors die)
            self.weights_version = self.host_version = None
            self.finalized = False
            self.state = RankState.STOPPED
            return self.state
        nxt = _TRANSITIONS.get((self.state, event))
        if nxt is None:
            raise RankStateError(
                f"{self.pipeline_id} dp{self.dp_rank}: '{event}' is not allowed in state {self.state.value}"
            )
        if event == "activated" and not self.finalized:
            raise RankStateError(f"{self.pipeline_id} dp{self.dp_rank}: activated before finalize")
        if event == "woken":
            self.weights_version = self.host_version  # level 1 restores, level 2 has nothing
            self.finalized = False
        elif event in ("synced", "refreshed"):
            self.weights_version = version
            self.finalized = False
        elif event == "finalized":
            self.finalized = True
        elif event == "slept":
            self.host_version = self.weights_version if level == 1 else None
            self.weights_version = None
            self.finalized = False
        self.state = nxt
        return nxt

    @property
    def serving(self) -> bool:
        return self.state is RankState.ROUTABLE
