"""``rlharness replay INPUTS.jsonl``: a trace's input records through the scheduler model,
its decisions printed (or written with ``--out``), every invariant run on the whole input
log, and with ``--expect`` the decisions compared with a recorded log (docs/trace-format.md).
"""

from __future__ import annotations

import argparse
import json

from harness.exit_codes import ExitCode
from harness.logs.expect import report_lines
from harness.logs.outputs.paths import check_output_file
from harness.logs.records import read_records
from harness.logs.replay import compare_decisions, format_table, replay_file
from harness.logs.writer import write_atomic
from rlharness.check import print_violations
from rlharness.options import add_baseline, add_command, read_baseline


def add_parser(sub) -> None:
    rp = add_command(sub, "replay", "replay a scheduler trace through the scheduler model")
    rp.add_argument("trace", metavar="INPUTS.jsonl", help="event log whose input records are replayed")
    rp.add_argument("--out", metavar="PATH", help="write the decision log (JSONL) here")
    rp.add_argument(
        "--expect",
        metavar="RECORDED.jsonl",
        help=f"compare decisions with a recorded log; exit {ExitCode.DIVERGED:d} at the first divergence",
    )
    rp.add_argument("--quiet", action="store_true", help="print no table, only the summary line")
    rp.add_argument(
        "--verdict",
        metavar="FILE",
        help="write the verdict as JSON: decisions (matched / diverged / "
        "not compared), invariants, findings, exit code (docs/trace-format.md)",
    )
    add_baseline(rp)


def run(args: argparse.Namespace, usage_error) -> int:
    if args.out:
        check_output_file(args.out, "--out", inputs=[args.trace, args.expect])
    if args.verdict:
        check_output_file(args.verdict, "--verdict", inputs=[args.trace, args.expect, args.baseline, args.out])
    expected = read_records(args.expect) if args.expect else None  # fail on a bad --expect before any output
    baseline = read_baseline(args.baseline, args.upstream_as_findings)
    result = replay_file(args.trace)
    if not args.quiet:
        table, notes = format_table(result)
        print(table)
        for note in notes:
            print(f"  note: {note}")
    if result.open_cycle is not None:
        print(f"  note: cycle {result.open_cycle} was planned but never committed")
    if args.out:
        write_atomic(args.out, result.log.lines())
    cycles = sum(1 for d in result.decisions if d["kind"] == "commit")
    print(
        f"replayed {args.trace}: {cycles} cycles committed, {len(result.decisions)} decisions, {result.rejected} inputs rejected"
        + (f"; decision log: {args.out}" if args.out else "")
    )
    from harness.logs.check import oracle_log, render, run_oracle

    log = oracle_log(read_records(args.trace), args.trace)  # the whole input log, not only the replayed decisions
    rows = run_oracle(log.records)
    violations = [v for r in rows for v in r.violations]
    if args.quiet:
        print("invariants: all hold" if not violations else f"invariants: {len(violations)} violation(s)")
        print_violations(violations, "rlharness check lists them with their context")
    else:
        print(render(args.trace, log, rows))
    from harness.logs.expect import classify, from_violations

    verdict = classify(from_violations(violations, log.records), baseline)
    if verdict.reported:
        for line in report_lines(verdict, args.strict):
            print(line)
    div = compare_decisions(result.decisions, expected) if expected is not None else None
    if div is not None:
        print(f"DIVERGED at decision #{div.index} (expected file line {div.expected_line}):")
        print(f"  model:    {json.dumps(div.produced) if div.produced else '<no more decisions>'}")
        print(f"  recorded: {json.dumps(div.expected) if div.expected else '<no more decisions>'}")
    elif expected is not None:
        print(f"matches {args.expect}: {len(result.decisions)} decisions identical")
    code = ExitCode.DIVERGED if div is not None else ExitCode.FINDING if verdict.failed(args.strict) else ExitCode.OK
    if args.verdict:
        write_atomic(
            args.verdict,
            [json.dumps(replay_verdict(code, expected is not None, div, verdict, len(violations)), sort_keys=True)],
        )
    return code


def replay_verdict(code: int, compared: bool, div, verdict, violations: int) -> dict:
    """``replay --verdict``: what a script needs to tell a decision divergence (the model
    and the recording disagree: a model or system change) from an invariant violation
    in a replay whose decisions agree (the recorded behaviour itself is wrong)."""
    name = {ExitCode.DIVERGED: "diverged", ExitCode.FINDING: "violation", ExitCode.OK: "ok"}[code]
    return {
        "verdict": name,
        "exit": code,
        "decisions": "diverged" if div is not None else "identical" if compared else "not_compared",
        "divergence": None
        if div is None
        else {"index": div.index, "expected_line": div.expected_line, "model": div.produced, "recorded": div.expected},
        "invariants": {"violations": violations, **verdict.as_json()},
    }
