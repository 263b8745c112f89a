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
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from harness.eventlog.kinds import category
from harness.exit_codes import ExitCode
from harness.logs.expect import Expectation, Finding, classify, from_violations, report_lines
from harness.logs.jsonline import loads
from harness.logs.records import InputError, Record, iter_records, read_records
from harness.logs.invariants import CHECKS, check_log, merge_findings
from harness.logs.invariants.base import READS, Violation, examined
from harness.logs.invariants.online import OnlineOracle

PASS, FAIL, NOT_APPLICABLE = "pass", "FAIL", "n/a"


@dataclass
class CheckRow:
    name: str
    status: str
    examined: int
    violations: List[Violation] = field(default_factory=list)


@dataclass
class OracleLog:
    """The records the oracle reads, where they came from, and each one's file line. A
    log checked as it was read (:func:`stream_check`) keeps no records: ``count`` of
    them, the ones the findings read (``kept``), and where each seq is in the file."""

    records: List[dict]
    how: str  # "as recorded" | "decisions derived by replay"
    lines: Optional[List[int]] = None  # file line per record (as recorded only)
    count: Optional[int] = None  # (streamed) how many records
    path: Optional[str] = None  # (streamed) the file, read again for the records shown
    seqs: Optional[array] = None  # (streamed) each record's seq, in order
    line_of: Optional[array] = None  # (streamed) each record's file line

    def __len__(self) -> int:
        return len(self.records) if self.count is None else self.count

    def around(self, seqs: Sequence[int], context: int) -> Dict[int, List[Tuple[str, dict, bool]]]:
        """For each seq: ``(where, record, is_it)`` of the records ``context`` either side."""
        if self.count is None:
            index = {rec["seq"]: i for i, rec in enumerate(self.records)}
            spans = {s: index[s] for s in seqs if s in index}
            out = {}
            for s, i in spans.items():
                out[s] = [
                    (
                        f"line {self.lines[j]}" if self.lines else f"seq {self.records[j]['seq']}",
                        self.records[j],
                        j == i,
                    )
                    for j in range(max(0, i - context), min(len(self.records), i + context + 1))
                ]
            return out
        return _around_in_file(self, seqs, context)


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
    return text if len(text) <= width else text[: width - 3] + "..."


def render(path: str, log: OracleLog, rows: List[CheckRow], *, context: int = 2, limit: int = 10) -> str:
    """The table, then up to ``limit`` violations with ``context`` records either side."""
    out = [f"{path}: {len(log)} records ({log.how})"]
    width = max([len("check")] + [len(r.name) for r in rows])
    out.append(f"  {'check'.ljust(width)}  result  records examined  violations")
    out.append(f"  {'-' * width}  ------  ----------------  ----------")
    for r in rows:
        out.append(
            f"  {r.name.ljust(width)}  {r.status.ljust(6)}  {str(r.examined).rjust(16)}  {str(len(r.violations)).rjust(10)}"
        )
    found = sorted((v for r in rows for v in r.violations), key=lambda v: (v.seq, v.invariant))
    near = log.around([v.seq for v in found[:limit]], context)
    for v in found[:limit]:
        out.append("")
        out.append(f"  violation {v}")
        for where, rec, it in near.get(v.seq, ()):
            out.append(f"    {'>' if it else ' '} {where:>10}  {_compact(rec)}")
    if len(found) > limit:
        out.append("")
        out.append(f"  ... {len(found) - limit} more violation(s) not shown (--max-shown)")
    total = len(found)
    failed = sorted({v.invariant for v in found})
    verdict = "every check holds" if not total else f"{total} violation(s) of {', '.join(failed)}"
    out.append(f"{path}: {verdict}")
    return "\n".join(out)


def check_file(path: str, names: Optional[Iterable[str]] = None) -> Tuple[OracleLog, List[CheckRow]]:
    """The oracle on one file, read once (:func:`stream_check`); a scheduler trace (inputs,
    no decisions: small) is read whole and its decisions derived by replay."""
    selected = _selected(names)
    streamed = stream_check(path, selected)
    if streamed is not None:
        return streamed
    log = oracle_log(read_records(path), path)
    return log, run_oracle(log.records, selected)


