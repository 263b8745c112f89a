"""The plain-text run summary.

Everything here is a pure function over a list of event-log record dicts (the records a
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
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from harness.ordered_sum import ordered_sum
from harness.outputs.dataplane import HopTotal, dataplane_totals, format_dataplane
from harness.outputs.streaming_summary import StreamingRow, streaming_lines, streaming_rows
from harness.outputs.intervals import (  # noqa: F401  (re-exported: the outputs' shared vocabulary)
    KIND_CATEGORY,
    REFIT_EFFECTS,
    SYNC_EFFECTS,
    TRAIN_EFFECTS,
    WAITING_EFFECTS,
    WAKE_SLEEP_EFFECTS,
    EffectInterval,
    GpuSlice,
    Log,
    RankInterval,
    RunView,
    all_gpus,
    as_view,
    assign_lanes,
    cluster_shape,
    effect_category,
    effect_intervals,
    effect_kind,
    effect_label,
    gpu_slices,
    p95,
    rank_intervals,
    run_bounds,
    scenario_name,
    union_length,
)

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
    dataplane: List[HopTotal] = field(default_factory=list)  # bytes per hop (harness/outputs/dataplane.py)
    # GPUs handed over with another cluster's memory still on them (the handover check)
    handovers: List[Dict[str, Any]] = field(default_factory=list)
    first_oom_seq: Optional[int] = None  # to say whether an unclean handover came first

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


def _exclusive_gpu_time(slices: Sequence[GpuSlice], t0: float, t1: float) -> Dict[str, float]:
    """Seconds of train / refit / generate on one GPU with precedence train > refit >
    generate; the rest of [t0, t1] is idle.

    A sweep over the slices' start and end points: each gap between consecutive points
    goes to the highest-precedence category active in it (added in sweep order). The
    order of the points at one instant does not matter — the gap before them is counted
    at the first, and it is zero between them — so they sort as plain tuples."""
    events: List[Tuple[float, int, int]] = []
    add = events.append
    for s in slices:
        rank = _KIND_RANK[s.kind]
        if rank is None:
            continue
        a, b = max(s.start, t0), min(s.end, t1)
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
_SCHEDULER_SUMMARY_KINDS = ("cycle_start", "plan", "commit", "rejected", "scheduler_failed", "validation_failed", "oom",
                            "host_oom", "fault_fired", "timeout", "sim_end")


def summarize(log: Log, handover_findings: Optional[Sequence[Any]] = None) -> Summary:
    """Summarize a simulator event log (a list of record dicts, header first, or a
    :class:`RunView` of one). ``handover_findings``: the oracle's ``handover`` violations
    of this log in its order, when the caller has them (else the check is run here)."""
    view = as_view(log)
    records = view.records
    t0, t1 = view.bounds
    nodes, gpn = view.shape
    effects = view.effects
    ranks = view.ranks
    slices = view.slices

    # ---- pipelines
    by_pipe_effects: Dict[str, List[EffectInterval]] = defaultdict(list)
    for iv in effects:
        by_pipe_effects[iv.pipeline_id].append(iv)
    by_pipe_ranks: Dict[str, List[RankInterval]] = defaultdict(list)
    for rv in ranks:
        by_pipe_ranks[rv.pipeline_id].append(rv)
    req_done: Dict[str, int] = defaultdict(int)
    req_abort: Dict[str, int] = defaultdict(int)
    req_failed: Dict[str, int] = defaultdict(int)
    tokens: Dict[str, int] = defaultdict(int)
    for r in view.of("request_done"):
        req_done[r["pipeline_id"]] += 1
        tokens[r["pipeline_id"]] += int(r.get("tokens", 0))
    for r in view.of("request_abort"):
        req_abort[r["pipeline_id"]] += 1
    for r in view.of("request_failed"):
        req_failed[r["pipeline_id"]] += 1

    pipelines: List[PipelineSummary] = []
    for pid in view.pipeline_ids:
        pe = by_pipe_effects.get(pid, [])
        done, times = _step_times(pe)
        spans: Dict[str, List[Tuple[float, float]]] = defaultdict(list)
        for iv in pe:
            spans[effect_category(iv.effect)].append((iv.start, iv.end))
        gen = [(rv.start, rv.end) for rv in by_pipe_ranks.get(pid, [])] + spans["generate"]
        pipelines.append(PipelineSummary(
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
        ))

    # ---- GPUs
    by_gpu: Dict[int, List[GpuSlice]] = defaultdict(list)
    for s in slices:
        by_gpu[s.gpu].append(s)
    gpus: List[GpuSummary] = []
    for g in view.gpus:
        x = _exclusive_gpu_time(by_gpu.get(g, []), t0, t1)
        gpus.append(GpuSummary(gpu=g, node=g // gpn, train_s=x["train"], refit_s=x["refit"],
                               generate_s=x["generate"], idle_s=x["idle"]))

    # ---- refit
    sync_count: Dict[str, Dict[str, int]] = defaultdict(lambda: defaultdict(int))
    sync_secs: Dict[str, Dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for iv in effects:
        if iv.effect == "SyncFromCache":
            path = str(iv.args.get("path", "?"))
            sync_count[iv.pipeline_id][path] += 1
            sync_secs[iv.pipeline_id][path] += iv.duration
    buckets: Dict[str, int] = defaultdict(int)
    bytes_tr: Dict[str, Dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in view.of("refit_bucket"):
        buckets[r["pipeline_id"]] += 1
        bytes_tr[r["pipeline_id"]][str(r["transport"])] += int(r["bytes"])
    refit: List[RefitSummary] = []
    for pid in sorted(set(sync_count) | set(buckets)):
        counts = {p: sync_count[pid][p] for p in sorted(sync_count.get(pid, {}))}
        secs = {p: sync_secs[pid][p] for p in sorted(sync_secs.get(pid, {}))}
        n = sum(counts.values())
        total = ordered_sum(secs[p] for p in sorted(secs))
        refit.append(RefitSummary(
            pipeline_id=pid, syncs_by_path=counts, sync_s_by_path=secs, total_sync_s=total,
            mean_sync_s=(total / n) if n else None, buckets=buckets.get(pid, 0),
            bytes_by_transport={k: bytes_tr[pid][k] for k in sorted(bytes_tr.get(pid, {}))},
        ))

    # ---- staleness
    merged: Dict[int, int] = defaultdict(int)
    per_pipe: Dict[str, Dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for r in view.of("batch_consumed"):
        for age, count in (r.get("staleness") or {}).items():
            merged[int(age)] += int(count)
            per_pipe[r["pipeline_id"]][int(age)] += int(count)
    staleness = {a: merged[a] for a in sorted(merged)}
    staleness_by_pipeline = {p: {a: per_pipe[p][a] for a in sorted(per_pipe[p])} for p in sorted(per_pipe)}

    # ---- scheduler, faults
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

    return Summary(
        scenario=view.scenario, t_start=t0, t_end=t1, end_reason=end_reason,
        nodes=nodes, gpus_per_node=gpn, pipelines=pipelines, gpus=gpus, refit=refit,
        staleness=staleness, staleness_by_pipeline=staleness_by_pipeline, scheduler=sched,
        ooms=ooms, faults=faults, timeouts=timeouts, handovers=_handovers(view, handover_findings),
        first_oom_seq=first_oom_seq,
        streaming=streaming_rows(view.of("streaming_setup"), {p.pipeline_id: p.mean_step_s for p in pipelines}),
        dataplane=dataplane_totals(view.of("dp_transfer")),
    )


def _handovers(view: RunView, found: Optional[Sequence[Any]] = None) -> List[Dict[str, Any]]:
    """The handover check's findings (``found``, when the caller already ran the oracle)."""
    if found is None:
        from harness.invariants import SEES, kind_views
        from harness.invariants.handover import handover  # the oracle's own reading of the log

        kinds = SEES["handover"]
        found = handover(kind_views(view.records, [kinds])[kinds])
    if not found:
        return []
    want = {v.seq for v in found}
    at = {r["seq"]: r["t"] for r in view.records if "seq" in r and r["seq"] in want}
    return [{"seq": v.seq, "t": at.get(v.seq), "message": v.message} for v in found]


