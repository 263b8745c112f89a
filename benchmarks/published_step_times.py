"""Simulated against published step times (a printed comparison, not a test).

Runs each scenario of examples/published/ (NeMo RL's published GRPO configurations, each
file citing its source) with the cost model's one shared set of efficiency factors and
prints the published step time beside the simulated one, with the simulated per-stage
shares (the source publishes totals only). Target: every step within +-25 %.

    python benchmarks/published_step_times.py
"""

from __future__ import annotations

import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: scenario name -> published total step time (s): NVIDIA-NeMo/RL docs/about/performance-summary.md
#: at 06beed91bac98a2c39a19435f6bbbbe71aa45720 (NeMo RL v0.4, DGX-H100, on-policy GRPO)
PUBLISHED_STEP_S = {
    "llama3.1_8b_grpo_onpolicy": 97.7,
    "qwen3_30b_a3b_grpo_onpolicy": 225.0,
    "qwen3_32b_grpo_onpolicy": 393.0,
    "qwen3_235b_a22b_grpo_onpolicy": 506.0,
}
TOLERANCE = 0.25


def main() -> int:
    from harness.outputs.run_view import RunView
    from harness.outputs.summary import summarize
    from harness.outputs.summary_text import summary_json
    from simulators.runtime import Simulation
    from simulators.scenario import load_scenario

    rows, missed = [], 0
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "published", "*.yaml"))):
        scenario = load_scenario(path)
        result = Simulation(scenario).run()
        p = summary_json(summarize(RunView(result.records)))["pipelines"][0]
        steps = p["steps_done"] or 1
        sim = p["mean_step_s"]
        pub = PUBLISHED_STEP_S[scenario.name]
        err = (sim - pub) / pub if sim else float("nan")
        ok = sim is not None and abs(err) <= TOLERANCE
        missed += not ok
        shares = {k: 100.0 * p[f"{k}_s"] / steps / sim if sim else 0.0 for k in ("generate", "train", "refit")}
        rows.append((scenario.name, pub, sim, err, shares, ok))
    print(f"{'configuration':32} {'published s':>11} {'simulated s':>11} {'error':>7}  generate/train/refit share (simulated)")
    for name, pub, sim, err, shares, ok in rows:
        print(f"{name:32} {pub:11.1f} {sim:11.1f} {100 * err:+6.0f}%  "
              f"{shares['generate']:.0f}/{shares['train']:.0f}/{shares['refit']:.0f} %  {'within' if ok else 'MISSED'} +-25 %")
    print(f"{len(rows) - missed} of {len(rows)} within +-{100 * TOLERANCE:.0f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
