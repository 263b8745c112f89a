"""``rlharness calibrate`` and ``rlharness fidelity``: fit the simulator's costs to
measurements, and check the fitted costs against measurements held out of the fit. Each
has two targets: ``refit`` measures the real transport on this machine
(:mod:`rlharness.refit_calibrate`), ``step TIMINGS`` reads measured per-stage step times
(:mod:`rlharness.step_calibrate`).
"""

from __future__ import annotations

import argparse

from harness.exit_codes import ExitCode
from harness.logs.outputs.paths import check_output_file
from rlharness.options import positive_int


def add_parser(sub) -> None:
    """Both subcommands, ``calibrate`` then ``fidelity``."""
    _add_calibrate(sub)
    _add_fidelity(sub)


def _add_repeats(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=5,
        metavar="N",
        help="runs per configuration (minimum of, each after a warm-up run)",
    )


def _add_calibrate(sub) -> None:
    cal = sub.add_parser(
        "calibrate",
        help="fit the simulator's refit costs to the real transport on this machine "
        "(refit), or the cost model's efficiency factors to measured step times (step TIMINGS)",
    )
    cal.add_argument("target", choices=["refit", "step"], help="what to calibrate")
    cal.add_argument(
        "timings",
        nargs="?",
        metavar="TIMINGS",
        help="step only: measured per-stage step times (format: docs/cost-model.md)",
    )
    cal.add_argument(
        "--out",
        metavar="FILE",
        help="calibration file to write (default refit-calibration.json / step-calibration.json)",
    )
    cal.add_argument(
        "--hold-out",
        action="append",
        default=[],
        metavar="RUN",
        help="step only: leave this run of TIMINGS out of the fit (repeatable)",
    )
    _add_repeats(cal)
    cal.add_argument("--quick", action="store_true", help="a 4-point grid instead of 9")


def _add_fidelity(sub) -> None:
    fid = sub.add_parser(
        "fidelity",
        help="compare simulated refit times with fresh measurements on held-out "
        "configurations (refit), or predicted stage times with measured ones (step TIMINGS)",
    )
    fid.add_argument("target", choices=["refit", "step"], help="what to check")
    fid.add_argument("timings", nargs="?", metavar="TIMINGS", help="step only: measured per-stage step times")
    how = fid.add_mutually_exclusive_group(required=True)
    how.add_argument("--calibration", metavar="FILE", help="file written by `rlharness calibrate refit`")
    how.add_argument(
        "--fit-alongside",
        action="store_true",
        help="fit on the calibration grid measured in the same interleaved rounds (not from a file)",
    )
    _add_repeats(fid)
    fid.add_argument("--strict", action="store_true", help="exit 1 when the error targets are missed")


def run_calibrate(args: argparse.Namespace, usage_error) -> int:
    from rlharness.step_calibrate import step_command

    if step_command(args, usage_error, check_output_file):
        return ExitCode.OK
    from rlharness.refit_calibrate import cmd_calibrate

    out = args.out or "refit-calibration.json"
    check_output_file(out, "--out")  # before minutes of measuring
    return cmd_calibrate(out, args.repeats, args.quick)


def run_fidelity(args: argparse.Namespace, usage_error) -> int:
    from rlharness.step_calibrate import step_command

    if step_command(args, usage_error, check_output_file):
        return ExitCode.OK
    from rlharness.refit_calibrate import cmd_fidelity

    return cmd_fidelity(args.calibration, args.repeats, args.strict, alongside=args.fit_alongside)
