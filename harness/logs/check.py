"""``rlharness check LOG...``: the whole invariant oracle on any event log.

Every check registered in :data:`harness.logs.invariants.CHECKS` runs — the catalogue here
and any check another module registers, which shows up in the table without a change
to this file. Per log the report is a table (check, pass / FAIL / n/a, records
examined), then each violation with the records around it.

What the oracle reads: the log as recorded (simulator, gate, replay output, a
converted RLix log). A *scheduler trace* — inputs and no decisions, such as
``examples/traces/*.jsonl`` — records only what the scheduler was told; its decisions
are derived by replaying the inputs through the scheduler model, interleaved after the
input that caused them, and the oracle reads that (``rlharness replay`` reads the same
log, so both commands agree on every input).

Exit codes (:class:`harness.exit_codes.ExitCode`): OK every check holds, FINDING a
violation in any log, BAD_INPUT bad input (one line).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

from harness.eventlog.kinds import category
from harness.exit_codes import ExitCode
from harness.logs.expect import Expectation, Finding, classify, from_violations, report_lines
from harness.logs.records import InputError, Record, read_records
from harness.logs.invariants import CHECKS, check_log
from harness.logs.invariants.base import Violation, examined

PASS, FAIL, NOT_APPLICABLE = "pass", "FAIL", "n/a"


@dataclass
class CheckRow:
    name: str
    status: str
    examined: int
    violations: List[Violation] = field(default_factory=list)


@dataclass
class OracleLog:
    """The records the oracle reads, where they came from, and each one's file line."""

    records: List[dict]
    how: str  # "as recorded" | "decisions derived by replay"
    lines: Optional[List[int]] = None  # file line per record (as recorded only)


def oracle_log(records: List[Record], path: str) -> OracleLog:
    """The log itself, or, for a scheduler trace (inputs, no decisions), its inputs with
    the decisions the scheduler model makes for them."""
    cats = {category(r.kind) for r in records}
    if "input" in cats and "decision" not in cats:
        from harness.logs.replay import replay_records  # local: replay imports the scheduler model

        merged = replay_records(records, path, merge=True).merged
        assert merged is not None
        return OracleLog(merged, "decisions derived by replaying its inputs through the scheduler model")
    return OracleLog([r.data for r in records], "as recorded", [r.line for r in records])


def run_oracle(records: Sequence[dict], names: Optional[Iterable[str]] = None) -> List[CheckRow]:
    """One row per check; a check that reads none of the log's record kinds is n/a."""
    selected = list(CHECKS) if names is None else list(names)
    unknown = [n for n in selected if n not in CHECKS]
    if unknown:
        raise InputError(f"--check: unknown check(s) {', '.join(unknown)}; known: {', '.join(sorted(CHECKS))}")
    rows = []
    for name in selected:
        n = examined(name, records)
        found = check_log(records, [name])
        status = FAIL if found else (PASS if n else NOT_APPLICABLE)
        rows.append(CheckRow(name, status, n, found))
    return rows


def _compact(rec: dict, width: int = 150) -> str:
    text = json.dumps({k: v for k, v in rec.items() if k != "seq"}, separators=(",", ":"))
    return text if len(text) <= width else text[:width - 3] + "..."


def render(path: str, log: OracleLog, rows: List[CheckRow], *, context: int = 2, limit: int = 10) -> str:
    """The table, then up to ``limit`` violations with ``context`` records either side."""
    out = [f"{path}: {len(log.records)} records ({log.how})"]
    width = max([len("check")] + [len(r.name) for r in rows])
    out.append(f"  {'check'.ljust(width)}  result  records examined  violations")
    out.append(f"  {'-' * width}  ------  ----------------  ----------")
    for r in rows:
        out.append(f"  {r.name.ljust(width)}  {r.status.ljust(6)}  {str(r.examined).rjust(16)}  {str(len(r.violations)).rjust(10)}")
    found = sorted((v for r in rows for v in r.violations), key=lambda v: (v.seq, v.invariant))
    index = {rec["seq"]: i for i, rec in enumerate(log.records)}
    for v in found[:limit]:
        out.append("")
        out.append(f"  violation {v}")
        i = index.get(v.seq)
        if i is None:
            continue
        for j in range(max(0, i - context), min(len(log.records), i + context + 1)):
            rec = log.records[j]
            where = f"line {log.lines[j]}" if log.lines else f"seq {rec['seq']}"
            mark = ">" if j == i else " "
            out.append(f"    {mark} {where:>10}  {_compact(rec)}")
    if len(found) > limit:
        out.append("")
        out.append(f"  ... {len(found) - limit} more violation(s) not shown (--max-shown)")
    total = len(found)
    failed = sorted({v.invariant for v in found})
    verdict = "every check holds" if not total else f"{total} violation(s) of {', '.join(failed)}"
    out.append(f"{path}: {verdict}")
    return "\n".join(out)


def check_file(path: str, names: Optional[Iterable[str]] = None) -> Tuple[OracleLog, List[CheckRow]]:
    log = oracle_log(read_records(path), path)
    return log, run_oracle(log.records, names)


def run_check(paths: Sequence[str], *, names: Optional[Sequence[str]] = None, context: int = 2, limit: int = 10,
              emit: Callable[[str], None] = print, baseline: Sequence[Expectation] = (), strict: bool = False,
              write_baseline: Optional[Callable[[List[Finding]], None]] = None) -> int:
    """``rlharness check``: every file is read and checked before anything is printed, so
    a bad file anywhere ends the command with one error line and no report.

    Violations are findings; with a ``baseline`` those it expects are reported apart and
    do not fail (one verdict over every log: an expectation is met by any of them).
    ``write_baseline`` receives every finding and the command exits 0: the findings of
    today are where a baseline starts."""
    results = []
    for path in paths:
        log, rows = check_file(path, names)
        results.append((path, log, rows))
    findings: List[Finding] = []
    for n, (path, log, rows) in enumerate(results):
        if n:
            emit("")
        emit(render(path, log, rows, context=context, limit=limit))
        findings += from_violations([v for r in rows for v in r.violations], log.records)
    if write_baseline is not None:
        write_baseline(findings)
        return ExitCode.OK
    verdict = classify(findings, baseline)
    if verdict.reported:
        for line in report_lines(verdict, strict):
            emit(line)
    return ExitCode.FINDING if verdict.failed(strict) else ExitCode.OK
