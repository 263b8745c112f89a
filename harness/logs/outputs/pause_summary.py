"""The summary's "Pauses" table: per pipeline, what its shrinks' pauses did to the requests
its ranks held, by pause mode (docs/engine-lifecycle.md).

A pause is a shrink's ``Abort`` effect (mode ``abort``, RLix's ``sleep_partial``) or its
``Pause`` effect (the mode in its args). From the records alone:

* **in flight** — requests dispatched to the paused ranks and not yet finished, aborted,
  failed or frozen, at the pause;
* **dropped** — ``request_abort`` records inside a pause (between its ``effect_start``
  and ``effect_end``): lost work, whatever the caller does next; of them, **retried**
  (dispatched again later) and **failed** (``request_failed``); **lost engine s** is the
  time the dropped requests had spent in the engine since their dispatch;
* **waited** — requests that finished on a rank while a ``wait`` pause drained it;
* **kept** / **resumed** — ``request_pause`` / ``request_resume`` records of a ``keep``
  pause; **kept, then dropped** — kept requests aborted before any resume (the pipeline
  finished with them frozen).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Sequence, Set, Tuple

from harness.ordered_sum import ordered_sum

Rank = Tuple[str, int]
#: the record kinds the table reads
PAUSE_KINDS = (
    "effect_start",
    "effect_end",
    "rank_state",
    "request_dispatch",
    "request_done",
    "request_abort",
    "request_failed",
    "request_pause",
    "request_resume",
)


@dataclass
class PauseRow:
    pipeline_id: str
    mode: str
    pauses: int = 0
    in_flight: int = 0
    dropped: int = 0
    retried: int = 0
    failed: int = 0
    lost_engine_s: float = 0.0
    waited: int = 0
    kept: int = 0
    resumed: int = 0
    kept_dropped: int = 0


class _Walk:
    def __init__(self) -> None:
        self.rows: Dict[str, PauseRow] = {}
        self.running: Dict[Rank, Set[int]] = {}
        self.where: Dict[Tuple[str, int], int] = {}
        self.since: Dict[Tuple[str, int], float] = {}  # request -> its last dispatch time
        self.open: Dict[str, int] = {}  # pipeline -> pauses open (Abort/Pause started, not ended)
        self.draining: Set[Rank] = set()  # ranks a wait pause is draining
        self.dropped: Dict[str, Set[int]] = {}  # pipeline -> requests a pause dropped (to see retries)
        self.kept: Set[Tuple[str, int]] = set()

    def row(self, pid: str, mode: str = "abort") -> PauseRow:
        row = self.rows.get(pid)
        if row is None:
            row = self.rows[pid] = PauseRow(pid, mode)
        return row

    def effect(self, r: Mapping[str, Any]) -> None:
        pid, name = r["pipeline_id"], r["effect"]
        if r["kind"] == "effect_end":
            self.open[pid] = max(0, self.open.get(pid, 0) - 1)
            return
        mode = r["args"].get("mode", "abort")
        row = self.row(pid, mode)
        row.mode, row.pauses = mode, row.pauses + 1
        self.open[pid] = self.open.get(pid, 0) + 1
        for dp in r["args"]["ranks"]:
            row.in_flight += len(self.running.get((pid, dp), ()))
            if mode == "wait" and name == "Pause":
                self.draining.add((pid, dp))

    def request(self, r: Mapping[str, Any]) -> None:
        k, pid, req = r["kind"], r["pipeline_id"], r["request"]
        key = (pid, req)
        if k == "request_dispatch":
            if req in self.dropped.get(pid, ()):
                self.dropped[pid].discard(req)
                self.row(pid).retried += 1
            self.running.setdefault((pid, r["dp_rank"]), set()).add(req)
            self.where[key], self.since[key] = r["dp_rank"], r["t"]
        elif k in ("request_done", "request_abort", "request_failed"):
            dp = self.where.pop(key, r.get("dp_rank"))
            self.running.get((pid, dp), set()).discard(req)
            if k == "request_done" and (pid, dp) in self.draining:
                self.row(pid).waited += 1
            elif k == "request_abort" and key in self.kept:
                self.kept.discard(key)
                self.row(pid).kept_dropped += 1
            elif k == "request_abort" and self.open.get(pid):
                row = self.row(pid)
                row.dropped += 1
                row.lost_engine_s += r["t"] - self.since.get(key, r["t"])
                self.dropped.setdefault(pid, set()).add(req)
            elif k == "request_failed" and req in self.dropped.get(pid, ()):
                self.dropped[pid].discard(req)
                self.row(pid).failed += 1
        elif k == "request_pause":
            self.running.get((pid, r["dp_rank"]), set()).discard(req)
            self.kept.add(key)
            self.row(pid, "keep").kept += 1
        elif k == "request_resume":
            self.kept.discard(key)
            self.running.setdefault((pid, r["dp_rank"]), set()).add(req)
            self.row(pid, "keep").resumed += 1


_UNSEEN: Any = object()


def pause_rows(records: Sequence[Mapping[str, Any]]) -> List[PauseRow]:
    """One row per pipeline that paused a rank, in the order of their first pause.

    A dispatch and a completion — nearly every record of a long run — are handled inline
    (what :meth:`_Walk.request` does with them, without its call and its kind tests):
    the 1024-GPU run has over half a million of them."""
    walk = _Walk()
    running, where, since, dropped, draining = walk.running, walk.where, walk.since, walk.dropped, walk.draining
    # the dicts' methods bound once and each record's key made once: the loop runs per record
    running_get, where_pop, since_pop, dropped_get = running.get, where.pop, since.pop, dropped.get
    for r in records:
        k = r.get("kind")
        if k == "request_dispatch":
            pid, req, dp = r["pipeline_id"], r["request"], r["dp_rank"]
            if dropped and req in dropped_get(pid, ()):
                walk.request(r)  # a retry: counted there
                continue
            rank = (pid, dp)
            held = running_get(rank)
            if held is None:
                running[rank] = {req}
            else:
                held.add(req)
            key = (pid, req)
            where[key] = dp
            since[key] = r["t"]
        elif k == "request_done":
            pid, req = r["pipeline_id"], r["request"]
            key = (pid, req)
            dp = where_pop(key, _UNSEEN)
            since_pop(key, None)  # (kept while the request is in flight: a long run's state stays what is live)
            if dp is _UNSEEN:
                walk.request(r)  # never dispatched: the general path
                continue
            rank = (pid, dp)
            held = running_get(rank)
            if held is not None:
                held.discard(req)
            if draining and rank in draining:
                walk.row(pid).waited += 1
        elif (
            k in ("effect_start", "effect_end") and r.get("effect") in ("Abort", "Pause") and r.get("scope") == "shrink"
        ):
            walk.effect(r)
        elif k in ("request_abort", "request_failed", "request_pause", "request_resume"):
            walk.request(r)
        elif k == "rank_state" and r["state"] in ("asleep", "routable", "stopped"):
            draining.discard((r["pipeline_id"], r["dp_rank"]))
    return [row for row in walk.rows.values() if row.pauses]


def pause_lines(rows: Sequence[PauseRow], table) -> List[str]:
    """Text lines of the section; none when no rank was paused."""
    if not rows:
        return []
    body = [
        [
            r.pipeline_id,
            r.mode,
            str(r.pauses),
            str(r.in_flight),
            str(r.dropped),
            str(r.retried),
            str(r.failed),
            f"{r.lost_engine_s:.3f}",
            str(r.waited),
            str(r.kept),
            str(r.resumed),
            str(r.kept_dropped),
        ]
        for r in rows
    ]
    lines = ["", "Pauses (what a shrink's pause did to the requests its ranks held; dropped = lost work)"]
    lines += table(
        [
            "pipeline",
            "mode",
            "pauses",
            "in flight",
            "dropped",
            "retried",
            "failed",
            "lost engine s",
            "waited",
            "kept",
            "resumed",
            "kept, dropped",
        ],
        body,
        "llrrrrrrrrrr",
    )
    for mode, t in lost_by_mode(rows).items():
        lines.append(
            f"lost work, pause mode {mode}: {t['dropped']} of {t['in_flight']} in-flight requests dropped "
            f"at a pause ({t['lost_engine_s']:.3f} engine s), {t['kept_dropped']} kept and never resumed"
        )
    return lines


def lost_by_mode(rows: Sequence[PauseRow]) -> Dict[str, Dict[str, Any]]:
    """Per pause mode (those the run used): requests in flight at its pauses, dropped,
    their engine seconds, and kept requests never resumed — summed over pipelines."""
    out: Dict[str, Dict[str, Any]] = {}
    for mode in ("abort", "wait", "keep"):
        of = [r for r in rows if r.mode == mode]
        if of:
            out[mode] = {
                "pipelines": [r.pipeline_id for r in of],
                "in_flight": sum(r.in_flight for r in of),
                "dropped": sum(r.dropped for r in of),
                "lost_engine_s": ordered_sum(r.lost_engine_s for r in of),
                "kept_dropped": sum(r.kept_dropped for r in of),
            }
    return out
