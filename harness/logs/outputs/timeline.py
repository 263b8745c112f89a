"""A PNG timeline of a simulator run: one row per GPU, coloured bars by kind of work.

Rows are GPUs (top: GPU 0); work that overlaps on a GPU is split into lanes inside the
row with the same greedy assignment as the Perfetto trace. Colours give the kind
(train, generate, refit/sync, wake/sleep, waiting); hatching gives the pipeline (and
wide bars carry its name). OOMs are red crosses on their GPU, fired faults dotted red
lines, expired RLix timeouts dashed red lines. The x axis is simulated seconds; the
title names the scenario.

Rendering uses matplotlib's Agg canvas directly (no pyplot, no global backend switch)
under matplotlib's default style, with fixed size and dpi and no PNG "Software" tag, so
the same records always give the same bytes on one matplotlib/Pillow installation.
"""

from __future__ import annotations

import io
import os
from array import array
from collections import defaultdict
from itertools import compress
from typing import Any, Dict, List, Sequence, Tuple, Union

import numpy as np

from harness.logs.outputs.intervals import GpuSlice
from harness.logs.outputs.run_view import Log, as_view
from harness.logs.outputs.slice_columns import SliceColumns
from harness.logs.outputs.timeline_rows import (
    DETAIL_GPUS,
    MAX_LEGEND_PIPELINES,
    pipeline_colours,
    pipeline_handles,
    row_image,
    row_layout,
)

#: picture kind -> (legend label, colour), in legend order. Each phase has a colour of its
#: own (a wake and a sleep are different events; one colour for both hid which was which);
#: the legend lists only the kinds a picture draws.
KIND_STYLE: Dict[str, Tuple[str, str]] = {
    "train": ("train", "#1f77b4"),
    "generate": ("generate", "#2ca02c"),
    "sync": ("refit / sync", "#ff7f0e"),
    "wake": ("wake", "#9467bd"),
    "sleep": ("sleep", "#8c564b"),
    "drain": ("abort / drain", "#e377c2"),
    "waiting": ("waiting", "#c7c7c7"),
}
_WAKE_SLEEP_KIND = {"Wake": "wake", "Sleep": "sleep", "Abort": "drain", "Drain": "drain"}


def picture_kind(kind: str, label: str) -> str:
    """The picture's kind of a slice: the wake/sleep kind split by its effect."""
    if kind != "wake_sleep":
        return kind
    return _WAKE_SLEEP_KIND.get(label.split(" ", 1)[0].split("(", 1)[0], "wake")


def picture_kinds(slices: Sequence[GpuSlice]) -> List[str]:
    """:func:`picture_kind` of each slice (its label parsed once per distinct label)."""
    return _picture_kinds([s.kind for s in slices], [s.label for s in slices])


def _picture_kinds(kinds: Sequence[str], labels: Sequence[str]) -> List[str]:
    """:func:`picture_kinds` of slices given as their kind and label columns."""
    of_label: Dict[str, str] = {}

    def wake_sleep(label: str) -> str:
        kind = of_label.get(label)
        if kind is None:
            kind = of_label[label] = picture_kind("wake_sleep", label)
        return kind

    return [kind if kind != "wake_sleep" else wake_sleep(label) for kind, label in zip(kinds, labels)]


def legend_kinds(drawn: "set[str]") -> List[str]:
    """The kinds to list in the legend: those drawn, in :data:`KIND_STYLE` order."""
    return [k for k in KIND_STYLE if k in drawn]


PIPELINE_HATCHES = ("", "//", "\\\\", "xx", "..", "++", "oo", "**", "--", "||")

_LEFT_IN, _RIGHT_IN, _TOP_IN, _BOTTOM_IN = 1.3, 2.2, 0.5, 0.6
MAX_PLOT_IN = 20.0  # a big cluster is squeezed into this height instead of growing without end
#: most lanes (overlapping work on one GPU) a raster row splits into; more share the last
MAX_RASTER_LANES = 4


def time_label(view) -> str:
    """ "simulated time (s)" for a simulator's log, "time (s)" for a real run's (a gate,
    an RLix log, a replay of one): the header's ``source`` says which."""
    source = str(view.records[0].get("source", "")) if view.records else ""
    return "simulated time (s)" if source in ("simulator", "") else "time (s)"


def _row_height(n_rows: int, row_height_in: float) -> float:
    return min(row_height_in, MAX_PLOT_IN / max(n_rows, 1))


