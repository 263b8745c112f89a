"""The timings file's field checks (format: ``simulators/costmodel/stepfit.py``): every
problem is one ``StepTimingsError`` naming the field, found before any fitting."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping

from simulators.refit.calibration import read_calibration_file
from simulators.costmodel import formulas as f
from simulators.costmodel.hardware import GPU_PRESETS
from simulators.costmodel.models import MODEL_PRESETS
from simulators.costmodel.stepfit import (
    CALIBRATION_FORMAT,
    FACTORS,
    STAGES,
    TIMINGS_FORMAT,
    VERSION,
    Run,
    StepTimingsError,
)

_RUN_KEYS = (
    "name",
    "gpu",
    "gpus_per_node",
    "model",
    "train_gpus",
    "infer_gpus",
    "infer_tp",
    "colocated",
    "train",
    "log_prob_passes",
    "batch",
    "steps",
)
_MODEL_KEYS = (
    "preset",
    "params",
    "active_params",
    "layers",
    "hidden_size",
    "num_kv_heads",
    "head_dim",
    "experts_per_token",
    "bytes_per_param",
)
_TRAIN_KEYS = ("tp", "pp", "cp", "ep", "micro_batch", "global_batch")
_BATCH_KEYS = ("trajectories", "prompt_tokens", "decode_tokens")


def _fail(where: str, path: str, problem: str) -> StepTimingsError:
    return StepTimingsError(f"{where}: {path}: {problem}")


def _mapping(where: str, path: str, value: Any, known) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where, path, f"expected a mapping, got {type(value).__name__}")
    for key in value:
        if key not in known:
            raise _fail(where, f"{path}.{key}", f"unknown field (known: {', '.join(known)})")
    return value


def _int(where: str, path: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _fail(where, path, f"expected an integer >= {low}, got {value!r}")
    return value


def _num(where: str, path: str, value: Any, positive: bool = True) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        raise _fail(where, path, f"expected a {'positive' if positive else 'non-negative'} number, got {value!r}")
    return float(value)


def parse(data: Any, where: str) -> List[Run]:
    top = _mapping(where, "(top level)", data, ("format", "version", "runs"))
    if top.get("format") != TIMINGS_FORMAT:
        raise _fail(where, "format", f"must be {TIMINGS_FORMAT!r}, got {top.get('format')!r}")
    if top.get("version") != VERSION:
        raise _fail(where, "version", f"must be {VERSION}, got {top.get('version')!r}")
    runs = top.get("runs")
    if not isinstance(runs, list) or not runs:
        raise _fail(where, "runs", "expected a non-empty list of runs")
    out, names = [], set()
    for i, raw in enumerate(runs):
        run = _run(where, f"runs[{i}]", raw)
        if run.name in names:
            raise _fail(where, f"runs[{i}].name", f"duplicate run name {run.name!r}")
        names.add(run.name)
        out.append(run)
    return out


def _run(where: str, path: str, raw: Any) -> Run:
    r = _mapping(where, path, raw, _RUN_KEYS)
    for key in ("name", "gpu", "model", "train_gpus", "infer_gpus", "batch", "steps"):
        if key not in r:
            raise _fail(where, f"{path}.{key}", "missing (required)")
    if not isinstance(r["name"], str) or not r["name"]:
        raise _fail(where, f"{path}.name", f"expected a non-empty string, got {r['name']!r}")
    if r["gpu"] not in GPU_PRESETS:
        raise _fail(where, f"{path}.gpu", f"unknown GPU preset {r['gpu']!r}; known: {', '.join(sorted(GPU_PRESETS))}")
    per_node = _int(where, f"{path}.gpus_per_node", r.get("gpus_per_node", 8))
    train_gpus = _int(where, f"{path}.train_gpus", r["train_gpus"])
    infer_gpus = _int(where, f"{path}.infer_gpus", r["infer_gpus"])
    tp = _int(where, f"{path}.infer_tp", r.get("infer_tp", 1))
    if infer_gpus % tp:
        raise _fail(where, f"{path}.infer_tp", f"{tp} does not divide infer_gpus {infer_gpus}")
    colocated = r.get("colocated", True)
    if not isinstance(colocated, bool):
        raise _fail(where, f"{path}.colocated", f"expected true or false, got {colocated!r}")
    layout = _layout(where, f"{path}.train", r.get("train", {}))
    problem = f.layout_problem(train_gpus, layout)
    if problem is not None:
        raise _fail(where, f"{path}.train", problem)
    b = _mapping(where, f"{path}.batch", r["batch"], _BATCH_KEYS)
    for key in _BATCH_KEYS:
        if key not in b:
            raise _fail(where, f"{path}.batch.{key}", "missing (required)")
    steps = _steps(where, f"{path}.steps", r["steps"])
    return Run(
        r["name"],
        GPU_PRESETS[r["gpu"]],
        per_node,
        _arch(where, f"{path}.model", r["model"]),
        train_gpus,
        infer_gpus,
        tp,
        colocated,
        layout,
        _int(where, f"{path}.batch.trajectories", b["trajectories"]),
        _num(where, f"{path}.batch.prompt_tokens", b["prompt_tokens"], positive=False),
        _num(where, f"{path}.batch.decode_tokens", b["decode_tokens"]),
        steps,
        _int(where, f"{path}.log_prob_passes", r.get("log_prob_passes", 1)),
    )


def _layout(where: str, path: str, raw: Any) -> f.Parallel:
    t = _mapping(where, path, raw, _TRAIN_KEYS)
    v = {k: _int(where, f"{path}.{k}", t[k], 0 if k == "global_batch" else 1) for k in _TRAIN_KEYS if k in t}
    return f.Parallel(**v)


def _arch(where: str, path: str, raw: Any) -> f.Arch:
    m: Dict[str, Any] = dict(_mapping(where, path, raw, _MODEL_KEYS))
    preset = m.pop("preset", None)
    if preset is not None:
        if preset not in MODEL_PRESETS:
            raise _fail(
                where, f"{path}.preset", f"unknown model preset {preset!r}; known: {', '.join(sorted(MODEL_PRESETS))}"
            )
        p = MODEL_PRESETS[preset]
        m = {
            "params": p.params,
            "active_params": p.active_params,
            "layers": p.layers,
            "hidden_size": p.hidden_size,
            "num_kv_heads": p.num_kv_heads,
            "head_dim": p.head_dim,
            "experts_per_token": p.experts_per_token,
            **m,
        }
    for key in ("params", "layers", "hidden_size", "num_kv_heads", "head_dim"):
        if key not in m:
            raise _fail(where, f"{path}.{key}", "missing (required without a preset)")
    params = _num(where, f"{path}.params", m["params"])
    return f.Arch(
        params,
        _num(where, f"{path}.active_params", m.get("active_params") or params),
        _int(where, f"{path}.layers", m["layers"]),
        _int(where, f"{path}.hidden_size", m["hidden_size"]),
        _int(where, f"{path}.num_kv_heads", m["num_kv_heads"]) * _int(where, f"{path}.head_dim", m["head_dim"]),
        _int(where, f"{path}.bytes_per_param", m.get("bytes_per_param", 2)),
        _int(where, f"{path}.experts_per_token", m.get("experts_per_token", 0), 0),
    )


def _steps(where: str, path: str, raw: Any):
    if not isinstance(raw, list) or not raw:
        raise _fail(where, path, "expected a non-empty list of steps")
    out = []
    for j, step in enumerate(raw):
        s = _mapping(where, f"{path}[{j}]", step, STAGES)
        if not s:
            raise _fail(where, f"{path}[{j}]", f"names no stage (one or more of {', '.join(STAGES)})")
        out.append({k: _num(where, f"{path}[{j}].{k}", v) for k, v in s.items()})
    return tuple(out)


def load_calibration(path: str) -> Dict[str, Any]:
    """A step calibration file (written by ``rlharness calibrate step``), validated:
    ``{"costs": {factor: value in (0, 1]}, "held_out": [run names], ...}``."""
    data = read_calibration_file(path, CALIBRATION_FORMAT, VERSION, StepTimingsError, "step")
    costs = data["costs"]
    for key, value in costs.items():
        if key not in FACTORS:
            raise StepTimingsError(f"{path}: costs.{key}: not a step-calibrated factor (known: {', '.join(FACTORS)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value <= 1):
            raise StepTimingsError(f"{path}: costs.{key}: expected a number in (0, 1], got {value!r}")
    held = data.get("held_out", [])
    if not isinstance(held, list) or not all(isinstance(h, str) for h in held):
        raise StepTimingsError(f"{path}: held_out: expected a list of run names")
    return data
