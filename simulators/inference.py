"""Inference DP ranks and the per-pipeline router.

A rank's lifecycle is ``harness.control.rank_state.RankLifecycle`` (the same table the
gates obey); this module adds what only a simulation needs: requests in flight, a
batching model, and round-robin routing over routable ranks. Routing never fails: while
no rank is routable, requests wait in the router's queue (RLix polls every 50 ms; here
the router is woken by activation). A shrink aborts a rank's in-flight requests and
puts them back at the head of the queue — turn-level re-dispatch, nothing lost.

Batching model: a rank decoding ``c`` sequences at once delivers an aggregate
``T·c/(c + h)`` tokens/s (T = ``tokens_per_s_per_rank``, h = ``batching_half_point``), so
a request dispatched when ``c`` sequences are running takes ``tokens·(c + h)/T`` seconds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Callable, Deque, Dict, List, Optional, Tuple

from harness.control.rank_state import RankLifecycle, RankState
from simulators.env import FirstOf, SimEnv


@dataclass(slots=True)
class Request:
    rid: int
    tokens: int
    attempt: int = 0
    version: Optional[int] = None  # weights version of the rank it was (last) dispatched to


@dataclass
class RankSim:
    pipeline_id: str
    dp_rank: int
    gpus: Tuple[int, ...]
    life: RankLifecycle
    inflight: Dict[int, Tuple[Request, float]] = field(default_factory=dict)
    # min-heap of (due time, request id) over ``inflight``, so the serve loop finds the
    # next completion without scanning; entries no longer in ``inflight`` are skipped
    dues: List[Tuple[float, int]] = field(default_factory=list)
    kick: Optional[object] = None  # simpy Event the serve loop waits on
    serving_proc: Optional[object] = None

    @property
    def routable(self) -> bool:
        return self.life.state is RankState.ROUTABLE


class Router:
    """Round-robin over routable ranks; blocks (queues) while none is routable.

    ``log(record)`` appends a whole record to the event log (``EventLog.add``)."""

    def __init__(self, env: SimEnv, pipeline_id: str, pipe_index: int, max_concurrent: int,
                 tokens_per_s: float, half_point: float, log: Callable[[dict], object],
                 on_done: Callable[[Request, RankSim], None]) -> None:
        self.env = env
        self.pipeline_id = pipeline_id
        self.pipe_index = pipe_index
        self.max_concurrent = max_concurrent
        self.tokens_per_s = tokens_per_s
        self.half_point = half_point
        self.log = log
        self.on_done = on_done
        self.queue: Deque[Request] = deque()
        self.ranks: Dict[int, RankSim] = {}
        self.order: List[int] = []  # routable ranks in activation order (round robin)
        self._rr = 0
        self.completed = 0
        self.aborted = 0

    # -------------------------------------------------------------- routing set
    def activate(self, rank: RankSim) -> None:
        if rank.dp_rank not in self.order:
            self.order.append(rank.dp_rank)
            self.order.sort()
        rank.kick = self.env.event()
        rank.serving_proc = self.env.spawn(self._serve(rank), "rank", self.pipe_index, rank.dp_rank)
        self.dispatch()

    def deactivate(self, rank: RankSim) -> List[Request]:
        """Take the rank off routing; abort its in-flight requests back to the queue head."""
        if rank.dp_rank in self.order:
            self.order.remove(rank.dp_rank)
        aborted = [req for req, _ in sorted(rank.inflight.values(), key=lambda x: x[0].rid)]
        rank.inflight.clear()
        rank.dues.clear()
        for req in reversed(aborted):
            req.attempt += 1
            self.queue.appendleft(req)
            self.log({"seq": 0, "t": self.env.now, "kind": "request_abort", "pipeline_id": self.pipeline_id,
                      "request": req.rid, "dp_rank": rank.dp_rank})
        self.aborted += len(aborted)
        self._kick(rank)
        self.dispatch()
        return aborted

    def submit(self, reqs: List[Request]) -> None:
        self.queue.extend(reqs)
        self.dispatch()

    # -------------------------------------------------------------- dispatch
    def dispatch(self) -> None:
        order, queue = self.order, self.queue
        if not order or not queue:
            return
        n, ranks, cap = len(order), self.ranks, self.max_concurrent
        while queue:
            rr = self._rr
            for probe in range(n):
                rank = ranks[order[(rr + probe) % n]]
                if len(rank.inflight) < cap:
                    self._rr = (rr + probe + 1) % n
                    self._start(rank, queue.popleft())
                    break
            else:
                return  # every routable rank is full

    def _start(self, rank: RankSim, req: Request) -> None:
        c = len(rank.inflight)
        duration = req.tokens * (c + 1 + self.half_point) / self.tokens_per_s
        req.version = version = rank.life.weights_version
        now = self.env.now
        due = now + duration
        rid = req.rid
        rank.inflight[rid] = (req, due)
        heappush(rank.dues, (due, rid))
        self.log({"seq": 0, "t": now, "kind": "request_dispatch", "pipeline_id": self.pipeline_id, "request": rid,
                  "dp_rank": rank.dp_rank, "version": version, "attempt": req.attempt})
        kick = rank.kick  # _kick, inlined
        if kick is not None and not kick.triggered:
            kick.succeed()

    def _kick(self, rank: RankSim) -> None:
        if rank.kick is not None and not rank.kick.triggered:
            rank.kick.succeed()

    def _serve(self, rank: RankSim):
        env, life, inflight = self.env, rank.life, rank.inflight
        log, on_done, pid, dp = self.log, self.on_done, self.pipeline_id, rank.dp_rank
        ROUTABLE = RankState.ROUTABLE
        while life.state is ROUTABLE:  # rank.routable
            if rank.kick.triggered:
                rank.kick = env.event()
            if inflight:  # the same dict for the rank's life: deactivate() clears it in place
                now = env.now
                due = _next_due(rank)
                if due > now:
                    # == env.any_of([timeout, kick]): same events, same order (see FirstOf)
                    yield FirstOf(env, env.timeout(due - now), rank.kick)
                    continue
                for req in _pop_due(rank, now):
                    del inflight[req.rid]
                    self.completed += 1
                    log({"seq": 0, "t": now, "kind": "request_done", "pipeline_id": pid, "request": req.rid,
                         "dp_rank": dp, "tokens": req.tokens, "version": req.version})
                    on_done(req, rank)
                self.dispatch()
            else:
                yield rank.kick


def _next_due(rank: RankSim) -> float:
    """The earliest due time in flight (== min over ``rank.inflight``; it must be non-empty)."""
    dues, inflight = rank.dues, rank.inflight
    while True:
        due, rid = dues[0]
        entry = inflight.get(rid)  # a heap entry is live while inflight holds it with that due
        if entry is not None and entry[1] == due:
            return due
        heappop(dues)


def _pop_due(rank: RankSim, now: float) -> List[Request]:
    """The requests in flight due by ``now``, by request id; their heap entries are popped
    (the caller removes them from ``inflight``)."""
    dues, inflight, done = rank.dues, rank.inflight, {}
    while dues and dues[0][0] <= now:
        due, rid = heappop(dues)
        entry = inflight.get(rid)  # live entries only (as in _next_due)
        if entry is not None and entry[1] == due:
            done[rid] = entry[0]
    if len(done) == 1:
        return list(done.values())
    return [done[rid] for rid in sorted(done)]
