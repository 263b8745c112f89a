"""``rlharness import SOURCE``: a real system's log or config in, something this project
runs out. ``rlix-log`` (here) turns RLix's scheduler log lines into a replayable input
trace (docs/rlix-log-format.md); the config sources (:mod:`rlharness.import_config`) turn
a user's config into a scenario.
"""

from __future__ import annotations

import argparse

from harness.exit_codes import ExitCode
from harness.logs.outputs.paths import check_output_file
from harness.logs.writer import write_atomic
from rlharness import import_config
from rlharness.options import OneLineErrorParser


def add_parser(sub) -> None:
    imp = sub.add_parser("import", help="convert a real system's log into a replayable input trace")
    imp_sub = imp.add_subparsers(dest="source", metavar="SOURCE", parser_class=OneLineErrorParser)
    rl = imp_sub.add_parser("rlix-log", help="RLix's [RLIX_SCHED_LOG] stdout lines (format: docs/rlix-log-format.md)")
    rl.add_argument("log", metavar="LOG", help="RLix stdout (other lines are passed over)")
    rl.add_argument(
        "--topology",
        required=True,
        metavar="TOPOLOGY.yaml",
        help="cluster and pipeline registrations, which RLix's log does not carry (format: docs/rlix-log-format.md)",
    )
    rl.add_argument("--out", required=True, metavar="TRACE.jsonl", help="the input trace to write")
    rl.add_argument("--poll-s", type=float, default=1.0, metavar="SECONDS", help="RLix's poll period (default 1)")
    import_config.add_parsers(imp_sub)


def run(args: argparse.Namespace, usage_error) -> int:
    from harness.logs.importers.rlix_log import import_rlix_log

    if args.source in import_config.SOURCES:
        return import_config.run(args, usage_error)
    if args.source != "rlix-log":
        raise usage_error(f"import: a source is required (rlix-log, {', '.join(import_config.SOURCES)})")
    if not 0 < args.poll_s <= 3600:
        raise usage_error(f"--poll-s: must be in (0, 3600] seconds, got {args.poll_s:g}")
    check_output_file(args.out, "--out", inputs=[args.log, args.topology])
    res = import_rlix_log(args.log, args.topology, poll_s=args.poll_s)
    write_atomic(args.out, res.log.lines())
    for note in res.notes:
        print(f"  note: {note}")
    print(
        f"imported {args.log}: {res.inputs} inputs from RLix's log, {res.poll_cycles} poll cycle(s) added, "
        f"{len(res.notes)} note(s); trace: {args.out} (rlharness replay {args.out})"
    )
    return ExitCode.OK
