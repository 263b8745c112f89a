"""The summary as a person reads it (``summary.txt``) and as a program does (``summary.json``).

:func:`format_summary` prints fixed-width tables with fixed decimals, and
:func:`summary_json` gives the same figures with the percentages a reader would
otherwise recompute, so identical runs print identically in both. The figures and their
definitions are :mod:`.summary`'s.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

from harness.ordered_sum import ordered_sum
from harness.logs.outputs.dataplane import format_dataplane
from harness.logs.outputs.headroom import headroom_lines
from harness.logs.outputs.pause_summary import lost_by_mode, pause_lines
from harness.logs.outputs.streaming_summary import streaming_lines
from harness.logs.outputs.summary import Summary
from harness.logs.outputs.waste import IDLE_CAUSES


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
    out = _run_lines(summary)
    out += _pipeline_lines(summary)
    out += streaming_lines(summary.streaming, _table)
    out += pause_lines(summary.pauses, _table)
    out += _gpu_lines(summary)
    out += _refit_lines(summary)
    out += _staleness_lines(summary)
    out += _scheduler_lines(summary)
    out += _waste_lines(summary)
    out += _handover_lines(summary)
    out += headroom_lines(summary.headroom, _table)
    if summary.dataplane:
        out += format_dataplane(summary.dataplane, _bytes, _table)

    if summary.ooms or summary.faults or summary.timeouts:
        out.append("")
        out.append("Faults")
        out += [line for _, _, line in sorted(_fault_lines(summary))]
    return "\n".join(out) + "\n"


def _run_lines(summary: Summary) -> List[str]:
    """The title and the run's span, end, cluster and policy."""
    title = "rlharness simulation summary"
    if summary.scenario:
        title += f": {summary.scenario}"
    return [
        title,
        f"run {_s(summary.t_start)} s .. {_s(summary.t_end)} s ({_s(summary.duration_s)} s simulated), "
        f"end: {summary.end_reason or 'no sim_end'}; cluster {summary.nodes} node(s) x "
        f"{summary.gpus_per_node} GPU(s); scheduler policy {summary.policy}",
    ]


def _pipeline_lines(summary: Summary) -> List[str]:
    """The pipelines table: steps, time per kind of work, requests."""
    d = summary.duration_s
    out = ["", "Pipelines (time split: simulated seconds with any such work, % of the run; kinds overlap;"]
    out.append(
        "  refit s = weight sync, finalize and publish plus wake, sleep, abort and drain of its inference ranks)"
    )
    rows = []
    for p in summary.pipelines:
        rows.append(
            [
                p.pipeline_id,
                str(p.steps_done),
                _s(p.mean_step_s),
                _s(p.p95_step_s),
                _s(p.generate_s),
                _pct(p.generate_s, d),
                _s(p.train_s),
                _pct(p.train_s, d),
                _s(p.refit_s),
                _pct(p.refit_s, d),
                _s(p.waiting_s),
                _pct(p.waiting_s, d),
                str(p.requests_done),
                str(p.requests_aborted),
                str(p.requests_failed),
            ]
        )
    out += (
        _table(
            [
                "pipeline",
                "steps",
                "mean step s",
                "p95 step s",
                "generate s",
                "gen %",
                "train s",
                "train %",
                "refit s",
                "refit %",
                "waiting s",
                "wait %",
                "req done",
                "req abort",
                "req failed",
            ],
            rows,
            "lrrrrrrrrrrrrrr",
        )
        if rows
        else ["(no pipelines)"]
    )
    return out


def _gpu_lines(summary: Summary) -> List[str]:
    """The GPU utilization table, with a row for all GPUs together."""
    d = summary.duration_s
    out = ["", "GPU utilization (% of the run; train > refit > generate where they overlap)"]
    rows = []
    for g in summary.gpus:
        rows.append(
            [str(g.gpu), str(g.node), _pct(g.train_s, d), _pct(g.generate_s, d), _pct(g.refit_s, d), _pct(g.idle_s, d)]
        )
    if summary.gpus:
        n = len(summary.gpus)
        tot = [ordered_sum(getattr(g, f) for g in summary.gpus) for f in ("train_s", "generate_s", "refit_s", "idle_s")]
        rows.append(["all", "-"] + [_pct(x, d * n) for x in tot])
    out += _table(["gpu", "node", "train %", "generate %", "refit %", "idle %"], rows, "rrrrrr")
    return out


def _refit_lines(summary: Summary) -> List[str]:
    """The weight syncs table, per pipeline."""
    out = ["", "Refit (weight syncs only: total sync s = SyncFromCache time summed over syncs, so"]
    out.append("  concurrent syncs add up; the pipeline table's refit s is a union over time that also")
    out.append("  counts finalize, publish, wake, sleep and drain)")
    if summary.refit:
        rows = []
        for r in summary.refit:
            paths = ", ".join(f"{p}={n}" for p, n in r.syncs_by_path.items()) or "-"
            trans = ", ".join(f"{k}={_bytes(v)}" for k, v in r.bytes_by_transport.items()) or "-"
            rows.append(
                [r.pipeline_id, str(r.syncs), paths, _s(r.total_sync_s), _s(r.mean_sync_s), str(r.buckets), trans]
            )
        out += _table(
            ["pipeline", "syncs", "by path", "total sync s", "mean sync s", "buckets", "bytes by transport"],
            rows,
            "lrlrrrl",
        )
    else:
        out.append("(no weight syncs)")
    return out