# --------------------------------------------------------------------------- text


def _s(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3f}"


def _pct(x: float, total: float) -> str:
    return f"{(100.0 * x / total) if total > 0 else 0.0:.1f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> List[str]:
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def fmt(cells: Sequence[str]) -> str:
        parts = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align)]
        return "  ".join(parts).rstrip()

    lines = [fmt(headers), "  ".join("-" * w for w in widths)]
    lines.extend(fmt(r) for r in rows)
    return lines


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n} ({n / size:.2f} {unit})"
    return f"{n} B"


def format_summary(summary: Summary) -> str:
    """Plain-text tables for a person; fixed decimals, so identical runs print identically."""
    d = summary.duration_s
    out: List[str] = []
    title = "rlharness simulation summary"
    if summary.scenario:
        title += f": {summary.scenario}"
    out.append(title)
    out.append(f"run {_s(summary.t_start)} s .. {_s(summary.t_end)} s ({_s(d)} s simulated), "
               f"end: {summary.end_reason or 'no sim_end'}; cluster {summary.nodes} node(s) x "
               f"{summary.gpus_per_node} GPU(s)")

    out.append("")
    out.append("Pipelines (time split: simulated seconds with any such work, % of the run; kinds overlap;")
    out.append("  refit s = weight sync, finalize and publish plus wake, sleep, abort and drain of its inference ranks)")
    rows = []
    for p in summary.pipelines:
        rows.append([p.pipeline_id, str(p.steps_done), _s(p.mean_step_s), _s(p.p95_step_s),
                     _s(p.generate_s), _pct(p.generate_s, d), _s(p.train_s), _pct(p.train_s, d),
                     _s(p.refit_s), _pct(p.refit_s, d), _s(p.waiting_s), _pct(p.waiting_s, d),
                     str(p.requests_done), str(p.requests_aborted), str(p.requests_failed)])
    out += _table(["pipeline", "steps", "mean step s", "p95 step s", "generate s", "gen %", "train s",
                   "train %", "refit s", "refit %", "waiting s", "wait %", "req done", "req abort",
                   "req failed"], rows, "lrrrrrrrrrrrrrr") if rows else ["(no pipelines)"]
    out += streaming_lines(summary.streaming, _table)

    out.append("")
    out.append("GPU utilization (% of the run; train > refit > generate where they overlap)")
    rows = []
    for g in summary.gpus:
        rows.append([str(g.gpu), str(g.node), _pct(g.train_s, d), _pct(g.generate_s, d),
                     _pct(g.refit_s, d), _pct(g.idle_s, d)])
    if summary.gpus:
        n = len(summary.gpus)
        tot = [ordered_sum(getattr(g, f) for g in summary.gpus) for f in ("train_s", "generate_s", "refit_s", "idle_s")]
        rows.append(["all", "-"] + [_pct(x, d * n) for x in tot])
    out += _table(["gpu", "node", "train %", "generate %", "refit %", "idle %"], rows, "rrrrrr")

    out.append("")
    out.append("Refit (weight syncs only: total sync s = SyncFromCache time summed over syncs, so")
    out.append("  concurrent syncs add up; the pipeline table's refit s is a union over time that also")
    out.append("  counts finalize, publish, wake, sleep and drain)")
    if summary.refit:
        rows = []
        for r in summary.refit:
            paths = ", ".join(f"{p}={n}" for p, n in r.syncs_by_path.items()) or "-"
            trans = ", ".join(f"{k}={_bytes(v)}" for k, v in r.bytes_by_transport.items()) or "-"
            rows.append([r.pipeline_id, str(r.syncs), paths, _s(r.total_sync_s), _s(r.mean_sync_s),
                         str(r.buckets), trans])
        out += _table(["pipeline", "syncs", "by path", "total sync s", "mean sync s", "buckets",
                       "bytes by transport"], rows, "lrlrrrl")
    else:
        out.append("(no weight syncs)")

    out.append("")
    total_traj = sum(summary.staleness.values())
    if total_traj:
        mean_age = sum(a * c for a, c in summary.staleness.items()) / total_traj
        out.append(f"Trajectory staleness ({total_traj} trajectories, mean age {mean_age:.3f} steps)")
        rows = [[str(a), str(c), _pct(c, total_traj)] for a, c in summary.staleness.items()]
        out += _table(["age (steps)", "trajectories", "%"], rows, "rrr")
    else:
        out.append("Trajectory staleness: (no batches consumed)")

    sc = summary.scheduler
    out.append("")
    out.append("Scheduler")
    out += _table(["cycles", "shrinks", "shrunk dp ranks", "expands", "expanded dp ranks", "signals",
                   "rejected", "failures"],
                  [[str(sc.cycles), str(sc.shrink_ops), str(sc.shrink_dp_ranks), str(sc.expand_ops),
                    str(sc.expand_dp_ranks), str(sc.signals), str(sc.rejected), str(sc.failures)]],
                  "rrrrrrrr")

    if summary.handovers:
        out.append("")
        out.append(f"GPU handovers with another cluster's memory still resident ({len(summary.handovers)})")
        for h in summary.handovers[:5]:
            out.append(f"t={_s(h['t'])} s {h['message']}")
        if len(summary.handovers) > 5:
            out.append(f"... and {len(summary.handovers) - 5} more (violations.txt)")
        if summary.ooms and summary.first_oom_seq is not None:
            h, o = summary.handovers[0], summary.ooms[0]
            first = "before" if h["seq"] < summary.first_oom_seq else "after"
            out.append(f"the first unclean handover (t={_s(h['t'])} s, seq {h['seq']}) came {first} the first OOM "
                       f"(t={_s(o['t'])} s, seq {summary.first_oom_seq}, GPU {o.get('gpu')})")
    if summary.dataplane:
        out += format_dataplane(summary.dataplane, _bytes, _table)

    if summary.ooms or summary.faults or summary.timeouts:
        out.append("")
        out.append("Faults")
        out += [line for _, _, line in sorted(_fault_lines(summary))]
    return "\n".join(out) + "\n"


