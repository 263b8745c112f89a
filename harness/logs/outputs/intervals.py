"""The interval model every output shares: effects, routable ranks and GPU slices.

Pure functions over a list of event-log record dicts (``records[0]`` is the header). The
summary (:mod:`.summary`), the Perfetto trace (:mod:`.perfetto`) and the PNG timeline
(:mod:`.timeline`) all draw or measure these same intervals; the definitions are in the
summary module's docstring. :mod:`.run_view` derives them once per run for all three,
and :mod:`.lanes` places overlapping slices of one GPU on lanes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from harness.control.effects import TRAINER_EFFECTS
from harness.control.streaming_effects import STREAMING_TRAINER_EFFECTS
from harness.logs.outputs.canonical_order import CanonKey, canonical_json, column_order

TRAIN_EFFECTS = TRAINER_EFFECTS + STREAMING_TRAINER_EFFECTS
SYNC_EFFECTS = ("SyncFromCache", "Finalize", "PublishVersion", "SyncWeights")
GENERATE_EFFECTS = ("Generate",)  # a single controller's rollout on its inference ranks
WAKE_SLEEP_EFFECTS = ("Wake", "Sleep", "Abort", "Drain")
REFIT_EFFECTS = SYNC_EFFECTS + WAKE_SLEEP_EFFECTS
WAITING_EFFECTS = ("RequestGpus", "ReleaseThenRequest", "AwaitRelease", "WaitBatch", "LockCoordinator")

#: Fine-grained kinds of a GPU slice (what the timeline colours), and the coarse
#: category each one counts under in the summary.
KIND_CATEGORY = {
    "train": "train",
    "generate": "generate",
    "sync": "refit",
    "wake_sleep": "refit",
    "waiting": "waiting",
    "other": "other",
}


def effect_kind(effect: str) -> str:
    """Fine kind of an effect name: train | sync | generate | wake_sleep | waiting | other."""
    if effect in TRAIN_EFFECTS:
        return "train"
    if effect in SYNC_EFFECTS:
        return "sync"
    if effect in GENERATE_EFFECTS:
        return "generate"
    if effect in WAKE_SLEEP_EFFECTS:
        return "wake_sleep"
    if effect in WAITING_EFFECTS:
        return "waiting"
    return "other"


def effect_category(effect: str) -> str:
    """Coarse category of an effect name: train | refit | waiting | other."""
    return KIND_CATEGORY[effect_kind(effect)]


# --------------------------------------------------------------------------- run facts


def _header(records: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    if not records or records[0].get("kind") != "header":
        raise ValueError("an event log starts with its header record")
    return records[0]


def run_bounds(records: Sequence[Mapping[str, Any]]) -> Tuple[float, float]:
    """(start, end) of the run in simulated seconds."""
    head = _header(records)
    t0 = float(head.get("t", 0.0))
    t1 = t0
    for r in records:
        t1 = max(t1, float(r.get("t", t0)))
        if r.get("kind") == "sim_end":
            t1 = max(t1, float(r.get("sim_time", t1)))
    return t0, t1


def cluster_shape(records: Sequence[Mapping[str, Any]]) -> Tuple[int, int]:
    """(nodes, gpus_per_node) from the header."""
    c = _header(records).get("cluster") or {}
    nodes = int(c.get("nodes", 1) or 1)
    gpn = int(c.get("gpus_per_node", 1) or 1)
    return nodes, gpn


def scenario_name(records: Sequence[Mapping[str, Any]]) -> Optional[str]:
    meta = _header(records).get("meta") or {}
    name = meta.get("scenario")
    return None if name is None else str(name)


def all_gpus(records: Sequence[Mapping[str, Any]]) -> List[int]:
    """The cluster's GPU ids, plus any id a record names beyond it, sorted."""
    nodes, gpn = cluster_shape(records)
    ids = set(range(nodes * gpn))
    for r in records[1:]:
        for g in r.get("gpus") or ():
            if isinstance(g, int):
                ids.add(g)
        if r.get("kind") in ("oom", "vram") and isinstance(r.get("gpu"), int):
            ids.add(r["gpu"])
    return sorted(ids)


# --------------------------------------------------------------------------- intervals


