"""Simulated against published step times (a printed comparison, not a test).

Runs each scenario of examples/published/ (NeMo RL's published GRPO configurations, each
file citing its source) with the cost model's one shared set of efficiency factors and
prints the published step time beside the simulated one, with the simulated per-stage
shares, and where the source publishes a per-stage breakdown (the NeMo RL v0.3 post) the
published shares beside them. Targets: every step within +-25 %, every published stage's
share of the step within +-10 points.

    python benchmarks/published_step_times.py [--cap-share S]

``--cap-share S`` is a what-if, not the comparison: every scenario draws the share S of its
answers at the length cap (``workload.decode_tokens_cap_share``), its median re-solved so
that the drawn mean stays the published one.
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
#: scenario name -> published seconds of (generation, log-probs, training, refit) per step, the
#: NeMo RL v0.3 post's table (https://nvidia-nemo.github.io/blog/2025/07/21/nemo-rl-v0.3, mean of
#: steps 22-29, Megatron backend, DGX-H100): "Generation", "Get logprobs", "Policy training", "Refit"
V03 = ("v0.3", "https://nvidia-nemo.github.io/blog/2025/07/21/nemo-rl-v0.3")
PUBLISHED_STAGES_S = {
    "llama3.1_8b_grpo_v03_breakdown": (112.0, (58.0, 18.0, 28.0, 5.0)),
    "llama3.1_70b_grpo_v03_breakdown": (147.0, (84.0, 18.0, 28.0, 14.0)),
    "qwen3_32b_grpo_v03_breakdown": (213.0, (96.0, 40.0, 68.0, 7.0)),
    "qwen3_30b_a3b_grpo_v03_breakdown": (167.0, (78.0, 23.0, 50.0, 12.0)),
    "llama3.3_70b_16k_grpo_v03_breakdown": (445.0, (287.0, 75.0, 64.0, 17.0)),
}
for _name, (_total, _) in PUBLISHED_STAGES_S.items():
    PUBLISHED_STEP_S[_name] = (_total,) + V03
TOLERANCE = 0.25
SHARE_TOLERANCE_POINTS = 10.0


STAGES = ("generation", "log_probs", "training", "refit")


def stage_seconds(records, steps: int):
    """Mean seconds per step of each stage, read from the event log: generation is the
    batch wait (WaitBatch), log-probs and training their Compute effects, and ``refit``
    the rest of the step (the weight sync with its wake, sleep, cache build and hand-offs)."""
    opened, total = {}, dict.fromkeys(STAGES[:3], 0.0)
    names = {
        ("WaitBatch", ""): "generation",
        ("Compute", "old_log_probs"): "log_probs",
        ("Compute", "train"): "training",
    }
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


def with_cap_share(path: str, share: float):
    """The scenario at ``path`` with the share ``share`` of its answers at the cap and its
    median re-solved so that the drawn mean stays the one the file draws (the published
    mean; at most the cap, as the files' own medians)."""
    from simulators.costmodel import formulas as f
    from simulators.scenario.loader import check_feasible, read_mapping, scenario_from_mapping

    data = read_mapping(path)
    w = data["pipelines"][0]["workload"]
    cap, sigma = w["decode_tokens_max"], w["decode_tokens_sigma"]
    mean = f.mean_decode_tokens(w["decode_tokens_median"], sigma, cap)
    w["decode_tokens_median"] = min(float(cap), f.median_for_mean(mean, sigma, cap, share))
    w["decode_tokens_cap_share"] = share
    scenario = scenario_from_mapping(data, path)
    check_feasible(scenario, path)
    return scenario


def run_all(cap_share: float = 0.0):
    """[(name, published s, release, simulated s, {stage: s})] for every scenario of examples/published/."""
    from harness.logs.outputs.run_view import RunView
    from harness.logs.outputs.summary import summarize
    from harness.logs.outputs.summary_text import summary_json
    from simulators.runtime.simulation import Simulation
    from simulators.scenario.loader import load_scenario

    rows = []
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "published", "*.yaml"))):
        scenario = with_cap_share(path, cap_share) if cap_share else load_scenario(path)
        result = Simulation(scenario).run()
        p = summary_json(summarize(RunView(result.records)))["pipelines"][0]
        sim = p["mean_step_s"]
        stages = stage_seconds(result.records, p["steps_done"] or 1)
        stages["refit"] = max(0.0, sim - sum(stages.values()))
        pub, release, _ = PUBLISHED_STEP_S[scenario.name]
        rows.append((scenario.name, pub, release, sim, stages))
    return rows


