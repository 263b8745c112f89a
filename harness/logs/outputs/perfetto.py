"""Chrome Trace Event Format JSON of a simulator run, for the Perfetto UI (ui.perfetto.dev).

Layout (docs/modelled-systems.md#test-harness-anchors):

- one *process* per node ("node n") and, inside it, one *thread* (track) per GPU named
  "GPU g (node n)". Perfetto cannot draw partially overlapping slices on one track, so
  work that overlaps on a GPU (a rank generating while its weights are refreshed, two
  pipelines on one device) goes to extra tracks "GPU g lane k", lanes assigned greedily
  and deterministically (:func:`harness.logs.outputs.lanes.assign_lanes`);
- complete events (``"ph": "X"``) for every effect that occupies GPUs (its ``gpus``) and
  for every routable interval of a DP rank ("generate ppl1 dp0"); ``cat`` is the kind
  (train, generate, sync, wake_sleep, waiting, other);
- a "scheduler" process with a "scheduler" track of instant events, one per planned cycle
  (plan summary in ``args``), a counter "idle GPUs" set after every commit, "resize"
  tracks for coordinator resize calls and an "events" track for OOMs, fired faults,
  rejected inputs and scheduler failures;
- metadata events (``"ph": "M"``) naming processes and threads and fixing their order.

Timestamps and durations are microseconds (simulated seconds x 1e6, to the nanosecond).
The event list is sorted, and the same records always give the same JSON.
"""

from __future__ import annotations

import json
import os
from itertools import chain
from typing import Any, Callable, Dict, Iterator, List, Mapping, NamedTuple, Sequence, Tuple, Union

import numpy as np

from harness.logs.writer import holds_json_only_float
from harness.logs.outputs.canonical_order import canonical_json, column_order
from harness.logs.outputs.intervals import GpuSlice, sort_slices
from harness.logs.outputs.lanes import assign_lanes
from harness.logs.outputs.slice_columns import args_at
from harness.logs.outputs.run_view import Log, RunView, as_view

Number = Union[int, float]
_PH_ORDER = {"M": 0, "C": 1, "X": 2, "i": 3}
# records drawn on the "events" track; with plan and commit, the only ones the trace reads one by one
_EVENT_KINDS = ("oom", "host_oom", "fault_fired", "timeout", "rejected", "scheduler_failed", "validation_failed")
_SCHEDULER_KINDS = ("plan", "commit") + _EVENT_KINDS


def _us(t: float) -> Number:
    """Simulated seconds -> microseconds, rounded to the nanosecond (int when whole)."""
    ns = round(t * 1e9)
    return ns // 1000 if ns % 1000 == 0 else ns / 1000


def _dur_us(start: float, end: float) -> Number:
    ns = max(0, round(end * 1e9) - round(start * 1e9))
    return ns // 1000 if ns % 1000 == 0 else ns / 1000


def _us_and_dur_us(starts: List[float], ends: List[float]) -> Tuple[List[Number], List[Number]]:
    """``[_us(s) for s in starts]`` and ``[_dur_us(s, e) ...]``, the same numbers, the
    rounding done by numpy (round half to even, as ``round``) for a whole trace at once;
    times too large for exact float arithmetic take the scalar functions."""
    start_ns = np.rint(np.asarray(starts, dtype=float) * 1e9)
    end_ns = np.rint(np.asarray(ends, dtype=float) * 1e9)
    if len(starts) and not (np.abs(start_ns).max() < 2.0**53 and np.abs(end_ns).max() < 2.0**53):
        return [_us(s) for s in starts], [_dur_us(s, e) for s, e in zip(starts, ends)]
    start_ns = start_ns.astype(np.int64)
    dur_ns = np.maximum(end_ns.astype(np.int64) - start_ns, 0)
    return _us_of_ns(start_ns), _us_of_ns(dur_ns)


