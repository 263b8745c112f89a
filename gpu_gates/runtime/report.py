"""Gate reports: atomic JSON files and the human summary rank 0 prints.

A report is written on every exit path, so a half-written file must never be mistaken
for a result: writes go to a temp file in the same folder and are renamed into place.
Rank 0 writes the merged report at ``--report PATH``; when a rank fails on its own it also
writes ``PATH`` with ``.rank<N>`` before the suffix, so what it knew survives even if
rank 0 never gets to merge.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

from harness.exit_codes import ExitCode

PASSED = "passed"
FAILED = "failed"
SKIPPED = "skipped"


def exit_code_for(status: str) -> ExitCode:
    """A gate's verdict as an exit code of the project's one table (a usage error is
    ``ExitCode.BAD_INPUT``, decided before there is a status)."""
    return {PASSED: ExitCode.OK, SKIPPED: ExitCode.SKIPPED}.get(status, ExitCode.FINDING)


def atomic_write_json(path: str, payload: Dict[str, Any]) -> None:
    from harness.logs.writer import atomic_write

    atomic_write(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


def rank_report_path(path: str, rank: int) -> str:
    """``out/r.json`` -> ``out/r.rank2.json`` (the per-rank fallback report)."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix or '.json'}"))


def default_event_log_path(report_path: Optional[str]) -> Optional[str]:
    if not report_path:
        return None
    p = Path(report_path)
    return str(p.with_name(p.stem + ".events.jsonl"))


def _cell(value: Any, width: int) -> str:
    text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def format_table(headers: List[str], rows: Iterable[List[Any]], max_width: int = 60) -> str:
    rows = [[_cell(c, max_width) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(row) for row in rows)
    return "\n".join(out)


def summary_text(report: Dict[str, Any]) -> str:
    """What rank 0 prints: verdict, per-rank table, per-check table, gate summary lines."""
    head = (
        f"gate {report.get('gate')}: {str(report.get('status')).upper()} "
        f"({report.get('backend')}, world {report.get('world_size')}, {report.get('elapsed_s', 0):.1f} s)"
    )
    lines = [head]
    if report.get("message"):
        lines.append(f"  {report['message']}")
    ranks = report.get("ranks", [])
    if ranks:
        rows = []
        for r in ranks:
            checks = r.get("checks", [])
            failed = sum(1 for c in checks if not c.get("passed"))
            first = (r.get("failures") or [""])[0]
            rows.append(
                [r.get("rank"), r.get("status"), r.get("phase"), f"{len(checks) - failed}/{len(checks)}", first]
            )
        lines += ["", format_table(["rank", "status", "last phase", "checks ok", "first failure"], rows)]
    by_check: Dict[str, List[int]] = {}
    for r in ranks:
        for c in r.get("checks", []):
            counts = by_check.setdefault(c["name"], [0, 0])
            counts[0 if c.get("passed") else 1] += 1
    if by_check:
        rows = [[name, counts[0], counts[1]] for name, counts in sorted(by_check.items())]
        lines += ["", format_table(["check", "passed", "failed"], rows)]
    for key, value in (report.get("summary") or {}).items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            for k, v in value.items():
                if isinstance(v, dict) and "verdict" in v:  # one readable line per mode/cycle
                    lines.append(f"  {k}: {str(v.get('status', '')).upper()} - {v['verdict']}")
                else:
                    lines.append(f"  {k}: {json.dumps(v, default=str)}")
        else:
            lines.append(f"{key}: {json.dumps(value, default=str)}")
    if report.get("missing_ranks"):
        lines.append(f"ranks that never reported: {report['missing_ranks']}")
    return "\n".join(lines)
