"""``rlharness preflight``: one verdict per question, each with its figure, before a
cluster is spent on a config (docs/preflight.md).

The questions: does every phase fit (the static memory plan, :mod:`simulators.preflight.memory`),
can the rollout buffer deadlock on its own settings (:mod:`harness.streaming.capacity`), is
the staleness bound honoured, what step time and tokens/s to expect (a short simulation,
with the cost model's error band from its published comparisons), and which known
upstream behaviours the settings meet. A refusal names the key to change: the config key
when the input was a config (the importer's draft says which key gave the field), the
scenario field otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, List, NamedTuple, Optional

from harness.streaming.capacity import required_capacity, upstream_requirement
from harness.streaming.samplers import make_sampler
from simulators.preflight.memory import known_behaviours, phase_peaks
from simulators.scenario.spec import Scenario

#: relative error of the simulated step against published step times, (lowest, highest),
#: per model kind: docs/cost-model.md's comparisons (dense: Llama 3.1 8B/70B, Qwen3-32B rows;
#: the long-context CP4 row, -64 %, is outside it; mixture of experts: the Qwen3 MoE rows)
STEP_ERROR_BAND = {"dense": (-0.21, 0.05), "moe": (-0.32, -0.01)}
#: the oracle's checks of a trained trajectory's age against the bound (invariant 14, the single controller's window)
AGE_CHECKS = ("trajectory_age", "staleness_window")


class Verdict(NamedTuple):
    question: str
    ok: Optional[bool]  # None: not applicable or not run
    figure: str
    key: str = ""  # what to change when not ok


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def fits(s: Scenario, key_of: Callable[[str], str]) -> List[Verdict]:
    out = []
    for peak in phase_peaks(s):
        ok = peak.peak_bytes <= peak.capacity_bytes
        out.append(
            Verdict(
                f"fits: {peak.pipeline} {peak.phase}",
                ok,
                f"per-GPU peak {_gib(peak.peak_bytes)} of {_gib(peak.capacity_bytes)}, headroom "
                f"{_gib(peak.headroom_bytes)} ({peak.parts})" + (f"; fits with {peak.fix}" if peak.fix else ""),
                "" if ok else key_of(peak.field),
            )
        )
    return out


def deadlock(s: Scenario, key_of: Callable[[str], str]) -> List[Verdict]:
    out = []
    for i, p in enumerate(s.pipelines):
        if p.type != "single_controller" or p.streaming is None:
            continue
        st, w = p.streaming, p.workload
        sampler = make_sampler(st.sampler, st.window, freshest_first=bool(st.freshest_first), target=st.custom_target)
        need = required_capacity(sampler.gated, w.prompts_per_step, st.window, st.min_groups_for_streaming_train)
        upstream = upstream_requirement(sampler.gated, w.prompts_per_step, st.window)
        ok = st.max_buffered_rollouts >= need.needed
        note = ""
        if ok and st.max_buffered_rollouts < upstream:
            note = f"; NeMo RL's setup check asks {upstream} and refuses it, wrongly"
        elif not ok and st.max_buffered_rollouts >= upstream:
            note = f"; NeMo RL's setup check ({upstream}) passes it"
        out.append(
            Verdict(
                f"cannot deadlock: {p.name} rollout buffer",
                ok,
                f"max_buffered_rollouts {st.max_buffered_rollouts}, needs {need.needed}: {need.why}{note}",
                "" if ok else key_of(f"pipelines[{i}].streaming.max_buffered_rollouts"),
            )
        )
    if not out:
        out.append(Verdict("cannot deadlock: rollout buffer", None, "no single controller: no buffer/window settings"))
    return out


def _bound(p) -> int:
    if p.type == "single_controller":
        return p.streaming.window if p.streaming is not None else 1
    return p.workload.max_trajectory_age_steps if p.type == "nemo_async" else 0


def _band(s: Scenario, step_s: float) -> str:
    moe = any(p.model.experts_per_token > 0 for p in s.pipelines)
    if not all(p.model.layers for p in s.pipelines):
        return "no error band: explicit costs, not the cost model's"
    lo, hi = STEP_ERROR_BAND["moe" if moe else "dense"]
    return (
        f"{step_s / (1 + hi):.0f}-{step_s / (1 + lo):.0f} s from the cost model's "
        f"{'mixture-of-experts' if moe else 'dense'} error band {lo:+.0%}..{hi:+.0%} (docs/cost-model.md)"
    )


def simulated(s: Scenario, steps: int) -> List[Verdict]:
    """Run ``steps`` steps of every pipeline; staleness, step time and findings from the run."""
    from harness.logs.outputs.summary_text import summary_json
    from simulators.run import simulate

    short = dataclasses.replace(
        s, pipelines=tuple(dataclasses.replace(p, steps=min(p.steps, steps)) for p in s.pipelines)
    )
    out = simulate(short, None, png=False)
    figures = summary_json(out.figures)
    res = out.result
    verdicts: List[Verdict] = []
    ages = figures.get("staleness_by_pipeline") or {}
    age_broken = {v.invariant for v in out.violations if v.invariant in AGE_CHECKS}
    for p in s.pipelines:
        seen = max((int(a) for a in (ages.get(p.name) or {})), default=None)
        bound = _bound(p)
        ok = (seen is None or seen <= bound) and not age_broken
        verdicts.append(
            Verdict(
                f"staleness bound: {p.name}",
                ok if seen is not None else None,
                f"oldest trajectory trained {seen} step(s) behind, bound {bound}"
                if seen is not None
                else "no trajectory trained in the simulated steps",
            )
        )
    for row in figures.get("pipelines", []):
        step = row.get("mean_step_s")
        if not step:
            verdicts.append(Verdict(f"step time: {row['pipeline_id']}", None, "no step finished"))
            continue
        per_step = row["tokens"] / max(1, row["steps_done"])
        rate = (
            f"{per_step / step:,.0f} generated tokens/s"
            if per_step
            else "generated tokens not counted (the single controller's log has no per-request records)"
        )
        verdicts.append(
            Verdict(
                f"step time: {row['pipeline_id']}",
                True,
                f"{step:.1f} s simulated ({_band(s, step)}); {rate} "
                f"over {row['steps_done']} step(s): generation {row['generate_pct']:.0f} %, "
                f"training {row['train_pct']:.0f} %, refit {row['refit_pct']:.0f} %",
            )
        )
    findings = out.unexpected
    verdicts.append(
        Verdict(
            "simulated run",
            not findings and res.reason == "done",
            f"{res.reason} after {res.sim_time:.0f} simulated s, {len(out.violations)} invariant "
            f"violation(s)" + (f": {', '.join(sorted({f.check for f in findings}))}" if findings else ""),
        )
    )
    return verdicts


def behaviours(s: Scenario, key_of: Callable[[str], str]) -> List[Verdict]:
    hits = known_behaviours(s)
    if not hits:
        return [Verdict("known upstream behaviours", True, "none of the listed ones applies (docs/preflight.md)")]
    return [
        Verdict(f"known upstream behaviour: {b.pipeline}", None, f"{b.name}: {b.figure}", key_of(b.field)) for b in hits
    ]


def preflight(s: Scenario, key_of: Callable[[str], str], steps: int = 2) -> List[Verdict]:
    """Every verdict; the run is skipped when a phase cannot fit (it would only show the OOM)."""
    memory = fits(s, key_of)
    verdicts = memory + deadlock(s, key_of)
    if all(v.ok is not False for v in verdicts):
        verdicts += simulated(s, steps)
    else:
        verdicts.append(Verdict("simulated run", None, "not run: a verdict above already refuses the config"))
    return verdicts + behaviours(s, key_of)
