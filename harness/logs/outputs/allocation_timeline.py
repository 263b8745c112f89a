"""The allocation timeline: which cluster holds each GPU over time, by priority.

A log with only scheduler records (a ``rlharness replay --out`` decision log, an RLix
trace imported with ``rlharness import rlix-log`` and replayed) has no work intervals,
so the work timeline (:mod:`.timeline`) would draw empty axes. What such a log does
say is who held which GPU when: the scheduler's committed plans and releases. This
module rebuilds that from the decision records alone, with the oracle's own walk
(:class:`harness.logs.invariants.allocations.DecisionWalk`: a plan applied at its commit, a
``released`` record frees), and draws it: rows are GPUs (or nodes, past
:data:`.timeline_rows.DETAIL_GPUS`, as in the work timeline), each bar one cluster's
hold of one GPU, coloured by the priority of its allocation, the row's top band
coloured by pipeline, and the cluster named on bars wide enough to hold its name.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from harness.logs.invariants.allocations import DecisionWalk, pipeline_of
from harness.logs.outputs.timeline_rows import (
    DETAIL_GPUS,
    PIPELINE_BAND,
    pipeline_colours,
    pipeline_handles,
    row_image,
    row_layout,
)

#: RLix priority -> colour (served first at the top of the legend)
PRIORITY_STYLE: Dict[str, str] = {
    "INITIALIZATION": "#7f7f7f",
    "ACTOR_TRAINING": "#1f77b4",
    "CRITIC_TRAINING": "#17becf",
    "OLD_LOG_PROBS": "#9467bd",
    "REF_LOG_PROBS": "#e377c2",
    "VALUE_COMPUTE": "#8c564b",
    "GENERATION": "#2ca02c",
}
#: the kinds that make a log drawable here
DECISION_KINDS = ("plan", "commit")
#: most hold boundaries drawn as lines (past it, rows are too dense for them to show)
MAX_BOUNDARIES = 5000
#: most cluster names written on bars (text is the costly part of a picture)
MAX_BAR_LABELS = 200


class Hold(NamedTuple):
    gpu: int
    start: float
    end: float
    cluster: str
    priority: str


class _HoldWalk(DecisionWalk):
    """The oracle's decision walk, closing and opening holds after every commit or release."""

    def __init__(self, records: Sequence[Mapping[str, Any]]) -> None:
        super().__init__(records)
        self.open: Dict[int, Tuple[str, str, float]] = {}
        self.holds: List[Hold] = []
        self._changed_at: Optional[float] = None

    def on_record(self, r: Mapping[str, Any]) -> None:
        if self._changed_at is not None:  # the previous record changed the holdings
            self._sync(self._changed_at)
        self._changed_at = float(r.get("t", 0.0)) if r["kind"] in ("commit", "released") else None

    def _sync(self, t: float) -> None:
        owner, priority = self.h.owner, self.h.priority
        for g, (cluster, prio, start) in list(self.open.items()):
            if owner.get(g) != cluster or priority.get(cluster, "GENERATION") != prio:
                self.holds.append(Hold(g, start, t, cluster, prio))
                del self.open[g]
        for g, cluster in owner.items():
            if g not in self.open:
                self.open[g] = (cluster, priority.get(cluster, "GENERATION"), t)

    def finish(self, t_end: float) -> List[Hold]:
        if self._changed_at is not None:
            self._sync(self._changed_at)
        for g, (cluster, prio, start) in sorted(self.open.items()):
            self.holds.append(Hold(g, start, max(t_end, start), cluster, prio))
        self.open.clear()
        return sorted(self.holds)


def has_decisions(records: Sequence[Mapping[str, Any]]) -> bool:
    return any(r.get("kind") in DECISION_KINDS for r in records)


def allocation_holds(records: Sequence[Mapping[str, Any]]) -> List[Hold]:
    """Every (GPU, start, end, cluster, priority) hold the decision records make."""
    walk = _HoldWalk(records)
    walk.run()
    t_end = max((float(r.get("t", 0.0)) for r in records), default=0.0)
    return walk.finish(t_end)


def _short(cluster: str) -> str:
    pid = pipeline_of(cluster)
    return f"{pid} {cluster[len(pid) + 1 :].replace('actor_', '')}"