def timeline_size_px(
    log: Log, *, width_in: float = 12.0, row_height_in: float = 0.45, dpi: int = 100
) -> Tuple[int, int]:
    """(width, height) in pixels of the PNG :func:`write_timeline_png` writes for this log."""
    view = as_view(log)
    work = view.work_columns
    return _size_px(
        _n_rows(view.gpus, view.shape[1]),
        set(_picture_kinds(work.kind, work.label)),
        set(work.pipeline_id),
        width_in,
        row_height_in,
        dpi,
        len(view.gpus) > DETAIL_GPUS,
    )


def _n_rows(gpus: Sequence[int], gpn: int) -> int:
    return len(gpus) if len(gpus) <= DETAIL_GPUS else len(row_layout(gpus, gpn)[1])


def _size_px(
    n_rows: int,
    kinds: "set[str]",
    pipelines: "set[str]",
    width_in: float,
    row_height_in: float,
    dpi: int,
    dense: bool = False,
) -> Tuple[int, int]:
    # a dense picture's legend has a title line above its pipelines
    entries = len(legend_kinds(kinds)) + min(len(pipelines), MAX_LEGEND_PIPELINES + 1) + 2 + dense
    plot_h = max(n_rows * _row_height(n_rows, row_height_in), 0.22 * entries, 1.5)
    return round(width_in * dpi), round((plot_h + _TOP_IN + _BOTTOM_IN) * dpi)


#: matplotlib settings every picture is drawn under (with its default style): fixed, so
#: the same records give the same bytes whatever the user's matplotlibrc says
_RC: Any = {  # (matplotlib types its keys as literals)
    "svg.hashsalt": "rlharness-timeline",
    "font.family": "DejaVu Sans",
    "font.size": 8,
    "hatch.linewidth": 0.6,
    "savefig.facecolor": "white",
    "savefig.edgecolor": "white",
    "savefig.transparent": False,
    "path.simplify": False,
}


