"""``rlharness check LOG...``: every invariant check of the oracle on event logs (exit 1
on a violation), and the listing of violations that ``replay`` and ``simulate`` share.
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from harness.logs.outputs.paths import check_output_file
from harness.logs.writer import write_atomic
from rlharness.options import add_baseline, add_command, read_baseline

#: violations printed before the list is cut (the count of the rest is printed)
SHOWN_VIOLATIONS = 20


def add_parser(sub) -> None:
    ck = add_command(sub, "check", "run every invariant check on event logs (exit 1 on a violation)")
    ck.add_argument(
        "logs", metavar="LOG", nargs="+", help="event log(s): simulator, gate, replay output or scheduler trace"
    )
    ck.add_argument("--check", dest="names", metavar="NAME", action="append", help="run only this check (repeatable)")
    ck.add_argument(
        "--context", type=int, default=2, metavar="N", help="records shown either side of a violation (default 2)"
    )
    ck.add_argument("--max-shown", type=int, default=10, metavar="N", help="violations shown per log (default 10)")
    add_baseline(ck)
    ck.add_argument(
        "--write-baseline", metavar="FILE", help="write today's findings as a baseline file to start from (exit 0)"
    )


def run(args: argparse.Namespace, usage_error) -> int:
    from harness.logs.check import run_check

    if args.write_baseline:
        check_output_file(args.write_baseline, "--write-baseline", inputs=list(args.logs) + [args.baseline])
    return run_check(
        args.logs,
        names=args.names,
        context=max(args.context, 0),
        limit=max(args.max_shown, 0),
        baseline=read_baseline(args.baseline, args.upstream_as_findings),
        strict=args.strict,
        write_baseline=_baseline_writer(args.write_baseline, args.logs),
    )


def _baseline_writer(path: Optional[str], logs: Sequence[str]):
    if not path:
        return None
    from simulators.verdict.baseline import baseline_text

    def write(findings) -> None:
        write_atomic(path, [baseline_text(findings, ", ".join(logs))])
        print(f"baseline: {len(findings)} finding(s) written to {path}; replace each reason with why it is expected")

    return write


def print_violations(violations: Sequence[object], where_all: str) -> None:
    """The first :data:`SHOWN_VIOLATIONS` violations, then how many more and where all are."""
    for v in violations[:SHOWN_VIOLATIONS]:
        print(f"  violation: {v}")
    rest = len(violations) - SHOWN_VIOLATIONS
    if rest > 0:
        print(f"  ... and {rest} more violation(s) ({len(violations)} in all; {where_all})")
