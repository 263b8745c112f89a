"""``rlharness export LOG --perfetto OUT --png OUT``: the pictures of any event log.

A simulator run writes its Perfetto trace and PNG timeline itself; a gate log, a replay
decision log or a log from an older run gets them here, drawn by the same writers from
the records alone. The log is read (and checked) and every output path is checked
before anything is drawn; each output is written atomically.
"""

from __future__ import annotations

import argparse

from harness.eventlog.records import read_records
from harness.outputs.paths import check_output_file


def add_parser(sub) -> None:
    ex = sub.add_parser("export", help="draw the Perfetto trace and/or PNG timeline of any event log")
    ex.add_argument("log", metavar="LOG.jsonl", help="event log (simulator, gate or replay)")
    ex.add_argument("--perfetto", metavar="OUT.json", help="write a Chrome/Perfetto trace here (open in ui.perfetto.dev)")
    ex.add_argument("--png", metavar="OUT.png", help="write a PNG timeline here")


def run(args: argparse.Namespace, usage_error) -> int:
    if not args.perfetto and not args.png:
        raise usage_error("export: give --perfetto OUT and/or --png OUT")
    if args.perfetto and args.png and args.perfetto == args.png:
        raise usage_error(f"export: --perfetto and --png are the same path {args.png}")
    if args.perfetto:
        check_output_file(args.perfetto, "--perfetto", inputs=[args.log])
    if args.png:
        check_output_file(args.png, "--png", inputs=[args.log])
    records = [r.data for r in read_records(args.log)]

    from harness.outputs.run_view import RunView

    view = RunView(records)
    written = []
    if args.perfetto:
        from harness.outputs.perfetto import write_chrome_trace

        write_chrome_trace(view, args.perfetto)
        written.append(args.perfetto)
    if args.png:
        from harness.outputs.timeline import write_timeline_png

        write_timeline_png(view, args.png)
        written.append(args.png)
    print(f"exported {args.log} ({len(records)} records): {', '.join(written)}")
    return 0
