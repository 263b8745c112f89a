"""Rows of a large timeline: one per GPU up to a limit, then one per node (or group of nodes).

Up to :data:`DETAIL_GPUS` GPUs the timeline draws every bar as a polygon, hatched and
labelled by pipeline. Beyond that a picture of one row per GPU was unreadable (1024 rows
two pixels high) and its cost grew with the bars, so:

* up to :data:`ROW_LIMIT` GPUs: one row per GPU;
* beyond: one row per node, or per group of whole nodes so that at most
  :data:`ROW_LIMIT` rows are drawn (a row of ``n`` GPUs shows each pixel's mix of what
  its GPUs do, opaque as far as they are busy: a row half its GPUs idle is half
  transparent);

and each row is two bands: the top quarter is coloured by *pipeline* (so pipelines can be
told apart without hatching), the rest by *kind of work*. Both are computed one pixel per
row, then stretched to the row's height (:func:`row_image`): the work is a few passes
over the bars in numpy plus a few over ``rows x width`` pixels per kind or pipeline —
bounded by the picture's pixels, not by the log's records.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from harness.logs.outputs.timeline_raster import bar_image

#: up to this many GPUs: one polygon row per GPU, hatched and labelled by pipeline
DETAIL_GPUS = 32
#: beyond DETAIL_GPUS: at most this many rows (one per GPU, else per node or nodes)
ROW_LIMIT = 128
#: the share of a row's height given to the pipeline band (the top of the row)
PIPELINE_BAND = 0.25


def pipeline_colours(n: int) -> List[Tuple[float, float, float]]:
    """``n`` colours for pipelines: matplotlib's pastel palettes (Pastel1, Pastel2,
    Set3; 29 colours, then again), which the saturated kind colours (tab10's) are not
    mistaken for."""
    from matplotlib import colormaps

    base = [c[:3] for name in ("Pastel1", "Pastel2", "Set3") for c in colormaps[name].colors]  # type: ignore[attr-defined]  # qualitative: listed
    return [tuple(base[i % len(base)]) for i in range(n)]


#: most pipelines a legend lists by colour
MAX_LEGEND_PIPELINES = 40


def pipeline_handles(pipelines: Sequence[str]) -> list:
    """Legend entries of the pipeline band: a title line, then each pipeline's colour."""
    from matplotlib.patches import Patch

    shown = list(pipelines[:MAX_LEGEND_PIPELINES])
    handles = [Patch(facecolor="none", edgecolor="none", label="pipeline (top of row):")]
    handles += [
        Patch(facecolor=c, edgecolor="black", linewidth=0.3, label=p)
        for p, c in zip(shown, pipeline_colours(len(pipelines)))
    ]
    if len(pipelines) > len(shown):
        handles.append(Patch(facecolor="none", edgecolor="none", label=f"... {len(pipelines) - len(shown)} more"))
    return handles


def row_layout(gpus: Sequence[int], gpus_per_node: int) -> Tuple[Dict[int, int], List[str], np.ndarray]:
    """(GPU -> row, row labels, GPUs per row) for a picture past :data:`DETAIL_GPUS`."""
    gpn = max(gpus_per_node, 1)
    if len(gpus) <= ROW_LIMIT:
        return (
            {g: i for i, g in enumerate(gpus)},
            [f"GPU {g} (node {g // gpn})" for g in gpus],
            np.ones(len(gpus), dtype=np.int64),
        )
    nodes = sorted({g // gpn for g in gpus})
    per_row = -(-len(nodes) // ROW_LIMIT)  # whole nodes per row
    row_of_node = {n: i // per_row for i, n in enumerate(nodes)}
    row_of = {g: row_of_node[g // gpn] for g in gpus}
    n_rows = max(row_of.values()) + 1
    members = np.bincount(np.fromiter(row_of.values(), dtype=np.int64), minlength=n_rows)
    labels = []
    for r in range(n_rows):
        mine = nodes[r * per_row : (r + 1) * per_row]
        labels.append(f"node {mine[0]}" if len(mine) == 1 else f"nodes {mine[0]}-{mine[-1]}")
    return row_of, labels, members


def row_image(
    x0: np.ndarray,
    x1: np.ndarray,
    y0: np.ndarray,
    y1: np.ndarray,
    rows: np.ndarray,
    members: np.ndarray,
    kind_codes: np.ndarray,
    kind_colours: Sequence[Tuple[float, ...]],
    pipe_codes: np.ndarray,
    pipe_colours: Sequence[Tuple[float, ...]],
    width: int,
    height: int,
    sub_rows: int = 1,
) -> np.ndarray:
    """(height, width, 4) RGBA of the rows: bar i spans [x0[i], x1[i]) pixels and
    [y0[i], y1[i]) rows (its lane's band inside row ``rows[i]``), weighted
    1/``members[row]``. The top :data:`PIPELINE_BAND` of each row mixes the pipelines'
    colours over the whole row, the rest the kinds' at ``sub_rows`` bands per row (the
    lanes of overlapping work on one GPU); each pixel's colour is the coverage-weighted
    mix, its opacity the busy share of the row's GPUs."""
    n_rows = len(members)
    weight = 1.0 / members[rows]
    whole = rows.astype(float)
    kinds = bar_image(x0, x1, y0 * sub_rows, y1 * sub_rows, kind_codes, kind_colours, width, n_rows * sub_rows, weight)
    pipes = bar_image(x0, x1, whole, whole + 1, pipe_codes, pipe_colours, width, n_rows, weight)
    centre = (np.arange(height) + 0.5) * n_rows / max(height, 1)
    row = np.minimum(centre.astype(np.int64), n_rows - 1)
    within = centre - row
    sub = np.minimum((centre * sub_rows).astype(np.int64), n_rows * sub_rows - 1)
    image = np.where((within < PIPELINE_BAND)[:, None, None], pipes[row], kinds[sub])
    if height >= 4 * n_rows:  # rows of four pixels or more: a clear line between them
        image[within > 1 - n_rows / height] = 0
    return image