@dataclass(frozen=True, slots=True)  # (slots: a long run holds hundreds of thousands: a third of the memory)
class EffectInterval:
    pipeline_id: str
    effect: str
    args: Dict[str, Any]
    scope: Optional[str]
    step: Optional[int]
    cycle: Optional[int]
    gpus: Tuple[int, ...]
    start: float
    end: float
    open: bool = False  # still running when the log ended
    error: Optional[str] = None
    seq: int = 0  # seq of the start record (a stable tie-breaker)

    @property
    def kind(self) -> str:
        return effect_kind(self.effect)

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class RankInterval:
    """A DP rank's routable (generating) interval."""

    pipeline_id: str
    dp_rank: int
    gpus: Tuple[int, ...]
    start: float
    end: float
    version: Optional[int] = None
    open: bool = False
    seq: int = 0

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class GpuSlice:
    """One interval of work on one GPU: what the Perfetto trace and the timeline draw."""

    gpu: int
    start: float
    end: float
    kind: str  # train | generate | sync | wake_sleep | waiting | other
    pipeline_id: str
    label: str
    args: Dict[str, Any] = field(default_factory=dict)
    seq: int = 0

    def sort_key(self) -> tuple:
        """The slice order: (gpu, start, longest first, seq, label, args); :func:`sort_slices`
        sorts by it without encoding the args unless everything before them ties."""
        return self._order() + (CanonKey(self.args),)

    def _order(self) -> tuple:
        return (self.gpu, self.start, -(self.end - self.start), self.seq, self.label)


_SLICE_FIELDS = ("gpu", "start", "end", "kind", "pipeline_id", "label", "args", "seq")


def new_slice(
    gpu: int, start: float, end: float, kind: str, pipeline_id: str, label: str, args: Dict[str, Any], seq: int
) -> GpuSlice:
    """``GpuSlice(...)`` with every field given, about a third faster: the frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``; here the
    instance's dict is filled at once (a 1024-GPU run builds ~400 thousand slices)."""
    s = _new_object(GpuSlice)
    s.__dict__.update(zip(_SLICE_FIELDS, (gpu, start, end, kind, pipeline_id, label, args, seq)))
    return s


_new_object = object.__new__


def sort_slices(slices: List[GpuSlice]) -> None:
    """``slices.sort(key=GpuSlice.sort_key)``, faster: numpy sorts the numeric part of the
    key (see :func:`column_order`)."""
    order = column_order(
        [
            [s.gpu for s in slices],
            [s.start for s in slices],
            [s.start - s.end for s in slices],
            [s.seq for s in slices],
        ],
        lambda i: (slices[i].label,),
        lambda i: slices[i].args,
    )
    slices[:] = [slices[i] for i in order]


def effect_intervals(
    records: Sequence[Mapping[str, Any]], t_end: Union[None, float, Callable[[], float]] = None
) -> List[EffectInterval]:
    """Every effect as an interval, ordered by start (then start seq); one still open is
    cut at ``t_end`` (default: the end of the run; a callable is asked after the pass,
    when records arrive as the run is made: harness/logs/outputs/derived.py)."""
    if t_end is None:
        _, t_end = run_bounds(records)
    open_: Dict[tuple, List[Mapping[str, Any]]] = defaultdict(list)
    out: List[EffectInterval] = []

    def make(start_rec: Mapping[str, Any], end_rec: Optional[Mapping[str, Any]]) -> EffectInterval:
        gpus = start_rec.get("gpus")
        if not gpus and end_rec is not None:
            gpus = end_rec.get("gpus")
        return EffectInterval(
            *(  # type: ignore[arg-type]  # (slots, frozen: the dataclass's own __init__ sets them)
                str(start_rec.get("pipeline_id")),
                str(start_rec.get("effect")),
                start_rec.get("args") or {},  # (the record's own: records are frozen once made)
                start_rec.get("scope"),
                start_rec.get("step"),
                start_rec.get("cycle"),
                tuple(sorted(set(gpus or ()))),
                float(start_rec["t"]),
                float(end_rec["t"]) if end_rec is not None else t_end,
                end_rec is None,
                None if end_rec is None else end_rec.get("error"),
                int(start_rec.get("seq", 0)),
            )
        )

    for r in records:
        kind = r.get("kind")
        if kind not in ("effect_start", "effect_end"):
            continue
        key = (r.get("pipeline_id"), r.get("effect"), r.get("scope"), r.get("step"), r.get("cycle"))
        if kind == "effect_start":
            open_[key].append(r)
            continue
        pending = open_.get(key)
        if not pending:
            continue  # an end without a start: nothing to draw
        if len(pending) == 1:
            idx = 0  # the only candidate (also what the search below falls back to)
        else:
            want = canonical_json(r.get("args"))
            idx = next((i for i, s in enumerate(pending) if canonical_json(s.get("args")) == want), 0)
        out.append(make(pending.pop(idx), r))
    if callable(t_end):  # (``make`` reads it for the intervals still open, made below)
        t_end = t_end()
    still_open = [key for key, pending in open_.items() if pending]  # (a closed key keeps an empty list)
    for key in sorted(still_open, key=lambda k: tuple("" if v is None else str(v) for v in k)):
        for s in open_[key]:
            out.append(make(s, None))
    out.sort(key=lambda iv: (iv.start, iv.seq))
    return out


