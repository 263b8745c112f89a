"""The ``per_step`` decode timing of an inference rank (``workload.decode_timing: per_step``).

Every decode step of ``c`` running sequences takes ``t(c)`` seconds (:func:`decode_step_time`)
and advances each of them by one token, as a continuous-batching engine runs it (vLLM's
scheduler admits and retires sequences between steps). A rank keeps one :class:`StepClock`
of tokens decoded per running sequence; a request ends when the clock has advanced by its
length. :class:`PerStepDecode` is the part of :class:`simulators.pipelines.inference.Router`
that keeps the clocks and arms one completion timer per rank.
"""

from __future__ import annotations

import math
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Callable, Optional, Tuple

from simulators.runtime.env import Timer

if TYPE_CHECKING:
    from simulators.pipelines.inference import RankSim, Request
    from simulators.scenario.spec import ModelSpec, WorkloadSpec


class StepClock:
    """A rank's per-step decode clock: ``v`` tokens decoded by every sequence that has run
    since the clock's origin, as of time ``at``; ``heap`` holds (clock value at which a
    request ends, rid, slot) — entries whose slot is no longer in ``inflight`` are stale.
    ``epoch`` moves on every change of the running set, so an armed completion timer from
    before the change finds itself stale."""

    __slots__ = ("v", "at", "heap", "epoch")

    def __init__(self) -> None:
        self.v, self.at, self.heap, self.epoch = 0.0, 0.0, [], 0


class _Slot:
    """What ``rank.inflight`` holds for a per_step request (``arg[1]`` is the request, as a
    completion Timer's is)."""

    __slots__ = ("arg", "finish")

    def __init__(self, arg: Tuple["RankSim", Request], finish: float) -> None:
        self.arg, self.finish = arg, finish


def decode_step_time(w: "WorkloadSpec", m: "ModelSpec") -> Optional[Callable[[int], float]]:
    """Seconds of one decode step of ``c`` sequences under ``per_step`` timing (None under
    ``at_start``): ``(h + c)/T`` — the batching curve's own step, ``a + β·c`` with
    ``a = h/T`` and ``β = 1/T`` — less the routed experts' weights that no sequence of the
    step routes to. With ``c`` tokens each routed to ``k`` of ``E`` experts (uniformly), an
    expert receives none with probability ``(1 − k/E)^c``; a fused-MoE kernel reads only
    the experts that received tokens, so ``decode_expert_read_s · (1 − k/E)^c`` of the
    full-coverage read is not spent (docs/cost-model.md)."""
    if w.decode_timing != "per_step":
        return None
    T, h, x = w.tokens_per_s_per_rank, w.batching_half_point, w.decode_expert_read_s
    if x and m.num_experts and m.experts_per_token:
        miss = 1.0 - m.experts_per_token / m.num_experts
        return lambda c: (h + c) / T - x * miss**c
    return lambda c: (h + c) / T


class PerStepDecode:
    """The router's per_step clock keeping (mixed into ``Router``, which supplies ``env``,
    ``step_time`` and ``_done``)."""

    def _clock_advance(self, rank: RankSim) -> None:
        """Bring the rank's clock to now at the concurrency it ran since the last change."""
        clock, now = rank.clock, self.env._now
        c = len(rank.inflight)
        if c:
            clock.v += (now - clock.at) / self.step_time(c)
        clock.at = now

    def _clock_reset(self, rank: RankSim) -> None:
        """The running set was dropped at once (abort, pause, crash): no entry is live."""
        if rank.clock is not None:
            rank.clock.heap = []
            rank.clock.epoch += 1

    def _clock_arm(self, rank: RankSim) -> None:
        """One timer for the rank's next completion at the current concurrency."""
        clock = rank.clock
        clock.epoch += 1
        heap, inflight = clock.heap, rank.inflight
        while heap and inflight.get(heap[0][1]) is not heap[0][2]:
            heappop(heap)  # aborted or re-dispatched since: stale
        if heap and heap[0][0] != math.inf:
            delay = (heap[0][0] - clock.v) * self.step_time(len(inflight))
            Timer(self.env, max(0.0, delay), rank.actor, self._clock_fire, (rank, clock.epoch, heap[0][0]))

    def _start_per_step(self, rank: RankSim, req: Request) -> None:
        if rank.clock is None:
            rank.clock = StepClock()
            rank.clock.at = self.env._now
        self._clock_advance(rank)
        tokens = req.tokens if req.remaining is None else req.remaining
        slot = _Slot((rank, req), math.inf if req.stuck else rank.clock.v + tokens)
        req.started_at = req.ends_at = self.env._now
        rank.inflight[req.rid] = slot
        heappush(rank.clock.heap, (slot.finish, req.rid, slot))
        self._clock_arm(rank)

    def _clock_fire(self, arg: Tuple[RankSim, int, float]) -> None:
        """The clock reached the earliest end: every request ending there is done (in
        request order), then the next completion is armed."""
        rank, epoch, target = arg
        clock = rank.clock
        if epoch != clock.epoch:
            return  # the running set changed since: a newer timer is armed
        clock.v, clock.at = target, self.env._now
        while clock.heap and clock.heap[0][0] <= target:
            _, rid, slot = heappop(clock.heap)
            if rank.inflight.get(rid) is slot:
                del rank.inflight[rid]
                self._done(rank, slot.arg[1])
        self._clock_arm(rank)
