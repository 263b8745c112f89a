"""``rlharness what-if colocate SCENARIO``: one workload in four shapes, side by side.

The scenario's one pipeline gives the workload (model, batch, lengths, steps, costs) and its
GPUs G (train ∪ infer). Four variants run it on the same G:

* ``colocated``: a ``roll_sync`` pipeline whose training and generation share every GPU
  of G (generate, then log-probs and training, then refit; RLix shrinks the generation to
  nothing for training);
* ``partial_overlap``: RLix's ``nemo_async`` with training on the first half of G and
  generation on all of it (the overlap ranks sleep while training runs);
* ``one_step_off`` and ``fully_async``: a ``disaggregated`` pipeline with training on the
  first half and generation on the second (``harness/control/disaggregated.py``).

Per variant: the mean step, GPU-hours per step (|G| x mean step), the share of GPU-time
idle, the mean staleness of the trained trajectories (versions), and the oracle's findings.
Writes ``table.txt``, ``results.json`` and ``colocate.png`` (docs/what-if.md).
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any, Dict, List, Optional

from harness.ordered_sum import ordered_sum

FILES = ("table.txt", "results.json", "colocate.png")
#: the variants, in the table's order: (name, what it is)
SHAPES = (
    ("colocated", "roll_sync, training and generation on every GPU"),
    ("partial_overlap", "RLix nemo_async, training on half, generation on all"),
    ("one_step_off", "disaggregated one step off, half and half"),
    ("fully_async", "disaggregated fully async (pause), half and half"),
)
# fields that belong to one pipeline type or one placement and would be refused on another
_TYPE_FIELDS = ("streaming", "disaggregated", "refit_path", "refit_export", "weight_sync_groups")


class ColocateError(ValueError):
    """The scenario cannot be recast: one line naming the field."""


def variants(mapping: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The four scenario mappings of :data:`SHAPES`, from the scenario's one pipeline."""
    pipes = mapping.get("pipelines")
    if not isinstance(pipes, list) or len(pipes) != 1 or not isinstance(pipes[0], dict):
        raise ColocateError("pipelines: what-if colocate needs exactly one pipeline (the workload)")
    pipe = pipes[0]
    gpus = sorted(set(pipe.get("train_gpus", [])) | set(pipe.get("infer_gpus", [])))
    tp = int(pipe.get("infer_tp", 1))
    half = len(gpus) // 2
    if half < tp or half % tp or (len(gpus) - half) % tp:
        raise ColocateError(
            f"pipelines[0].infer_gpus: {len(gpus)} GPUs do not split into two halves of whole TP-{tp} bundles"
        )
    train, gen = gpus[:half], gpus[half:]
    base = {k: v for k, v in pipe.items() if k not in _TYPE_FIELDS}
    placements = {
        "colocated": {"type": "roll_sync", "train_gpus": gpus, "infer_gpus": gpus},
        "partial_overlap": {"type": "nemo_async", "train_gpus": train, "infer_gpus": gpus},
        "one_step_off": {
            "type": "disaggregated",
            "train_gpus": train,
            "infer_gpus": gen,
            "disaggregated": {"shape": "one_step_off"},
        },
        "fully_async": {
            "type": "disaggregated",
            "train_gpus": train,
            "infer_gpus": gen,
            "disaggregated": {"shape": "fully_async", "weight_sync": "pause"},
        },
    }
    out = []
    for name, _ in SHAPES:
        m = copy.deepcopy(mapping)
        m["name"] = f"{mapping.get('name', 'scenario')}_{name}"
        m["pipelines"] = [{**copy.deepcopy(base), **placements[name]}]
        m.pop("faults", None)
        m.pop("expect", None)
        out.append(m)
    return out


