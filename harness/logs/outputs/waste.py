"""The waste a scheduler causes, named in every summary.

Read from the log alone (any runtime's):

* **wasted expands**: an expand whose ranks serve no request -- no ``request_dispatch`` to
  any of them -- between the expand's end and the next shrink that takes one of them back
  (or the run's end). Each such expand paid a wake and a weight sync for nothing.
* **resize time**: the time each pipeline's resizes took (``resize_start`` to
  ``resize_end``), shrinks and expands apart; one pipeline's resizes do not overlap.
* **GPU-time idle while a request waits**: GPU-seconds with GPUs unallocated (the idle
  count each cycle's ``commit`` leaves, plus GPUs ``released`` since) while at least one
  GPU request is queued (``enqueued`` and not yet ``signalled``), split by cause. Each
  stretch of time goes to the first cause that holds (docs/outputs.md):

  - ``lock_held``: a scheduler cycle is open (its ``plan`` logged, its ``commit`` not
    yet): the idle count is the one before the cycle's resizes, and nothing queued can be
    granted until it commits (cycles are serial);
  - ``ungrantable``: a non-GENERATION request is queued: RLix grants such a request its
    whole device mapping at once, so it waits while part of it is held by a cluster it may
    not preempt, and the GPUs freed for it meanwhile idle;
  - ``planner_cap``: only GENERATION requests are queued and one of them has demand (the
    ``step_target_estimate`` > 0 of its ``request``, or a ``progress`` report of its
    pipeline not cleared since), yet the last commit left GPUs idle: the gap-ratio
    planner stopped short (the pipeline at its target share, no whole idle bundle in its
    mapping, or the loop's bounds);
  - ``no_demand``: only GENERATION requests with no demand the planner reads are queued:
    RLix skips such a pipeline (debug #27), so the idle GPUs stay idle.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Sequence, Set, Tuple, Union

from harness.ordered_sum import ordered_sum

#: the causes of GPU-time idle while a request waits, in the order they are tried
IDLE_CAUSES = ("lock_held", "ungrantable", "planner_cap", "no_demand")
_GEN = "GENERATION"


@dataclass
class PipelineWaste:
    pipeline_id: str
    expands: int = 0
    wasted_expands: int = 0
    expand_s: float = 0.0
    shrink_s: float = 0.0


@dataclass
class WasteSummary:
    pipelines: List[PipelineWaste] = field(default_factory=list)
    idle_gpu_s_while_waiting: float = 0.0
    waiting_s: float = 0.0  # time with at least one GPU request queued
    # idle_gpu_s_while_waiting split by cause (IDLE_CAUSES; they sum to it, up to rounding:
    # the split is summed over finer stretches)
    idle_by_cause: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(IDLE_CAUSES, 0.0))

    @property
    def expands(self) -> int:
        return sum(p.expands for p in self.pipelines)

    @property
    def wasted_expands(self) -> int:
        return sum(p.wasted_expands for p in self.pipelines)


class _Waiting:
    """What is queued, and what the cause split reads about it (request, progress and
    cycle records)."""

    __slots__ = ("requests", "non_gen", "estimate", "progress", "open_cycles")

    def __init__(self) -> None:
        self.requests: Dict[Any, Tuple[str, bool, bool]] = {}  # request id -> (cluster, has an estimate, GEN)
        self.non_gen = 0  # queued non-GENERATION requests
        self.estimate: Dict[str, bool] = {}  # cluster -> its last request carried an estimate > 0
        self.progress: Set[str] = set()  # pipelines with a progress report not cleared since
        self.open_cycles: Set[Any] = set()

    def cause(self) -> int:
        if self.open_cycles:
            return 0
        if self.non_gen:
            return 1
        progress = self.progress
        for cluster, has_estimate, _gen in self.requests.values():
            if has_estimate or (progress and cluster[: -len(_GEN_SUFFIX)] in progress):
                return 2
        return 3

    def see(self, kind: str, r: Mapping[str, Any]) -> None:
        if kind == "enqueued":
            cid = r.get("cluster_id", "")
            gen = r.get("priority") == _GEN
            self.requests[r.get("request_id")] = (cid, self.estimate.get(cid, False) if gen else False, gen)
            if not gen:
                self.non_gen += 1
        elif kind == "signalled":
            got = self.requests.pop(r.get("request_id"), None)
            if got is not None and not got[2]:
                self.non_gen -= 1
        elif kind == "request":
            self.estimate[r.get("cluster_id", "")] = (r.get("step_target_estimate") or 0) > 0
        elif kind == "release_then_request":
            self.estimate[r.get("request_cluster_id", "")] = (r.get("request_step_target_estimate") or 0) > 0
        elif kind == "progress":
            self.progress.add(r.get("pipeline_id"))
        elif kind == "clear_progress":
            self.progress.discard(r.get("pipeline_id"))
        elif kind == "plan":
            self.open_cycles.add(r.get("cycle"))
        elif kind == "commit":
            self.open_cycles.discard(r.get("cycle"))


_GEN_SUFFIX = "_actor_infer"


def scheduler_waste(records: Sequence[Mapping[str, Any]], t_end: Union[float, Callable[[], float]]) -> WasteSummary:
    """``records``: the run's :data:`WASTE_KINDS` records, in log order; ``t_end`` the
    run's end (a callable is asked after the pass: harness/logs/outputs/derived.py)."""
    per: Dict[str, PipelineWaste] = {}
    open_resize: Dict[Tuple[str, str, int], float] = {}
    live: Dict[str, List[Tuple[Set[int], List[bool]]]] = defaultdict(list)  # pid -> (ranks, [served])
    queue = _Waiting()
    waiting = queue.requests
    idle, last_t, last_cause_t = 0, None, None
    idle_gpu_s: List[float] = []
    waiting_s: List[float] = []
    by_cause: List[List[float]] = [[] for _ in IDLE_CAUSES]
    for r in records:
        kind, t = r["kind"], float(r.get("t", 0.0))
        if waiting and idle and last_cause_t is not None and t > last_cause_t:
            by_cause[queue.cause()].append(idle * (t - last_cause_t))
        last_cause_t = t
        if kind in _CAUSE_ONLY:
            queue.see(kind, r)  # the total's stretches stay those of the kinds it always read
            continue
        if last_t is not None and waiting and t > last_t:
            waiting_s.append(t - last_t)
            idle_gpu_s.append(idle * (t - last_t))
        last_t = t
        if kind in ("resize_start", "resize_end"):
            pid, phase = r["pipeline_id"], r["phase"]
            w = per.setdefault(pid, PipelineWaste(pid))
            slot = (pid, phase, r.get("cycle", -1))
            ranks = set(r.get("dp_ranks") or [])
            if kind == "resize_start":
                open_resize[slot] = t
                if phase == "shrink":
                    _close_shrunk(live[pid], ranks, w)
            else:
                start = open_resize.pop(slot, t)
                if phase == "expand":
                    w.expands += 1
                    w.expand_s += t - start
                    live[pid].append((ranks, [False]))
                else:
                    w.shrink_s += t - start
        elif kind == "request_dispatch":
            for ranks, served in live.get(r["pipeline_id"], ()):
                if r.get("dp_rank") in ranks:
                    served[0] = True
        elif kind == "released":
            idle += len(r.get("gpus") or [])
        else:
            if kind == "commit":
                idle = int(r.get("idle_gpus", idle))
            queue.see(kind, r)
    if callable(t_end):
        t_end = t_end()
    if last_t is not None and waiting and t_end > last_t:
        waiting_s.append(t_end - last_t)
        idle_gpu_s.append(idle * (t_end - last_t))
    if waiting and idle and last_cause_t is not None and t_end > last_cause_t:
        by_cause[queue.cause()].append(idle * (t_end - last_cause_t))
    for pid, expands in live.items():  # still up at the end: wasted if never served
        for _ranks, served in expands:
            if not served[0]:
                per[pid].wasted_expands += 1
    return WasteSummary(
        sorted(per.values(), key=lambda w: w.pipeline_id),
        ordered_sum(idle_gpu_s),
        ordered_sum(waiting_s),
        {c: ordered_sum(v) for c, v in zip(IDLE_CAUSES, by_cause)},
    )


def _close_shrunk(expands: List[Tuple[Set[int], List[bool]]], shrunk: Set[int], w: PipelineWaste) -> None:
    """A shrink takes ranks back: each live expand it touches is judged now."""
    for item in list(expands):
        ranks, served = item
        if ranks & shrunk:
            if not served[0]:
                w.wasted_expands += 1
            expands.remove(item)


# kinds read only for the cause split: they do not cut the total's stretches, so the total
# is summed from exactly the pieces it was summed from before the split existed
_CAUSE_ONLY = frozenset(("plan", "request", "release_then_request", "progress", "clear_progress"))
WASTE_KINDS = (
    "resize_start",
    "resize_end",
    "request_dispatch",
    "commit",
    "released",
    "enqueued",
    "signalled",
    *sorted(_CAUSE_ONLY),
)