def _staleness_lines(summary: Summary) -> List[str]:
    """The consumed trajectories' staleness histogram."""
    out = [""]
    total_traj = sum(summary.staleness.values())
    if total_traj:
        mean_age = sum(a * c for a, c in summary.staleness.items()) / total_traj
        out.append(f"Trajectory staleness ({total_traj} trajectories, mean age {mean_age:.3f} steps)")
        rows = [[str(a), str(c), _pct(c, total_traj)] for a, c in summary.staleness.items()]
        out += _table(["age (steps)", "trajectories", "%"], rows, "rrr")
    else:
        out.append("Trajectory staleness: (no batches consumed)")
    return out


def _scheduler_lines(summary: Summary) -> List[str]:
    """The scheduler's totals: cycles, resizes, signals, rejections, failures."""
    sc = summary.scheduler
    return ["", "Scheduler"] + _table(
        ["cycles", "shrinks", "shrunk dp ranks", "expands", "expanded dp ranks", "signals", "rejected", "failures"],
        [
            [
                str(sc.cycles),
                str(sc.shrink_ops),
                str(sc.shrink_dp_ranks),
                str(sc.expand_ops),
                str(sc.expand_dp_ranks),
                str(sc.signals),
                str(sc.rejected),
                str(sc.failures),
            ]
        ],
        "rrrrrrrr",
    )


def _handover_lines(summary: Summary) -> List[str]:
    """The first unclean GPU handovers and whether the first came before the first OOM."""
    if not summary.handovers:
        return []
    out = ["", f"GPU handovers with another cluster's memory still resident ({len(summary.handovers)})"]
    for h in summary.handovers[:5]:
        out.append(f"t={_s(h['t'])} s {h['message']}")
    if len(summary.handovers) > 5:
        out.append(f"... and {len(summary.handovers) - 5} more (violations.txt)")
    if summary.ooms and summary.first_oom_seq is not None:
        h, o = summary.handovers[0], summary.ooms[0]
        first = "before" if h["seq"] < summary.first_oom_seq else "after"
        out.append(
            f"the first unclean handover (t={_s(h['t'])} s, seq {h['seq']}) came {first} the first OOM "
            f"(t={_s(o['t'])} s, seq {summary.first_oom_seq}, GPU {o.get('gpu')})"
        )
    return out


def _fault_lines(summary: Summary) -> List[Tuple[float, int, str]]:
    """``(t, order, line)`` of every OOM, fault and timeout: the section reads in time
    order, with the log's order (OOMs, then faults, then timeouts) among equal times."""
    lines: List[Tuple[float, int, str]] = []
    for o in summary.ooms:
        where = (
            f"host RAM of node {o['node']}: {o['owner']}" if "node" in o else f"GPU {o['gpu']}: {o['owner']} {o['mem']}"
        )
        lines.append(
            (
                float(o["t"]),
                0,
                f"t={_s(o['t'])} s OOM on {where} requested "
                f"{o['requested']} with {o['used']} of {o['capacity']} bytes used",
            )
        )
    for f in summary.faults:
        step = "" if f.get("step") is None else f" step {f['step']}"
        lines.append((float(f["t"]), 1, f"t={_s(f['t'])} s fault {f['name']} fired in {f['pipeline_id']}{step}"))
    for x in summary.timeouts:
        lines.append(
            (
                float(x["t"]),
                2,
                f"t={_s(x['t'])} s timeout: {x['what']} of {x['pipeline_id']} waited since "
                f"t={_s(x['since'])} s, past its {x['limit_s']:g} s limit",
            )
        )
    return lines


def _waste_lines(summary: Summary) -> List[str]:
    """Scheduler waste (harness/logs/outputs/waste.py): expands that served nothing, resize time,
    idle GPU-time while a request waits."""
    w = summary.waste
    if not w.pipelines and not w.waiting_s:
        return []
    out = ["", "Scheduler waste (wasted expand: its ranks served no request before they were shrunk or the run ended)"]
    rows = [
        [
            p.pipeline_id,
            str(p.expands),
            str(p.wasted_expands),
            _pct(p.wasted_expands, p.expands),
            _s(p.expand_s),
            _s(p.shrink_s),
        ]
        for p in w.pipelines
    ]
    out += _table(["pipeline", "expands", "wasted", "wasted %", "expand s", "shrink s"], rows, "lrrrrr")
    gpus = summary.nodes * summary.gpus_per_node
    out.append(
        f"GPU-time idle while a GPU request waited: {_s(w.idle_gpu_s_while_waiting)} GPU-s "
        f"({_pct(w.idle_gpu_s_while_waiting, summary.duration_s * gpus)} of all GPU-time); "
        f"some request waited {_s(w.waiting_s)} s of the run"
    )
    if w.idle_gpu_s_while_waiting:
        out.append(
            "  by cause (docs/outputs.md): "
            + ", ".join(f"{cause} {_s(w.idle_by_cause.get(cause, 0.0))}" for cause in IDLE_CAUSES)
            + " GPU-s"
        )
    return out