def _selected(names: Optional[Iterable[str]]) -> List[str]:
    selected = list(CHECKS) if names is None else list(names)
    unknown = [n for n in selected if n not in CHECKS]
    if unknown:
        raise InputError(f"--check: unknown check(s) {', '.join(unknown)}; known: {', '.join(sorted(CHECKS))}")
    return selected


#: records the findings read of a checked log (harness.logs.expect.from_violations): kept;
#: the header first (its ``meta.pipeline_types``: an expectation's ``pipeline`` matches a type)
_FINDING_KINDS = ("header", "register", "fault_fired")


def stream_check(path: str, names: List[str], per_chunk: int = 8192) -> Optional[Tuple[OracleLog, List[CheckRow]]]:
    """The checks ``names`` over ``path`` as it is read, ``per_chunk`` records at a time
    (:class:`~harness.logs.invariants.online.OnlineOracle`): memory bounded by what the checks
    keep, not by the log. ``None`` for a scheduler trace (its decisions come from replay)."""
    oracle = OnlineOracle(names)
    seqs, line_of = array("q"), array("q")
    kinds: Counter = Counter()
    kept: List[dict] = []
    chunk: List[dict] = []
    try:
        for rec in iter_records(path):
            data = rec.data
            seqs.append(data["seq"])
            line_of.append(rec.line)
            kinds[data["kind"]] += 1
            if data["kind"] in _FINDING_KINDS:
                kept.append(data)
            chunk.append(data)
            if len(chunk) >= per_chunk:
                oracle(chunk)
                chunk = []
        oracle(chunk)
        cats = {category(k) for k in kinds}
        if "input" in cats and "decision" not in cats:
            oracle.close()
            return None
        found = oracle.finish()
    except BaseException:
        oracle.close()
        raise
    log = OracleLog(kept, "as recorded", count=len(seqs), path=path, seqs=seqs, line_of=line_of)
    rows = []
    for name in names:
        reads = READS.get(name)
        n = len(seqs) if reads is None else sum(kinds[k] for k in reads)
        status = FAIL if found[name] else (PASS if n else NOT_APPLICABLE)
        rows.append(CheckRow(name, status, n, merge_findings({name: found[name]}, [name])))
    return log, rows


def _around_in_file(log: OracleLog, seqs: Sequence[int], context: int) -> Dict[int, List[Tuple[str, dict, bool]]]:
    """:meth:`OracleLog.around` of a streamed log: the file read again, only the lines
    wanted decoded."""
    index = {s: i for i, s in enumerate(log.seqs) if s in set(seqs)} if seqs else {}
    want = {j for i in index.values() for j in range(max(0, i - context), min(len(log.seqs), i + context + 1))}
    if not want:
        return {}
    by_line = {log.line_of[j]: j for j in want}
    got: Dict[int, dict] = {}
    with open(log.path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            j = by_line.get(lineno)
            if j is not None:
                got[j] = loads(raw.decode("utf-8"))
                if len(got) == len(by_line):
                    break
    return {
        s: [
            (f"line {log.line_of[j]}", got[j], j == i)
            for j in range(max(0, i - context), min(len(log.seqs), i + context + 1))
        ]
        for s, i in index.items()
    }


def run_check(
    paths: Sequence[str],
    *,
    names: Optional[Sequence[str]] = None,
    context: int = 2,
    limit: int = 10,
    emit: Callable[[str], None] = print,
    baseline: Sequence[Expectation] = (),
    strict: bool = False,
    write_baseline: Optional[Callable[[List[Finding]], None]] = None,
) -> int:
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
        findings += from_violations(
            [v for r in rows for v in r.violations], log.records
        )  # (a streamed log keeps what it reads)
    if write_baseline is not None:
        write_baseline(findings)
        return ExitCode.OK
    verdict = classify(findings, baseline)
    if verdict.reported:
        for line in report_lines(verdict, strict):
            emit(line)
    return ExitCode.FINDING if verdict.failed(strict) else ExitCode.OK
