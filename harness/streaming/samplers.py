"""Staleness samplers: which prompt groups the single controller admits, trains and drops.

NeMo RL's ``PromptGroupSampler`` protocol (``async_utils/staleness_sampler.py``,
docs/modelled-systems.md#nemo-rl-streaming-single-controller) with the four built-ins of the reference's table and a
``custom`` one loaded from ``module:Class``:

=============  ==========================  ==================================  ======================
name           admit gate                  select                              evict
=============  ==========================  ==================================  ======================
in_order       gated; stamps target_step   ready, ``target_step == trainer``   ready, ``target < trainer``
weight_fifo    gated, no stamp             oldest in-window start version       ``start < trainer - w``
                                           only; waits for it to fill
windowed       ungated (capacity bounds)   any ready, ``start`` in              same; also aborts in-flight
                                           ``[trainer - w, trainer]``           older than the window
ready_first    gated                       any ready, ``start <= trainer``     never
=============  ==========================  ==================================  ======================

Every select reads ready groups in reservation (dispatch) order, as NeMo RL's buffer
lists them, not in the order they finished: a capped select trains the groups
dispatched first. Only ``windowed`` aborts rollouts still generating at a weight sync
(it has no admission gate, so nothing else bounds how stale its in-flight work gets);
the gated samplers let them finish and their ``evict`` drops them once committed if
they can no longer be selected (NeMo RL's samplers answer ``should_abort_inflight``
False except the windowed one).

The gate. The reference writes it ``dispatch_index < trainer + window``; here versions
and the dispatch index both start at 0, and with that origin a strict ``<`` would admit
nothing at window 0 (the strict on-policy setting). So the gate is the same bound
written for this origin, ``dispatch_index <= trainer + window``: at most ``window + 1``
batches (one per step) are admitted ahead of the trainer, which is exactly the
``groups_per_step x (window + 1)`` capacity the setup check demands.

A sampler here is synchronous and pure over the buffer: ``admit`` returns ``None`` when
the gate is closed and the runtime waits for the trainer version to move (NeMo polls the
gate every 5 ms). ``should_abort_inflight`` answers, for a rollout still generating,
whether the sampler wants it aborted at a weight sync (only ``windowed`` says yes).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import List, Optional, Protocol, runtime_checkable

from harness.streaming.buffer import GroupEntry, RolloutBuffer

SAMPLER_NAMES = ("in_order", "weight_fifo", "windowed", "ready_first", "custom")


class SamplerError(ValueError):
    """A sampler configuration that cannot work (unknown name, bad custom target)."""


@dataclass(frozen=True)
class Admission:
    """One admitted batch of prompts: ``target_step`` is the stamp (in_order only)."""

    dispatch_index: int
    target_step: Optional[int] = None


@runtime_checkable
class PromptGroupSampler(Protocol):
    name: str
    window: int
    gated: bool

    def admit(self, trainer_version: int) -> Optional[Admission]: ...

    def select(
        self, buffer: RolloutBuffer, trainer_version: int, min_groups: int, max_groups: int
    ) -> List[GroupEntry]: ...

    def evict(self, buffer: RolloutBuffer, trainer_version: int) -> List[GroupEntry]: ...

    def should_abort_inflight(self, entry: GroupEntry, trainer_version: int) -> bool: ...

    def is_on_policy(self, entry: GroupEntry, trainer_version: int) -> bool: ...

    def required_buffer_capacity(self, groups_per_step: int) -> int: ...

    def set_dispatch_index(self, resume_from_step: int) -> None: ...


class _Base:
    """Shared parts: the admission gate, capacity and the on-policy test."""

    name = "base"
    gated = True
    stamps = False

    def __init__(self, window: int = 1, freshest_first: bool = False) -> None:
        if window < 0:
            raise SamplerError(f"window must be >= 0, got {window}")
        self.window = window
        self.freshest_first = freshest_first
        self.dispatch_index = 0

    def admit(self, trainer_version: int) -> Optional[Admission]:
        if self.gated and self.dispatch_index > trainer_version + self.window:
            return None
        adm = Admission(self.dispatch_index, self.dispatch_index if self.stamps else None)
        self.dispatch_index += 1
        return adm

    def is_on_policy(self, entry: GroupEntry, trainer_version: int) -> bool:
        return entry.start_version == trainer_version

    def required_buffer_capacity(self, groups_per_step: int) -> int:
        # a gated sampler admits window + 1 batches ahead; anything less deadlocks
        return groups_per_step * (self.window + 1) if self.gated else 1

    def set_dispatch_index(self, resume_from_step: int) -> None:
        """Seed the dispatch cursor for a run resumed at ``resume_from_step`` (0 = fresh):
        the gate and in_order's stamps line up with the restored trainer version."""
        if resume_from_step < 0:
            raise SamplerError(f"resume step must be >= 0, got {resume_from_step}")
        self.dispatch_index = resume_from_step

    def should_abort_inflight(self, entry: GroupEntry, trainer_version: int) -> bool:
        return False  # gated: a stale rollout finishes and its commit is evicted

    @staticmethod
    def _take(candidates: List[GroupEntry], min_groups: int, max_groups: int) -> List[GroupEntry]:
        if len(candidates) < max(min_groups, 1):
            return []
        return candidates[:max_groups]


