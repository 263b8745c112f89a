"""The summary's "Streaming single controllers" table: mode, sampler and mean step time of
every single controller, and each streaming one's step-time difference against the first
non-streaming (batch) one of the same run — the comparison the bundled scenario
``streaming_vs_batch`` exists to show.

A controller is *streaming* when it trains on fewer groups than a step holds
(``min_groups_for_streaming_train < groups_per_step``), *batch* otherwise.

Each row also counts, from the pumps' effects, the prompts dropped after their retries
(``SkipPrompt``, and ``DropReplaced`` under ``on_dropped_prompt: replace``), how many of
those a step was owed and lost (stamped, in_order, no spare: the step shrinks), how many a
spare prompt replaced, and the steps that finished on fewer groups than ``groups_per_step`` (closed short): a step-time
comparison across runs must account for a step that trained less.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple


@dataclass(frozen=True)
class StreamingRow:
    pipeline_id: str
    sampler: str
    window: Optional[int]
    min_groups: int
    groups_per_step: int
    mean_step_s: Optional[float]
    dropped: int = 0  # prompts dropped after their retries
    dropped_owed: int = 0  # of which stamped for a step (it closes short)
    short_steps: int = 0  # finished steps that trained fewer than groups_per_step groups
    replaced: int = 0  # of the drops, those a spare prompt took the slot of (on_dropped_prompt replace)

    @property
    def mode(self) -> str:
        return "streaming" if self.min_groups < self.groups_per_step else "batch"


def _drops_and_steps(records: Sequence[Mapping[str, Any]]) -> Dict[str, Tuple[int, int, Dict[int, int], set, int]]:
    """pipeline -> (drops, owed drops, groups trained per step, finished steps, replaced drops)."""
    out: Dict[str, Tuple[int, int, Dict[int, int], set, int]] = {}
    for r in records:
        k = r.get("kind")
        if k == "effect_end" and not r.get("error") and r["effect"] in ("SkipPrompt", "ClearSamples", "DropReplaced"):
            d, o, trained, done, rep = out.setdefault(r["pipeline_id"], (0, 0, {}, set(), 0))
            if r["effect"] == "SkipPrompt":
                out[r["pipeline_id"]] = (d + 1, o + (r["args"].get("target_step") is not None), trained, done, rep)
            elif r["effect"] == "DropReplaced":
                out[r["pipeline_id"]] = (d + 1, o, trained, done, rep + 1)
            else:
                trained[r["args"]["step"]] = trained.get(r["args"]["step"], 0) + len(r["args"]["groups"])
        elif k == "trainer_step" and r.get("action") == "finish":
            out.setdefault(r["pipeline_id"], (0, 0, {}, set(), 0))[3].add(r["step"])
    return out


def streaming_rows(
    records: Sequence[Mapping[str, Any]], mean_step: Mapping[str, Optional[float]]
) -> List[StreamingRow]:
    counts = _drops_and_steps(records)
    rows = []
    for r in records:
        if r.get("kind") != "streaming_setup":
            continue
        pid, n = r["pipeline_id"], r["groups_per_step"]
        d, o, trained, done, rep = counts.get(pid, (0, 0, {}, set(), 0))
        rows.append(
            StreamingRow(
                pid,
                r["sampler"],
                r.get("window"),
                r["min_groups_for_streaming_train"],
                n,
                mean_step.get(pid),
                d,
                o,
                sum(1 for s in done if trained.get(s, 0) < n),
                rep,
            )
        )
    return rows


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
        body.append(
            [
                r.pipeline_id,
                r.mode,
                r.sampler,
                "-" if r.window is None else str(r.window),
                f"{r.min_groups}/{r.groups_per_step}",
                "-" if r.mean_step_s is None else f"{r.mean_step_s:.3f}",
                diff,
                f"{r.dropped} ({r.dropped_owed} owed" + (f", {r.replaced} replaced)" if r.replaced else ")"),
                str(r.short_steps),
            ]
        )
    head = "Streaming single controllers (step time vs the batch controller"
    head += f" {base.pipeline_id})" if base is not None else "; no batch controller in this run)"
    return ["", head] + table(
        ["pipeline", "mode", "sampler", "window", "min groups", "mean step s", "vs batch", "dropped", "steps short"],
        body,
        "lllrrrrrr",
    )
