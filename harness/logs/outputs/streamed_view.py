"""A :class:`~harness.logs.outputs.run_view.RunView` of a log read once, as it is made.

The summary, trace and picture read a run through its view. :class:`StreamedRunView` is
a :class:`~harness.logs.stream.StreamedLog` consumer that builds the same view
without the whole log: the bulk of a long run (request, VRAM, rank-state and effect
records) goes only into the one-pass tables of :mod:`harness.logs.outputs.derived`, each
built as the records arrive (:class:`~harness.logs.one_pass.OnePassRun`); the few kinds the
outputs read record by record (:data:`KEPT`: scheduler decisions, resizes, faults, the
run's end, ...) are kept; and the index the outputs need of every record (the latest
time, the GPU and pipeline ids named, each record's time by seq) is kept as it passes.
Then :meth:`finish`, and the view answers as a view of the whole list would (the hash
benchmark holds every output of every bundled scenario to it).

What stays in memory is bounded by the run's intervals and tables, not by its records:
at 4,096 GPUs a few hundred thousand intervals against five million records.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from array import array
from functools import cached_property
from operator import itemgetter, methodcaller
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence

import numpy as np

from harness.logs.one_pass import OnePassRun, SplitOnce, abandon, pick_kinds
from harness.logs.outputs.derived import DERIVED
from harness.logs.outputs.run_view import RunView, _int_ids, _LogIndex

#: the kinds the outputs (and the findings) read record by record: kept whole. The
#: perfetto trace's scheduler slices and events, the summary's scheduler table, sync
#: buckets, steps, data plane and end, the picture's faults, the findings' registrations
#: and the failure that ended a run
KEPT = frozenset(
    (
        "plan",
        "commit",
        "oom",
        "host_oom",
        "fault_fired",
        "timeout",
        "rejected",
        "scheduler_failed",
        "validation_failed",
        "cycle_start",
        "sim_end",
        "resize_start",
        "resize_end",
        "sync_bucket",
        "batch_consumed",
        "streaming_setup",
        "trainer_step",
        "dp_transfer",
        "register",
        "unregister",
    )
)
#: the kinds whose ``gpu`` (one GPU) names a GPU of the run
_GPU_KINDS = frozenset(("vram", "oom"))
_T = itemgetter("t")
_GPUS = methodcaller("get", "gpus")
_PIPELINE_ID = methodcaller("get", "pipeline_id")
#: kept besides when the run has single controllers (their streaming table reads effect ends)
KEPT_STREAMING = frozenset(("effect_end",))


def _str_ids(records: List[Dict[str, Any]]) -> set:
    """The ``pipeline_id`` strings of ``records``: their distinct values first, at C speed
    (a handful in a chunk), record by record only if one is unhashable."""
    try:
        named = set(map(_PIPELINE_ID, records))
    except TypeError:
        return {p for r in records if isinstance(p := r.get("pipeline_id"), str)}
    return {p for p in named if isinstance(p, str)}


class StreamedRunView(RunView):
    """Feed it the log (``view(chunk)``, in order), call :meth:`finish`, then read it as a
    :class:`RunView`. ``streaming``: keep ``effect_end`` records too (the summary's
    streaming table reads them when the log has ``streaming_setup`` records). ``split``:
    the splitter of chunks by kind, shared with another reader of the same chunks (the
    oracle: :class:`~harness.logs.one_pass.SplitOnce`)."""

    def __init__(self, streaming: bool = False, split: Optional[SplitOnce] = None) -> None:
        self._split = split if split is not None else SplitOnce()
        self.kept_kinds: FrozenSet[str] = KEPT | (KEPT_STREAMING if streaming else frozenset())
        self.records: List[Mapping[str, Any]] = []
        self._runs: Dict[str, OnePassRun] = {}
        self._kinds_of = {name: frozenset(kinds) for name, (_fn, kinds) in DERIVED.items()}
        self._reads_header = {name for name, kinds in self._kinds_of.items() if "header" in kinds}
        # each record's t, by seq (a simulator log's seq is its position), run-length coded:
        # the seq where each run of equal times starts, and its time (a run's records share
        # their instants: about one run per five records, 3 bytes a record, not 8)
        self._t_from = array("q")
        self._t_at = array("d")
        self._n = 0
        self._t_max = -math.inf
        self._gpu_ids: set = set()
        self._pipeline_ids: set = set()
        self._last: Optional[Mapping[str, Any]] = None
        self.finished = False

    def _with_end(self, fn: Callable[..., Any]) -> Callable[[Any], Any]:
        """``fn(view, end)``: a derived table reads the run's end only after its pass."""
        return lambda view: fn(view, self._end)

    def __call__(self, chunk: List[Dict[str, Any]]) -> None:
        if not chunk:
            return
        first = not self.records
        if first:
            self.records.append(chunk[0])  # the header
            self._runs = {name: OnePassRun(self._with_end(fn), None, name) for name, (fn, _kinds) in DERIVED.items()}
        if chunk[0]["seq"] != self._n:
            raise ValueError(
                f"a streamed view reads a log whose seq counts its records: seq {chunk[0]['seq']} at record {self._n}"
            )
        times = np.fromiter(map(_T, chunk), dtype=float, count=len(chunk))
        new_run = np.empty(len(times), dtype=bool)
        new_run[0] = not self._t_at or self._t_at[-1] != times[0]
        np.not_equal(times[1:], times[:-1], out=new_run[1:])
        starts = np.flatnonzero(new_run)
        self._t_from.extend((starts + self._n).tolist())
        self._t_at.extend(times[starts].tolist())
        self._n += len(times)
        self._t_max = max(self._t_max, float(times.max()))
        body = chunk[1:] if first else chunk
        split = self._split(body)
        batches: Dict[str, List[Dict[str, Any]]] = {}
        for name, kinds in self._kinds_of.items():
            batch = pick_kinds(split, kinds)
            if first and name in self._reads_header:  # (a table that reads the header gets it first,
                batch.insert(0, chunk[0])  # as a list's of("header", ...) gives it)
            batches[name] = batch
        self.records.extend(pick_kinds(split, self.kept_kinds))
        # (each record's fields read by map and filter, in C: the index reads every record)
        self._gpu_ids |= _int_ids(list(filter(None, map(_GPUS, body))))
        self._gpu_ids |= {g for r in pick_kinds(split, _GPU_KINDS) if isinstance(g := r.get("gpu"), int)}
        self._pipeline_ids |= _str_ids(body)
        self._last = chunk[-1]
        for name, batch in batches.items():
            if batch:
                self._runs[name].push(batch)

    def _end(self) -> float:
        return self.bounds[1]

    def finish(self) -> "StreamedRunView":
        """The log has ended: its tables are made (each reads the run's end now)."""
        if self.finished:
            return self
        if self._last is not None and self.records[-1] is not self._last:
            self.records.append(self._last)  # a view's log ends with the log's last record
        self.finished = True
        self._made = {name: run.finish() for name, run in self._runs.items()}
        self.__dict__["_derived"] = self._made
        return self

    def close(self) -> None:
        """End every table's pass without reading it (a run that failed before its end)."""
        abandon(self._runs.values())

    @cached_property
    def _index(self) -> _LogIndex:
        index = _LogIndex(self.records)  # the kept records by kind
        index.t_max = self._t_max if self._t_max > -math.inf else None
        index.gpu_ids = self._gpu_ids
        index.pipeline_ids = self._pipeline_ids
        return index

    def of(self, *kinds: str) -> Sequence[Mapping[str, Any]]:
        missing = [k for k in kinds if k not in self.kept_kinds and k != "header"]
        if missing:
            raise KeyError(f"a streamed view keeps no {', '.join(missing)} records (read them through DERIVED)")
        return super().of(*kinds)

    @cached_property
    def gpus(self) -> List[int]:
        nodes, gpn = self.shape
        return sorted(set(range(nodes * gpn)) | self._gpu_ids)

    def with_seqs(self, want) -> List[Mapping[str, Any]]:
        """``{"seq", "t"}`` of each record whose seq is in ``want`` (all the summary reads
        of them: the handover findings' times)."""
        t_from, t_at = self._t_from, self._t_at
        return [
            {"seq": s, "t": t_at[bisect_right(t_from, s) - 1]}
            for s in sorted(s for s in want if isinstance(s, int) and 0 <= s < self._n)
        ]
