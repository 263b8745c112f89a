"""Data-plane section of the summary: bytes and transfers per hop, per pipeline.

Read from ``dp_transfer`` records only. The driver's bulk bytes (any hop of role
``driver`` other than ``driver_meta``) get their own line, because "zero" there is the
1-hop rule (``data_plane``) and a person should see it without adding up a table.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Tuple


@dataclass
class HopTotal:
    pipeline_id: str
    hop: str
    role: str
    transfers: int
    bytes: int
    busy_s: float  # sum of the transfers' modelled durations (0 where a runtime records none)


def dataplane_totals(records: Iterable[Mapping[str, Any]]) -> List[HopTotal]:
    acc: Dict[Tuple[str, str, str], List[float]] = defaultdict(lambda: [0, 0, 0.0])
    for r in records:
        if r.get("kind") == "dp_transfer":
            a = acc[(r.get("pipeline_id") or r["partition"], r["hop"], r["role"])]
            a[0] += 1
            a[1] += int(r["bytes"])
            a[2] += float(r.get("duration") or 0.0)
    return [HopTotal(p, h, role, int(n), int(b), s) for (p, h, role), (n, b, s) in sorted(acc.items())]


def driver_bulk_bytes(totals: Iterable[HopTotal]) -> Dict[str, int]:
    out: Dict[str, int] = defaultdict(int)
    for t in totals:
        out[t.pipeline_id] += t.bytes if (t.role == "driver" and t.hop != "driver_meta") else 0
    return dict(out)


def format_dataplane(totals: List[HopTotal], fmt_bytes, table) -> List[str]:
    """Lines for the summary (``fmt_bytes``/``table``: the summary's own formatters)."""
    out = ["", "Data plane (bytes per hop)"]
    rows = [[t.pipeline_id, t.hop, t.role, str(t.transfers), fmt_bytes(t.bytes), f"{t.busy_s:.3f}"] for t in totals]
    out += table(["pipeline", "hop", "role", "transfers", "bytes", "busy s"], rows, "lllrlr")
    for pid, n in sorted(driver_bulk_bytes(totals).items()):
        out.append(
            f"{pid}: driver bulk bytes {n}"
            + (" (1-hop: the driver moved metadata only)" if n == 0 else " (bulk tensors went through the driver)")
        )
    return out