def _us_of_ns(ns: "np.ndarray") -> List[Number]:
    """Microseconds of integer nanoseconds: an int when whole, else a float (as _us)."""
    whole = (ns % 1000 == 0).tolist()
    return [i if w else f for i, f, w in zip((ns // 1000).tolist(), (ns / 1000).tolist(), whole)]


def _resize_slices(records: Sequence[Mapping[str, Any]], t_end: float) -> List[GpuSlice]:
    """Coordinator resize calls as slices (gpu -1: they belong to the scheduler process);
    one still open is cut at ``t_end``."""
    open_: Dict[Tuple, List[Mapping[str, Any]]] = {}
    out: List[GpuSlice] = []

    def make(s: Mapping[str, Any], end_t: float, closed: bool) -> GpuSlice:
        args = {
            "cycle": s.get("cycle"),
            "pipeline_id": s.get("pipeline_id"),
            "phase": s.get("phase"),
            "dp_ranks": list(s.get("dp_ranks") or ()),
        }
        if not closed:
            args["open"] = True
        label = f"{s.get('phase')} {s.get('pipeline_id')} dp{','.join(str(d) for d in s.get('dp_ranks') or ())}"
        return GpuSlice(
            -1, float(s["t"]), end_t, "resize", str(s.get("pipeline_id")), label, args, int(s.get("seq", 0))
        )

    for r in records:
        k = r.get("kind")
        if k not in ("resize_start", "resize_end"):
            continue
        key = (r.get("cycle"), r.get("pipeline_id"), r.get("phase"))
        if k == "resize_start":
            open_.setdefault(key, []).append(r)
        elif open_.get(key):
            out.append(make(open_[key].pop(0), float(r["t"]), True))
    for key in sorted(open_, key=canonical_json):
        for s in open_[key]:
            out.append(make(s, t_end, False))
    sort_slices(out)
    return out


def _plan_args(plan: Mapping[str, Any]) -> Dict[str, Any]:
    def ranks(entries: Any) -> Dict[str, List[int]]:
        out: Dict[str, List[int]] = {}
        for e in entries or ():
            out.setdefault(str(e.get("cluster_id")), []).extend(
                int(b.get("dp_rank")) for b in e.get("bundles") or () if b.get("dp_rank") is not None
            )
        return {k: sorted(v) for k, v in sorted(out.items())}

    return {
        "cycle": plan.get("cycle"),
        "shrinks": ranks(plan.get("shrinks")),
        "expands": ranks(plan.get("expands")),
        "signals": [
            {"cluster_id": s.get("cluster_id"), "priority": s.get("priority"), "gpus": s.get("gpus")}
            for s in plan.get("signals") or ()
        ],
        "n_shrinks": len(plan.get("shrinks") or ()),
        "n_expands": len(plan.get("expands") or ()),
        "n_signals": len(plan.get("signals") or ()),
    }


class _SliceEventColumns:
    """The GPU slices' trace fields (ts, dur, pid, tid) as numpy columns, each converted
    to the JSON's numbers only for the chunk of events being written: as Python lists of
    ints and floats, four per slice, they were most of a large run's trace memory. Times
    too large for exact float arithmetic keep the lists (:func:`_us_and_dur_us`)."""

    def __init__(self, slices: Any, lanes: Sequence[int], gpn: int, first_tid: Dict[int, int]) -> None:
        n = len(slices)
        start_ns = np.rint(np.asarray(slices.start, dtype=float) * 1e9)
        end_ns = np.rint(np.asarray(slices.end, dtype=float) * 1e9)
        self.exact = not n or bool(np.abs(start_ns).max() < 2.0**53 and np.abs(end_ns).max() < 2.0**53)
        if self.exact:
            self.ts_ns = start_ns.astype(np.int64)
            self.dur_ns = np.maximum(end_ns.astype(np.int64) - self.ts_ns, 0)
        else:
            self.ts, self.dur = _us_and_dur_us(slices.start, slices.end)
        del start_ns, end_ns
        gpus = slices.gpu
        self.pid = np.fromiter((g // gpn + 1 for g in gpus), dtype=np.int64, count=n)  # (node n's pid: n + 1)
        self.tid = np.fromiter((first_tid[g] + lane for g, lane in zip(gpus, lanes)), dtype=np.int64, count=n)

    def at(self, positions: List[int]) -> Tuple[List[Number], List[Number], List[int], List[int]]:
        """(ts, dur, pid, tid) of the slices at ``positions``, as the JSON's numbers."""
        if self.exact:
            at = np.asarray(positions, dtype=np.int64)
            if not len(self.ts_ns):
                return [], [], [], []
            ts, dur = _us_of_ns(self.ts_ns[at]), _us_of_ns(self.dur_ns[at])
            return ts, dur, self.pid[at].tolist(), self.tid[at].tolist()
        ts, dur = [self.ts[i] for i in positions], [self.dur[i] for i in positions]
        return ts, dur, self.pid[positions].tolist(), self.tid[positions].tolist()

    def sort_columns(self, events: List[Dict[str, Any]]) -> List[Any]:
        """The sort's numeric columns, the slices' then ``events``': ts, pid, tid, phase,
        minus the duration — the values (as numpy compares them) of the JSON's numbers."""
        n = len(self.pid)
        if self.exact and all(abs(e["ts"]) < 2.0**53 / 1000 and abs(e.get("dur", 0)) < 2.0**53 / 1000 for e in events):
            ts = np.concatenate((self.ts_ns / 1000, np.array([e["ts"] for e in events], dtype=float)))
            dur = np.concatenate((-(self.dur_ns / 1000), np.array([-e.get("dur", 0) for e in events], dtype=float)))
        else:  # (the JSON's numbers themselves, as the sort of Python numbers compares them)
            every = list(range(n))
            ts_l, dur_l, _, _ = self.at(every)
            ts = ts_l + [e["ts"] for e in events]
            dur = [-d for d in dur_l] + [-e.get("dur", 0) for e in events]
        return [
            ts,
            np.concatenate((self.pid, np.array([e["pid"] for e in events], dtype=np.int64))),
            np.concatenate((self.tid, np.array([e["tid"] for e in events], dtype=np.int64))),
            np.concatenate(
                (
                    np.full(n, _PH_ORDER["X"], dtype=np.int64),
                    np.array([_PH_ORDER.get(e["ph"], 9) for e in events], dtype=np.int64),
                )
            ),
            dur,
        ]


class _Trace:
    """A trace with its events not yet built: the metadata events, then the events in
    the order ``order``, built by ``events_at(positions)`` (a list of the events at those
    positions) when they are written. The 1024-GPU run's trace has ~400 thousand slice
    events; as dicts all at once they were ~180 MB on top of the log (the run's peak);
    here only their sort columns are held, and :func:`iter_chrome_trace` builds and
    encodes them a chunk at a time."""

    def __init__(
        self,
        head: Dict[str, Any],
        meta: List[Dict[str, Any]],
        order: List[int],
        events_at: Callable[[List[int]], List[Dict[str, Any]]],
    ) -> None:
        self.head, self.meta, self.order, self.events_at = head, meta, order, events_at


class _Tracks(NamedTuple):
    """Where the trace's events go: the metadata events naming processes and tracks,
    the scheduler process and its tracks, each GPU's first track id (its lanes'
    tracks follow it) and the next free track id."""

    meta: List[Dict[str, Any]]
    sched_pid: int
    sched_tid: int
    events_tid: int
    first_tid: Dict[int, int]
    next_tid: int


def _meta(name: str, pid: int, tid: int, args: Dict[str, Any]) -> Dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _tracks(gpus: Sequence[int], slice_gpus: Sequence[int], lanes: Sequence[int], nodes: int, gpn: int) -> _Tracks:
    """One process per node with a track per (GPU, lane) and a scheduler process with
    its "scheduler" and "events" tracks; track ids are sequential over (gpu, lane),
    then the scheduler's, unique trace-wide."""
    n_lanes: Dict[int, int] = {g: 1 for g in gpus}
    for g, lane in set(zip(slice_gpus, lanes)):  # each GPU's lanes, once
        n_lanes[g] = max(n_lanes.get(g, 1), lane + 1)

    node_ids = sorted({g // gpn for g in n_lanes} | set(range(nodes)))
    node_pid = {n: n + 1 for n in node_ids}
    sched_pid = max(node_pid.values()) + 1

    meta: List[Dict[str, Any]] = []
    for n in node_ids:
        meta.append(_meta("process_name", node_pid[n], 0, {"name": f"node {n}"}))
        meta.append(_meta("process_sort_index", node_pid[n], 0, {"sort_index": n + 1}))
    meta.append(_meta("process_name", sched_pid, 0, {"name": "scheduler"}))
    meta.append(_meta("process_sort_index", sched_pid, 0, {"sort_index": 0}))

    first_tid: Dict[int, int] = {}
    next_tid = 1
    for g in sorted(n_lanes):
        node = g // gpn
        first_tid[g] = next_tid  # (its lanes' tracks are consecutive)
        for lane in range(n_lanes[g]):
            name = f"GPU {g} (node {node})" if lane == 0 else f"GPU {g} lane {lane + 1}"
            meta.append(_meta("thread_name", node_pid[node], next_tid, {"name": name}))
            meta.append(_meta("thread_sort_index", node_pid[node], next_tid, {"sort_index": next_tid}))
            next_tid += 1

    sched_tid = next_tid
    events_tid = next_tid + 1
    meta.append(_meta("thread_name", sched_pid, sched_tid, {"name": "scheduler"}))
    meta.append(_meta("thread_sort_index", sched_pid, sched_tid, {"sort_index": 0}))
    meta.append(_meta("thread_name", sched_pid, events_tid, {"name": "events"}))
    meta.append(_meta("thread_sort_index", sched_pid, events_tid, {"sort_index": 1}))
    return _Tracks(meta, sched_pid, sched_tid, events_tid, first_tid, next_tid + 2)


def _resize_events(view: RunView, t1: float, tracks: _Tracks) -> List[Dict[str, Any]]:
    """The coordinator's resize calls as slices on "resize" tracks (lanes where they
    overlap); adds those tracks' metadata to ``tracks.meta``."""
    resizes = _resize_slices(view.of("resize_start", "resize_end"), t1)
    resize_lanes = assign_lanes(resizes)
    resize_tid: Dict[int, int] = {}
    next_tid, sched_pid, meta = tracks.next_tid, tracks.sched_pid, tracks.meta
    for lane in sorted(set(resize_lanes)):
        resize_tid[lane] = next_tid
        meta.append(
            _meta("thread_name", sched_pid, next_tid, {"name": "resize" if lane == 0 else f"resize lane {lane + 1}"})
        )
        meta.append(_meta("thread_sort_index", sched_pid, next_tid, {"sort_index": 2 + lane}))
        next_tid += 1
    return [
        {
            "name": s.label,
            "cat": "resize",
            "ph": "X",
            "ts": _us(s.start),
            "dur": _dur_us(s.start, s.end),
            "pid": sched_pid,
            "tid": resize_tid[lane],
            "args": s.args,
        }
        for s, lane in zip(resizes, resize_lanes)
    ]


def _scheduler_events(view: RunView, t0: float, tracks: _Tracks, events: List[Dict[str, Any]]) -> None:
    """Appends to ``events`` an instant per planned cycle, the "idle GPUs" counter at
    every commit and an instant on the "events" track per record of :data:`_EVENT_KINDS`."""
    sched_pid, sched_tid, events_tid = tracks.sched_pid, tracks.sched_tid, tracks.events_tid
    for r in view.of(*_SCHEDULER_KINDS):  # (not the requests, VRAM and rank states of a long log)
        k = r.get("kind")
        ts = _us(float(r.get("t", t0)))
        if k == "plan":
            events.append(
                {
                    "name": f"cycle {r.get('cycle')}",
                    "cat": "scheduler",
                    "ph": "i",
                    "s": "t",
                    "ts": ts,
                    "pid": sched_pid,
                    "tid": sched_tid,
                    "args": _plan_args(r),
                }
            )
        elif k == "commit":
            events.append(
                {
                    "name": "idle GPUs",
                    "cat": "scheduler",
                    "ph": "C",
                    "ts": ts,
                    "pid": sched_pid,
                    "tid": sched_tid,
                    "args": {"idle": r.get("idle_gpus")},
                }
            )
        else:  # one of _EVENT_KINDS
            if k == "oom":
                name = f"OOM GPU {r.get('gpu')} {r.get('owner')}"
            elif k == "host_oom":
                name = f"host OOM node {r.get('node')} {r.get('owner')}"
            elif k == "fault_fired":
                name = f"fault {r.get('name')} {r.get('pipeline_id')}"
            elif k == "timeout":
                name = f"timeout {r.get('what')} {r.get('pipeline_id')}"
            else:
                name = k
            args = {f: v for f, v in r.items() if f not in ("seq", "t", "kind")}
            events.append(
                {
                    "name": name,
                    "cat": k,
                    "ph": "i",
                    "s": "p" if k == "oom" else "t",
                    "ts": ts,
                    "pid": sched_pid,
                    "tid": events_tid,
                    "args": args,
                }
            )


def _trace(view: RunView) -> _Trace:
    t0, t1 = view.bounds
    nodes, gpn = view.shape
    slices = view.slice_columns
    lanes = view.lanes
    tracks = _tracks(view.gpus, slices.gpu, lanes, nodes, gpn)
    # the GPU slices' events, as columns (each built into a dict only when written)
    cols = _SliceEventColumns(slices, lanes, gpn, tracks.first_tid)
    # every event but the GPU slices' (a few thousand)
    events = _resize_events(view, t1, tracks)
    _scheduler_events(view, t0, tracks, events)

    meta = tracks.meta
    meta.sort(key=lambda e: (e["pid"], e["tid"], e["name"]))
    n_slices = len(slices)
    labels, cats, slice_args = slices.label, slices.kind, slices.args

    def events_at(positions: Sequence[int]) -> List[Dict[str, Any]]:
        # (one comprehension per chunk, no call per event: the slices' dicts are most of the trace)
        positions = positions.tolist() if isinstance(positions, np.ndarray) else list(positions)
        at = [i if i < n_slices else 0 for i in positions]
        ts, dur, pid, tid = cols.at(at)
        args = args_at(slice_args, at) if n_slices else []
        return [
            {
                "name": labels[i],
                "cat": cats[i],
                "ph": "X",
                "ts": ts[k],
                "dur": dur[k],
                "pid": pid[k],
                "tid": tid[k],
                "args": args[k],
            }
            if i < n_slices
            else events[i - n_slices]
            for k, i in enumerate(positions)
        ]

    def name_of(i: int) -> tuple:
        return (labels[i] if i < n_slices else events[i - n_slices]["name"],)

    def args_of(i: int) -> Any:
        return slice_args[i] if i < n_slices else events[i - n_slices].get("args")

    # events (slices first, then the rest) by (ts, pid, tid, phase, longest first, name, canonical args)
    order = column_order(
        cols.sort_columns(events),
        name_of,
        args_of,
        as_array=True,
    )
    head = {
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "rlharness harness.logs.outputs.perfetto",
            "scenario": view.scenario or "",
            "cluster": {"nodes": nodes, "gpus_per_node": gpn},
            "sim_start_s": t0,
            "sim_end_s": t1,
        },
    }
    return _Trace(head, meta, order, events_at)


def chrome_trace(log: Log) -> Dict[str, Any]:
    """The run as a Chrome Trace Event Format dict: {"traceEvents": [...], "displayTimeUnit": "ms", ...}.
    ``log``: the records (header first) or a :class:`RunView` of them."""
    trace = _trace(as_view(log))
    return {"traceEvents": trace.meta + trace.events_at(trace.order), **trace.head}


_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False).encode
_EVENTS_PER_CHUNK = 4096

try:
    import orjson  # the event log's fast encoder (see harness/logs/writer.py)
except ImportError:  # pragma: no cover
    orjson = None


def _refuse(obj: Any) -> Any:
    raise TypeError  # not a plain JSON type: json decides


def _encode_events(events: List[Dict[str, Any]]) -> bytes:
    """``_ENCODE(events)`` as ASCII bytes, byte for byte, about 5x faster: orjson with sorted keys where
    its output is the same — pure ASCII (json escapes non-ASCII here) and no float it
    spells differently (below 1e-4: "0.00001" for json's "1e-05"); json otherwise (an
    int over 64 bits, a subclass, ...). One difference on input the simulator never
    writes: a NaN or infinite argument, which json refuses, is written as null."""
    if orjson is not None:
        try:
            out = orjson.dumps(
                events,
                default=_refuse,
                option=orjson.OPT_SORT_KEYS
                | orjson.OPT_PASSTHROUGH_SUBCLASS
                | orjson.OPT_PASSTHROUGH_DATACLASS
                | orjson.OPT_PASSTHROUGH_DATETIME,
            )
        except TypeError:
            pass
        else:
            if out.isascii() and not holds_json_only_float(out):
                return out
    return _ENCODE(events).encode("ascii")  # (json escapes every non-ASCII character)


def iter_chrome_trace(log: Log) -> Iterator[str]:
    """Canonical JSON text of :func:`chrome_trace` (sorted keys, compact) in chunks whose
    concatenation is exactly ``json.dumps`` of the whole: a 1024-GPU run's trace is a few
    hundred MB of text that is never held as one string (and again as its bytes)."""
    for chunk in _trace_chunks(log):
        yield bytes(chunk).decode("ascii")


def _trace_chunks(log: Log) -> Iterator[Union[bytes, memoryview]]:
    """The trace file's bytes (ASCII: json escapes the rest), a chunk at a time, as
    encoded: no decoding to text and encoding back, no copy to cut each chunk's brackets."""
    trace = _trace(as_view(log))
    head = _ENCODE(trace.head)
    assert all(key < "traceEvents" for key in trace.head)  # so it is the last key: head is "{...}"
    yield (head[:-1] + ',"traceEvents":[').encode("ascii")
    n = _EVENTS_PER_CHUNK
    meta_chunks = (trace.meta[at : at + n] for at in range(0, len(trace.meta), n))
    event_chunks = (trace.events_at(trace.order[at : at + n]) for at in range(0, len(trace.order), n))
    for k, chunk in enumerate(chain(meta_chunks, event_chunks)):
        if k:
            yield b","
        yield memoryview(_encode_events(chunk))[1:-1]  # one C-level call per chunk, its [ ] left out
    yield b"]}"


def dumps_chrome_trace(log: Log) -> str:
    """Canonical JSON text of :func:`chrome_trace` (sorted keys, compact)."""
    return "".join(iter_chrome_trace(log))


def write_chrome_trace(log: Log, path: Union[str, os.PathLike]) -> str:
    """Write the trace to ``path`` atomically (temp file beside it, then os.replace); returns the path."""
    from harness.logs.writer import atomic_write

    return atomic_write(os.fspath(path), _trace_chunks(log))
