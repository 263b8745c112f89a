"""A run's event log and what its outputs derive from it, each derived once.

The summary, the Perfetto trace and the PNG timeline each need the run's bounds, GPUs,
effect and rank intervals, GPU slices and lanes. Given a :class:`RunView` instead of the
records, the outputs of one run share one derivation (a 1024-GPU run's log has over a
million records), and one pass over the log (:class:`_LogIndex`) answers what each of
them used to walk the whole log for.
"""

from __future__ import annotations

import math
from functools import cached_property
from itertools import chain, compress, islice
from operator import itemgetter
from typing import AbstractSet, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from harness.logs.outputs.intervals import EffectInterval, GpuSlice, RankInterval, _header, cluster_shape, scenario_name
from harness.logs.outputs.lanes import _greedy_lanes
from harness.logs.outputs.slice_columns import SliceColumns, slice_columns_of


class RunView:
    """A log and what the outputs derive from it, each derived once, on first use.

    The summary, the Perfetto trace and the PNG each need the run's bounds, GPUs, effect
    and rank intervals and GPU slices; given a view instead of the records, the three
    outputs of one run share one derivation instead of repeating it (a 1024-GPU run's
    log has over a million records). Treat the records as frozen once viewed.
    """

    def __init__(self, records: Sequence[Mapping[str, Any]]) -> None:
        _header(records)
        self.records = records

    @cached_property
    def _index(self) -> "_LogIndex":
        return _LogIndex(self.records)

    def with_seqs(self, want: AbstractSet[Any]) -> List[Mapping[str, Any]]:
        """The records that have a ``seq`` in ``want``, in log order (from the shared pass)."""
        records = self.records
        return [r for r in map(records.__getitem__, self._index.positions_of_seqs(want)) if "seq" in r]

    def of(self, *kinds: str) -> Sequence[Mapping[str, Any]]:
        """The records of these kinds, in log order (from one pass over the log, shared:
        most outputs read a few thousand scheduler records of a million-record log)."""
        return self._index.of(kinds)

    @cached_property
    def bounds(self) -> Tuple[float, float]:
        """:func:`run_bounds`, from the shared pass."""
        t0 = float(self.records[0].get("t", 0.0))
        t1 = max(t0, self._index.t_max if self._index.t_max is not None else t0)
        for r in self.of("sim_end"):
            t1 = max(t1, float(r.get("sim_time", t1)))
        return t0, t1

    @cached_property
    def shape(self) -> Tuple[int, int]:
        return cluster_shape(self.records)

    @cached_property
    def gpus(self) -> List[int]:
        """:func:`all_gpus`, from the shared pass."""
        nodes, gpn = self.shape
        ids = set(range(nodes * gpn)) | self._index.gpu_ids
        for kind in ("oom", "vram"):  # (the header is neither)
            ids |= {g for r in self.of(kind) if isinstance(g := r.get("gpu"), int)}
        return sorted(ids)

    @cached_property
    def pipeline_ids(self) -> List[str]:
        """Every pipeline id a record after the header names, sorted."""
        return sorted(self._index.pipeline_ids)

    @cached_property
    def scenario(self) -> Optional[str]:
        return scenario_name(self.records)

    def derived(self, name: str) -> Any:
        """The table ``name`` of :data:`harness.logs.outputs.derived.DERIVED` (effect and rank
        intervals, request counts, pause rows, scheduler waste), made once, on first use."""
        made = self.__dict__.setdefault("_derived", {})
        if name not in made:
            from harness.logs.outputs.derived import DERIVED  # (its tables import this module's neighbours)

            fn, kinds = DERIVED[name]
            made[name] = fn(self.of(*kinds), lambda: self.bounds[1])
        return made[name]

    @cached_property
    def effects(self) -> List[EffectInterval]:
        return self.derived("effects")

    @cached_property
    def ranks(self) -> List[RankInterval]:
        return self.derived("ranks")

    @cached_property
    def slice_columns(self) -> SliceColumns:
        """The GPU slices (every kind) as columns: what the summary, trace and picture read."""
        return slice_columns_of(self.effects, self.ranks)

    @cached_property
    def work_columns(self) -> SliceColumns:
        """:attr:`slice_columns` without kind "other" (the same order)."""
        columns = self.slice_columns
        if "other" not in columns.kind:
            return columns
        return columns.where([kind != "other" for kind in columns.kind])

    @cached_property
    def slices(self) -> List[GpuSlice]:
        """:func:`gpu_slices` with every kind (objects built from :attr:`slice_columns`)."""
        return self.slice_columns.objects()

    @cached_property
    def work_slices(self) -> List[GpuSlice]:
        """:func:`gpu_slices` without kind "other" (the same order: a filtered sorted list)."""
        return [s for s in self.slices if s.kind != "other"]

    @cached_property
    def lanes(self) -> List[int]:
        """:func:`assign_lanes` of :attr:`slices` (the Perfetto trace's tracks)."""
        return self._lane_sets[0]

    @cached_property
    def work_lanes(self) -> List[int]:
        """:func:`assign_lanes` of :attr:`work_slices` (the timeline's lanes)."""
        return self._lane_sets[1]

    @cached_property
    def _lane_sets(self) -> Tuple[List[int], List[int]]:
        """Both lane assignments from one sort: the work slices, a subsequence of the
        slices, are in the same relative order when only they are sorted."""
        columns = self.slice_columns
        gpus, starts, ends = columns.gpu, columns.start, columns.end
        order = columns.lane_order()
        lanes = _greedy_lanes(gpus, starts, ends, order)
        if "other" not in columns.kind:
            return lanes, lanes
        # the work slices visited in the same order, on the full columns (no copy of the
        # columns without "other": only the picture reads those), their lanes kept
        is_work = [kind != "other" for kind in columns.kind]
        work_lanes = _greedy_lanes(gpus, starts, ends, [i for i in order if is_work[i]])
        return lanes, list(compress(work_lanes, is_work))


