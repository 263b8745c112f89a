"""The rollout buffer of the single controller: reserve -> commit -> remove_group.

NeMo RL's ``TQReplayBuffer`` (docs/modelled-systems.md#nemo-rl-streaming-single-controller): a rollout *reserves* a slot
before it generates (a fresh group id per attempt, tagged with the weight version at
dispatch), *commits* its record when generation ends, and the slot is freed by
``remove_group`` (a failed attempt, an evicted group, a group the trainer consumed and
cleared, or an aborted in-flight rollout). Capacity counts reserved *and* committed
groups: that is what bounds how far generation can run ahead of training, and why a
capacity below what the sampler needs to fill one step deadlocks (see
``controller.check_capacity``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional


class BufferError(RuntimeError):
    """A buffer operation the protocol forbids (commit of an unknown group, double commit)."""


@dataclass
class GroupEntry:
    """One prompt group in the buffer (one reserve attempt)."""

    group_id: int
    prompt_id: int
    start_version: int  # weight version at dispatch (reserve)
    target_step: Optional[int]  # stamped by in_order admission, else None
    reserved_seq: int  # order of reservation
    ready: bool = False  # committed
    end_version: Optional[int] = None  # weight version when generation ended
    commit_seq: Optional[int] = None  # arrival order (commit order)
    size: int = 1  # trajectories in the group (generations per prompt)


class RolloutBuffer:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"buffer capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._entries: Dict[int, GroupEntry] = {}
        self._next_group = 0
        self._reserve_seq = 0
        self._commit_seq = 0

    # ---- capacity
    @property
    def used(self) -> int:
        """Slots held: reserved (in flight) plus committed (ready) groups."""
        return len(self._entries)

    @property
    def free(self) -> int:
        return self.capacity - len(self._entries)

    # ---- protocol
    def reserve(
        self, prompt_id: int, weight_version: int, target_step: Optional[int] = None, size: int = 1
    ) -> Optional[int]:
        """A fresh group id for one rollout attempt, or None when the buffer is full."""
        if len(self._entries) >= self.capacity:
            return None
        gid = self._next_group
        self._next_group += 1
        self._entries[gid] = GroupEntry(gid, prompt_id, weight_version, target_step, self._reserve_seq, size=size)
        self._reserve_seq += 1
        return gid

    def commit(self, group_id: int, end_version: int) -> GroupEntry:
        entry = self._entries.get(group_id)
        if entry is None:
            raise BufferError(f"commit of group {group_id}, which is not reserved (removed or never reserved)")
        if entry.ready:
            raise BufferError(f"group {group_id} committed twice")
        entry.ready = True
        entry.end_version = end_version
        entry.commit_seq = self._commit_seq
        self._commit_seq += 1
        return entry

    def remove_group(self, group_id: int) -> bool:
        """Free the group's slot; False if it was already gone (removal is idempotent:
        an abort and a failing rollout may both try)."""
        return self._entries.pop(group_id, None) is not None

    def promote_ready_group(self, to_target_step: int) -> Optional[int]:
        """Re-stamp one finished group of the furthest later step onto ``to_target_step``
        (a step that lost a prompt); returns the step it came from, or None. Only ready
        groups: a reserved one would hand the step the same wait."""
        best: Optional[GroupEntry] = None
        for e in self._entries.values():
            if e.ready and e.target_step is not None and e.target_step > to_target_step:
                if best is None or (e.target_step, -e.reserved_seq) > (best.target_step, -best.reserved_seq):
                    best = e
        if best is None:
            return None
        lender, best.target_step = best.target_step, to_target_step
        return lender

    def count_for_target_step(self, target_step: int) -> int:
        return sum(1 for e in self._entries.values() if e.target_step == target_step)

    # ---- views
    def get(self, group_id: int) -> Optional[GroupEntry]:
        return self._entries.get(group_id)

    def entries(self) -> Iterator[GroupEntry]:
        """All groups in reservation order."""
        return iter(sorted(self._entries.values(), key=lambda e: e.reserved_seq))

    def ready(self) -> List[GroupEntry]:
        """Committed groups in reservation (dispatch) order: the order the samplers read
        them in (NeMo RL's buffer lists its slots by reservation), so a capped select
        takes the groups dispatched first, whichever finished first."""
        return sorted((e for e in self._entries.values() if e.ready), key=lambda e: e.reserved_seq)

    def inflight(self) -> List[GroupEntry]:
        return sorted((e for e in self._entries.values() if not e.ready), key=lambda e: e.reserved_seq)