def _fault_lines(summary: Summary) -> List[Tuple[float, int, str]]:
    """``(t, order, line)`` of every OOM, fault and timeout: the section reads in time
    order, with the log's order (OOMs, then faults, then timeouts) among equal times."""
    lines: List[Tuple[float, int, str]] = []
    for o in summary.ooms:
        where = f"host RAM of node {o['node']}: {o['owner']}" if "node" in o else f"GPU {o['gpu']}: {o['owner']} {o['mem']}"
        lines.append((float(o["t"]), 0, f"t={_s(o['t'])} s OOM on {where} requested "
                                        f"{o['requested']} with {o['used']} of {o['capacity']} bytes used"))
    for f in summary.faults:
        step = "" if f.get("step") is None else f" step {f['step']}"
        lines.append((float(f["t"]), 1, f"t={_s(f['t'])} s fault {f['name']} fired in {f['pipeline_id']}{step}"))
    for x in summary.timeouts:
        lines.append((float(x["t"]), 2, f"t={_s(x['t'])} s timeout: {x['what']} of {x['pipeline_id']} waited since "
                                        f"t={_s(x['since'])} s, past its {x['limit_s']:g} s limit"))
    return lines


def summary_json(summary: Summary) -> Dict[str, Any]:
    """The figures of :func:`format_summary` as a JSON-ready mapping (``summary.json``):
    the same numbers, unrounded, with the units in the key names (``_s`` simulated
    seconds, ``_pct`` percent of the run)."""
    d = summary.duration_s

    def pct(x: float, total: float) -> float:
        return (100.0 * x / total) if total > 0 else 0.0

    n_gpus = len(summary.gpus)
    return {
        "scenario": summary.scenario,
        "time_unit": "simulated seconds",
        "run": {"start_s": summary.t_start, "end_s": summary.t_end, "simulated_s": d, "end": summary.end_reason,
                "nodes": summary.nodes, "gpus_per_node": summary.gpus_per_node},
        # every field of the summary's dataclass (a figure added there lands here too),
        # plus each time's share of the run as printed
        "pipelines": [{**asdict(p), **{f"{k}_pct": pct(getattr(p, f"{k}_s"), d)
                                       for k in ("generate", "train", "refit", "waiting")}}
                      for p in summary.pipelines],
        "gpus": [{
            "gpu": g.gpu, "node": g.node, "train_pct": pct(g.train_s, d), "generate_pct": pct(g.generate_s, d),
            "refit_pct": pct(g.refit_s, d), "idle_pct": pct(g.idle_s, d),
            "train_s": g.train_s, "generate_s": g.generate_s, "refit_s": g.refit_s, "idle_s": g.idle_s,
        } for g in summary.gpus],
        "gpus_all": {f"{k}_pct": pct(ordered_sum(getattr(g, f"{k}_s") for g in summary.gpus), d * n_gpus)
                     for k in ("train", "generate", "refit", "idle")} if n_gpus else {},
        "refit": [{**asdict(r), "syncs": r.syncs} for r in summary.refit],
        "staleness": {
            "trajectories": sum(summary.staleness.values()),
            "mean_age_steps": (sum(a * c for a, c in summary.staleness.items()) / sum(summary.staleness.values())
                               if summary.staleness else None),
            "by_age": {str(age): count for age, count in summary.staleness.items()},
            "by_age_pct": {str(age): pct(count, sum(summary.staleness.values())) for age, count in summary.staleness.items()},
        },
        "staleness_by_pipeline": {p: {str(a): c for a, c in ages.items()} for p, ages in summary.staleness_by_pipeline.items()},
        "scheduler": dict(vars(summary.scheduler)),
        "faults": [{"t": t, "line": line} for t, _, line in sorted(_fault_lines(summary))],
        "ooms": summary.ooms,
        "fault_hooks_fired": summary.faults,
        "timeouts": summary.timeouts,
        # sections other runtimes added (single controllers, data plane): every row whole
        "streaming": [asdict(r) for r in summary.streaming],
        "dataplane": [asdict(h) for h in summary.dataplane],
    }