def compare(mapping: Dict[str, Any], source: str) -> List[Dict[str, Any]]:
    """One row per shape: its figures (``simulators.whatif.one_run.run_one``'s, reduced)."""
    from simulators.whatif.one_run import run_one

    gpus = len(set(mapping["pipelines"][0].get("train_gpus", [])) | set(mapping["pipelines"][0].get("infer_gpus", [])))
    rows = []
    for i, (m, (name, what)) in enumerate(zip(variants(mapping), SHAPES)):
        run = run_one(i, i, m, f"{source} as {name}", int(m.get("seed", 0) or 0))
        pipe = next(iter(run["pipelines"].values()))
        times = pipe["step_times"]
        step = ordered_sum(times) / len(times) if times else None
        rows.append(
            {
                "shape": name,
                "what": what,
                "end": run["end"],
                "steps_done": pipe["steps_done"],
                "mean_step_s": step,
                "gpu_hours_per_step": None if step is None else gpus * step / 3600.0,
                "idle_pct": run["idle_pct"],
                "mean_age_steps": pipe["mean_age_steps"],
                "findings": run["findings"],
            }
        )
    return rows


def _f(x: Optional[float], fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_table(rows: List[Dict[str, Any]], gpus: int) -> str:
    lines = [
        f"one workload on the same {gpus} GPUs, four shapes (mean over the run's steps; idle: share of GPU-time)",
        f"{'shape':16} {'mean step s':>11} {'vs colocated':>12} {'GPU-h/step':>10} {'idle %':>6} "
        f"{'staleness':>9}  {'end':7} findings",
    ]
    ref = rows[0]["mean_step_s"]
    for r in rows:
        ratio = None if r["mean_step_s"] is None or not ref else r["mean_step_s"] / ref
        findings = ", ".join(f"{k} x{v}" for k, v in r["findings"].items()) or "-"
        lines.append(
            f"{r['shape']:16} {_f(r['mean_step_s'], '11.2f')} {_f(ratio, '12.2f')} "
            f"{_f(r['gpu_hours_per_step'], '10.3f')} {_f(r['idle_pct'], '6.1f')} "
            f"{_f(r['mean_age_steps'], '9.2f')}  {r['end']:7} {findings}"
        )
    return "\n".join(lines)


def draw(rows: List[Dict[str, Any]], path: str, title: str) -> None:
    """Step time and GPU-hours per step (top), idle share and staleness (bottom), per shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = list(range(len(rows)))
    names = [r["shape"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6.0), sharex=True)
    top.bar(xs, [r["mean_step_s"] or 0.0 for r in rows], color="#4c72b0")
    top.set_ylabel("mean step (simulated s)")
    top.set_title(title, fontsize=9)
    for x, r in zip(xs, rows):
        top.annotate(
            f"{_f(r['gpu_hours_per_step'], '.3f')} GPU-h",
            (x, r["mean_step_s"] or 0.0),
            ha="center",
            va="bottom",
            fontsize=7,
        )
    w = 0.38
    bottom.bar([x - w / 2 for x in xs], [r["idle_pct"] or 0.0 for r in rows], w, color="#999999", label="GPU idle %")
    bottom.set_ylabel("GPU idle % of GPU-time")
    ages = bottom.twinx()
    ages.bar(
        [x + w / 2 for x in xs],
        [r["mean_age_steps"] or 0.0 for r in rows],
        w,
        color="#dd8452",
        label="staleness (versions)",
    )
    ages.set_ylabel("mean staleness (versions)")
    bottom.set_xticks(xs)
    bottom.set_xticklabels(names, fontsize=8)
    handles = bottom.get_legend_handles_labels()[0] + ages.get_legend_handles_labels()[0]
    bottom.legend(handles, ["GPU idle %", "staleness (versions)"], fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def results_json(source: str, rows: List[Dict[str, Any]]) -> str:
    return (
        json.dumps(
            {"format": "rlharness-what-if-colocate", "version": 1, "source": source, "shapes": rows},
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )


def write(out_dir: str, source: str, rows: List[Dict[str, Any]], gpus: int, png: bool) -> str:
    from harness.logs.writer import atomic_write

    os.makedirs(out_dir, exist_ok=True)
    table = format_table(rows, gpus)
    atomic_write(os.path.join(out_dir, "table.txt"), table + "\n")
    atomic_write(os.path.join(out_dir, "results.json"), results_json(source, rows))
    if png:
        draw(rows, os.path.join(out_dir, "colocate.png"), f"{os.path.basename(source)}: the same workload, four shapes")
    return table