def rank_intervals(
    records: Sequence[Mapping[str, Any]], t_end: Union[None, float, Callable[[], float]] = None
) -> List[RankInterval]:
    """Routable intervals of every DP rank, ordered by start (then seq); one still open is
    cut at ``t_end`` (default: the end of the run; a callable is asked after the pass)."""
    if t_end is None:
        _, t_end = run_bounds(records)
    current: Dict[Tuple[str, int], Mapping[str, Any]] = {}
    out: List[RankInterval] = []

    def close(start_rec: Mapping[str, Any], end_t: Optional[float]) -> None:
        out.append(
            RankInterval(
                *(  # type: ignore[arg-type]  # (slots, frozen: the dataclass's own __init__ sets them)
                    str(start_rec["pipeline_id"]),
                    int(start_rec["dp_rank"]),
                    tuple(sorted(set(start_rec.get("gpus") or ()))),
                    float(start_rec["t"]),
                    t_end if end_t is None else end_t,
                    start_rec.get("version"),
                    end_t is None,
                    int(start_rec.get("seq", 0)),
                )
            )
        )

    for r in records:
        if r.get("kind") != "rank_state":
            continue
        key = (str(r["pipeline_id"]), int(r["dp_rank"]))
        prev = current.pop(key, None)
        if prev is not None:
            close(prev, float(r["t"]))
        if r.get("state") == "routable":
            current[key] = r
    if callable(t_end):  # (``close`` reads it for the intervals still open, closed below)
        t_end = t_end()
    for key in sorted(current):
        close(current[key], None)
    out.sort(key=lambda iv: (iv.start, iv.seq))
    return out


def effect_label(iv: EffectInterval) -> str:
    """Slice name of an effect: ``Compute(train) ppl1 s3``."""
    base = iv.effect
    detail = (
        iv.args.get("what") if iv.effect == "Compute" else iv.args.get("path") if iv.effect == "SyncFromCache" else None
    )
    if detail is not None:
        base = f"{base}({detail})"
    text = f"{base} {iv.pipeline_id}"
    if iv.step is not None:
        text += f" s{iv.step}"
    return text


def gpu_slices(records: Sequence[Mapping[str, Any]], *, include_other: bool = True) -> List[GpuSlice]:
    """Per-GPU work slices from effects (their ``gpus``) and routable ranks, sorted by
    (gpu, start, longest first, seq)."""
    return slices_of(effect_intervals(records), rank_intervals(records), include_other=include_other)


def slices_of(
    effects: Sequence[EffectInterval], ranks: Sequence[RankInterval], *, include_other: bool = True
) -> List[GpuSlice]:
    """:func:`gpu_slices` from intervals already derived (built as columns, see
    :mod:`.slice_columns`)."""
    from harness.logs.outputs.slice_columns import slice_columns_of  # (it builds on this module)

    return slice_columns_of(effects, ranks, include_other=include_other).objects()


def union_length(spans: Iterable[Tuple[float, float]]) -> float:
    """Total length covered by a set of [start, end) spans."""
    total = 0.0
    cur_s: Optional[float] = None
    cur_e = 0.0
    for s, e in sorted(spans):
        if e <= s:
            continue
        if cur_s is None or s > cur_e:
            if cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_s is not None:
        total += cur_e - cur_s
    return total


def p95(values: Sequence[float]) -> Optional[float]:
    """95th percentile by nearest rank (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
