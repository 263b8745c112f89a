"""Inference DP ranks and the per-pipeline router.

A rank's lifecycle is ``harness.control.rank_state.RankLifecycle`` (the same table the
gates obey); this module adds what only a simulation needs: requests in flight, a
batching model, and the routing of requests to ranks as the reference does it.

Routing (docs/modelled-systems.md#rlix-partial-overlap-shrink-expand-and-routing F3; NeMo RL fork ``VllmGeneration``, ``nemo`` @0775e9c:
``_async_generate_base``, ``_select_next_active_dp_rank``, ``_wait_for_active_dp_ranks``,
``activate_dp_ranks``):

* every request (one trajectory) is its own caller and is routed the moment it is
  submitted: round robin per request over the active ranks, with one cursor that walks the
  positional DP indices ``0..dp_size-1`` and skips inactive ones (``self.cursor``; from
  {1, 3} active and the cursor at 0 it picks 1, 3, 1, ...). The router holds no queue
  and applies no admission limit: the request goes to the picked rank at once;
* a rank's engine runs at most ``max_num_seqs`` sequences at a time (vLLM's
  ``max_num_seqs``; NeMo RL leaves it unset, so vLLM's default applies — the scenarios'
  ``workload.max_concurrent_per_rank``, 64 by default); requests beyond it wait in that
  rank's own FCFS queue (vLLM's scheduler ``waiting`` queue) and start as running ones
  finish. A queued request is not moved to another rank that has room;
* while no rank is active a caller polls every 50 ms (``_wait_for_active_dp_ranks``): it
  is routed at its first poll tick after some rank becomes active, ticks counted from
  when it started waiting;
* an expand's ranks join routing together (``activate_dp_ranks(ranks)`` adds the whole
  set under one lock): :meth:`Router.activate` takes the set;
* a shrink aborts the rank's running and queued requests; each caller re-dispatches at
  once through the same round robin (turn-level retry), or polls while no rank is active
  — up to ``max_attempts`` dispatches per request (NeMo: min(3, dp_size); ``None``: no
  limit, ROLL's request migration). A request aborted on its last attempt raises
  ``ShardPreemptedError`` into its rollout worker, which drops the prompt group
  (``request_failed``) and reopens its slot (``on_give_up``).

ROLL's own request router (``EnvAffinityRouter``: sticky per environment, least-loaded
rank for an environment's first request) is not modelled: every pipeline type routes as
RLix's NeMo port does.

Batching model: a rank decoding ``c`` sequences at once delivers an aggregate
``T·c/(c + h)`` tokens/s (T = ``tokens_per_s_per_rank``, h = ``batching_half_point``), so
a request that starts running when ``c`` sequences are running takes ``tokens·(c + h)/T``
seconds (``workload.decode_timing: at_start``, the default). With ``per_step`` (what the cost
model derives) every decode step is charged at the concurrency of that step instead, as a
continuous-batching engine runs it (vLLM's scheduler admits and retires sequences between
steps): each step of ``c`` sequences takes ``t(c) = (h + c)/T`` seconds (less the expert
weights no sequence of the step routes to, for a mixture of experts) and advances every
running sequence by one token. A rank keeps one clock of tokens decoded per running
sequence; a request ends when the clock has advanced by its length, so as a batch drains
its last, longest sequences decode alone at the low-batch step time — the length tail that
ends a synchronous generation phase.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Deque, Dict, Iterable, List, Optional, Tuple

from harness.control.engine import EngineTags
from harness.control.rank_state import RankLifecycle, RankState
from simulators.pipelines.decode_clock import PerStepDecode
from simulators.runtime.env import Actor, SimEnv, Timer

if TYPE_CHECKING:
    from simulators.pipelines.decode_clock import LiveKv, StepClock

POLL_S = 0.05  # _wait_for_active_dp_ranks: asyncio.sleep(0.05) between looks at the active set


@dataclass(slots=True)
class Request:
    rid: int
    tokens: int
    attempt: int = 0
    version: Optional[int] = None  # weights version of the rank it was (last) dispatched to
    waiting_since: float = 0.0  # when its caller started polling for an active rank
    stuck: bool = False  # fault stuck_request: a straggler that never finishes, wherever it runs
    remaining: Optional[int] = None  # tokens still to decode after a keep pause froze it (None: all)
    started_at: float = 0.0  # when its current run started, and when it will end (keep pause)
    ends_at: float = 0.0


@dataclass
class RankSim:
    pipeline_id: str
    dp_rank: int
    gpus: Tuple[int, ...]
    life: RankLifecycle
    # request id -> the Timer that completes it; a timer no longer here (aborted, or
    # superseded by a re-dispatch) finds itself stale when it fires and does nothing
    inflight: Dict[int, Timer] = field(default_factory=dict)
    # routed here while the engine ran max_num_seqs sequences: vLLM's waiting queue (FCFS)
    queued: Deque[Request] = field(default_factory=deque)
    actor: Optional[Actor] = None  # the order key its completions run under (set by the router)
    engine: EngineTags = field(default_factory=lambda: EngineTags("engine"))  # tags, pause (engine.py)
    kept: List[Request] = field(default_factory=list)  # frozen by a keep pause until the resume
    clock: Optional["StepClock"] = None  # per_step decode timing only (set by the router)

    @property
    def routable(self) -> bool:
        return self.life.state is RankState.ROUTABLE


class Router(PerStepDecode):
    """RLix round robin over the active ranks; callers poll while none is active.

    ``log(record)`` appends a whole record to the event log (``EventLog.add``)."""

    def __init__(
        self,
        env: SimEnv,
        pipeline_id: str,
        pipe_index: int,
        max_concurrent: int,
        tokens_per_s: float,
        half_point: float,
        log: Callable[[dict], object],
        on_done: Callable[[Request, RankSim], None],
        max_attempts: Optional[int] = None,
        on_give_up: Optional[Callable[[Request], None]] = None,
        step_time: Optional[Callable[[int], float]] = None,
        live_kv: Optional["LiveKv"] = None,
    ) -> None:
        self.env = env
        self.pipeline_id = pipeline_id
        self.pipe_index = pipe_index
        self.max_concurrent = max_concurrent  # the engine's max_num_seqs
        self.tokens_per_s = tokens_per_s
        self.half_point = half_point
        self.log = log
        self.on_done = on_done
        self.max_attempts = max_attempts
        self.on_give_up = on_give_up
        self.ranks: Dict[int, RankSim] = {}
        self.active: set = set()  # _active_dp_ranks
        self.cursor = 0  # current_generate_dp_shard_idx
        self.polling: Deque[Request] = deque()  # callers waiting for an active rank, FIFO
        self._callers_epoch = 0  # poll ticks armed before a crash/stop find a newer epoch and drop their callers
        self._caller = Actor("caller", pipe_index)
        self.completed = 0
        self.aborted = 0
        # fault stamp_at_completion (simulators/faults/oracle.py): armed -> stamp the version at completion
        self.stamp_at_completion: Optional[Callable[[], bool]] = None
        # per_step decode timing: seconds of one decode step of c sequences (None: at_start)
        self.step_time = step_time
        self.live_kv = live_kv  # per_step: each running sequence's KV read at its own context (or None)

    # -------------------------------------------------------------- routing set
    def activate(self, ranks: Iterable[RankSim]) -> None:
        """``activate_dp_ranks``: the whole set joins routing at once, then waiting callers
        are routed at their next poll tick."""
        for rank in ranks:
            self.active.add(rank.dp_rank)
            if rank.actor is None:
                rank.actor = Actor("rank", self.pipe_index, rank.dp_rank)
        self._arm_polls()

    def deactivate(self, ranks: Iterable[RankSim]) -> List[Request]:
        """Take the ranks off routing together; abort their running and queued requests,
        whose callers then re-dispatch to the ranks still active (or poll while none is)."""
        ranks = list(ranks)
        for rank in ranks:
            self.active.discard(rank.dp_rank)
        aborted = self._abort(ranks)
        limit = self.max_attempts
        given_up = [req for req in aborted if limit is not None and req.attempt >= limit]
        self.submit([req for req in aborted if limit is None or req.attempt < limit])
        for req in given_up:  # in request order
            self.log(
                {
                    "seq": 0,
                    "t": self.env._now,
                    "kind": "request_failed",
                    "pipeline_id": self.pipeline_id,
                    "request": req.rid,
                    "attempts": req.attempt,
                    "error": "ShardPreemptedError",
                }
            )
            if self.on_give_up is not None:
                self.on_give_up(req)
        return aborted

    def stop(self) -> None:
        """The pipeline's engines exit (it unregistered): every rank leaves routing, their
        running and queued requests are aborted and dropped with the polling callers —
        nobody will collect them."""
        self.active.clear()
        self._abort([self.ranks[r] for r in sorted(self.ranks)])
        self.polling.clear()
        self._callers_epoch += 1

    def crash(self) -> None:
        """The engines die silently (fault engines_crash_after_refit): nothing is routable,
        running and queued requests vanish without an abort, and no caller is told (the
        callers still polling are dropped too, as the fault's rollout loses them)."""
        self.active.clear()
        for rank in self.ranks.values():
            rank.inflight.clear()  # their completion timers are now stale
            self._clock_reset(rank)
            rank.queued.clear()
            rank.kept.clear()
        self.polling.clear()
        self._callers_epoch += 1

    def _abort(self, ranks: List[RankSim]) -> List[Request]:
        log, now, pid = self.log, self.env._now, self.pipeline_id
        aborted: List[Request] = []
        for rank in ranks:
            reqs = [rank.inflight[rid].arg[1] for rid in rank.inflight]
            reqs.extend(rank.queued)
            reqs.extend(rank.kept)
            rank.inflight.clear()  # their timers are now stale
            self._clock_reset(rank)
            rank.queued.clear()
            rank.kept.clear()
            reqs.sort(key=lambda req: req.rid)
            for req in reqs:
                req.attempt += 1
                req.remaining = None  # what it decoded is lost: a retry starts over
                log(
                    {
                        "seq": 0,
                        "t": now,
                        "kind": "request_abort",
                        "pipeline_id": pid,
                        "request": req.rid,
                        "dp_rank": rank.dp_rank,
                    }
                )
            aborted.extend(reqs)
        self.aborted += len(aborted)
        return aborted

    # -------------------------------------------------------------- pause modes
    def pause_ranks(self, ranks: Iterable[RankSim], mode: str) -> None:
        """``pause_generation(mode)`` for ``wait`` / ``keep`` (harness/control/engine.py):
        the ranks leave routing together; ``wait`` lets what they hold run on, ``keep``
        freezes it (a ``request_pause`` record each) until :meth:`resume_kept`."""
        ranks = list(ranks)
        for rank in ranks:
            self.active.discard(rank.dp_rank)
        if mode != "keep":
            return
        now = self.env._now
        for rank in ranks:
            reqs = []
            if rank.clock is not None:
                self._clock_advance(rank)
            for timer in rank.inflight.values():
                req = timer.arg[1]
                left = req.tokens if req.remaining is None else req.remaining
                if self.step_time is not None:
                    if not req.stuck:  # the tokens its clock has not reached yet
                        left = max(1, math.ceil(timer.finish - rank.clock.v - 1e-9))
                elif not req.stuck and req.ends_at > req.started_at:
                    left = max(1, math.ceil(left * (req.ends_at - now) / (req.ends_at - req.started_at)))
                req.remaining = left
                reqs.append(req)
            reqs.extend(rank.queued)
            rank.inflight.clear()  # their timers are now stale
            self._clock_reset(rank)
            rank.queued.clear()
            reqs.sort(key=lambda req: req.rid)
            for req in reqs:
                self.log(
                    {
                        "seq": 0,
                        "t": now,
                        "kind": "request_pause",
                        "pipeline_id": self.pipeline_id,
                        "request": req.rid,
                        "dp_rank": rank.dp_rank,
                        "mode": mode,
                        "tokens_left": req.tokens if req.remaining is None else req.remaining,
                    }
                )
            rank.kept.extend(reqs)

    def resume_kept(self, rank: RankSim) -> None:
        """The rank resumed: the requests a keep pause froze go on where they stopped."""
        if not rank.kept:
            return
        if rank.actor is None:
            rank.actor = Actor("rank", self.pipe_index, rank.dp_rank)
        reqs, rank.kept = rank.kept, []
        for req in reqs:
            self.log(
                {
                    "seq": 0,
                    "t": self.env._now,
                    "kind": "request_resume",
                    "pipeline_id": self.pipeline_id,
                    "request": req.rid,
                    "dp_rank": rank.dp_rank,
                }
            )
            if len(rank.inflight) < self.max_concurrent:
                self._start(rank, req)
            else:
                rank.queued.append(req)

    # -------------------------------------------------------------- dispatch
    def submit(self, reqs: List[Request]) -> None:
        """Each request's caller picks a rank now, or starts polling."""
        for req in reqs:
            dp = self._next_active()
            if dp is None:
                req.waiting_since = self.env._now
                self.polling.append(req)
            else:
                self._route(self.ranks[dp], req)

    def _next_active(self) -> Optional[int]:
        """``_select_next_active_dp_rank``: the cursor walks every DP index once at most."""
        active = self.active
        if not active:
            return None
        n = len(self.ranks)
        cursor = self.cursor
        for _ in range(n):
            candidate = cursor
            cursor = (cursor + 1) % n
            if candidate in active:
                self.cursor = cursor
                return candidate
        self.cursor = cursor
        return None

    def _arm_polls(self) -> None:
        """Route the polling callers at their next 50 ms tick: one timer per distinct tick."""
        if not self.polling or not self.active:
            return
        now = self.env._now
        ticks: Dict[float, List[Request]] = {}
        for req in self.polling:
            waited = now - req.waiting_since
            k = math.ceil(waited / POLL_S - 1e-9)
            ticks.setdefault(req.waiting_since + k * POLL_S, []).append(req)
        self.polling.clear()
        for t in sorted(ticks):
            Timer(self.env, max(0.0, t - now), self._caller, self._poll_tick, (ticks[t], self._callers_epoch))

    def _poll_tick(self, arg: Tuple[List[Request], int]) -> None:
        reqs, epoch = arg
        if epoch != self._callers_epoch:
            return  # the engines crashed or stopped meanwhile: these callers are gone
        for req in reqs:
            dp = self._next_active()
            if dp is None:  # deactivated again before this tick: keep polling (same phase)
                self.polling.append(req)
            else:
                self._route(self.ranks[dp], req)

    def _route(self, rank: RankSim, req: Request) -> None:
        req.version = version = rank.life.weights_version
        self.log(
            {
                "seq": 0,
                "t": self.env._now,
                "kind": "request_dispatch",
                "pipeline_id": self.pipeline_id,
                "request": req.rid,
                "dp_rank": rank.dp_rank,
                "version": version,
                "attempt": req.attempt,
            }
        )
        if len(rank.inflight) < self.max_concurrent:
            self._start(rank, req)
        else:
            rank.queued.append(req)

    def _start(self, rank: RankSim, req: Request) -> None:
        """Start serving ``req`` on ``rank``: its completion timer, the one place the
        decode-time model (slower the more requests share the rank) is written."""
        if self.step_time is not None:
            self._start_per_step(rank, req)
            return
        c = len(rank.inflight)
        tokens = req.tokens if req.remaining is None else req.remaining
        duration = tokens * (c + 1 + self.half_point) / self.tokens_per_s
        if req.stuck:
            duration = float("inf")
        req.started_at = now = self.env._now
        req.ends_at = now + duration
        rank.inflight[req.rid] = Timer(self.env, duration, rank.actor, self._complete, (rank, req))

    def _complete(self, arg: Tuple[RankSim, Request]) -> None:
        """A completion timer fired: the request is done unless it was aborted meanwhile
        (then its rid is gone from ``inflight`` or holds a newer timer)."""
        rank, req = arg
        inflight = rank.inflight
        timer = inflight.get(req.rid)
        if timer is None or timer.arg is not arg:
            return
        del inflight[req.rid]
        self._done(rank, req)

    def _done(self, rank: RankSim, req: Request) -> None:
        """``req`` left ``rank.inflight`` finished: record it, start the next queued request,
        tell the pipeline."""
        self.completed += 1
        version = req.version
        if self.stamp_at_completion is not None and self.stamp_at_completion():
            version = rank.life.weights_version  # fault stamp_at_completion: the version it ended on
        self.log(
            {
                "seq": 0,
                "t": self.env._now,
                "kind": "request_done",
                "pipeline_id": self.pipeline_id,
                "request": req.rid,
                "dp_rank": rank.dp_rank,
                "tokens": req.tokens,
                "version": version,
            }
        )
        if rank.queued:
            self._start(rank, rank.queued.popleft())
        self.on_done(req, rank)
