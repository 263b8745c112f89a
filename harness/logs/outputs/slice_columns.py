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
        args: Sequence[Dict[str, Any]],
        seq: List[int],
    ) -> None:
        self.gpu, self.start, self.end, self.kind = gpu, start, end, kind
        self.pipeline_id, self.label, self.args, self.seq = pipeline_id, label, args, seq

    def columns(self) -> List[Any]:
        """The lists in :data:`SLICE_FIELDS` order."""
        return [self.gpu, self.start, self.end, self.kind, self.pipeline_id, self.label, self.args, self.seq]

    def __len__(self) -> int:
        return len(self.gpu)

    def take(self, order: Sequence[int]) -> "SliceColumns":
        """The slices at the positions ``order``, in that order."""
        return SliceColumns(*(_take(column, order) for column in self.columns()))

    def where(self, keep: Sequence[bool]) -> "SliceColumns":
        """The slices whose ``keep`` is true, in their order."""
        return SliceColumns(*(_where(column, keep) for column in self.columns()))

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


def _effect_args(iv: EffectInterval) -> Dict[str, Any]:
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
    return args


def _rank_args(rv: RankInterval) -> Dict[str, Any]:
    args = {"pipeline_id": rv.pipeline_id, "dp_rank": rv.dp_rank, "version": rv.version, "gpus": list(rv.gpus)}
    if rv.open:
        args["open"] = True
    return args


def slice_args(iv: Any) -> Dict[str, Any]:
    """The ``args`` of a slice drawn from the effect or rank interval ``iv``."""
    return _effect_args(iv) if type(iv) is EffectInterval else _rank_args(iv)


class SliceArgs(Sequence[Dict[str, Any]]):
    """The ``args`` column, each slice's dict built when it is read, from the interval
    the slice is drawn from: an interval's args dict (seven keys, its GPU list) held per
    interval for the whole run was most of the slices' memory on a large run, and only
    the trace's encoder and a sort's last tie-breaker read it. A read-only sequence."""

    __slots__ = ("sources",)

    def __init__(self, sources: List[Any]) -> None:
        self.sources = sources

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, i):  # (an index: the columns are read by position)
        return slice_args(self.sources[i])

    def __iter__(self):
        return map(slice_args, self.sources)

    def at(self, positions: Sequence[int]) -> List[Dict[str, Any]]:
        """The args at ``positions``, one dict per interval among them (its slices on
        several GPUs, written near one another, share it as they did when it was kept)."""
        made: Dict[int, Dict[str, Any]] = {}
        sources = self.sources
        out = []
        for i in positions:
            iv = sources[i]
            args = made.get(id(iv))
            if args is None:
                args = made[id(iv)] = slice_args(iv)
            out.append(args)
        return out


def args_at(column: Sequence[Dict[str, Any]], positions: Sequence[int]) -> List[Dict[str, Any]]:
    """``[column[i] for i in positions]`` of an args column (a list or :class:`SliceArgs`)."""
    if type(column) is SliceArgs:
        return column.at(positions)
    return [column[i] for i in positions]


def _take(column: Any, order: Sequence[int]) -> Any:
    if type(column) is SliceArgs:
        return SliceArgs(list(map(column.sources.__getitem__, order)))
    return list(map(column.__getitem__, order))


def _where(column: Any, keep: Sequence[bool]) -> Any:
    if type(column) is SliceArgs:
        return SliceArgs(list(compress(column.sources, keep)))
    return list(compress(column, keep))


def slice_columns_of(
    effects: Sequence[EffectInterval], ranks: Sequence[RankInterval], *, include_other: bool = True
) -> SliceColumns:
    """:func:`harness.logs.outputs.intervals.slices_of` as columns: one slice per GPU of
    every effect, then of every routable rank interval, sorted (the same slices, fields
    and order)."""
    unsorted = _unsorted_columns(effects, ranks, include_other)
    order = unsorted.slice_order()
    columns = unsorted.columns()
    del unsorted
    taken = []
    while columns:  # each column sorted then dropped: one column's copy at a time
        taken.append(_take(columns.pop(0), order))
    return SliceColumns(*taken)


def _unsorted_columns(
    effects: Sequence[EffectInterval], ranks: Sequence[RankInterval], include_other: bool
) -> SliceColumns:
    """The slices in interval order, each column filled an interval at a time (no row
    tuple per slice)."""
    gpu: List[Any] = []
    start: List[float] = []
    end: List[float] = []
    kind: List[str] = []
    pipeline_id: List[str] = []
    label: List[str] = []
    sources: List[Any] = []
    seq: List[int] = []

    def add(iv: Any, k: str, text: str) -> None:
        n = len(iv.gpus)
        if n:
            gpu.extend(iv.gpus)
            start.extend((iv.start,) * n)
            end.extend((iv.end,) * n)
            kind.extend((k,) * n)
            pipeline_id.extend((iv.pipeline_id,) * n)
            label.extend((text,) * n)
            sources.extend((iv,) * n)
            seq.extend((iv.seq,) * n)

    for iv in effects:
        k = iv.kind
        if k == "other" and not include_other:
            continue
        add(iv, k, effect_label(iv))
    for rv in ranks:
        add(rv, "generate", f"generate {rv.pipeline_id} dp{rv.dp_rank}")
    return SliceColumns(gpu, start, end, kind, pipeline_id, label, SliceArgs(sources), seq)
