"""A sweep's comparison: per-variant figures over seeds, the table, results.json, the plot.

Means and spreads are taken with :func:`harness.ordered_sum.ordered_sum` so results.json
has the same bytes on every supported Python. The spread is the sample standard deviation
of the per-seed means (0 with one seed); p95 is the nearest-rank 95th percentile of every
step of every seed pooled.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence

from harness.ordered_sum import ordered_sum


def _mean(xs: Sequence[float]) -> Optional[float]:
    return ordered_sum(xs) / len(xs) if xs else None


def _sd(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = ordered_sum(xs) / len(xs)
    return math.sqrt(ordered_sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _p95(xs: Sequence[float]) -> Optional[float]:
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, math.ceil(0.95 * len(s)) - 1)]


def aggregate(variants, runs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One entry per variant: its settings and its figures over the seeds that ran."""
    out = []
    for v in variants:
        mine = [r for r in runs if r.get("variant") == v.index]
        ok = [r for r in mine if r["status"] == "ok"]
        pids = sorted({pid for r in ok for pid in r["pipelines"]})
        pipes = {}
        for pid in pids:
            per_seed = [r["pipelines"][pid] for r in ok if pid in r["pipelines"]]
            means = [_mean(p["step_times"]) for p in per_seed if p["step_times"]]
            pooled = [t for p in per_seed for t in p["step_times"]]
            ages = [p["mean_age_steps"] for p in per_seed if p["mean_age_steps"] is not None]
            pipes[pid] = {
                "mean_step_s": _mean(means),
                "mean_step_sd": _sd(means),
                "p95_step_s": _p95(pooled),
                "steps_done": _mean([p["steps_done"] for p in per_seed]),
                "refit_s": _mean([p["refit_s"] for p in per_seed]),
                "mean_age_steps": _mean(ages),
            }
        findings: Counter = Counter()
        for r in ok:
            findings.update(r["findings"])
        ages = [p["mean_age_steps"] for r in ok for p in r["pipelines"].values() if p["mean_age_steps"] is not None]
        out.append(
            {
                "variant": v.index,
                "settings": v.settings,
                "label": v.label,
                "seeds_ok": len(ok),
                "seeds_failed": {
                    r["run_seed"] if "run_seed" in r else r["seed"]: r["status"] for r in mine if r["status"] != "ok"
                },
                "end": dict(sorted(Counter(r["end"] for r in ok).items())),
                "busy_pct": _mean([r["busy_pct"] for r in ok]),
                "idle_pct": _mean([r["idle_pct"] for r in ok]),
                "refit_s": _mean([ordered_sum(p["refit_s"] for p in r["pipelines"].values()) for r in ok]),
                "mean_age_steps": _mean(ages),
                "findings": dict(sorted(findings.items())),
                "pipelines": pipes,
                **_policy_means(ok),
            }
        )
    return out


#: per-run policy figures (harness/logs/outputs/policy_figures.py) a variant averages over seeds
POLICY_FIGURES = (
    "cost_efficiency_pct",
    "useful_gpu_s",
    "gpu_s",
    "preemptions",
    "expands",
    "wasted_expands",
    "resize_s",
)


