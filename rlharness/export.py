"""``rlharness export LOG --perfetto OUT --png OUT``: the pictures of any event log.

A simulator run writes its Perfetto trace and PNG timeline itself; a gate log, a replay
decision log or a log from an older run gets them here, drawn by the same writers from
the records alone. The log is read (and checked) and every output path is checked
before anything is drawn; each output is written atomically.

The PNG is the work timeline (GPU x time, by kind of work and pipeline) when the log
has work intervals. A log with only scheduler records gets the allocation timeline
instead (GPU x time, by cluster and priority: :mod:`harness.logs.outputs.allocation_timeline`)
— from its decisions (a ``replay --out`` log), or, for an input trace with no decisions
(an imported RLix log), from the decisions the scheduler model makes replaying it. A log
with neither is refused in one line before anything is written: a picture of empty axes
says nothing.
"""

from __future__ import annotations

import argparse

from harness.logs.records import read_records
from harness.exit_codes import ExitCode
from harness.logs.outputs.paths import check_output_file


def add_parser(sub) -> None:
    ex = sub.add_parser("export", help="draw the Perfetto trace and/or PNG timeline of any event log")
    ex.add_argument("log", metavar="LOG.jsonl", help="event log (simulator, gate or replay)")
    ex.add_argument(
        "--perfetto", metavar="OUT.json", help="write a Chrome/Perfetto trace here (open in ui.perfetto.dev)"
    )
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

    from harness.logs.outputs.run_view import RunView

    view = RunView(records)
    png_kind = _png_kind(view, args, usage_error) if args.png else None
    written = []
    if args.perfetto:
        from harness.logs.outputs.perfetto import write_chrome_trace

        write_chrome_trace(view, args.perfetto)
        written.append(args.perfetto)
    if png_kind == "work":
        from harness.logs.outputs.timeline import write_timeline_png

        write_timeline_png(view, args.png)
        written.append(args.png)
    elif png_kind is not None:
        _write_allocations(view, args, png_kind)
        written.append(
            f"{args.png} (GPU allocations{' as replayed by the scheduler model' if png_kind == 'replayed' else ''})"
        )
    print(f"exported {args.log} ({len(records)} records): {', '.join(written)}")
    return ExitCode.OK


def _png_kind(view, args: argparse.Namespace, usage_error) -> str:
    """ "work", "decisions" or "replayed": which picture the log can give (or a usage error)."""
    from harness.eventlog.kinds import category
    from harness.logs.outputs.allocation_timeline import has_decisions

    if len(view.work_columns.start):
        return "work"
    if has_decisions(view.records):
        return "decisions"
    if any(category(r["kind"]) == "input" for r in view.records[1:]):
        return "replayed"
    kinds = sorted({r["kind"] for r in view.records[1:]})
    raise usage_error(
        f"--png {args.png}: {args.log} has no work intervals and no scheduler records to draw "
        f"(its kinds: {', '.join(kinds) or 'only a header'})"
    )


def _write_allocations(view, args: argparse.Namespace, png_kind: str) -> None:
    from harness.logs.outputs.allocation_timeline import write_allocation_png
    from harness.logs.outputs.timeline import time_label

    records = view.records
    name = view.scenario or args.log.rsplit("/", 1)[-1]
    if png_kind == "replayed":
        from harness.logs.replay import replay_records

        records = replay_records(read_records(args.log), args.log, merge=True).merged
        title = f"{name} - GPU allocations (replayed by the scheduler model)"
    else:
        title = f"{name} - GPU allocations"
    write_allocation_png(records, args.png, title=title, time_label=time_label(view))
