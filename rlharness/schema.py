"""``rlharness schema``: print the event log's JSON Schema (docs/trace-format.md)."""

from __future__ import annotations

import argparse
import sys

from harness.exit_codes import ExitCode


def add_parser(sub) -> None:
    sp = sub.add_parser("schema", help="print the event-log JSON Schema")
    sp.set_defaults(command="schema")


def run(args: argparse.Namespace, usage_error) -> int:
    from harness.logs.schema import render

    sys.stdout.write(render())
    return ExitCode.OK