def _policy_means(ok: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The policy each run named (one, or several joined) and its figures' means."""
    names = sorted({r.get("policy", "gap_ratio") for r in ok})
    out: Dict[str, Any] = {"policy": ",".join(names) or None}
    for key in POLICY_FIGURES:
        out[key] = _mean([r[key] for r in ok if key in r])
    return out


def results_json(header: Dict[str, Any], variants: List[Dict[str, Any]], runs: List[Dict[str, Any]]) -> str:
    """Canonical JSON: runs sorted by (variant, seed), keys sorted; no wall times."""
    runs = sorted(runs, key=lambda r: (r.get("variant", -1), r.get("run_seed", -1), r["seed"]))
    return json.dumps({**header, "variants": variants, "runs": runs}, indent=1, sort_keys=True, allow_nan=False) + "\n"


def _f(x: Optional[float], fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def _table(head: List[str], rows: List[List[str]], left: int = 2) -> List[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(
        c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
    )
    return [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]


def format_table(agg: List[Dict[str, Any]], seeds: int) -> str:
    """Two tables: the variants (GPU shares, refit, staleness, findings), then each
    pipeline's step times per variant."""
    rows = []
    for a in agg:
        findings = ", ".join(f"{k} x{n}" for k, n in a["findings"].items()) or "none"
        failed = f" ({len(a['seeds_failed'])} failed)" if a["seeds_failed"] else ""
        wasted = "-" if a.get("expands") is None else f"{_f(a['wasted_expands'], '.0f')}/{_f(a['expands'], '.0f')}"
        rows.append(
            [
                f"v{a['variant']}",
                a["label"],
                a.get("policy") or "-",
                f"{a['seeds_ok']}/{seeds}{failed}",
                _f(a.get("cost_efficiency_pct")),
                _f(a["busy_pct"]),
                _f(a["idle_pct"]),
                _f(a.get("preemptions")),
                wasted,
                _f(a.get("resize_s")),
                _f(a["refit_s"]),
                _f(a["mean_age_steps"], ".2f"),
                " ".join(f"{k}:{n}" for k, n in a["end"].items()),
                findings,
            ]
        )
    out = [
        "variants (means over seeds; GPU shares of GPU-time; eff % = useful GPU-s / GPU-s (docs/policies.md); "
        "wasted = wasted/all expands; resize and refit s summed over pipelines)"
    ]
    out += _table(
        [
            "variant",
            "settings",
            "policy",
            "seeds",
            "eff %",
            "busy %",
            "idle %",
            "preempt",
            "wasted",
            "resize s",
            "refit s",
            "age",
            "end",
            "findings",
        ],
        rows,
        left=3,
    )
    prow = []
    for a in agg:
        for pid, p in a["pipelines"].items():
            prow.append(
                [
                    f"v{a['variant']}",
                    pid,
                    _f(p["steps_done"]),
                    f"{_f(p['mean_step_s'], '.2f')} ± {_f(p['mean_step_sd'], '.2f')}",
                    _f(p["p95_step_s"], ".2f"),
                    _f(p["refit_s"], ".2f"),
                    _f(p["mean_age_steps"], ".2f"),
                ]
            )
    out += ["", "pipelines (mean step ± sd of the per-seed means; p95 of every step pooled)"]
    out += _table(["variant", "pipeline", "steps", "mean step s", "p95 step s", "refit s", "age"], prow)
    return "\n".join(out)


def draw(agg: List[Dict[str, Any]], path: str, title: str) -> None:
    """Mean step per pipeline (with the spread over seeds) and the GPU idle share, per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = list(range(len(agg)))
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(max(6.0, min(16.0, 0.5 * len(xs) + 4)), 6.5), sharex=True, gridspec_kw={"height_ratios": [2, 1]}
    )
    pids = sorted({pid for a in agg for pid in a["pipelines"]})
    for pid in pids:
        ys = [a["pipelines"].get(pid, {}).get("mean_step_s") for a in agg]
        es = [a["pipelines"].get(pid, {}).get("mean_step_sd") or 0.0 for a in agg]
        pts = [(x, y, e) for x, y, e in zip(xs, ys, es) if y is not None]
        if pts:
            top.errorbar(
                [p[0] for p in pts],
                [p[1] for p in pts],
                yerr=[p[2] for p in pts],
                marker="o",
                ms=3,
                capsize=2,
                label=pid,
            )
    top.set_ylabel("mean step (simulated s)")
    top.set_title(title)
    if len(pids) <= 12:
        top.legend(fontsize=7, ncol=min(4, len(pids)))
    eff = [a.get("cost_efficiency_pct") for a in agg]
    if any(e is not None for e in eff):  # cost efficiency beside the idle share
        w = 0.38
        bottom.bar([x - w / 2 for x in xs], [a["idle_pct"] or 0.0 for a in agg], w, color="#999999", label="GPU idle %")
        bottom.bar(
            [x + w / 2 for x in xs],
            [e or 0.0 for e in eff],
            w,
            color="#4c72b0",
            label="cost efficiency % (useful GPU-s / GPU-s)",
        )
        bottom.set_ylabel("% of GPU-time")
        bottom.set_ylim(0, 1.45 * max([a["idle_pct"] or 0.0 for a in agg] + [e or 0.0 for e in eff] + [1.0]))
        bottom.legend(fontsize=7, ncol=2, loc="upper center")
    else:
        bottom.bar(xs, [a["idle_pct"] or 0.0 for a in agg], color="#999999")
        bottom.set_ylabel("GPU idle %")
    bottom.set_xticks(xs)
    varying = [k for k in agg[0]["settings"] if len({repr(a["settings"][k]) for a in agg}) > 1] if agg else []
    labels = [
        "\n".join(f"{k.rsplit('.', 1)[-1]}={a['settings'][k]}" for k in varying) or f"v{a['variant']}"
        if len(agg) <= 8
        else f"v{a['variant']}"
        for a in agg
    ]
    bottom.set_xticklabels(labels, fontsize=7)
    if len(agg) > 8:
        bottom.set_xlabel("variant (settings in table.txt)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
