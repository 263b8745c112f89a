"""The ``rlharness`` command line.

Bad input of any kind (arguments, files, records) ends with one line
``error: <what>`` on stderr and exit code 2 — no traceback, no partial output file.
A replay whose decisions diverge from ``--expect`` exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from harness.eventlog.records import InputError, read_records
from harness.eventlog.writer import write_atomic
from harness.replay import compare_decisions, format_table, replay_file

EXIT_OK, EXIT_DIVERGED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print usage + exit 2; one line is clearer
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rlharness", description="Simulation-backed test harness for RL post-training on shared GPUs.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    rp = sub.add_parser("replay", help="replay a scheduler trace through the scheduler model")
    rp.add_argument("trace", metavar="INPUTS.jsonl", help="event log whose input records are replayed")
    rp.add_argument("--out", metavar="PATH", help="write the decision log (JSONL) here")
    rp.add_argument("--expect", metavar="RECORDED.jsonl", help="compare decisions with a recorded log; exit 1 at the first divergence")
    rp.add_argument("--quiet", action="store_true", help="print no table, only the summary line")
    sp = sub.add_parser("schema", help="print the event-log JSON Schema")
    sp.set_defaults(command="schema")
    return parser


def _cmd_replay(args: argparse.Namespace) -> int:
    expected = read_records(args.expect) if args.expect else None  # fail on a bad --expect before any output
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
    print(f"replayed {args.trace}: {cycles} cycles committed, {len(result.decisions)} decisions, {result.rejected} inputs rejected"
          + (f"; decision log: {args.out}" if args.out else ""))
    if expected is not None:
        div = compare_decisions(result.decisions, expected)
        if div is not None:
            print(f"DIVERGED at decision #{div.index} (expected file line {div.expected_line}):")
            print(f"  model:    {json.dumps(div.produced) if div.produced else '<no more decisions>'}")
            print(f"  recorded: {json.dumps(div.expected) if div.expected else '<no more decisions>'}")
            return EXIT_DIVERGED
        print(f"matches {args.expect}: {len(result.decisions)} decisions identical")
    return EXIT_OK


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            raise UsageError("a command is required (replay, schema); see rlharness --help")
        if args.command == "replay":
            return _cmd_replay(args)
        if args.command == "schema":
            from harness.eventlog.schema import render
            sys.stdout.write(render())
            return EXIT_OK
        raise UsageError(f"unknown command {args.command!r}")
    except (UsageError, InputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