class InOrderSampler(_Base):
    name = "in_order"
    stamps = True

    def select(self, buffer, trainer_version, min_groups, max_groups):
        return self._take([e for e in buffer.ready() if e.target_step == trainer_version], min_groups, max_groups)

    def evict(self, buffer, trainer_version):
        return [e for e in buffer.ready() if e.target_step is not None and e.target_step < trainer_version]


class WeightFifoSampler(_Base):
    name = "weight_fifo"

    def _oldest_in_window(self, buffer: RolloutBuffer, trainer_version: int) -> Optional[int]:
        lo = trainer_version - self.window
        versions = [e.start_version for e in buffer.entries() if lo <= e.start_version <= trainer_version]
        return min(versions) if versions else None

    def select(self, buffer, trainer_version, min_groups, max_groups):
        oldest = self._oldest_in_window(buffer, trainer_version)
        if oldest is None:
            return []
        return self._take([e for e in buffer.ready() if e.start_version == oldest], min_groups, max_groups)

    def evict(self, buffer, trainer_version):
        return [e for e in buffer.ready() if e.start_version < trainer_version - self.window]


class WindowedSampler(_Base):
    name = "windowed"
    gated = False

    def select(self, buffer, trainer_version, min_groups, max_groups):
        lo = trainer_version - self.window
        ready = [e for e in buffer.ready() if lo <= e.start_version <= trainer_version]
        if self.freshest_first:  # newest start version first, dispatch order within a version
            ready.sort(key=lambda e: (-e.start_version, e.reserved_seq))
        return self._take(ready, min_groups, max_groups)

    def evict(self, buffer, trainer_version):
        return [e for e in buffer.ready() if e.start_version < trainer_version - self.window]

    def should_abort_inflight(self, entry, trainer_version):
        return entry.start_version < trainer_version - self.window


class ReadyFirstSampler(_Base):
    name = "ready_first"

    def select(self, buffer, trainer_version, min_groups, max_groups):
        return self._take([e for e in buffer.ready() if e.start_version <= trainer_version], min_groups, max_groups)

    def evict(self, buffer, trainer_version):
        return []


_BUILTIN = {c.name: c for c in (InOrderSampler, WeightFifoSampler, WindowedSampler, ReadyFirstSampler)}
_PROTOCOL_METHODS = (
    "admit",
    "select",
    "evict",
    "should_abort_inflight",
    "is_on_policy",
    "required_buffer_capacity",
    "set_dispatch_index",
)


def make_sampler(name: str, window: int = 1, *, freshest_first: bool = False, target: str = "") -> PromptGroupSampler:
    """Build a sampler by name; ``custom`` loads ``target`` = ``"module:Class"`` and
    constructs it with ``window=`` (and checks it has every protocol method)."""
    if name in _BUILTIN:
        return _BUILTIN[name](window, freshest_first=freshest_first)
    if name != "custom":
        raise SamplerError(f"unknown sampler {name!r}; known: {', '.join(SAMPLER_NAMES)}")
    module_name, sep, cls_name = target.partition(":")
    if not sep or not module_name or not cls_name:
        raise SamplerError(f"custom sampler target must be 'module:Class', got {target!r}")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError) as e:
        raise SamplerError(f"custom sampler target {target!r} cannot be loaded: {e}") from None
    try:
        sampler = cls(window=window)
    except TypeError as e:
        raise SamplerError(f"custom sampler {target!r} cannot be built with window={window}: {e}") from None
    missing = [m for m in _PROTOCOL_METHODS if not callable(getattr(sampler, m, None))]
    if missing:
        raise SamplerError(f"custom sampler {target!r} lacks {', '.join(missing)} (PromptGroupSampler protocol)")
    for attr in ("window", "gated"):
        if not hasattr(sampler, attr):
            raise SamplerError(f"custom sampler {target!r} has no attribute {attr!r}")
    return sampler
