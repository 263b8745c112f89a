"""Two runs' figures side by side: what changed between a run and its what-if.

Reads the mappings of two ``summary.json`` files (any runtime's) and pairs their figures:
the run as a whole, then each pipeline by id (a pipeline only one run has is listed with
the other side empty). Each row: A, B, B - A and the change in percent of A.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Tuple

from harness.ordered_sum import ordered_sum

Row = Tuple[str, Optional[float], Optional[float]]

_RUN_FIGURES = (
    ("simulated s", ("run", "simulated_s")),
    ("GPU train %", ("gpus_all", "train_pct")),
    ("GPU generate %", ("gpus_all", "generate_pct")),
    ("GPU refit %", ("gpus_all", "refit_pct")),
    ("GPU idle %", ("gpus_all", "idle_pct")),
    ("scheduler cycles", ("scheduler", "cycles")),
    ("shrink ops", ("scheduler", "shrink_ops")),
    ("expand ops", ("scheduler", "expand_ops")),
    ("mean staleness (steps)", ("staleness", "mean_age_steps")),
)
_PIPELINE_FIGURES = (
    ("steps done", "steps_done"),
    ("mean step s", "mean_step_s"),
    ("p95 step s", "p95_step_s"),
    ("generate s", "generate_s"),
    ("train s", "train_s"),
    ("refit s", "refit_s"),
    ("waiting s", "waiting_s"),
    ("requests done", "requests_done"),
    ("requests aborted", "requests_aborted"),
    ("tokens", "tokens"),
)


def _dig(data: Mapping[str, Any], keys: Sequence[str]) -> Optional[float]:
    node: Any = data
    for k in keys:
        if not isinstance(node, Mapping) or k not in node:
            return None
        node = node[k]
    return node if isinstance(node, (int, float)) and not isinstance(node, bool) else None


def diff_rows(a: Mapping[str, Any], b: Mapping[str, Any]) -> List[Tuple[str, List[Row]]]:
    """Sections of (figure, A, B) rows: the run, then each pipeline."""
    sections = [("run", [(name, _dig(a, keys), _dig(b, keys)) for name, keys in _RUN_FIGURES])]
    sections[0][1].append(("total refit s", _refit_total(a), _refit_total(b)))
    pa = {p["pipeline_id"]: p for p in a.get("pipelines", [])}
    pb = {p["pipeline_id"]: p for p in b.get("pipelines", [])}
    for pid in sorted(set(pa) | set(pb)):
        rows = [(name, _dig(pa.get(pid, {}), (key,)), _dig(pb.get(pid, {}), (key,))) for name, key in _PIPELINE_FIGURES]
        sections.append((f"pipeline {pid}", rows))
    return sections


def _refit_total(data: Mapping[str, Any]) -> Optional[float]:
    refit = data.get("refit")
    if not isinstance(refit, list):
        return None
    return ordered_sum(r.get("total_sync_s", 0.0) for r in refit)


def _num(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if isinstance(x, int):
        return f"{x:,}"
    return (
        f"{x:,.0f}" if float(x).is_integer() and abs(x) >= 1000 else f"{x:.4g}" if abs(x) < 1e-3 and x else f"{x:.2f}"
    )


def _delta(d: Optional[float]) -> str:
    if d is None:
        return "-"
    if d == 0:
        return "0"
    return f"{d:+,}" if isinstance(d, int) else f"{d:+.2f}"


def format_diff(
    sections: List[Tuple[str, List[Row]]], label_a: str, label_b: str, *, changed_only: bool = False
) -> str:
    head = ["figure", "A", "B", "B - A", "change"]
    lines = [f"A: {label_a}", f"B: {label_b}"]
    for title, rows in sections:
        table = []
        for name, x, y in rows:
            if x is None and y is None:
                continue
            delta = None if x is None or y is None else y - x
            if delta is not None and abs(delta) <= 1e-9 * max(abs(x), abs(y), 1.0):
                delta = 0  # float totals taken in another order: not a change
            if changed_only and delta == 0:
                continue
            pct = "-" if delta is None or not x else f"{100.0 * delta / abs(x):+.1f} %"
            table.append([name, _num(x), _num(y), _delta(delta), pct])
        if not table:
            continue
        widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(head)]
        fmt = lambda cells: "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )
        lines += ["", title, fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in table]
    return "\n".join(lines)