def render_timeline_png(log: Log, *, width_in: float = 12.0, row_height_in: float = 0.45, dpi: int = 100) -> bytes:
    """PNG bytes of the timeline of ``log`` (the records, header first, or a RunView)."""
    import matplotlib
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    view = as_view(log)
    t0, t1 = view.bounds
    if t1 <= t0:
        t1 = t0 + 1.0
    _, gpn = view.shape
    gpus = view.gpus
    dense = len(gpus) > DETAIL_GPUS
    if dense:  # one row per GPU up to ROW_LIMIT, then per node (timeline_rows)
        row_of, row_labels, members = row_layout(gpus, gpn)
    else:
        row_of = {g: i for i, g in enumerate(gpus)}
    n_rows = len(row_labels) if dense else len(gpus)
    slices = view.work_columns
    kinds = _picture_kinds(slices.kind, slices.label)
    pipelines = sorted(set(slices.pipeline_id))
    w_px, h_px = _size_px(n_rows, set(kinds), set(pipelines), width_in, row_height_in, dpi, dense)
    node_rows = dense and not bool((members == 1).all())  # a row mixes whole nodes: no lanes
    slices, kinds, lanes = _styled_slices(view, slices, kinds, node_rows)
    pipelines = sorted(set(slices.pipeline_id))
    hatch_of = {p: PIPELINE_HATCHES[i % len(PIPELINE_HATCHES)] for i, p in enumerate(pipelines)}
    ooms = list(view.of("oom"))
    faults = list(view.of("fault_fired"))
    timeouts = list(view.of("timeout"))

    w_in, h_in = w_px / dpi, h_px / dpi

    with matplotlib.style.context("default"), matplotlib.rc_context(_RC):
        fig = Figure(figsize=(w_in, h_in), dpi=dpi)
        FigureCanvasAgg(fig)
        fig.subplots_adjust(
            left=_LEFT_IN / w_in, right=1 - _RIGHT_IN / w_in, top=1 - _TOP_IN / h_in, bottom=_BOTTOM_IN / h_in
        )
        ax = fig.add_subplot(1, 1, 1)

        # a run that ends on a failure has its marker at the last instant: leave room for it
        ends_on_marker = any(float(r["t"]) >= t1 for r in ooms + faults + timeouts)
        x_max = t1 + 0.015 * (t1 - t0) if ends_on_marker else t1
        if dense:  # rows as one image, its cost bounded by its pixels
            drawn, bars = _bar_image(ax, slices, lanes, row_of, members, kinds, pipelines, (t0, t1), (t0, x_max))
        else:
            drawn = _draw_bar_polygons(ax, slices, lanes, row_of, kinds, hatch_of, pipelines, (t0, t1))
        _draw_markers(ax, row_of, ooms, faults, timeouts)

        ax.set_xlim(t0, x_max)
        ax.set_ylim(n_rows, 0)
        if dense:  # a label per row while they fit, else every k-th row's
            row_px = (h_px - (_TOP_IN + _BOTTOM_IN) * dpi) / n_rows
            every = max(1, -(-24 // max(int(row_px), 1)))  # labels at least 24 pixels apart
            _row_labels(ax, row_labels, every)
        else:
            _gpu_rows(ax, gpus, gpn)
        ax.set_xlabel(time_label(view))
        if not dense:  # (a raster picture's grid would be drawn over its bars)
            ax.grid(axis="x", color="#eeeeee", linewidth=0.5)
        ax.set_axisbelow(True)
        ax.set_title(f"{view.scenario or 'rlharness run'} - GPU timeline")
        handles = _legend_handles(drawn, dense, pipelines, hatch_of, (ooms, faults, timeouts))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)

        if dense:
            return _composite_png(fig, ax, bars)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def _styled_slices(
    view: Any, slices: SliceColumns, kinds: List[str], node_rows: bool
) -> Tuple[SliceColumns, List[str], Sequence[int]]:
    """The slices drawn (those of a kind :data:`KIND_STYLE` colours), their picture kinds
    and their lanes (none where a row holds whole nodes)."""
    if all(kind in KIND_STYLE for kind in set(kinds)):
        return slices, kinds, [] if node_rows else view.work_lanes  # the Perfetto trace's lanes too
    keep = [kind in KIND_STYLE for kind in kinds]
    slices = slices.where(keep)
    return slices, list(compress(kinds, keep)), [] if node_rows else slices.lanes()


def _draw_markers(ax: Any, row_of: Dict[int, int], ooms: List[Any], faults: List[Any], timeouts: List[Any]) -> None:
    """OOMs as red crosses on their GPU's row, fired faults and timeouts as red lines."""
    for r in ooms:
        g = r.get("gpu")
        if g in row_of:
            ax.plot(
                [float(r["t"])],
                [row_of[g] + 0.5],
                marker="x",
                color="red",
                markersize=9,
                markeredgewidth=2,
                linestyle="none",
                zorder=5,
            )
    for r in faults:
        ax.axvline(float(r["t"]), color="red", linestyle=":", linewidth=1.0, zorder=4)
    for r in timeouts:
        ax.axvline(float(r["t"]), color="red", linestyle="--", linewidth=1.0, zorder=4)


def _gpu_rows(ax: Any, gpus: Sequence[int], gpn: int) -> None:
    """A detailed picture's row labels (one per GPU) and the lines between rows."""
    ax.set_yticks([i + 0.5 for i in range(len(gpus))])
    ax.set_yticklabels([f"GPU {g} (node {g // gpn})" for g in gpus])
    for i in range(1, len(gpus)):
        ax.axhline(i, color="#dddddd", linewidth=0.5, zorder=0)


def _legend_handles(
    drawn: "set[str]", dense: bool, pipelines: List[str], hatch_of: Dict[str, str], marked: Tuple[List[Any], ...]
) -> List[Any]:
    """The legend: the kinds drawn, the pipelines (hatches, or a raster row's top band
    colours) and the markers the picture has (``marked``: its OOMs, faults, timeouts)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ooms, faults, timeouts = marked
    handles: List[Any] = [
        Patch(facecolor=KIND_STYLE[k][1], edgecolor="black", linewidth=0.3, label=KIND_STYLE[k][0])
        for k in legend_kinds(drawn)
    ]
    if not dense:
        handles += [
            Patch(
                facecolor="white",
                edgecolor="black",
                linewidth=0.3,
                hatch=hatch_of[p] or None,
                label=f"pipeline {p}",
            )
            for p in pipelines
        ]
    else:  # a raster row's top band is coloured by pipeline
        handles += pipeline_handles(pipelines)
    if ooms:
        handles.append(
            Line2D([], [], marker="x", color="red", markersize=8, markeredgewidth=2, linestyle="none", label="OOM")
        )
    if faults:
        handles.append(Line2D([], [], color="red", linestyle=":", label="fault fired"))
    if timeouts:
        handles.append(Line2D([], [], color="red", linestyle="--", label="RLix timeout"))
    return handles


def _composite_png(fig: Any, ax: Any, bars: np.ndarray) -> bytes:
    """PNG bytes of ``fig`` with the RGBA image ``bars`` laid under everything the axes
    draw (markers, lines, text) and over white, pixel for pixel in the axes' box.

    matplotlib's own image path (imshow, then Agg) masked and resampled the two-million
    pixel image of a 1024-GPU picture: most of the picture's cost. Here the figure is
    drawn with transparent backgrounds and the two layers are blended in numpy, then
    PIL encodes the result (no metadata: the same pixels give the same bytes)."""
    from PIL import Image

    fig.patch.set_alpha(0.0)
    ax.patch.set_alpha(0.0)
    canvas = fig.canvas
    canvas.draw()
    top_layer = np.asarray(canvas.buffer_rgba())
    height = top_layer.shape[0]
    box = ax.get_window_extent()
    x0, y0 = round(box.x0), height - round(box.y0) - bars.shape[0]
    out = np.full(top_layer.shape[:2] + (3,), 255, dtype=np.uint8)
    _blend(out[y0 : y0 + bars.shape[0], x0 : x0 + bars.shape[1]], bars)
    _blend(out, top_layer)
    buf = io.BytesIO()
    Image.fromarray(out, "RGB").save(buf, format="png", compress_level=3)
    return buf.getvalue()


def _draw_bar_polygons(
    ax: Any,
    slices: SliceColumns,
    lanes: Sequence[int],
    row_of: Dict[int, int],
    kinds: Sequence[str],
    hatch_of: Dict[str, str],
    pipelines: Sequence[str],
    span: Tuple[float, float],
) -> "set[str]":
    """The bars as polygons (hatched by pipeline, wide ones labelled), one PolyCollection
    per (kind, pipeline); returns the kinds drawn."""
    from matplotlib.collections import PolyCollection

    t0, t1 = span
    n_lanes: Dict[int, int] = defaultdict(lambda: 1)
    for gpu, lane in zip(slices.gpu, lanes):
        n_lanes[gpu] = max(n_lanes[gpu], lane + 1)
    # per (kind, pipeline): the bars' x0, x1, y0, y1 as packed doubles
    groups: Dict[Tuple[str, str], Tuple[array, ...]] = defaultdict(lambda: tuple(array("d") for _ in range(4)))
    labels: List[Tuple[float, float, str]] = []
    pad = 0.08
    for gpu, start, end, pipeline_id, lane, kind in zip(
        slices.gpu, slices.start, slices.end, slices.pipeline_id, lanes, kinds
    ):
        width = min(end, t1) - max(start, t0)
        if width <= 0:
            continue
        lane_h = (1 - 2 * pad) / n_lanes[gpu]
        y0 = row_of[gpu] + pad + lane * lane_h
        x0 = max(start, t0)
        xs0, xs1, ys0, ys1 = groups[(kind, pipeline_id)]
        xs0.append(x0)
        xs1.append(x0 + width)
        ys0.append(y0)
        ys1.append(y0 + lane_h)
        if len(pipelines) > 1 and width >= 0.08 * (t1 - t0):
            labels.append((x0 + width / 2, y0 + lane_h / 2, pipeline_id))
    for kind, pid in sorted(groups):
        ax.add_collection(
            PolyCollection(
                # one (n, 4, 2) array: matplotlib builds the closed paths in bulk from it
                _bar_vertices(*groups[(kind, pid)]),  # type: ignore[arg-type]
                facecolors=KIND_STYLE[kind][1],
                edgecolors="black",
                linewidths=0.3,
                hatch=hatch_of[pid] or None,
            )
        )
    for x, y, text in sorted(labels):
        ax.text(x, y, text, ha="center", va="center", fontsize=6, color="black", clip_on=True)
    return {kind for kind, _ in groups}


def _row_labels(ax: Any, labels: Sequence[str], every: int) -> None:
    """Every ``every``-th row's label left of the axes, as plain text: a matplotlib tick
    per row (two lines and two texts each) was most of a 64-GPU picture's cost."""
    from matplotlib.transforms import blended_transform_factory

    ax.set_yticks([])
    where = blended_transform_factory(ax.transAxes, ax.transData)
    for i in range(0, len(labels), every):
        ax.text(-0.008, i + 0.5, labels[i], transform=where, ha="right", va="center", fontsize=8)


def _blend(under: np.ndarray, over: np.ndarray) -> None:
    """``over`` (RGBA bytes) over ``under`` (RGB bytes), in place, in integers (exact,
    so the same layers give the same bytes); only the pixels ``over`` covers are touched
    (the axes' layer is mostly transparent)."""
    alpha = over[:, :, 3]
    opaque = alpha == 255
    under[opaque] = over[:, :, :3][opaque]
    part = (alpha > 0) & ~opaque
    if part.any():
        a = alpha[part].astype(np.uint32)[:, None]
        mixed = over[:, :, :3][part].astype(np.uint32) * a + under[part].astype(np.uint32) * (255 - a)
        under[part] = ((mixed + 127) // 255).astype(np.uint8)


def _bar_image(
    ax: Any,
    slices: SliceColumns,
    lanes: Sequence[int],
    row_of: Dict[int, int],
    members: np.ndarray,
    kinds: Sequence[str],
    pipelines: Sequence[str],
    span: Tuple[float, float],
    x_range: Tuple[float, float],
) -> Tuple["set[str]", np.ndarray]:
    """The bars of a large picture as one image the size of the axes in pixels
    (:func:`.timeline_rows.row_image`): per row a pipeline band and the kinds (a GPU's
    lanes as bands of its row, up to :data:`MAX_RASTER_LANES`; a node row mixes its
    GPUs), no outline, no hatching; returns the kinds drawn and the image (laid into
    the picture by :func:`_composite_png`)."""
    t0, t1 = span
    order = list(KIND_STYLE)
    code_of = {k: i for i, k in enumerate(order)}
    pipe_of = {p: i for i, p in enumerate(pipelines)}
    start = np.maximum(np.array(slices.start, dtype=float), t0)
    end = np.minimum(np.array(slices.end, dtype=float), t1)
    n = len(slices.gpu)  # (each column read straight into its array: no Python list of ints)
    row = np.fromiter(map(row_of.__getitem__, slices.gpu), dtype=np.int64, count=n)
    lane = (
        np.minimum(np.array(lanes, dtype=np.int64), MAX_RASTER_LANES - 1)
        if len(lanes)
        else np.zeros(len(row), np.int64)
    )
    codes = np.fromiter(map(code_of.__getitem__, kinds), dtype=np.int64, count=n)
    pipes = np.fromiter(map(pipe_of.__getitem__, slices.pipeline_id), dtype=np.int64, count=n)
    shown = end > start
    start, end, row, lane, codes, pipes = start[shown], end[shown], row[shown], lane[shown], codes[shown], pipes[shown]
    per_gpu = bool((members == 1).all())
    if per_gpu:  # a GPU's lanes: bands of its row below the pipeline band
        n_lanes = np.ones(len(members), dtype=np.int64)
        np.maximum.at(n_lanes, row, lane + 1)
        sub_rows = int(n_lanes.max()) if len(n_lanes) else 1
        lane_h = 1.0 / n_lanes[row]
        y0 = row + lane * lane_h
        y1 = y0 + lane_h
    else:  # a node row: its GPUs' work mixed over the whole row
        sub_rows, y0 = 1, row.astype(float)
        y1 = y0 + 1
    box = ax.get_window_extent()
    width, height = round(box.width), round(box.height)
    x_lo, x_hi = x_range
    to_px = width / (x_hi - x_lo)
    colours = [tuple(int(KIND_STYLE[k][1][i : i + 2], 16) / 255 for i in (1, 3, 5)) for k in order]
    image = row_image(
        (start - x_lo) * to_px,
        (end - x_lo) * to_px,
        y0,
        y1,
        row,
        members,
        codes,
        colours,
        pipes,
        pipeline_colours(len(pipelines)),
        width,
        height,
        sub_rows,
    )
    return {order[c] for c in np.unique(codes)}, image


def _bar_vertices(x0: array, x1: array, y0: array, y1: array) -> np.ndarray:
    """(n, 4, 2) corners of n bars, in the order (x0,y0) (x0,y1) (x1,y1) (x1,y0)."""
    xs0, xs1 = np.frombuffer(x0, dtype=float), np.frombuffer(x1, dtype=float)
    ys0, ys1 = np.frombuffer(y0, dtype=float), np.frombuffer(y1, dtype=float)
    verts = np.empty((len(xs0), 4, 2))
    verts[:, 0, 0] = verts[:, 1, 0] = xs0
    verts[:, 2, 0] = verts[:, 3, 0] = xs1
    verts[:, 0, 1] = verts[:, 3, 1] = ys0
    verts[:, 1, 1] = verts[:, 2, 1] = ys1
    return verts


def write_timeline_png(
    log: Log, path: Union[str, os.PathLike], *, width_in: float = 12.0, row_height_in: float = 0.45, dpi: int = 100
) -> str:
    """Render the timeline and write it to ``path`` atomically; returns the path."""
    data = render_timeline_png(log, width_in=width_in, row_height_in=row_height_in, dpi=dpi)
    from harness.logs.writer import atomic_write

    return atomic_write(os.fspath(path), data)
