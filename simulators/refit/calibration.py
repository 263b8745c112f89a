"""The refit calibration file: costs fitted on a machine by ``rlharness calibrate refit``.

A scenario references one with ``refit_calibration: <path>`` (relative to the scenario
file); its costs fill every ``CostSpec`` field the scenario's own ``costs:`` section does
not set, so a scenario can take the measured refit costs of this machine and still pin a
value by hand. The file is JSON::

    {"format": "rlharness-refit-calibration", "version": 1,
     "costs": {"refit_pack_bytes_per_s": ..., "receiver_load_bytes_per_s": ..., ...},
     "machine": {...}, "grid": [...measurements...], "fit": {...}}
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Dict, Set, Tuple

from harness.logs.writer import atomic_write
from simulators.scenario.spec import CostSpec

FORMAT = "rlharness-refit-calibration"
VERSION = 1
# what a calibration may set: the refit stream's costs and the cache build's
CALIBRATED_COSTS = (
    "refit_pack_bytes_per_s",
    "receiver_load_bytes_per_s",
    "refit_group_overhead_s",
    "refit_tensor_overhead_s",
    "refit_setup_s",
    "refit_staging_bytes_per_s",
    "refit_complete_s",
    "cache_pack_bytes_per_s",
)
_POSITIVE = ("receiver_load_bytes_per_s", "cache_pack_bytes_per_s")


class CalibrationError(ValueError):
    """A calibration file that cannot be used (message names the file and the field)."""


def resolve(path: str, scenario_source: str) -> str:
    """A relative path is relative to the scenario file's folder (or the working directory)."""
    if os.path.isabs(path) or not os.path.isfile(scenario_source):
        return os.path.abspath(path)
    return os.path.abspath(os.path.join(os.path.dirname(scenario_source), path))


def read_calibration_file(path: str, fmt: str, version: int, error: type, what: str) -> Dict[str, Any]:
    """A calibration file's JSON, its ``format``, ``version`` and ``costs`` mapping checked:
    one reader for every calibration file (refit here, step in simulators/costmodel), each
    problem one ``error`` line naming the file and the field."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise error(f"{path}: not JSON: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise error(f"{path}: not a {what} calibration file (format must be {fmt!r})")
    if data.get("version") != version:
        raise error(f"{path}: version {data.get('version')!r} unsupported (expected {version})")
    if not isinstance(data.get("costs"), dict):
        raise error(f"{path}: costs: expected a mapping")
    return data


def load_calibration(path: str) -> Dict[str, float]:
    """The validated ``costs`` mapping of a calibration file."""
    costs = read_calibration_file(path, FORMAT, VERSION, CalibrationError, "refit")["costs"]
    out: Dict[str, float] = {}
    for key, value in costs.items():
        if key not in CALIBRATED_COSTS:
            raise CalibrationError(f"{path}: costs.{key}: not a calibrated cost (known: {', '.join(CALIBRATED_COSTS)})")
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
            or (key in _POSITIVE and value == 0)
        ):
            raise CalibrationError(
                f"{path}: costs.{key}: expected a {'positive' if key in _POSITIVE else 'non-negative'} "
                f"number, got {value!r}"
            )
        out[key] = float(value)
    return out


def apply_calibration(path: str, scenario_source: str, costs: CostSpec, explicit: Set[str]) -> Tuple[str, CostSpec]:
    """(absolute path, costs with the file's values wherever ``explicit`` does not pin one)."""
    full = resolve(path, scenario_source)
    calibrated = load_calibration(full)
    return full, dataclasses.replace(costs, **{k: v for k, v in calibrated.items() if k not in explicit})


def write_calibration(path: str, costs: Dict[str, float], **extra: Any) -> None:
    """Write atomically (a temp file renamed into place): never half a file."""
    body = {
        "format": FORMAT,
        "version": VERSION,
        "costs": {k: costs[k] for k in CALIBRATED_COSTS if k in costs},
        **extra,
    }
    atomic_write(path, [json.dumps(body, indent=2) + "\n"])