Log = Union[Sequence[Mapping[str, Any]], RunView]


class _LogIndex:
    """One pass over a log: its records by kind (with their positions, to merge kinds
    back into log order), each record's ``seq``, the latest ``t``, and the GPU ids
    (``gpus`` lists) and pipeline ids named after the header — what :func:`run_bounds`, :func:`all_gpus` and the
    summary's pipeline list each walked the whole log for."""

    def __init__(self, records: Sequence[Mapping[str, Any]]) -> None:
        # one walk of the log reads every field the index keeps (each record is touched
        # once: on a million-record log the walks, not their bodies, are the cost)
        self.records = records
        t0 = records[0].get("t", 0.0) if records else 0.0
        rows = [(r.get("kind"), r.get("t", t0), r.get("pipeline_id"), r.get("gpus"), r.get("seq")) for r in records]
        self.seqs: Tuple[Any, ...]
        kinds, times, pids, gpus, self.seqs = zip(*rows) if rows else ((), (), (), (), ())
        del rows
        # group the positions by kind with numpy (a stable sort of each record's kind
        # code), then take each kind's records: no Python loop body per record
        code_of: Dict[Any, int] = {}
        codes = np.array([code_of.setdefault(kind, len(code_of)) for kind in kinds], dtype=np.int64)
        order = np.argsort(codes, kind="stable")
        ends = np.cumsum(np.bincount(codes, minlength=len(code_of))).tolist()
        self.by_kind: Dict[Any, Tuple[List[Mapping[str, Any]], np.ndarray]] = {}
        for kind, code in code_of.items():
            positions = order[(ends[code - 1] if code else 0) : ends[code]]
            at = positions.tolist()
            self.by_kind[kind] = (
                list(itemgetter(*at)(records)) if len(at) > 1 else [records[i] for i in at],
                positions,
            )
        self.t_max: Optional[float] = None
        if times:
            try:  # numpy reads a list of floats at C speed; float() decides anything else (and NaN)
                latest = float(np.array(times, dtype=float).max())
            except (TypeError, ValueError, OverflowError):
                latest = math.nan
            self.t_max = latest if latest == latest else max(map(float, times))
        self.gpu_ids = _int_ids([gs for gs in islice(gpus, 1, None) if gs])
        try:
            named = set(islice(pids, 1, None))
        except TypeError:  # an unhashable pipeline id: not a str, so not one
            named = {p for p in islice(pids, 1, None) if isinstance(p, str)}
        self.pipeline_ids = {p for p in named if isinstance(p, str)}

    def positions_of_seqs(self, want: AbstractSet[Any]) -> List[int]:
        """The positions, in log order, of the records whose ``seq`` (``None`` where a
        record has none) is in ``want``."""
        return [i for i, s in enumerate(self.seqs) if s in want]

    def of(self, kinds: Sequence[str]) -> Sequence[Mapping[str, Any]]:
        parts = [self.by_kind[k] for k in dict.fromkeys(kinds) if k in self.by_kind]
        if not parts:
            return []
        if len(parts) == 1:
            return parts[0][0]
        # the kinds' positions (each kind's ascending, no two alike) merged into log order,
        # and the records at them taken at C speed
        positions = np.sort(np.concatenate([positions for _, positions in parts])).tolist()
        return list(itemgetter(*positions)(self.records))


def _int_ids(lists: List[Sequence[Any]]) -> set:
    """The ints named in ``lists``: one set() of all of them at C speed when every entry
    is a plain int (a log's ``gpus`` lists), else entry by entry (a float 1.0 must not
    stand in for the GPU 1 it equals, nor an unhashable entry stop the walk)."""
    try:
        named = set(chain.from_iterable(lists))
    except TypeError:
        named = None
    if named is not None and all(type(g) is int for g in named):
        return named
    return {g for gs in lists for g in gs if isinstance(g, int)}


def as_view(log: Log) -> RunView:
    """The view of ``log``: itself if it is one, else a new view of the records."""
    return log if isinstance(log, RunView) else RunView(log)
