"""``rlharness calibrate step TIMINGS`` and ``rlharness fidelity step TIMINGS``.

``calibrate`` fits the cost model's efficiency factors to a run's measured per-stage step
times (``simulators/costmodel/stepfit.py`` gives the file format and the fit) and writes a
calibration file a scenario references with ``step_calibration: FILE``; runs named with
``--hold-out`` are left out of the fit and recorded, so ``fidelity`` can report the error
on them apart from the fitted ones. Bad input is one line naming the field (exit 2),
found before anything is written.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Sequence

from harness.logs.writer import atomic_write
from harness.exit_codes import ExitCode
from simulators.costmodel import stepfit, stepfit_parse


class StepCalibrationError(ValueError):
    """Bad input to the step calibration (message names the file and the field)."""


def read_timings(path: str) -> List[stepfit.Run]:
    from simulators.scenario.yaml_dialect import strict_safe_load

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read(1 << 22)
    except OSError as e:
        raise StepCalibrationError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise StepCalibrationError(f"{path}: not UTF-8 text") from None
    try:
        data = json.loads(text) if path.endswith(".json") else strict_safe_load(text)
    except Exception as e:  # noqa: BLE001 - a parser's error becomes one line naming the file
        raise StepCalibrationError(
            f"{path}: not {'JSON' if path.endswith('.json') else 'YAML'}: {' '.join(str(e).split())}"
        ) from None
    try:
        return stepfit.parse_timings(data, path)
    except stepfit.StepTimingsError as e:
        raise StepCalibrationError(str(e)) from None


def load_step_calibration(path: str) -> Dict[str, Any]:
    try:
        return stepfit_parse.load_calibration(path)
    except stepfit.StepTimingsError as e:
        raise StepCalibrationError(str(e)) from None


def cmd_calibrate_step(timings: str, out: str, hold_out: Sequence[str]) -> int:
    runs = read_timings(timings)
    names = {r.name for r in runs}
    for name in hold_out:
        if name not in names:
            raise StepCalibrationError(f"--hold-out: no run named {name!r} in {timings}")
    fitted = [r for r in runs if r.name not in hold_out]
    if not fitted:
        raise StepCalibrationError("--hold-out: every run is held out; nothing is left to fit")
    factors = stepfit.fit(fitted)
    body = {
        "format": stepfit.CALIBRATION_FORMAT,
        "version": stepfit.VERSION,
        "costs": {k: round(factors[k], 6) for k in stepfit.FACTORS if k in factors},
        "timings": os.path.basename(timings),
        "fitted": sorted(r.name for r in fitted),
        "held_out": sorted(hold_out),
    }
    atomic_write(out, [json.dumps(body, indent=2) + "\n"])
    for key in stepfit.FACTORS:
        print(f"{key:24} {factors[key]:.4f}" if key in factors else f"{key:24} (not measured: default kept)")
    print(f"wrote {out}; a scenario uses it with `step_calibration: {out}` (its own costs still win)")
    return ExitCode.OK


def cmd_fidelity_step(timings: str, calibration: str) -> int:
    runs = read_timings(timings)
    cal = load_step_calibration(calibration)
    held = set(cal["held_out"])
    rows = stepfit.errors(runs, cal["costs"])
    print(f"{'run':20} {'':9} {'stage':13} {'measured s':>11} {'predicted s':>11} {'error':>7}")
    for run, stage, measured, predicted in rows:
        tag = "held out" if run in held else "fitted"
        print(
            f"{run:20} {tag:9} {stage:13} {measured:11.2f} {predicted:11.2f} {100 * (predicted - measured) / measured:+6.1f}%"
        )
    _summary("held-out runs", [r for r in rows if r[0] in held])
    _summary("fitted runs", [r for r in rows if r[0] not in held])
    return ExitCode.OK


def _summary(label: str, rows: List[Any]) -> None:
    if not rows:
        print(f"{label}: none")
        return
    errs = sorted(abs(p - m) / m for _, _, m, p in rows)
    median = errs[len(errs) // 2] if len(errs) % 2 else (errs[len(errs) // 2 - 1] + errs[len(errs) // 2]) / 2
    print(f"{label}: {len(rows)} stage means, median |error| {100 * median:.1f} %, worst {100 * errs[-1]:.1f} %")


def step_command(args: Any, usage_error: type, check_output_file: Any) -> bool:
    """Run ``calibrate step`` / ``fidelity step`` (True), or check a refit call takes
    none of the step arguments (False: the caller runs the refit command)."""
    if args.target != "step":
        if args.timings:
            raise usage_error(f"{args.command} refit takes no TIMINGS file (got {args.timings!r})")
        if getattr(args, "hold_out", None):
            raise usage_error("--hold-out: only for calibrate step")
        return False
    if not args.timings:
        raise usage_error(f"{args.command} step: TIMINGS (the measured step times file) is required")
    try:
        if args.command == "calibrate":
            out = args.out or "step-calibration.json"
            check_output_file(out, "--out")
            cmd_calibrate_step(args.timings, out, args.hold_out)
        else:
            if not args.calibration:
                raise usage_error(
                    "fidelity step: --calibration FILE (from `rlharness calibrate step`) is required "
                    "(--fit-alongside is for fidelity refit)"
                )
            cmd_fidelity_step(args.timings, args.calibration)
    except StepCalibrationError as e:
        raise usage_error(str(e)) from None
    return True
