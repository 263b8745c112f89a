"""What several subcommands of the command line share: the parser whose errors are one
line, the exit-code table every command's help ends with, and the expected-findings
flags (``--baseline``, ``--strict``, ``--upstream-as-findings``) with the reading of
their file.

Kept apart from :mod:`rlharness.cli` so that a subcommand's module (which adds its parser
and runs it) needs nothing from the program that dispatches to it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from harness.exit_codes import ExitCode

EXIT_CODES_HELP = f"""exit codes (every command; docs/cli.md#exit-codes):
  {ExitCode.OK:<4d} done, nothing found (every invariant held, a replay matched)
  {ExitCode.FINDING:<4d} a finding: the simulated system failed, an invariant broke, a determinism
       check found a difference (a simulation cut by its horizon is an outcome: 0 unless
       the oracle finds a stall); findings a scenario's expect: list or --baseline FILE
       covers are reported, not failures, and --strict also fails on an expected finding
       that did not occur (docs/expected-findings.md)
  {ExitCode.BAD_INPUT:<4d} bad input: one line "error: <where>: <what>" on stderr, nothing written
  {ExitCode.DIVERGED:<4d} replay --expect: a decision diverged from the recorded log (whatever the
       invariants say; a finding from replay is an invariant violation alone)
  {ExitCode.SKIPPED:<4d} gate: the gate skipped (the node cannot host it; the reason is in its report)
  {ExitCode.INTERRUPTED:<4d} interrupted
  {ExitCode.BROKEN_PIPE:<4d} the output pipe was closed before all output was written (e.g. | head);
       nothing more is printed, nothing on stderr (--help and --version too)"""


class UsageError(Exception):
    pass


class OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print usage + exit 2; one line is clearer
        raise UsageError(message)

    def _print_message(self, message: str, file=None) -> None:
        # argparse swallows write errors here (a closed pipe under --help would exit 0);
        # let BrokenPipeError reach main(), which ends every command the same way (141)
        if message:
            (file or sys.stderr).write(message)


def add_command(sub, name: str, help: str) -> argparse.ArgumentParser:
    """A subcommand whose help ends with the exit-code table (and keeps its line breaks)."""
    return sub.add_parser(name, help=help, epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def add_baseline(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--baseline", metavar="FILE", help="expected findings (docs/expected-findings.md): reported, not failures"
    )
    p.add_argument("--strict", action="store_true", help="exit 1 also when an expected finding did not occur")
    add_upstream_flag(p)


def add_upstream_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--upstream-as-findings",
        action="store_true",
        help="count known upstream behaviour (RLix, NeMo RL, ROLL as they are today; "
        "docs/expected-findings.md) as findings: for people changing those systems",
    )


def read_baseline(path: Optional[str], upstream_as_findings: bool = False):
    """The baseline's expectations, then the known upstream behaviours (unless counted as findings)."""
    from harness.logs.known_upstream import upstream_expectations
    from simulators.verdict.baseline import BaselineError, read_baseline as read_file

    try:
        return read_file(path) + upstream_expectations(upstream_as_findings)
    except BaselineError as e:
        raise UsageError(str(e)) from None