def render_allocation_png(
    records: Sequence[Mapping[str, Any]],
    *,
    title: str,
    time_label: str,
    width_in: float = 12.0,
    row_height_in: float = 0.45,
    dpi: int = 100,
) -> bytes:
    """PNG bytes of the allocation timeline of ``records`` (decision records, header first)."""
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from harness.logs.outputs.timeline import _LEFT_IN, _RIGHT_IN, _BOTTOM_IN, _TOP_IN, _composite_png, _row_height

    holds = allocation_holds(records)
    cluster = records[0].get("cluster", {}) if records else {}
    gpn = int(cluster.get("gpus_per_node", 1) or 1)
    gpus = sorted(set(range(int(cluster.get("nodes", 0)) * gpn)) | {h.gpu for h in holds})
    if len(gpus) <= DETAIL_GPUS:
        row_of = {g: i for i, g in enumerate(gpus)}
        labels = [f"GPU {g} (node {g // gpn})" for g in gpus]
        members = np.ones(len(gpus), dtype=np.int64)
    else:
        row_of, labels, members = row_layout(gpus, gpn)
    n_rows = len(labels)
    t0 = float(records[0].get("t", 0.0)) if records else 0.0
    t1 = max([t0 + 1.0] + [h.end for h in holds])
    priorities = [p for p in PRIORITY_STYLE if any(h.priority == p for h in holds)]
    pipelines = sorted({pipeline_of(h.cluster) for h in holds})
    entries = len(priorities) + min(len(pipelines), 41) + 1
    plot_h = max(n_rows * _row_height(n_rows, row_height_in), 0.22 * entries, 1.5)
    w_in, h_in = width_in, plot_h + _TOP_IN + _BOTTOM_IN
    with matplotlib.style.context("default"), matplotlib.rc_context({"font.family": "DejaVu Sans", "font.size": 8}):
        fig = Figure(figsize=(w_in, h_in), dpi=dpi)
        FigureCanvasAgg(fig)
        fig.subplots_adjust(
            left=_LEFT_IN / w_in, right=1 - _RIGHT_IN / w_in, top=1 - _TOP_IN / h_in, bottom=_BOTTOM_IN / h_in
        )
        ax = fig.add_subplot(1, 1, 1)
        ax.set_xlim(t0, t1)
        ax.set_ylim(n_rows, 0)
        row_px = plot_h * dpi / max(n_rows, 1)
        every = max(1, -(-12 // max(int(row_px), 1)))
        ax.set_yticks([i + 0.5 for i in range(0, n_rows, every)])
        ax.set_yticklabels(labels[::every])
        ax.set_xlabel(time_label)
        ax.set_title(title)
        image = _bars(ax, holds, row_of, members, priorities, pipelines, (t0, t1))
        if n_rows == len(gpus) and len(holds) <= MAX_BOUNDARIES:  # where one hold ends and the next begins
            from matplotlib.collections import LineCollection

            ends = [[(h.end, row_of[h.gpu]), (h.end, row_of[h.gpu] + 1)] for h in holds]
            ax.add_collection(LineCollection(ends, colors="white", linewidths=1.5, zorder=3))
        if n_rows == len(gpus):  # one row per GPU: name the cluster on bars wide enough
            wide = [h for h in holds if h.end - h.start >= 0.12 * (t1 - t0)][:MAX_BAR_LABELS]
            for h in wide:
                ax.text(
                    (h.start + h.end) / 2,
                    row_of[h.gpu] + 0.5 + PIPELINE_BAND / 2,
                    _short(h.cluster),
                    ha="center",
                    va="center",
                    fontsize=6,
                    clip_on=True,
                )
        handles: List[Any] = [
            Patch(facecolor=PRIORITY_STYLE[p], edgecolor="black", linewidth=0.3, label=p) for p in priorities
        ]
        handles += pipeline_handles(pipelines)
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
        return _composite_png(fig, ax, image)


def _bars(
    ax: Any,
    holds: Sequence[Hold],
    row_of: Dict[int, int],
    members: np.ndarray,
    priorities: Sequence[str],
    pipelines: Sequence[str],
    span: Tuple[float, float],
) -> np.ndarray:
    box = ax.get_window_extent()
    width, height = round(box.width), round(box.height)
    t0, t1 = span
    to_px = width / (t1 - t0)
    order = list(PRIORITY_STYLE)
    start = np.array([h.start for h in holds], dtype=float)
    end = np.array([h.end for h in holds], dtype=float)
    rows = np.array([row_of[h.gpu] for h in holds], dtype=np.int64)
    codes = np.array(
        [order.index(h.priority) if h.priority in order else order.index("GENERATION") for h in holds], dtype=np.int64
    )
    pipe_of = {p: i for i, p in enumerate(pipelines)}
    pipes = np.array([pipe_of[pipeline_of(h.cluster)] for h in holds], dtype=np.int64)
    colours = [tuple(int(PRIORITY_STYLE[k][i : i + 2], 16) / 255 for i in (1, 3, 5)) for k in order]
    y0 = rows.astype(float)
    return row_image(
        (start - t0) * to_px,
        (end - t0) * to_px,
        y0,
        y0 + 1,
        rows,
        members,
        codes,
        colours,
        pipes,
        pipeline_colours(len(pipelines)),
        width,
        height,
    )


def write_allocation_png(records: Sequence[Mapping[str, Any]], path: str, **kw: Any) -> str:
    from harness.logs.writer import atomic_write

    return atomic_write(path, render_allocation_png(records, **kw))


__all__ = ["Hold", "allocation_holds", "has_decisions", "render_allocation_png", "write_allocation_png"]