def summary_json(summary: Summary) -> Dict[str, Any]:
    """The figures of :func:`format_summary` as a JSON-ready mapping (``summary.json``):
    the same numbers, unrounded, with the units in the key names (``_s`` simulated
    seconds, ``_pct`` percent of the run)."""
    d = summary.duration_s
    return {
        "scenario": summary.scenario,
        "policy": summary.policy,
        "time_unit": "simulated seconds",
        "run": {
            "start_s": summary.t_start,
            "end_s": summary.t_end,
            "simulated_s": d,
            "end": summary.end_reason,
            "nodes": summary.nodes,
            "gpus_per_node": summary.gpus_per_node,
        },
        # every field of the summary's dataclass (a figure added there lands here too),
        # plus each time's share of the run as printed
        "pipelines": [
            {
                **asdict(p),
                **{f"{k}_pct": _share(getattr(p, f"{k}_s"), d) for k in ("generate", "train", "refit", "waiting")},
            }
            for p in summary.pipelines
        ],
        "gpus": _gpus_json(summary),
        "gpus_all": _gpus_all_json(summary),
        "refit": [{**asdict(r), "syncs": r.syncs} for r in summary.refit],
        "staleness": _staleness_json(summary),
        "staleness_by_pipeline": {
            p: {str(a): c for a, c in ages.items()} for p, ages in summary.staleness_by_pipeline.items()
        },
        "scheduler": dict(vars(summary.scheduler)),
        "waste": {
            "pipelines": [asdict(p) for p in summary.waste.pipelines],
            "expands": summary.waste.expands,
            "wasted_expands": summary.waste.wasted_expands,
            "idle_gpu_s_while_waiting": summary.waste.idle_gpu_s_while_waiting,
            "waiting_s": summary.waste.waiting_s,
            "idle_gpu_s_by_cause": dict(summary.waste.idle_by_cause),
        },
        "faults": [{"t": t, "line": line} for t, _, line in sorted(_fault_lines(summary))],
        "ooms": summary.ooms,
        "memory_headroom": None if summary.headroom is None else summary.headroom.as_json(),
        "fault_hooks_fired": summary.faults,
        "timeouts": summary.timeouts,
        # sections other runtimes added (single controllers, data plane): every row whole
        "streaming": [asdict(r) for r in summary.streaming],
        "pauses": [asdict(r) for r in summary.pauses],
        "lost_work_by_pause_mode": lost_by_mode(summary.pauses),
        "dataplane": [asdict(h) for h in summary.dataplane],
    }


def _share(x: float, total: float) -> float:
    """``x`` as a percent of ``total`` (0 of nothing), unrounded: :func:`_pct`'s number."""
    return (100.0 * x / total) if total > 0 else 0.0


def _gpus_json(summary: Summary) -> List[Dict[str, Any]]:
    """Per GPU: its share of the run per kind of work, then the seconds."""
    d = summary.duration_s
    return [
        {
            "gpu": g.gpu,
            "node": g.node,
            "train_pct": _share(g.train_s, d),
            "generate_pct": _share(g.generate_s, d),
            "refit_pct": _share(g.refit_s, d),
            "idle_pct": _share(g.idle_s, d),
            "train_s": g.train_s,
            "generate_s": g.generate_s,
            "refit_s": g.refit_s,
            "idle_s": g.idle_s,
        }
        for g in summary.gpus
    ]


def _gpus_all_json(summary: Summary) -> Dict[str, float]:
    """All GPUs together: each kind's share of the run's GPU-time ({} without GPUs)."""
    n_gpus = len(summary.gpus)
    if not n_gpus:
        return {}
    return {
        f"{k}_pct": _share(ordered_sum(getattr(g, f"{k}_s") for g in summary.gpus), summary.duration_s * n_gpus)
        for k in ("train", "generate", "refit", "idle")
    }


def _staleness_json(summary: Summary) -> Dict[str, Any]:
    """The staleness histogram: trajectories, mean age, count and share per age."""
    return {
        "trajectories": sum(summary.staleness.values()),
        "mean_age_steps": (
            sum(a * c for a, c in summary.staleness.items()) / sum(summary.staleness.values())
            if summary.staleness
            else None
        ),
        "by_age": {str(age): count for age, count in summary.staleness.items()},
        "by_age_pct": {
            str(age): _share(count, sum(summary.staleness.values())) for age, count in summary.staleness.items()
        },
    }
