"""Simulated against published step times (a printed comparison, not a test).

Runs each scenario of examples/published/ (NeMo RL's published GRPO configurations, each
file citing its source) with the cost model's one shared set of efficiency factors and
prints the published step time beside the simulated one, with the simulated per-stage
shares (the source publishes totals only, so the shares cannot be checked against it).
Target: every step within +-25 %.

    python benchmarks/published_step_times.py
"""

from __future__ import annotations

import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: scenario name -> (published total step s, release, commit of NVIDIA-NeMo/RL docs/about/performance-summary.md):
#: each configuration's newest published figure (DGX-H100, on-policy GRPO)
PUBLISHED_STEP_S = {
    "llama3.1_8b_grpo_onpolicy": (92.8, "v0.5", "108bffdab368507a5500f27089ea2e7d90a06dea"),
    "qwen3_32b_grpo_onpolicy": (376.0, "v0.5", "108bffdab368507a5500f27089ea2e7d90a06dea"),
    "qwen3_30b_a3b_grpo_onpolicy": (225.0, "v0.4", "06beed91bac98a2c39a19435f6bbbbe71aa45720"),
    "qwen3_30b_a3b_grpo_onpolicy_v06": (192.0, "v0.6", "aea463dd2dad3c9dd39d92df3a1616647c8ff45a"),
    "qwen3_235b_a22b_grpo_onpolicy": (395.0, "v0.6", "aea463dd2dad3c9dd39d92df3a1616647c8ff45a"),
    "qwen3_235b_a22b_grpo_onpolicy_256gpu_v06": (312.0, "v0.6", "aea463dd2dad3c9dd39d92df3a1616647c8ff45a"),
}
TOLERANCE = 0.25


STAGES = ("generation", "log_probs", "training", "refit")


def stage_seconds(records, steps: int):
    """Mean seconds per step of each stage, read from the event log: generation is the
    batch wait (WaitBatch), log-probs and training their Compute effects, and ``refit``
    the rest of the step (the weight sync with its wake, sleep, cache build and hand-offs)."""
    opened, total = {}, dict.fromkeys(STAGES[:3], 0.0)
    names = {("WaitBatch", ""): "generation", ("Compute", "old_log_probs"): "log_probs", ("Compute", "train"): "training"}
    for r in records:
        if r["kind"] not in ("effect_start", "effect_end") or r.get("scope") != "step":
            continue
        stage = names.get((r["effect"], str(r["args"].get("what", ""))))
        if stage is None:
            continue
        if r["kind"] == "effect_start":
            opened[stage] = r["t"]
        else:
            total[stage] += r["t"] - opened.pop(stage)
    return {k: v / steps for k, v in total.items()}


def run_all():
    """[(name, published s, release, simulated s, {stage: s})] for every scenario of examples/published/."""
    from harness.outputs.run_view import RunView
    from harness.outputs.summary import summarize
    from harness.outputs.summary_text import summary_json
    from simulators.runtime import Simulation
    from simulators.scenario import load_scenario

    rows = []
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "published", "*.yaml"))):
        scenario = load_scenario(path)
        result = Simulation(scenario).run()
        p = summary_json(summarize(RunView(result.records)))["pipelines"][0]
        sim = p["mean_step_s"]
        stages = stage_seconds(result.records, p["steps_done"] or 1)
        stages["refit"] = max(0.0, sim - sum(stages.values()))
        pub, release, _ = PUBLISHED_STEP_S[scenario.name]
        rows.append((scenario.name, pub, release, sim, stages))
    return rows


def main() -> int:
    rows, missed = run_all(), 0
    print(f"{'configuration':42} {'release':>7} {'published s':>11} {'simulated s':>11} {'error':>6}  "
          f"simulated shares: generation / log-probs / training / refit+transitions")
    for name, pub, release, sim, stages in rows:
        err = (sim - pub) / pub
        ok = abs(err) <= TOLERANCE
        missed += not ok
        shares = " / ".join(f"{100 * stages[k] / sim:.0f}" for k in STAGES)
        print(f"{name:42} {release:>7} {pub:11.1f} {sim:11.1f} {100 * err:+5.0f}%  {shares} %  "
              f"{'within' if ok else 'MISSED'} +-{100 * TOLERANCE:.0f} %")
    print(f"{len(rows) - missed} of {len(rows)} within +-{100 * TOLERANCE:.0f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
