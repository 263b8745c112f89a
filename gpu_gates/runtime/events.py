"""Gate event recording: each rank buffers events, rank 0 writes one merged JSONL log.

The invariants read the same event log from the simulator and from a gate, so a gate
emits the harness schema through ``harness.logs.writer.EventLogWriter`` (kinds
registered in ``harness/eventlog/kinds_gate.py``). Ranks only buffer in memory; their
events travel to rank 0 with their result, and rank 0 merges them in a documented order:
``(t, rank, per-rank sequence)``. ``t`` is seconds since rank 0's start (wall clock,
shared through the store), which is comparable across ranks on one node.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional


class EventRecorder:
    """In-memory events of one rank; every record carries its rank."""

    def __init__(self, rank: int, epoch: Optional[float] = None) -> None:
        self.rank = rank
        self.epoch = time.time() if epoch is None else epoch
        self.records: List[Dict[str, Any]] = []

    def now(self) -> float:
        return max(0.0, round(time.time() - self.epoch, 6))

    def emit(self, kind: str, **fields: Any) -> None:
        record = {"kind": kind, "t": self.now(), "rank": self.rank, "_seq": len(self.records)}
        record.update(fields)
        self.records.append(record)


def merge_events(per_rank: List[List[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    flat = [rec for records in per_rank for rec in records]
    return sorted(flat, key=lambda r: (r["t"], r["rank"], r["_seq"]))


def write_event_log(
    path: str,
    gate_name: str,
    records: List[Dict[str, Any]],
    cluster: Optional[Dict[str, Any]] = None,
    meta: Optional[Dict[str, Any]] = None,
) -> Optional[str]:
    """Write the merged log; returns an error string instead of raising (reports must still be written)."""
    try:
        from harness.logs.writer import EventLogWriter
    except Exception as exc:  # the event-log package is optional for the gates themselves
        return f"event log not written: cannot import harness.logs.writer ({exc})"
    try:
        writer = EventLogWriter(path, source=f"gate:{gate_name}", cluster=cluster, meta=meta)
        try:
            for rec in records:
                fields = {k: v for k, v in rec.items() if k not in ("kind", "t", "_seq")}
                writer.emit(rec["kind"], rec["t"], **fields)
        finally:
            writer.close()
    except Exception as exc:
        return f"event log not written: {type(exc).__name__}: {exc}"
    return None
