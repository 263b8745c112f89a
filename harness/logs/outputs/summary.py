"""The run summary: what a run's event log adds up to (:func:`summarize`).

Its text and JSON forms are :mod:`.summary_text`'s. Everything here is a pure function over a list of event-log record dicts (the records a
simulator run wrote, ``records[0]`` being the header; docs/trace-format.md). Nothing
imports the simulator, so a log read back from disk summarizes exactly like one still in
memory, and the Perfetto trace (:mod:`.perfetto`) and the PNG timeline (:mod:`.timeline`)
draw the very intervals this module measures.

Definitions (all times are simulated seconds):

- **run** spans the header's ``t`` to the end of the log (``sim_end.sim_time``, or the last
  record's ``t``); an effect or routable interval still open then is cut there.
- **effect intervals** pair each ``effect_start`` with its ``effect_end`` (same pipeline,
  effect, scope, step and cycle; equal ``args`` first, else oldest first). An effect
  occupies the GPUs in its start record's ``gpus`` (the end record's if the start has none).
- **generate intervals**: a DP rank is generating from the ``rank_state`` that makes it
  ``routable`` to its next ``rank_state``, on that record's ``gpus``.
- effect kinds: train = Compute, OffloadTraining, ReloadTrainComm, DestroyTrainComm,
  BuildCache; refit = SyncFromCache, Finalize, PublishVersion (the *sync* part) and Wake,
  Sleep, Abort, Drain (the *wake/sleep* part); waiting = RequestGpus, ReleaseThenRequest,
  AwaitRelease, WaitBatch, LockCoordinator; every other effect is "other".
- **pipeline time split**: for each kind, the simulated time during which the pipeline had at
  least one such interval (a union, so concurrent effects are not counted twice); generate
  = simulated time with at least one routable rank. Kinds overlap in time (ranks keep serving
  while training runs), so the percentages (of the run) need not add up to 100.
- **step time** of step s: from the first ``effect_start`` with scope "step" of step s to
  the first of step s+1, or, when there is no step s+1, to the last ``effect_end`` of step s.
  A step is *done* when every step-scope effect of it ended before the log did; mean and
  p95 are over done steps, p95 by the nearest-rank method.
- **GPU utilization** is exclusive: at every instant a GPU counts as train if any train
  effect occupies it, else refit if any refit effect does, else generate if a routable
  rank sits on it, else idle (waiting effects count as idle). The four add up to the run.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import groupby
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from harness.logs.outputs.headroom import Headroom
from harness.ordered_sum import ordered_sum
from harness.logs.outputs.dataplane import HopTotal, dataplane_totals
from harness.logs.outputs.pause_summary import PauseRow
from harness.logs.outputs.streaming_summary import StreamingRow, streaming_rows
from harness.logs.outputs.intervals import (
    EffectInterval,
    KIND_CATEGORY,
    RankInterval,
    effect_category,
    p95,
    union_length,
)
from harness.logs.outputs.run_view import Log, RunView, as_view
from harness.logs.outputs.policy_figures import policy_name
from harness.logs.outputs.waste import WasteSummary


@dataclass
class PipelineSummary:
    pipeline_id: str
    steps_done: int
    step_times: List[float]  # seconds, done steps in step order
    mean_step_s: Optional[float]
    p95_step_s: Optional[float]
    generate_s: float
    train_s: float
    refit_s: float
    waiting_s: float
    requests_done: int = 0
    requests_aborted: int = 0
    requests_failed: int = 0  # given up after their last re-dispatch attempt (request_failed)
    tokens: int = 0


@dataclass
class GpuSummary:
    gpu: int
    node: int
    train_s: float
    refit_s: float
    generate_s: float
    idle_s: float


@dataclass
class RefitSummary:
    pipeline_id: str
    syncs_by_path: Dict[str, int]
    sync_s_by_path: Dict[str, float]
    total_sync_s: float
    mean_sync_s: Optional[float]
    buckets: int
    bytes_by_transport: Dict[str, int]

    @property
    def syncs(self) -> int:
        return sum(self.syncs_by_path.values())


@dataclass
class SchedulerSummary:
    cycles: int = 0
    shrink_ops: int = 0
    shrink_dp_ranks: int = 0
    expand_ops: int = 0
    expand_dp_ranks: int = 0
    signals: int = 0
    rejected: int = 0
    failures: int = 0


@dataclass
class Summary:
    scenario: Optional[str]
    t_start: float
    t_end: float
    end_reason: Optional[str]
    nodes: int
    gpus_per_node: int
    pipelines: List[PipelineSummary]
    gpus: List[GpuSummary]
    refit: List[RefitSummary]
    staleness: Dict[int, int]  # age in steps -> trajectories, all pipelines
    staleness_by_pipeline: Dict[str, Dict[int, int]]
    scheduler: SchedulerSummary
    ooms: List[Dict[str, Any]]
    faults: List[Dict[str, Any]]
    timeouts: List[Dict[str, Any]]  # RLix timeouts that expired
    streaming: List[StreamingRow] = field(default_factory=list)  # single controllers
    dataplane: List[HopTotal] = field(default_factory=list)  # bytes per hop (harness/logs/outputs/dataplane.py)
    # GPUs handed over with another cluster's memory still on them (the handover check)
    handovers: List[Dict[str, Any]] = field(default_factory=list)
    waste: WasteSummary = field(default_factory=WasteSummary)  # harness/logs/outputs/waste.py
    pauses: List[PauseRow] = field(default_factory=list)  # lost work per pause mode (pause_summary.py)
    first_oom_seq: Optional[int] = None  # to say whether an unclean handover came first
    # the scheduling policy the header names (absent: gap_ratio, RLix's planner; docs/policies.md)
    policy: str = "gap_ratio"
    headroom: Optional[Headroom] = None  # memory headroom per GPU, phase and handover (headroom.py)

    @property
    def duration_s(self) -> float:
        return self.t_end - self.t_start


def _step_times(effects: Sequence[EffectInterval]) -> Tuple[int, List[float]]:
    first_start: Dict[int, float] = {}
    last_end: Dict[int, float] = {}
    unfinished = set()
    for iv in effects:
        if iv.scope != "step" or iv.step is None:
            continue
        s = int(iv.step)
        first_start[s] = min(first_start.get(s, iv.start), iv.start)
        last_end[s] = max(last_end.get(s, iv.end), iv.end)
        if iv.open:
            unfinished.add(s)
    done = [s for s in sorted(first_start) if s not in unfinished]
    times = []
    for s in done:
        end = first_start[s + 1] if (s + 1) in first_start else last_end[s]
        times.append(end - first_start[s])
    return len(done), times


_PRECEDENCE = {"train": 0, "refit": 1, "generate": 2}  # category -> rank (lower wins)
_KIND_RANK = {kind: _PRECEDENCE.get(cat) for kind, cat in KIND_CATEGORY.items()}


def _exclusive_gpu_time(
    kinds: Sequence[str], starts: Sequence[float], ends: Sequence[float], t0: float, t1: float
) -> Dict[str, float]:
    """Seconds of train / refit / generate on one GPU, given its slices' kinds, starts
    and ends (columns), with precedence train > refit > generate; the rest of [t0, t1]
    is idle.

    A sweep over the slices' start and end points: each gap between consecutive points
    goes to the highest-precedence category active in it (added in sweep order). The
    order of the points at one instant does not matter — the gap before them is counted
    at the first, and it is zero between them — so they sort as plain tuples."""
    events: List[Tuple[float, int, int]] = []
    add = events.append
    for kind, start, end in zip(kinds, starts, ends):
        rank = _KIND_RANK[kind]
        if rank is None:
            continue
        a, b = max(start, t0), min(end, t1)
        if b > a:
            add((a, 1, rank))
            add((b, -1, rank))
    events.sort()
    train = refit = generate = 0.0
    active = [0, 0, 0]
    prev = None
    for t, delta, rank in events:
        if prev is not None and t > prev:
            if active[0] > 0:
                train += t - prev
            elif active[1] > 0:
                refit += t - prev
            elif active[2] > 0:
                generate += t - prev
        active[rank] += delta
        prev = t
    out = {"train": train, "refit": refit, "generate": generate}
    out["idle"] = (t1 - t0) - ordered_sum(out[c] for c in ("train", "refit", "generate"))
    return out


# what the scheduler and faults section reads, in log order
_SCHEDULER_SUMMARY_KINDS = (
    "cycle_start",
    "plan",
    "commit",
    "rejected",
    "scheduler_failed",
    "validation_failed",
    "oom",
    "host_oom",
    "fault_fired",
    "timeout",
    "sim_end",
)


def summarize(log: Log, handover_findings: Optional[Sequence[Any]] = None) -> Summary:
    """Summarize a simulator event log (a list of record dicts, header first, or a
    :class:`RunView` of one). ``handover_findings``: the oracle's ``handover`` violations
    of this log in its order, when the caller has them (else the check is run here)."""
    view = as_view(log)
    t0, t1 = view.bounds
    nodes, gpn = view.shape
    pipelines = _pipeline_summaries(view)
    gpus = _gpu_summaries(view, t0, t1, gpn)
    refit = _refit_summaries(view)
    staleness, staleness_by_pipeline = _staleness(view)
    sched, ooms, faults, timeouts, first_oom_seq, end_reason = _scheduler_summary(view)
    return Summary(
        scenario=view.scenario,
        t_start=t0,
        t_end=t1,
        end_reason=end_reason,
        nodes=nodes,
        gpus_per_node=gpn,
        pipelines=pipelines,
        gpus=gpus,
        refit=refit,
        staleness=staleness,
        staleness_by_pipeline=staleness_by_pipeline,
        scheduler=sched,
        ooms=ooms,
        faults=faults,
        timeouts=timeouts,
        handovers=_handovers(view, handover_findings),
        first_oom_seq=first_oom_seq,
        streaming=streaming_rows(
            view.of("streaming_setup", "effect_end", "trainer_step") if view.of("streaming_setup") else (),
            {p.pipeline_id: p.mean_step_s for p in pipelines},
        ),
        dataplane=dataplane_totals(view.of("dp_transfer")),
        waste=view.derived("waste"),
        pauses=view.derived("pauses"),
        policy=policy_name(view.records),
        headroom=view.derived("headroom"),
    )


def _pipeline_summaries(view: RunView) -> List[PipelineSummary]:
    """Per pipeline: its steps, the time it spent per category and its requests."""
    by_pipe_effects: Dict[str, List[EffectInterval]] = defaultdict(list)
    for iv in view.effects:
        by_pipe_effects[iv.pipeline_id].append(iv)
    by_pipe_ranks: Dict[str, List[RankInterval]] = defaultdict(list)
    for rv in view.ranks:
        by_pipe_ranks[rv.pipeline_id].append(rv)
    req_done, req_abort, req_failed, tokens = view.derived("requests")

    pipelines: List[PipelineSummary] = []
    for pid in view.pipeline_ids:
        pe = by_pipe_effects.get(pid, [])
        done, times = _step_times(pe)
        spans: Dict[str, List[Tuple[float, float]]] = defaultdict(list)
        for iv in pe:
            spans[effect_category(iv.effect)].append((iv.start, iv.end))
        gen = [(rv.start, rv.end) for rv in by_pipe_ranks.get(pid, [])] + spans["generate"]
        pipelines.append(
            PipelineSummary(
                pipeline_id=pid,
                steps_done=done,
                step_times=times,
                mean_step_s=(ordered_sum(times) / len(times)) if times else None,
                p95_step_s=p95(times),
                generate_s=union_length(gen),
                train_s=union_length(spans["train"]),
                refit_s=union_length(spans["refit"]),
                waiting_s=union_length(spans["waiting"]),
                requests_done=req_done.get(pid, 0),
                requests_aborted=req_abort.get(pid, 0),
                requests_failed=req_failed.get(pid, 0),
                tokens=tokens.get(pid, 0),
            )
        )
    return pipelines


def _gpu_summaries(view: RunView, t0: float, t1: float, gpn: int) -> List[GpuSummary]:
    """Per GPU: the time it spent per category, each instant counted once."""
    columns = view.slice_columns
    # each GPU's slices: a run of the columns (the slices are sorted by GPU first)
    by_gpu: Dict[Any, Tuple[int, int]] = {}
    at = 0
    for g, run in groupby(columns.gpu):
        n = sum(1 for _ in run)
        by_gpu[g] = (at, at + n)
        at += n
    gpus: List[GpuSummary] = []
    for g in view.gpus:
        lo, hi = by_gpu.get(g, (0, 0))
        x = _exclusive_gpu_time(columns.kind[lo:hi], columns.start[lo:hi], columns.end[lo:hi], t0, t1)
        gpus.append(
            GpuSummary(
                gpu=g, node=g // gpn, train_s=x["train"], refit_s=x["refit"], generate_s=x["generate"], idle_s=x["idle"]
            )
        )
    return gpus


def _refit_summaries(view: RunView) -> List[RefitSummary]:
    """Per pipeline: its weight syncs by path and the bytes its buckets moved by transport."""
    sync_count: Dict[str, Dict[str, int]] = defaultdict(lambda: defaultdict(int))
    sync_secs: Dict[str, Dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for iv in view.effects:
        if iv.effect == "SyncFromCache":
            path = str(iv.args.get("path", "?"))
            sync_count[iv.pipeline_id][path] += 1
            sync_secs[iv.pipeline_id][path] += iv.duration
    buckets: Dict[str, int] = defaultdict(int)
    bytes_tr: Dict[str, Dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in view.of("sync_bucket"):
        if "pipeline_id" not in r:
            continue  # a gate's record (a rank's sync): the refit table is per pipeline
        buckets[r["pipeline_id"]] += 1
        bytes_tr[r["pipeline_id"]][str(r["path"])] += int(r["bytes"])
    refit: List[RefitSummary] = []
    for pid in sorted(set(sync_count) | set(buckets)):
        counts = {p: sync_count[pid][p] for p in sorted(sync_count.get(pid, {}))}
        secs = {p: sync_secs[pid][p] for p in sorted(sync_secs.get(pid, {}))}
        n = sum(counts.values())
        total = ordered_sum(secs[p] for p in sorted(secs))
        refit.append(
            RefitSummary(
                pipeline_id=pid,
                syncs_by_path=counts,
                sync_s_by_path=secs,
                total_sync_s=total,
                mean_sync_s=(total / n) if n else None,
                buckets=buckets.get(pid, 0),
                bytes_by_transport={k: bytes_tr[pid][k] for k in sorted(bytes_tr.get(pid, {}))},
            )
        )
    return refit


def _staleness(view: RunView) -> Tuple[Dict[int, int], Dict[str, Dict[int, int]]]:
    """The consumed samples' staleness histogram (age -> count), overall and per pipeline."""
    merged: Dict[int, int] = defaultdict(int)
    per_pipe: Dict[str, Dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for r in view.of("batch_consumed"):
        for age, count in (r.get("staleness") or {}).items():
            merged[int(age)] += int(count)
            per_pipe[r["pipeline_id"]][int(age)] += int(count)
    staleness = {a: merged[a] for a in sorted(merged)}
    return staleness, {p: {a: per_pipe[p][a] for a in sorted(per_pipe[p])} for p in sorted(per_pipe)}


def _scheduler_summary(
    view: RunView,
) -> Tuple[
    SchedulerSummary, List[Dict[str, Any]], List[Dict[str, Any]], List[Dict[str, Any]], Optional[int], Optional[str]
]:
    """The scheduler's totals, then the OOMs, fired faults and timeouts, the first OOM's
    seq and why the run ended: one pass over the records of those kinds."""
    sched = SchedulerSummary()
    cycles = set()
    ooms: List[Dict[str, Any]] = []
    faults: List[Dict[str, Any]] = []
    timeouts: List[Dict[str, Any]] = []
    first_oom_seq: Optional[int] = None
    end_reason: Optional[str] = None
    for r in view.of(*_SCHEDULER_SUMMARY_KINDS):
        k = r.get("kind")
        if k in ("cycle_start", "plan", "commit") and r.get("cycle") is not None:
            cycles.add(r["cycle"])
        if k == "plan":
            sched.shrink_ops += len(r.get("shrinks") or ())
            sched.shrink_dp_ranks += sum(len(s.get("bundles") or ()) for s in r.get("shrinks") or ())
            sched.expand_ops += len(r.get("expands") or ())
            sched.expand_dp_ranks += sum(len(s.get("bundles") or ()) for s in r.get("expands") or ())
            sched.signals += len(r.get("signals") or ())
        elif k == "rejected":
            sched.rejected += 1
        elif k in ("scheduler_failed", "validation_failed"):
            sched.failures += 1
        elif k == "oom":
            ooms.append({f: r.get(f) for f in ("t", "gpu", "owner", "mem", "requested", "used", "capacity")})
            if first_oom_seq is None:
                first_oom_seq = r.get("seq")
        elif k == "host_oom":
            ooms.append({f: r.get(f) for f in ("t", "node", "owner", "requested", "used", "capacity")})
        elif k == "fault_fired":
            faults.append({f: r.get(f) for f in ("t", "name", "pipeline_id", "step")})
        elif k == "timeout":
            timeouts.append({f: r.get(f) for f in ("t", "what", "pipeline_id", "limit_s", "since")})
        elif k == "sim_end":
            end_reason = r.get("reason")
    sched.cycles = len(cycles)
    return sched, ooms, faults, timeouts, first_oom_seq, end_reason


def _handovers(view: RunView, found: Optional[Sequence[Any]] = None) -> List[Dict[str, Any]]:
    """The handover check's findings (``found``, when the caller already ran the oracle)."""
    if found is None:
        from harness.logs.invariants import SEES, kind_views
        from harness.logs.invariants.handover import handover  # the oracle's own reading of the log

        kinds = SEES["handover"]
        found = handover(kind_views(view.records, [kinds])[kinds])  # type: ignore[arg-type]  # records are dicts
    if not found:
        return []
    want = {v.seq for v in found}
    at = {r["seq"]: r["t"] for r in view.with_seqs(want)}
    return [{"seq": v.seq, "t": at.get(v.seq), "message": v.message} for v in found]
