"""Inference DP ranks and the per-pipeline router.

A rank's lifecycle is ``harness.control.rank_state.RankLifecycle`` (the same table the
gates obey); this module adds what only a simulation needs: requests in flight, a
batching model, and round-robin routing over routable ranks. Routing never fails: while
no rank is routable, requests wait in the router's queue (RLix polls every 50 ms; here
the router is woken by activation). A shrink aborts a rank's in-flight requests and
puts them back at the head of the queue — turn-level re-dispatch — up to
``max_attempts`` dispatches per request (NeMo's ``_async_generate_base``: min(3, dp_size);
``None``: no limit, ROLL's request migration). A request aborted on its last attempt
raises ``ShardPreemptedError`` into its rollout worker, which drops the prompt group
(``request_failed``) and reopens its slot (``on_give_up``).

Batching model: a rank decoding ``c`` sequences at once delivers an aggregate
``T·c/(c + h)`` tokens/s (T = ``tokens_per_s_per_rank``, h = ``batching_half_point``), so
a request dispatched when ``c`` sequences are running takes ``tokens·(c + h)/T`` seconds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Optional, Tuple

from harness.control.rank_state import RankLifecycle, RankState
from simulators.env import Actor, SimEnv, Timer


@dataclass(slots=True)
class Request:
    rid: int
    tokens: int
    attempt: int = 0
    version: Optional[int] = None  # weights version of the rank it was (last) dispatched to
    stuck: bool = False  # fault stuck_request: a straggler that never finishes, wherever it runs


@dataclass
class RankSim:
    pipeline_id: str
    dp_rank: int
    gpus: Tuple[int, ...]
    life: RankLifecycle
    # request id -> the Timer that completes it; a timer no longer here (aborted, or
    # superseded by a re-dispatch) finds itself stale when it fires and does nothing
    inflight: Dict[int, Timer] = field(default_factory=dict)
    actor: Optional[Actor] = None  # the order key its completions run under (set by the router)

    @property
    def routable(self) -> bool:
        return self.life.state is RankState.ROUTABLE


class Router:
    """Round-robin over routable ranks; blocks (queues) while none is routable.

    ``log(record)`` appends a whole record to the event log (``EventLog.add``)."""

    def __init__(self, env: SimEnv, pipeline_id: str, pipe_index: int, max_concurrent: int,
                 tokens_per_s: float, half_point: float, log: Callable[[dict], object],
                 on_done: Callable[[Request, RankSim], None], max_attempts: Optional[int] = None,
                 on_give_up: Optional[Callable[[Request], None]] = None) -> None:
        self.env = env
        self.pipeline_id = pipeline_id
        self.pipe_index = pipe_index
        self.max_concurrent = max_concurrent
        self.tokens_per_s = tokens_per_s
        self.half_point = half_point
        self.log = log
        self.on_done = on_done
        self.max_attempts = max_attempts
        self.on_give_up = on_give_up
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
        if rank.actor is None:
            rank.actor = Actor("rank", self.pipe_index, rank.dp_rank)
        self.dispatch()

    def deactivate(self, rank: RankSim) -> List[Request]:
        """Take the rank off routing; abort its in-flight requests back to the queue head."""
        if rank.dp_rank in self.order:
            self.order.remove(rank.dp_rank)
        aborted = [rank.inflight[rid].arg[1] for rid in sorted(rank.inflight)]
        rank.inflight.clear()  # their timers are now stale
        given_up = []
        for req in reversed(aborted):
            req.attempt += 1
            self.log({"seq": 0, "t": self.env._now, "kind": "request_abort", "pipeline_id": self.pipeline_id,
                      "request": req.rid, "dp_rank": rank.dp_rank})
            if self.max_attempts is not None and req.attempt >= self.max_attempts:
                given_up.append(req)
                continue
            self.queue.appendleft(req)
        self.aborted += len(aborted)
        for req in reversed(given_up):  # in dispatch order
            self.log({"seq": 0, "t": self.env._now, "kind": "request_failed", "pipeline_id": self.pipeline_id,
                      "request": req.rid, "attempts": req.attempt, "error": "ShardPreemptedError"})
            if self.on_give_up is not None:
                self.on_give_up(req)
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
        if req.stuck:
            duration = float("inf")
        req.version = version = rank.life.weights_version
        rid = req.rid
        rank.inflight[rid] = Timer(self.env, duration, rank.actor, self._complete, (rank, req))
        self.log({"seq": 0, "t": self.env._now, "kind": "request_dispatch", "pipeline_id": self.pipeline_id,
                  "request": rid, "dp_rank": rank.dp_rank, "version": version, "attempt": req.attempt})

    def _complete(self, arg: Tuple[RankSim, Request]) -> None:
        """A completion timer fired: the request is done unless it was aborted meanwhile
        (then its rid is gone from ``inflight`` or holds a newer timer)."""
        rank, req = arg
        inflight = rank.inflight
        timer = inflight.get(req.rid)
        if timer is None or timer.arg is not arg:
            return
        del inflight[req.rid]
        self.completed += 1
        self.log({"seq": 0, "t": self.env._now, "kind": "request_done", "pipeline_id": self.pipeline_id,
                  "request": req.rid, "dp_rank": rank.dp_rank, "tokens": req.tokens, "version": req.version})
        self.on_done(req, rank)
        self.dispatch()
