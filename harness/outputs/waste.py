"""The waste a scheduler causes, named in every summary.

Read from the log alone (any runtime's):

* **wasted expands**: an expand whose ranks serve no request -- no ``request_dispatch`` to
  any of them -- between the expand's end and the next shrink that takes one of them back
  (or the run's end). Each such expand paid a wake and a weight sync for nothing.
* **resize time**: the time each pipeline's resizes took (``resize_start`` to
  ``resize_end``), shrinks and expands apart; one pipeline's resizes do not overlap.
* **GPU-time idle while a request waits**: GPU-seconds with GPUs unallocated (the idle
  count each cycle's ``commit`` leaves, plus GPUs ``released`` since) while at least one
  GPU request is queued (``enqueued`` and not yet ``signalled``). The cause (no demand,
  lock held, planner cap, an ungrantable request) is not split out yet.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Sequence, Set, Tuple

from harness.ordered_sum import ordered_sum


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

    @property
    def expands(self) -> int:
        return sum(p.expands for p in self.pipelines)

    @property
    def wasted_expands(self) -> int:
        return sum(p.wasted_expands for p in self.pipelines)


def scheduler_waste(records: Sequence[Mapping[str, Any]], t_end: float) -> WasteSummary:
    """``records``: the run's ``resize_start``/``resize_end``, ``request_dispatch``,
    ``commit``, ``released``, ``enqueued`` and ``signalled`` records, in log order."""
    per: Dict[str, PipelineWaste] = {}
    open_resize: Dict[Tuple[str, str, int], float] = {}
    live: Dict[str, List[Tuple[Set[int], List[bool]]]] = defaultdict(list)  # pid -> (ranks, [served])
    waiting: Set[Any] = set()
    idle, last_t = 0, None
    idle_gpu_s: List[float] = []
    waiting_s: List[float] = []
    for r in records:
        kind, t = r["kind"], float(r.get("t", 0.0))
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
        elif kind == "commit":
            idle = int(r.get("idle_gpus", idle))
        elif kind == "released":
            idle += len(r.get("gpus") or [])
        elif kind == "enqueued":
            waiting.add(r.get("request_id"))
        elif kind == "signalled":
            waiting.discard(r.get("request_id"))
    if last_t is not None and waiting and t_end > last_t:
        waiting_s.append(t_end - last_t)
        idle_gpu_s.append(idle * (t_end - last_t))
    for pid, expands in live.items():  # still up at the end: wasted if never served
        for _ranks, served in expands:
            if not served[0]:
                per[pid].wasted_expands += 1
    return WasteSummary(sorted(per.values(), key=lambda w: w.pipeline_id), ordered_sum(idle_gpu_s), ordered_sum(waiting_s))


def _close_shrunk(expands: List[Tuple[Set[int], List[bool]]], shrunk: Set[int], w: PipelineWaste) -> None:
    """A shrink takes ranks back: each live expand it touches is judged now."""
    for item in list(expands):
        ranks, served = item
        if ranks & shrunk:
            if not served[0]:
                w.wasted_expands += 1
            expands.remove(item)


WASTE_KINDS = ("resize_start", "resize_end", "request_dispatch", "commit", "released", "enqueued", "signalled")
