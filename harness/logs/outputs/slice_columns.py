"""A run's GPU slices as columns: one list per field, in slice order.

A 1024-GPU run has about 380 thousand slices. As :class:`GpuSlice` objects they were
built once (~0.25 s) and then taken apart again by every output — the slice sort, both
lane assignments, the summary's per-GPU split, the trace's timestamps and the picture's
bars each pulled a few fields out of every object (``[s.start for s in slices]``, about
twenty such passes, over 1 CPU s together). Here the slices are born as columns, sorted
as columns, and read as columns; the objects are built only for a caller that asks for
them (:attr:`RunView.slices <harness.logs.outputs.run_view.RunView.slices>`, small logs).
"""

from __future__ import annotations

from itertools import compress
from typing import Any, Dict, List, Sequence

from harness.logs.outputs.canonical_order import column_order
from harness.logs.outputs.intervals import EffectInterval, GpuSlice, RankInterval, effect_label, new_slice
from harness.logs.outputs.lanes import _greedy_lanes

SLICE_FIELDS = ("gpu", "start", "end", "kind", "pipeline_id", "label", "args", "seq")


class SliceColumns:
    """GPU slices as one list per :class:`GpuSlice` field (slice ``i`` is the ``i``-th
    entry of every list)."""

    __slots__ = SLICE_FIELDS

    def __init__(
        self,
        gpu: List[Any],
        start: List[float],
        end: List[float],
        kind: List[str],
        pipeline_id: List[str],
        label: List[str],
        args: List[Dict[str, Any]],
        seq: List[int],
    ) -> None:
        self.gpu, self.start, self.end, self.kind = gpu, start, end, kind
        self.pipeline_id, self.label, self.args, self.seq = pipeline_id, label, args, seq

    def columns(self) -> List[List[Any]]:
        """The lists in :data:`SLICE_FIELDS` order."""
        return [self.gpu, self.start, self.end, self.kind, self.pipeline_id, self.label, self.args, self.seq]

    def __len__(self) -> int:
        return len(self.gpu)

    def take(self, order: Sequence[int]) -> "SliceColumns":
        """The slices at the positions ``order``, in that order."""
        return SliceColumns(*(list(map(column.__getitem__, order)) for column in self.columns()))

    def where(self, keep: Sequence[bool]) -> "SliceColumns":
        """The slices whose ``keep`` is true, in their order."""
        return SliceColumns(*(list(compress(column, keep)) for column in self.columns()))

    def objects(self) -> List[GpuSlice]:
        """The slices as :class:`GpuSlice` objects, in order."""
        return list(map(new_slice, *self.columns()))

    def slice_order(self) -> List[int]:
        """The positions in :meth:`GpuSlice.sort_key` order: (gpu, start, longest first,
        seq, label, canonical args), as :func:`harness.logs.outputs.intervals.sort_slices`."""
        return column_order(
            [self.gpu, self.start, [s - e for s, e in zip(self.start, self.end)], self.seq],
            lambda i: (self.label[i],),
            self.args.__getitem__,
        )

    def lane_order(self) -> List[int]:
        """The positions in the lane assignment's order: (gpu, start, end, seq, label,
        canonical args), as :func:`harness.logs.outputs.lanes.assign_lanes`."""
        return column_order(
            [self.gpu, self.start, self.end, self.seq], lambda i: (self.label[i],), self.args.__getitem__
        )

    def lanes(self) -> List[int]:
        """:func:`harness.logs.outputs.lanes.assign_lanes` of these slices."""
        return _greedy_lanes(self.gpu, self.start, self.end, self.lane_order())


def slice_columns_of(
    effects: Sequence[EffectInterval], ranks: Sequence[RankInterval], *, include_other: bool = True
) -> SliceColumns:
    """:func:`harness.logs.outputs.intervals.slices_of` as columns: one slice per GPU of
    every effect, then of every routable rank interval, sorted (the same slices, fields
    and order)."""
    rows: List[tuple] = []
    add = rows.extend
    for iv in effects:
        kind = iv.kind
        if kind == "other" and not include_other:
            continue
        args = {
            "pipeline_id": iv.pipeline_id,
            "effect": iv.effect,
            "args": iv.args,
            "scope": iv.scope,
            "step": iv.step,
            "cycle": iv.cycle,
            "gpus": list(iv.gpus),
        }
        if iv.open:
            args["open"] = True
        if iv.error is not None:
            args["error"] = iv.error
        label = effect_label(iv)
        start, end, pid, seq = iv.start, iv.end, iv.pipeline_id, iv.seq
        add([(g, start, end, kind, pid, label, args, seq) for g in iv.gpus])
    for rv in ranks:
        args = {"pipeline_id": rv.pipeline_id, "dp_rank": rv.dp_rank, "version": rv.version, "gpus": list(rv.gpus)}
        if rv.open:
            args["open"] = True
        label = f"generate {rv.pipeline_id} dp{rv.dp_rank}"
        start, end, pid, seq = rv.start, rv.end, rv.pipeline_id, rv.seq
        add([(g, start, end, "generate", pid, label, args, seq) for g in rv.gpus])
    if not rows:
        return SliceColumns(*([] for _ in SLICE_FIELDS))
    unsorted = SliceColumns(*(list(column) for column in zip(*rows)))
    del rows
    return unsorted.take(unsorted.slice_order())
