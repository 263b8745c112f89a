"""``rlharness diff RUN_A RUN_B``: two run folders' figures side by side, with the deltas."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Dict

from harness.exit_codes import ExitCode


def add_parser(sub) -> None:
    df = sub.add_parser("diff", help="two run folders' figures side by side (from their summary.json), with the deltas")
    df.add_argument("run_a", metavar="RUN_A", help="a run folder (or its summary.json)")
    df.add_argument("run_b", metavar="RUN_B", help="the run to compare with it")
    df.add_argument("--changed", action="store_true", help="show only the figures that differ")


def _load(path: str, arg: str, usage_error) -> Dict[str, Any]:
    file = os.path.join(path, "summary.json") if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise usage_error(f"{arg} {path}: no summary.json there (a folder written by rlharness simulate)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise usage_error(f"{arg} {file}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    except json.JSONDecodeError as e:
        raise usage_error(f"{arg} {file}: not JSON: {e.msg} (line {e.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("pipelines"), list):
        raise usage_error(f"{arg} {file}: not a run summary (no pipelines list)")
    return data


def run(args: argparse.Namespace, usage_error) -> int:
    from harness.logs.outputs.run_diff import diff_rows, format_diff

    a = _load(args.run_a, "RUN_A", usage_error)
    b = _load(args.run_b, "RUN_B", usage_error)
    print(
        format_diff(
            diff_rows(a, b),
            f"{args.run_a} ({a.get('scenario', '?')})",
            f"{args.run_b} ({b.get('scenario', '?')})",
            changed_only=args.changed,
        )
    )
    return ExitCode.OK
