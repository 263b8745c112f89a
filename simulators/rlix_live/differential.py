"""Differential mode: the scheduler model and RLix's own scheduler see the same inputs,
cycle by cycle; the first cycle they decide differently is a finding.

The inputs are a scheduler trace's input records (``rlharness replay``'s format: a
simulator's event log, a gate's, an imported RLix log): each goes to the model (as replay
feeds it) and to the live RLix (:mod:`.driver`); at each cycle's plan both plans are
compared, shrinks, grants and expands alike, after normalising their order; an input one
refuses and the other takes is a divergence too. A divergence names the cycle, both
decisions and the inputs since the previous cycle, and the trace up to that cycle is
written so that ``rlharness replay`` (and this mode again) reproduces it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from harness.eventlog.kinds import category
from harness.logs.records import Record
from harness.logs.replay import _Feeder
from harness.scheduler.model import SchedulerModel
from harness.scheduler.options import SchedulerOptions
from harness.scheduler.types import Priority, Rejected
from harness.scheduler.topology import ClusterTopology
from simulators.rlix_live.driver import LiveRejected, LiveScheduler
from simulators.rlix_live.loader import RlixModules

Decision = Dict[str, Any]


@dataclass
class Divergence:
    cycle: int  # 1-based count of cycles planned when it happened (0: at an input)
    at_line: int  # the trace line where it showed
    model: Decision
    rlix: Decision
    inputs: List[Dict[str, Any]]  # the inputs since the previous cycle


@dataclass
class DiffResult:
    cycles: int = 0
    inputs: int = 0
    divergence: Optional[Divergence] = None
    prefix: List[Dict[str, Any]] = field(default_factory=list)  # the records up to the divergence


def _model_plan(plan) -> Decision:
    return {
        "shrink": sorted([op.cluster_id, sorted(op.dp_ranks_to_remove)] for op in plan.shrinks),
        "grant": sorted([s.cluster_id, sorted(s.gpus), Priority(int(s.priority)).name] for s in plan.signals),
        "expand": sorted(
            [e.cluster_id, sorted([int(r), sorted(g)] for r, g in e.dp_rank_to_gpus.items())] for e in plan.expands
        ),
    }


def _rlix_plan(plan) -> Decision:
    return {
        "shrink": sorted([op.cluster_id, sorted(op.dp_ranks_to_remove)] for op in plan.sched_guided_shrink_ops),
        "grant": sorted(
            [s.cluster_id, sorted(s.gpus_to_allocate), getattr(s.priority, "name", str(s.priority))]
            for s in plan.signal_pending_allocation_ops
        ),
        "expand": sorted(
            [e.cluster_id, sorted([int(r), sorted(g)] for r, g in e.dp_rank_to_gpus_to_add.items())]
            for e in plan.sched_guided_allocation_ops
        ),
    }


def _topology(records: List[Record]) -> Tuple[int, int]:
    header = records[0].data if records and records[0].kind == "header" else {}
    c = header.get("cluster") or {}
    if not c.get("nodes") or not c.get("gpus_per_node"):
        raise ValueError("the trace's header names no cluster (nodes, gpus_per_node)")
    return int(c["nodes"]), int(c["gpus_per_node"])


class _Both:
    def __init__(self, records: List[Record], mods: RlixModules, options: SchedulerOptions, path: str) -> None:
        nodes, gpn = _topology(records)
        self.model = SchedulerModel(ClusterTopology(nodes, gpn), options)
        self.feeder = _Feeder(self.model, path)
        self.live = LiveScheduler(mods, nodes * gpn, gpn)
        self.open_model = None
        self.early = False  # the open cycle committed at its plan (no resize calls)

    def input(self, rec: Record) -> Optional[Tuple[Decision, Decision]]:
        d = dict(rec.data)
        for key in ("priority", "request_priority"):
            if key in d:
                d[key] = Priority.parse(d[key]).name
        model_ok = live_ok = "accepted"
        try:
            self.feeder.feed(rec)
        except Rejected as e:
            model_ok = f"refused: {e}"
        try:
            self.live.feed(rec.kind, d)
        except LiveRejected as e:
            live_ok = f"refused: {e}"
        if (model_ok == "accepted") != (live_ok == "accepted"):
            return {"input": model_ok}, {"input": live_ok}
        return None

    def plan(self) -> Optional[Tuple[Decision, Decision]]:
        cp = self.model.plan_cycle("wakeup")
        self.open_model = cp
        live_plan, live_fail = self.live.plan()
        mine = {"failed": self.model.failed} if cp is None else _model_plan(cp.plan)
        theirs = {"failed": live_fail} if live_plan is None else _rlix_plan(live_plan)
        if ("failed" in mine) != ("failed" in theirs) or ("failed" not in mine and mine != theirs):
            return mine, theirs
        if cp is not None and not cp.shrink_calls and not cp.expand_calls:
            # no resize call: RLix's cycle awaits nothing between its two lock holds, so no
            # input can land between plan and commit (a trace recorded under other options
            # may show a gap where that run resized); both commit now
            self.early = True
            return self.commit()
        return None

    def commit(self) -> Optional[Tuple[Decision, Decision]]:
        cp, self.open_model = self.open_model, None
        if cp is not None:
            for p in ("shrink", "expand"):
                self.model.resize_records(cp, p, "start")
                self.model.resize_records(cp, p, "end")
            self.model.commit_cycle(cp)
        live_fail = self.live.commit()
        if (self.model.failed is None) != (live_fail is None):
            return {"failed": self.model.failed}, {"failed": live_fail}
        return None


def differential(
    records: List[Record], mods: RlixModules, options: Optional[SchedulerOptions] = None, path: str = "<trace>"
) -> DiffResult:
    """Feed ``records``' inputs to both; stop at the first divergence."""
    both = _Both(records, mods, options or SchedulerOptions(), path)
    res = DiffResult()
    since: List[Dict[str, Any]] = []
    try:
        for rec in records:
            res.prefix.append(rec.data)
            if category(rec.kind) != "input":
                continue
            diff = None
            if rec.kind == "cycle":
                phase = rec.data.get("phase", "full")
                if phase in ("plan", "full"):
                    res.cycles += 1
                    diff = both.plan()
                if diff is None and phase in ("commit", "full"):
                    diff = None if both.early else both.commit()
                    both.early = False
            else:
                res.inputs += 1
                since.append(rec.data)
                diff = both.input(rec)
            if diff is not None:
                res.divergence = Divergence(
                    res.cycles if rec.kind == "cycle" else 0, rec.line, diff[0], diff[1], list(since)
                )
                return res
            if rec.kind == "cycle":
                since = []
    finally:
        both.live.close()
    res.prefix = []
    return res


def trace_lines(prefix: List[Dict[str, Any]]) -> List[str]:
    """The replayable trace up to the divergence (input records and the header only)."""
    return [json.dumps(r, sort_keys=False) for r in prefix if category(r["kind"]) in ("header", "input")]