def share_misses(name: str, sim: float, stages) -> list:
    """[(stage, published %, simulated %)] of every stage whose simulated share of the step is
    more than SHARE_TOLERANCE_POINTS off the published one; [] where none is published. Both
    shares are of the whole step (the published total also holds a few seconds no column names)."""
    if name not in PUBLISHED_STAGES_S:
        return []
    total, published = PUBLISHED_STAGES_S[name]
    out = []
    for stage, pub_s in zip(STAGES, published):
        pub_pct, sim_pct = 100 * pub_s / total, 100 * stages[stage] / sim
        if abs(sim_pct - pub_pct) > SHARE_TOLERANCE_POINTS:
            out.append((stage, pub_pct, sim_pct))
    return out


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cap-share", type=float, default=0.0, help="what-if: the share of every scenario's answers at the length cap"
    )
    args = parser.parse_args(argv)
    if args.cap_share:
        print(f"WHAT-IF: {args.cap_share:g} of every scenario's answers at the length cap (not the comparison)")
    rows, missed = run_all(args.cap_share), 0
    print(
        f"{'configuration':42} {'release':>7} {'published s':>11} {'simulated s':>11} {'error':>6}  "
        f"simulated shares: generation / log-probs / training / refit+transitions"
    )
    for name, pub, release, sim, stages in rows:
        err = (sim - pub) / pub
        ok = abs(err) <= TOLERANCE
        missed += not ok
        shares = " / ".join(f"{100 * stages[k] / sim:.0f}" for k in STAGES)
        print(
            f"{name:42} {release:>7} {pub:11.1f} {sim:11.1f} {100 * err:+5.0f}%  {shares} %  "
            f"{'within' if ok else 'MISSED'} +-{100 * TOLERANCE:.0f} %"
        )
    print(f"{len(rows) - missed} of {len(rows)} within +-{100 * TOLERANCE:.0f} %")
    print_shares(rows)
    print_seconds(rows)
    return 0


def print_seconds(rows) -> None:
    """Each published stage's seconds per step beside the simulated ones (the breakdown rows)."""
    print("\nper-stage seconds per step, published -> simulated")
    print(f"{'configuration':42} " + " ".join(f"{k:>16}" for k in STAGES))
    for name, _pub, _release, _sim, stages in rows:
        if name in PUBLISHED_STAGES_S:
            published = PUBLISHED_STAGES_S[name][1]
            print(f"{name:42} " + " ".join(f"{p:7.1f} -> {stages[k]:5.1f}" for k, p in zip(STAGES, published)))


def print_shares(rows) -> None:
    """The per-stage shares, published against simulated, of every configuration whose source
    publishes a breakdown, with each share more than SHARE_TOLERANCE_POINTS off marked."""
    print(
        f"\nper-stage shares of the step, published -> simulated (points; * = more than "
        f"+-{SHARE_TOLERANCE_POINTS:.0f} off)"
    )
    print(f"{'configuration':42} " + " ".join(f"{k:>16}" for k in STAGES))
    checked = bad = 0
    for name, _pub, _release, sim, stages in rows:
        if name not in PUBLISHED_STAGES_S:
            continue
        total, published = PUBLISHED_STAGES_S[name]
        missed = {stage for stage, _, _ in share_misses(name, sim, stages)}
        cells = []
        for stage, pub_s in zip(STAGES, published):
            cells.append(
                f"{100 * pub_s / total:5.0f} -> {100 * stages[stage] / sim:3.0f}{'*' if stage in missed else ' '}"
            )
            checked += 1
        bad += len(missed)
        print(f"{name:42} " + " ".join(f"{c:>16}" for c in cells))
    print(f"{checked - bad} of {checked} stage shares within +-{SHARE_TOLERANCE_POINTS:.0f} points")


if __name__ == "__main__":
    sys.exit(main())
