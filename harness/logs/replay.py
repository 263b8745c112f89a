"""Scheduler-trace replay: feed recorded inputs to the model, diff its decisions.

The input file is any event log (a hand-written trace, a simulator log, a gate log):
its input records are fed to a fresh :class:`SchedulerModel` in order, its decision and
runtime records are passed over. Each input a real RLix would refuse becomes a
``rejected`` decision and the replay goes on. Decisions are compared on content
(``seq`` and ``t`` ignored): the model decides *what*; when it happens belongs to the
runtime that recorded the log.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from harness.eventlog.kinds import category
from harness.logs.records import InputError, Record, read_records
from harness.logs.writer import EventLog, header_record
from harness.scheduler.cycle import CyclePlan
from harness.scheduler.model import SchedulerModel
from harness.scheduler.options import SchedulerOptions
from harness.scheduler.progress import ProgressReport
from harness.scheduler.types import Priority, Rejected
from harness.scheduler.topology import ClusterTopology, TopologyError, build_pipeline_entry, validate_partial_overlap

IGNORED_IN_COMPARISON = ("seq", "t")


@dataclass
class ReplayResult:
    log: EventLog  # header + decisions, stamped
    model: SchedulerModel
    open_cycle: Optional[int] = None
    rejected: int = 0
    # with merge=True: the input log with its recorded decisions replaced by the model's,
    # each input followed by the decisions it produced (seq renumbered) — what the oracle
    # reads for a scheduler trace that carries no decisions of its own
    merged: Optional[List[Dict[str, Any]]] = None

    @property
    def decisions(self) -> List[Dict[str, Any]]:
        return [r for r in self.log.records if r["kind"] != "header"]


@dataclass
class Divergence:
    index: int
    produced: Optional[Dict[str, Any]]
    expected: Optional[Dict[str, Any]]
    expected_line: Optional[int] = None


def _priority(value: Any, where: str, name: str) -> Priority:
    try:
        return Priority.parse(value)
    except ValueError as e:
        raise InputError(f"{where}: field {name!r}: {e}") from None


class _Feeder:
    """Applies one input record to the model."""

    def __init__(self, model: SchedulerModel, path: str) -> None:
        self.model = model
        self.path = path
        self.open: Optional[CyclePlan] = None

    def feed(self, rec: Record) -> None:
        d, where, m = rec.data, f"{self.path}:{rec.line}", self.model
        kind = rec.kind
        if kind == "register":
            if d.get("topology") not in (None, "partial_overlap"):
                raise InputError(
                    f"{where}: field 'topology': must be 'partial_overlap' when given, got {d['topology']!r}"
                )
            if d.get("topology") == "partial_overlap":
                try:
                    entry = build_pipeline_entry(
                        d["pipeline_id"],
                        d.get("namespace") or "ns",
                        d["cluster_tp_configs"],
                        d["cluster_device_mappings"],
                        m.topology,
                    )
                    validate_partial_overlap(entry, train_parallel_size=d.get("train_parallel_size", 1))
                except TopologyError as e:
                    raise Rejected(str(e)) from None
            m.register(d["pipeline_id"], d["cluster_tp_configs"], d["cluster_device_mappings"], d.get("namespace"))
        elif kind == "admit":
            m.admit(d["pipeline_id"])
        elif kind == "unregister":
            m.unregister(d["pipeline_id"])
        elif kind == "request":
            m.request(
                d["cluster_id"],
                _priority(d["priority"], where, "priority"),
                global_step=d.get("global_step"),
                step_target_estimate=d.get("step_target_estimate"),
                lora_name=d.get("lora_name"),
            )
        elif kind == "release":
            m.release(d["cluster_id"], global_step=d.get("global_step"))
        elif kind == "release_then_request":
            m.release_then_request(
                d["release_cluster_id"],
                d["request_cluster_id"],
                _priority(d["request_priority"], where, "request_priority"),
                release_global_step=d.get("release_global_step"),
                request_global_step=d.get("request_global_step"),
                request_step_target_estimate=d.get("request_step_target_estimate"),
                request_lora_name=d.get("request_lora_name"),
            )
        elif kind == "await_release":
            m.await_release(
                cluster_id=d.get("cluster_id"), pipeline_id=d.get("pipeline_id"), global_step=d.get("global_step")
            )
        elif kind == "progress":
            wire = {"remaining": d["remaining"]} if "remaining" in d else None
            m.report_progress(
                ProgressReport(
                    d["pipeline_id"],
                    d["step_target"],
                    d["completed"],
                    mode=d.get("mode", "train"),
                    adapter=d.get("adapter"),
                ),
                wire_fields=wire,
            )
        elif kind == "clear_progress":
            m.clear_progress(d["pipeline_id"])
        elif kind == "cycle":
            self._cycle(d, where)
        else:  # pragma: no cover - kinds table and this switch are kept in step by tests
            raise InputError(f"{where}: field 'kind': {kind!r} is an input kind replay does not handle")

    def _cycle(self, d: Dict[str, Any], where: str) -> None:
        phase = d.get("phase", "full")
        reason = d.get("reason", "wakeup")
        m = self.model
        if phase not in ("full", "plan", "commit"):
            raise InputError(f"{where}: field 'phase': must be full, plan or commit, got {phase!r}")
        if phase in ("full", "plan") and self.open is not None:
            raise InputError(
                f"{where}: field 'phase': cycle {self.open.cycle} was planned but not committed (cycles are serial)"
            )
        if phase == "commit":
            if self.open is None and m.failed is not None:
                # the model failed fast while planning (RLix shuts down): a runtime that
                # goes on to commit disagrees with the model's decision, which is a
                # divergence for --expect to report, not a malformed trace
                raise Rejected(f"commit after the scheduler failed fast ({m.failed})")
            if self.open is None:
                raise InputError(f"{where}: field 'phase': commit without a planned cycle")
            cp, self.open = self.open, None
            for p in ("shrink", "expand"):
                m.resize_records(cp, p, "start")
                m.resize_records(cp, p, "end")
            m.commit_cycle(cp)
            return
        if phase == "full":
            m.run_cycle(reason)
        else:
            self.open = m.plan_cycle(reason)


def replay_records(records: List[Record], path: str, *, merge: bool = False) -> ReplayResult:
    head = records[0]
    where = f"{path}:{head.line}"
    cluster = head.data["cluster"]
    try:
        topo = ClusterTopology(cluster["nodes"], cluster["gpus_per_node"])
        options = SchedulerOptions.from_mapping(head.data.get("scheduler", {}))
    except ValueError as e:
        raise InputError(f"{where}: field 'scheduler': {e}") from None
    model = SchedulerModel(topo, options)
    log = EventLog(
        header_record(cluster, scheduler=options.to_mapping(), source="replay", meta={"input": os.path.basename(path)})
    )
    feeder = _Feeder(model, path)
    result = ReplayResult(log=log, model=model)
    merged: Optional[List[Dict[str, Any]]] = [dict(head.data)] if merge else None
    for rec in records[1:]:
        cat = category(rec.kind)
        if merged is not None and cat != "decision":
            input_at = len(merged)  # == its seq once renumbered
            merged.append(dict(rec.data))
        if cat != "input":
            continue
        before = len(log.records)
        try:
            feeder.feed(rec)
        except Rejected as e:
            # What the call changed before it was refused is logged: release_then_request
            # releases (RLix keeps the release) and then refuses a duplicate request, and
            # a state change that happened must be in the log whatever is refused after it.
            log.extend(rec.t, model.drain())
            log.emit("rejected", rec.t, input_seq=rec.seq, input_kind=rec.kind, reason=e.reason)
            result.rejected += 1
        else:
            log.extend(rec.t, model.drain())
        if merged is not None:
            for d in log.records[before:]:
                # a rejection names its input by the input's place in the merged log
                merged.append({**d, "input_seq": input_at} if d["kind"] == "rejected" else dict(d))
    if merged is not None:
        for seq, d in enumerate(merged):
            d["seq"] = seq
        result.merged = merged
    result.open_cycle = feeder.open.cycle if feeder.open is not None else None
    return result


def replay_file(path: str) -> ReplayResult:
    return replay_records(read_records(path), path)


def _strip(rec: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in rec.items() if k not in IGNORED_IN_COMPARISON}


_RESIZE = ("resize_start", "resize_end")
_PHASE_ORDER = {
    ("resize_start", "shrink"): 0,
    ("resize_end", "shrink"): 1,
    ("resize_start", "expand"): 2,
    ("resize_end", "expand"): 3,
}


def canonical_order(
    decisions: List[Tuple[Dict[str, Any], Optional[int]]],
) -> List[Tuple[Dict[str, Any], Optional[int]]]:
    """Put each cycle's resize records in one canonical place and order.

    A runtime executes a cycle's resize calls concurrently and over time: their records
    interleave with each other and with decisions on inputs that arrive meanwhile (the
    lock gap). Replay executes them instantly at commit. Both are the same decisions, so
    before comparing, every cycle's resize records move to just before that cycle's first
    ``signalled``/``commit``/``scheduler_failed`` record, ordered shrink starts, shrink
    ends, expand starts, expand ends, each by pipeline id.
    """
    held: Dict[int, List[Tuple[Dict[str, Any], Optional[int]]]] = {}
    out: List[Tuple[Dict[str, Any], Optional[int]]] = []
    for rec, line in decisions:
        kind = rec["kind"]
        if kind in _RESIZE:
            held.setdefault(rec["cycle"], []).append((rec, line))
            continue
        cycle = rec.get("cycle")
        if kind in ("signalled", "commit", "scheduler_failed") and cycle in held:
            batch = held.pop(cycle)
            batch.sort(key=lambda x: (_PHASE_ORDER[(x[0]["kind"], x[0]["phase"])], x[0]["pipeline_id"]))
            out.extend(batch)
        out.append((rec, line))
    for cycle in sorted(held):
        out.extend(held[cycle])
    return out


def compare_decisions(produced: List[Dict[str, Any]], expected: List[Record]) -> Optional[Divergence]:
    """First position where the decision streams differ (after :func:`canonical_order`), or None."""
    exp = canonical_order([(r.data, r.line) for r in expected if category(r.kind) == "decision"])
    got = canonical_order([(d, None) for d in produced])
    for i in range(max(len(got), len(exp))):
        p = got[i][0] if i < len(got) else None
        e, line = exp[i] if i < len(exp) else (None, None)
        if p is None or e is None or _strip(p) != _strip(e):
            return Divergence(i, p, e, line)
    return None


# ---------------------------------------------------------------- human-readable table


def _bundles(items: List[Dict[str, Any]]) -> str:
    return ", ".join(f"dp{b['dp_rank']}->{b['gpus']}" for b in items)


def format_table(result: ReplayResult) -> Tuple[str, List[str]]:
    """Per-cycle table of shrinks, grants, expands and signals, then rejections."""
    rows: List[Tuple[str, str, str, str, str, str]] = []
    notes: List[str] = []
    current = None
    for r in result.decisions:
        k = r["kind"]
        if k == "plan":
            shrinks = "; ".join(f"{s['cluster_id']} {_bundles(s['bundles'])}" for s in r["shrinks"]) or "-"
            grants = (
                "; ".join(f"{s['cluster_id']} {s['gpus']} {s['priority']}" for s in r["signals"] if s["gpus"]) or "-"
            )
            expands = "; ".join(f"{e['cluster_id']} {_bundles(e['bundles'])}" for e in r["expands"]) or "-"
            current = [str(r["cycle"]), f"{r['t']:.3f}", shrinks, grants, expands, ""]
            rows.append(current)  # type: ignore[arg-type]
        elif k == "signalled" and r["cycle"] is not None and current is not None and int(current[0]) == r["cycle"]:
            what = "ack" if r["waiter"] == "planned_release" else str(r["gpus"])
            current[5] = (current[5] + "; " if current[5] else "") + f"#{r['request_id']} {r['cluster_id']} {what}"
        elif k == "rejected":
            notes.append(f"rejected input seq {r['input_seq']} ({r['input_kind']}): {r['reason']}")
        elif k == "validation_failed":
            notes.append(f"cycle {r['cycle']}: plan validation failed, condition {r['condition']}: {r['message']}")
        elif k == "scheduler_failed":
            notes.append(f"scheduler failed fast: {r['reason']}")
    header = ("cycle", "t", "shrinks", "grants (non-GEN)", "expands (GEN)", "signals")
    table = _render([header] + [tuple(x or "-" for x in row) for row in rows])
    return table, notes


def _render(rows: List[Tuple[str, ...]]) -> str:
    widths = [min(max(len(r[i]) for r in rows), 60) for i in range(len(rows[0]))]
    out = []
    for n, row in enumerate(rows):
        cells = [c if len(c) <= 60 else c[:57] + "..." for c in row]
        out.append("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
