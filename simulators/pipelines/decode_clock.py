"""The ``per_step`` decode timing of an inference rank (``workload.decode_timing: per_step``).

Every decode step of ``c`` running sequences takes ``t(c)`` seconds (:func:`decode_step_time`)
and advances each of them by one token, as a continuous-batching engine runs it (vLLM's
scheduler admits and retires sequences between steps). A rank keeps one :class:`StepClock`
of tokens decoded per running sequence; a request ends when the clock has advanced by its
length. :class:`PerStepDecode` is the part of :class:`simulators.pipelines.inference.Router`
that keeps the clocks and arms one completion timer per rank.

With ``workload.decode_kv_s_per_token`` (γ) a step also reads each running sequence's KV
cache at its own length (:class:`LiveKv`): the curve's t(c) charges every sequence the
mean context, so a step at clock value ``v`` costs ``t(c) + γ·(Σ ctx_i(v) − c·ctx_mean)``,
where sequence i's context grows by one token a step. Between two changes of the running
set the sum is ``k + c·v`` (``k`` the running sequences' contexts less the clock value
each started at), so the time to advance the clock by Δ is the integral
``(b + γ·c·Δ/2)·Δ`` with ``b`` the step now (:func:`time_for`), and the tokens a time
buys its root (:func:`tokens_in`).
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

    __slots__ = ("v", "at", "heap", "epoch", "k")

    def __init__(self) -> None:
        self.v, self.at, self.heap, self.epoch = 0.0, 0.0, [], 0
        self.k = 0.0  # live KV: the running sequences' contexts less the clock value each started at


class _Slot:
    """What ``rank.inflight`` holds for a per_step request (``arg[1]`` is the request, as a
    completion Timer's is)."""

    __slots__ = ("arg", "finish", "ctx0")

    def __init__(self, arg: Tuple["RankSim", Request], finish: float, ctx0: float = 0.0) -> None:
        self.arg, self.finish, self.ctx0 = arg, finish, ctx0


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


class LiveKv:
    """The live-context KV read of a per_step decode (the module doc): γ seconds per cached
    token a step, the prompt every sequence starts from, the mean context the curve charges."""

    __slots__ = ("s_per_token", "prompt", "mean_ctx")

    def __init__(self, s_per_token: float, prompt: float, mean_ctx: float) -> None:
        self.s_per_token, self.prompt, self.mean_ctx = s_per_token, prompt, mean_ctx

    def base(self, step: float, c: int) -> float:
        """The step of ``c`` sequences less the curve's KV read at the mean context."""
        return step - self.s_per_token * c * self.mean_ctx


def mean_context(w: "WorkloadSpec") -> float:
    """The context the cost model's curve charges every decode step of a sequence: the
    prompt and half the mean answer (``simulators/costmodel/derive.py``)."""
    from simulators.costmodel.formulas import mean_decode_tokens

    share = w.decode_tokens_cap_share
    return (
        w.prompt_tokens
        + mean_decode_tokens(w.decode_tokens_median, w.decode_tokens_sigma, w.decode_tokens_max, share) / 2.0
    )


def live_kv(w: "WorkloadSpec") -> Optional[LiveKv]:
    """The pipeline's live-context KV read, or None (per_step with ``decode_kv_s_per_token``)."""
    if w.decode_timing != "per_step" or not w.decode_kv_s_per_token:
        return None
    return LiveKv(w.decode_kv_s_per_token, float(w.prompt_tokens), mean_context(w))


def tokens_in(dt: float, b: float, kv: float, c: int) -> float:
    """Tokens every running sequence advances in ``dt`` seconds when the step now is ``b``
    and grows by ``kv·c`` a token: the positive root of ``(kv·c/2)·Δ² + b·Δ = dt``."""
    return 2.0 * dt / (b + math.sqrt(b * b + 2.0 * kv * c * dt))


def time_for(delta: float, b: float, kv: float, c: int) -> float:
    """Seconds to advance every running sequence by ``delta`` tokens from a step of ``b``
    growing by ``kv·c`` a token."""
    return delta * (b + kv * c * delta / 2.0)


class PerStepDecode:
    """The router's per_step clock keeping (mixed into ``Router``, which supplies ``env``,
    ``step_time``, ``live_kv`` and ``_done``)."""

    def _live_b(self, rank: RankSim, c: int) -> float:
        """The step of the ``c`` running sequences at the clock's current value (live KV)."""
        kv, clock = self.live_kv, rank.clock
        return kv.base(self.step_time(c), c) + kv.s_per_token * (clock.k + c * clock.v)

    def _clock_advance(self, rank: RankSim) -> None:
        """Bring the rank's clock to now at the concurrency it ran since the last change."""
        clock, now = rank.clock, self.env._now
        c = len(rank.inflight)
        if c:
            if self.live_kv is None:
                clock.v += (now - clock.at) / self.step_time(c)
            else:
                clock.v += tokens_in(now - clock.at, self._live_b(rank, c), self.live_kv.s_per_token, c)
        clock.at = now

    def _clock_reset(self, rank: RankSim) -> None:
        """The running set was dropped at once (abort, pause, crash): no entry is live."""
        if rank.clock is not None:
            rank.clock.heap = []
            rank.clock.epoch += 1
            rank.clock.k = 0.0

    def _clock_arm(self, rank: RankSim) -> None:
        """One timer for the rank's next completion at the current concurrency."""
        clock = rank.clock
        clock.epoch += 1
        heap, inflight = clock.heap, rank.inflight
        while heap and inflight.get(heap[0][1]) is not heap[0][2]:
            heappop(heap)  # aborted or re-dispatched since: stale
        if heap and heap[0][0] != math.inf:
            if self.live_kv is None:
                delay = (heap[0][0] - clock.v) * self.step_time(len(inflight))
            else:
                c = len(inflight)
                delay = time_for(heap[0][0] - clock.v, self._live_b(rank, c), self.live_kv.s_per_token, c)
            Timer(self.env, max(0.0, delay), rank.actor, self._clock_fire, (rank, clock.epoch, heap[0][0]))

    def _start_per_step(self, rank: RankSim, req: Request) -> None:
        if rank.clock is None:
            rank.clock = StepClock()
            rank.clock.at = self.env._now
        self._clock_advance(rank)
        tokens = req.tokens if req.remaining is None else req.remaining
        # live KV: its context now (the prompt and what it decoded before a pause) less the clock
        ctx0 = 0.0 if self.live_kv is None else self.live_kv.prompt + (req.tokens - tokens) - rank.clock.v
        rank.clock.k += ctx0
        slot = _Slot((rank, req), math.inf if req.stuck else rank.clock.v + tokens, ctx0)
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
                clock.k -= slot.ctx0
                self._done(rank, slot.arg[1])
        self._clock_arm(rank)
