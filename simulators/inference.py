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
from simulators.env import SimEnv


@dataclass
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
    """Round-robin over routable ranks; blocks (queues) while none is routable."""

    def __init__(self, env: SimEnv, pipeline_id: str, pipe_index: int, max_concurrent: int,
                 tokens_per_s: float, half_point: float, log: Callable[..., None],
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
            self.log("request_abort", pipeline_id=self.pipeline_id, request=req.rid, dp_rank=rank.dp_rank)
        self.aborted += len(aborted)
        self._kick(rank)
        self.dispatch()
        return aborted

    def submit(self, reqs: List[Request]) -> None:
        self.queue.extend(reqs)
        self.dispatch()

    # -------------------------------------------------------------- dispatch
    def dispatch(self) -> None:
        if not self.order:
            return
        n = len(self.order)
        while self.queue:
            for probe in range(n):
                rank = self.ranks[self.order[(self._rr + probe) % n]]
                if len(rank.inflight) < self.max_concurrent:
                    self._rr = (self._rr + probe + 1) % n
                    self._start(rank, self.queue.popleft())
                    break
            else:
                return  # every routable rank is full

    def _start(self, rank: RankSim, req: Request) -> None:
        c = len(rank.inflight)
        duration = req.tokens * (c + 1 + self.half_point) / self.tokens_per_s
        req.version = rank.life.weights_version
        due = self.env.now + duration
        rank.inflight[req.rid] = (req, due)
        heappush(rank.dues, (due, req.rid))
        self.log("request_dispatch", pipeline_id=self.pipeline_id, request=req.rid, dp_rank=rank.dp_rank,
                 version=req.version, attempt=req.attempt)
        self._kick(rank)

    def _kick(self, rank: RankSim) -> None:
        if rank.kick is not None and not rank.kick.triggered:
            rank.kick.succeed()

    def _serve(self, rank: RankSim):
        env, life = self.env, rank.life
        while life.state is RankState.ROUTABLE:  # rank.routable
            if rank.kick.triggered:
                rank.kick = env.event()
            if rank.inflight:
                now = env.now
                due = _next_due(rank)
                if due > now:
                    yield env.any_of([env.timeout(due - now), rank.kick])
                    continue
                for req in _pop_due(rank, now):
                    del rank.inflight[req.rid]
                    self.completed += 1
                    self.log("request_done", pipeline_id=self.pipeline_id, request=req.rid, dp_rank=rank.dp_rank,
                             tokens=req.tokens, version=req.version)
                    self.on_done(req, rank)
                self.dispatch()
            else:
                yield rank.kick


def _live(rank: RankSim, due: float, rid: int) -> bool:
    entry = rank.inflight.get(rid)
    return entry is not None and entry[1] == due


def _next_due(rank: RankSim) -> float:
    """The earliest due time in flight (== min over ``rank.inflight``; it must be non-empty)."""
    dues = rank.dues
    while not _live(rank, *dues[0]):
        heappop(dues)
    return dues[0][0]


def _pop_due(rank: RankSim, now: float) -> List[Request]:
    """The requests in flight due by ``now``, by request id; their heap entries are popped
    (the caller removes them from ``inflight``)."""
    dues, done = rank.dues, {}
    while dues and dues[0][0] <= now:
        due, rid = heappop(dues)
        if _live(rank, due, rid):
            done[rid] = rank.inflight[rid][0]
    return [done[rid] for rid in sorted(done)]
