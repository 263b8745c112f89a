"""The summary's "Streaming single controllers" table: mode, sampler and mean step time of
every single controller, and each streaming one's step-time difference against the first
non-streaming (batch) one of the same run — the comparison the bundled scenario
``streaming_vs_batch`` exists to show.

A controller is *streaming* when it trains on fewer groups than a step holds
(``min_groups_for_streaming_train < groups_per_step``), *batch* otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence


@dataclass(frozen=True)
class StreamingRow:
    pipeline_id: str
    sampler: str
    window: Optional[int]
    min_groups: int
    groups_per_step: int
    mean_step_s: Optional[float]

    @property
    def mode(self) -> str:
        return "streaming" if self.min_groups < self.groups_per_step else "batch"


def streaming_rows(records: Sequence[Mapping[str, Any]], mean_step: Mapping[str, Optional[float]]) -> List[StreamingRow]:
    return [StreamingRow(r["pipeline_id"], r["sampler"], r.get("window"), r["min_groups_for_streaming_train"],
                         r["groups_per_step"], mean_step.get(r["pipeline_id"]))
            for r in records if r.get("kind") == "streaming_setup"]


def streaming_lines(rows: Sequence[StreamingRow], table) -> List[str]:
    """Text lines of the section (``table`` is the summary's table formatter); none
    when the run has no single controller."""
    if not rows:
        return []
    base = next((r for r in rows if r.mode == "batch" and r.mean_step_s), None)
    body = []
    for r in rows:
        if r is base:
            diff = "(reference)"
        elif base is not None and r.mean_step_s is not None:
            d = r.mean_step_s - base.mean_step_s
            diff = f"{d:+.3f} s ({100.0 * d / base.mean_step_s:+.1f} %)"
        else:
            diff = "-"
        body.append([r.pipeline_id, r.mode, r.sampler, "-" if r.window is None else str(r.window),
                     f"{r.min_groups}/{r.groups_per_step}", "-" if r.mean_step_s is None else f"{r.mean_step_s:.3f}", diff])
    head = "Streaming single controllers (step time vs the batch controller"
    head += f" {base.pipeline_id})" if base is not None else "; no batch controller in this run)"
    return ["", head] + table(["pipeline", "mode", "sampler", "window", "min groups", "mean step s", "vs batch"],
                              body, "lllrrrr")
