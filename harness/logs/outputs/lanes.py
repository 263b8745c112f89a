"""Lanes: where overlapping work on one GPU is drawn.

A GPU runs training, a weight sync and inference ranks at once; the Perfetto trace gives
each GPU as many tracks, and the PNG timeline as many rows, as its deepest overlap. The
assignment is greedy in a canonical order of the slices, so equal logs give equal lanes.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, List, Sequence

from harness.logs.outputs.canonical_order import column_order
from harness.logs.outputs.intervals import GpuSlice


def assign_lanes(slices: Sequence[GpuSlice]) -> List[int]:
    """Greedy lane per slice (same order as given): within each GPU, slices in (start, end,
    seq) order take the lowest lane whose previous slice has ended — interval partitioning,
    so a GPU gets as many lanes as its deepest overlap. Slices in one lane never overlap
    (touching is fine, so a zero-length slice shares the lane of the work it abuts)."""
    gpus, starts, ends = [s.gpu for s in slices], [s.start for s in slices], [s.end for s in slices]
    order = column_order(
        [gpus, starts, ends, [s.seq for s in slices]], lambda i: (slices[i].label,), lambda i: slices[i].args
    )  # then the label, the args
    return _greedy_lanes(gpus, starts, ends, order)


def _greedy_lanes(
    gpus: Sequence[Any], starts: Sequence[float], ends: Sequence[float], order: Sequence[int]
) -> List[int]:
    """The lanes of :func:`assign_lanes`, the slices (as columns) visited in ``order``."""
    lanes = [0] * len(gpus)
    lane_end: Dict[Any, List[float]] = defaultdict(list)
    for i in order:
        start = starts[i]
        busy = lane_end[gpus[i]]
        for lane, end in enumerate(busy):
            if end <= start:
                busy[lane] = ends[i]
                lanes[i] = lane
                break
        else:
            busy.append(ends[i])
            lanes[i] = len(busy) - 1
    return lanes
