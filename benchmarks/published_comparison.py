"""The published comparison set, simulated (a printed comparison, not a test).

Reads examples/published/comparison/set.yaml: published step times of RL post-training runs
(NeMo RL on H100, verl on H20, AReaL on H800; colocated synchronous, disaggregated synchronous,
one-step-off and fully asynchronous), each row citing its source, a third of the rows held out by
a hash of the row id. Runs every row with the cost model's one shared set of factors and prints,
fitted and held-out apart: per row published / simulated / error of the step time and the stage
shares; then every published pair's ratio (async / sync, which is also colocated / disaggregated
here, and fewer -> more GPUs) with its direction right or wrong.

    python benchmarks/published_comparison.py [--fit]

``--fit`` re-fits the set's fitted figures and prints them: the verl workload's mean generated
length and share of answers at the cap (on its fitted colocated rows), AReaL's mean answer
length (on its fitted rows; the file keeps all three), and the cost model's colocated-training
factor (on the published pairs whose two rows are both fitted and publish training seconds;
``simulators/costmodel/colocation.py`` keeps it).
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SET_PATH = os.path.join(ROOT, "examples", "published", "comparison", "set.yaml")
STAGES = ("generation", "log_probs", "training")
TOLERANCE = 0.25
#: grids of the two fitted workload figures: the mean generated length (tokens) and the share of
#: answers at the length cap
MEAN_GRID = range(600, 2401, 100)
CAP_SHARE_GRID = (0.0, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01)
#: the grid of the AReaL workloads' one fitted figure, the mean answer length (tokens; cap 27,648)
LONG_MEAN_GRID = range(4000, 20001, 500)
#: the workloads that share AReaL's fitted mean (the first one's fitted rows are what it is fitted on)
AREAL_WORKLOADS = ("areal_boba_r1_distill_1.5b", "areal_boba_r1_distill_7b")


def load_set(path: str = SET_PATH) -> dict:
    import yaml

    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def held_out_ids(ids) -> set:
    """The held-out third: ids sorted by the sha256 of the id, the first round(n/3)."""
    ordered = sorted(ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())
    return set(ordered[: round(len(ordered) / 3)])


def _gpus(first: int, count: int) -> list:
    return list(range(first, first + count))


#: the set's shape names of a disaggregated row -> the disaggregated pipeline's shape
DISAGGREGATED_SHAPES = {"disaggregated_sync": "sync", "one_step_off": "one_step_off", "fully_async": "fully_async"}


def mini_batch_answers(workload: dict) -> int:
    """Answers an optimizer step trains: the recipe's global batch where it names one
    (AReaL's), else verl's ``ppo_mini_batch_size`` prompts times the answers a prompt."""
    if "train_global_batch" in workload:
        return int(workload["train_global_batch"])
    return int(workload["mini_batch_prompts"]) * int(workload["generations_per_prompt"])


def _train_layout(workload: dict, train: int, mean_tokens: float) -> dict:
    """The training layout fields of a workload row. FSDP2 (verl): Ulysses SP and one
    micro-batch per SP group per mini-batch (verl's dynamic batching at these lengths).
    Megatron: its tensor and pipeline stages, and the sequences a micro-batch holds: the
    recipe's fixed count where it names one (verl's Megatron recipes, without dynamic
    batching), else what the recipe's token budget holds at the mean length (AReaL)."""
    if workload.get("train_backend", "fsdp2") == "fsdp2":
        sp = workload["train_sp"]
        micro = max(1, mini_batch_answers(workload) * sp // train)
        return {"train_backend": "fsdp2", "train_sp": sp, "train_micro_batch": micro}
    if "train_micro_batch" in workload:
        micro = int(workload["train_micro_batch"])
    else:
        per_sequence = workload["prompt_tokens"] + mean_tokens
        micro = max(1, int(workload["train_tokens_per_micro_batch"] // per_sequence))
    return {
        "train_backend": "megatron",
        "train_tp": int(workload.get("train_tp", 1)),
        "train_pp": int(workload.get("train_pp", 1)),
        "train_micro_batch": micro,
    }


def workload_mapping(row: dict, workload: dict, mean_tokens: float, cap_share: float) -> dict:
    """The scenario mapping of a row built from its workload: the workload's recipe figures,
    the row's GPUs and shape. A colocated row is one roll_sync pipeline on every GPU (verl's
    hybrid engine); a disaggregated row a disaggregated pipeline with ``rollout_gpus``
    generating and the rest training."""
    from simulators.costmodel import formulas as f

    cap = int(row.get("decode_tokens_max", workload.get("decode_tokens_max", 28672)))
    sigma = float(workload["decode_tokens_sigma"])
    n, rollout = int(row["gpus"]), int(row.get("rollout_gpus", 0))
    train = n - rollout if rollout else n
    load = {
        "prompts_per_step": workload["prompts_per_step"],
        "generations_per_prompt": workload["generations_per_prompt"],
        "prompt_tokens": workload["prompt_tokens"],
        "decode_tokens_sigma": sigma,
        "decode_tokens_max": cap,
        "decode_tokens_cap_share": cap_share,
        "decode_tokens_median": min(float(cap), f.median_for_mean(mean_tokens, sigma, cap, cap_share)),
    }
    pipe = {
        "name": "grpo",
        "infer_tp": workload["infer_tp"],
        "train_global_batch": mini_batch_answers(workload),
        "log_prob_passes": int(row.get("log_prob_passes", workload.get("log_prob_passes", 1))),
        "train_recompute": bool(workload["train_recompute"]),
        "model": {"preset": workload["model"]},
        "workload": load,
        **_train_layout(workload, train, mean_tokens),
    }
    if row["shape"] == "colocated_sync":
        pipe.update(
            type="roll_sync",
            train_gpus=_gpus(0, n),
            infer_gpus=_gpus(0, n),
            steps=2,
            sleep_level=1,
            refit_path="colocated_ipc",
        )
    else:
        pipe.update(
            type="disaggregated",
            train_gpus=_gpus(0, train),
            infer_gpus=_gpus(train, rollout),
            steps=4,
            disaggregated={
                "shape": DISAGGREGATED_SHAPES[row["shape"]],
                **({"weight_sync": "pause"} if row["shape"] == "fully_async" else {}),
            },
        )
        if row["shape"] != "disaggregated_sync":
            load["max_trajectory_age_steps"] = 1
    return {
        "name": row["id"],
        "seed": 0,
        "horizon_s": 200000,
        "costs": {"kv_cache_fraction": workload["kv_cache_fraction"]},
        "cluster": {"nodes": max(1, n // 8), "gpus_per_node": min(8, n), "gpu": row["gpu"]},
        "pipelines": [pipe],
    }


def simulate(scenario):
    """(mean step s, {stage: s per step}) of one scenario run."""
    from harness.logs.outputs.run_view import RunView
    from harness.logs.outputs.summary import summarize
    from harness.logs.outputs.summary_text import summary_json
    from published_step_times import stage_seconds
    from simulators.runtime.simulation import Simulation

    result = Simulation(scenario).run()
    p = summary_json(summarize(RunView(result.records)))["pipelines"][0]
    return p["mean_step_s"], stage_seconds(result.records, p["steps_done"] or 1)


def row_scenario(row: dict, data: dict, mean_tokens=None, cap_share=None):
    """The row's scenario: its bundled file, or a verl row built from its workload (with the
    workload's fitted figures unless others are given)."""
    from simulators.scenario.loader import check_feasible, load_scenario, scenario_from_mapping

    if "scenario" in row:
        return load_scenario(os.path.join(ROOT, "examples", "published", row["scenario"] + ".yaml"))
    workload = data["workloads"][row["workload"]]
    mean = workload["decode_tokens_mean"] if mean_tokens is None else mean_tokens
    share = workload["decode_tokens_cap_share"] if cap_share is None else cap_share
    scenario = scenario_from_mapping(workload_mapping(row, workload, float(mean), float(share)), SET_PATH)
    check_feasible(scenario, SET_PATH)
    return scenario


def published_of(row: dict) -> dict:
    """{'step': s, stage: s ...} as published; NeMo RL rows from benchmarks/published_step_times.py."""
    if "published" in row:
        return dict(row["published"])
    from published_step_times import PUBLISHED_STAGES_S, PUBLISHED_STEP_S

    out = {"step": PUBLISHED_STEP_S[row["scenario"]][0]}
    if row["scenario"] in PUBLISHED_STAGES_S:
        out.update(zip(STAGES, PUBLISHED_STAGES_S[row["scenario"]][1][:3]))
    return out


def _grid_min(label: str, grid, loss_of):
    best = None
    for value in grid:
        loss = loss_of(value)
        print(f"  {label} {value:g}: sum of squared log errors {loss:.4f}")
        if best is None or loss < best[1]:
            best = (value, loss)
    return best[0]


def fit_workload(data: dict):
    """(mean generated length, share at the cap) of the verl workload, fitted on its fitted
    colocated rows only (the held-out rows are not read), in two stages: the mean on the
    log-prob + training seconds (which the share leaves alone: the median is re-solved so that
    the drawn mean stays), then the share on the generation seconds at that mean."""
    rows = [
        r
        for r in data["rows"]
        if r.get("workload") == "verl_dapo_qwen2.5_math_7b"
        and r["split"] == "fitted"
        and r["shape"] == "colocated_sync"
    ]

    def loss(stage_of, mean, share):
        total = 0.0
        for r in rows:
            _, stages = simulate(row_scenario(r, data, mean, share))
            total += math.log(stage_of(stages) / stage_of(r["published"])) ** 2
        return total

    trained = lambda st: st["log_probs"] + st["training"]  # noqa: E731
    mean = _grid_min("mean", MEAN_GRID, lambda m: loss(trained, m, 0.0))
    share = _grid_min("cap share", CAP_SHARE_GRID, lambda s: loss(lambda st: st["generation"], mean, s))
    return float(mean), float(share)


def fit_areal_mean(data: dict) -> float:
    """AReaL's mean answer length: least squares on the log of the step seconds of the fitted
    rows of its workloads (only the 1.5B's rows are fitted; held-out rows are not read), the
    share at the cap held at the workload's (0: the published truncation rate is only bounded)."""
    rows = [r for r in data["rows"] if r.get("workload") in AREAL_WORKLOADS and r["split"] == "fitted"]

    def loss(mean):
        total = 0.0
        for r in rows:
            share = data["workloads"][r["workload"]]["decode_tokens_cap_share"]
            step, _ = simulate(row_scenario(r, data, mean, share))
            total += math.log(step / r["published"]["step"]) ** 2
        return total

    return float(_grid_min("mean", LONG_MEAN_GRID, loss))


def fit_colocated_train_factor(data: dict) -> float:
    """The colocated-training factor: the geometric mean, over the asynchronous/synchronous
    pairs whose two rows are both fitted and both publish their training seconds, of the
    colocated row's training GPU-seconds over the dedicated row's (its training GPUs:
    ``gpus - rollout_gpus``). Held-out rows are not read; a pair publishing step times only
    (NeMo RL's) has no training seconds to read."""
    rows = {r["id"]: r for r in data["rows"]}
    logs = []
    for first, second, kind in data["pairs"]:
        sync, dedicated = rows[first], rows[second]
        if kind != "async_sync" or "fitted" != sync["split"] or "fitted" != dedicated["split"]:
            continue
        if "training" not in sync.get("published", {}) or "training" not in dedicated.get("published", {}):
            continue
        colocated_s = sync["gpus"] * sync["published"]["training"]
        dedicated_s = (dedicated["gpus"] - dedicated["rollout_gpus"]) * dedicated["published"]["training"]
        print(
            f"  {first} / {second}: training GPU-seconds {colocated_s:.0f} / {dedicated_s:.0f} = "
            f"{colocated_s / dedicated_s:.3f}"
        )
        logs.append(math.log(colocated_s / dedicated_s))
    return math.exp(sum(logs) / len(logs))


def run_rows(data: dict) -> dict:
    """{row id: (row, published, simulated step s, {stage: s})}."""
    out = {}
    for row in data["rows"]:
        step, stages = simulate(row_scenario(row, data))
        out[row["id"]] = (row, published_of(row), step, stages)
    return out


def print_rows(results: dict) -> None:
    for split in ("fitted", "held_out"):
        chosen = [v for v in results.values() if v[0]["split"] == split]
        within = 0
        print(
            f"\n{split.upper()} rows ({len(chosen)}): step time published / simulated / error; stage shares of the "
            f"step published -> simulated (points: generation / log-probs / training)"
        )
        for row, pub, sim, stages in chosen:
            err = (sim - pub["step"]) / pub["step"]
            within += abs(err) <= TOLERANCE
            shares = " / ".join(
                (
                    f"{100 * pub[k] / pub['step']:.0f}->{100 * stages[k] / sim:.0f}"
                    if k in pub
                    else f"-->{100 * stages[k] / sim:.0f}"
                )
                for k in STAGES
            )
            print(
                f"  {row['id']:30} {row['framework']:7} {row['shape']:14} {row['gpu']:8} {row['gpus']:4d} GPUs "
                f"{pub['step']:8.1f} {sim:8.1f} {100 * err:+5.0f}%  {shares}"
            )
        errs = sorted(abs(v[2] - v[1]["step"]) / v[1]["step"] for v in chosen)
        print(
            f"  {within} of {len(chosen)} within +-{100 * TOLERANCE:.0f} %; median |error| "
            f"{100 * errs[len(errs) // 2]:.0f} %, worst {100 * errs[-1]:.0f} %"
        )


def print_pairs(data: dict, results: dict) -> None:
    print("\npublished pairs: ratio published / simulated, direction (second vs first)")
    right = 0
    for first, second, kind in data["pairs"]:
        (_, p1, s1, _), (_, p2, s2, _) = results[first], results[second]
        pub, sim = p2["step"] / p1["step"], s2 / s1
        ok = (pub < 1) == (sim < 1)
        right += ok
        label = {"async_sync": "async/sync = disaggregated/colocated", "scaling": "more / fewer GPUs"}[kind]
        print(f"  {second:28} / {first:28} {label:38} {pub:5.2f} {sim:5.2f}  direction {'right' if ok else 'WRONG'}")
    print(f"  direction right on {right} of {len(data['pairs'])} pairs")


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--fit", action="store_true", help="re-fit the fitted mean length on the fitted rows and print it"
    )
    args = parser.parse_args(argv)
    data = load_set()
    if args.fit:
        mean, share = fit_workload(copy.deepcopy(data))
        print(f"fitted: mean generated length {mean:.0f} tokens, share at the cap {share:g}")
        print(f"fitted: AReaL's mean answer length {fit_areal_mean(copy.deepcopy(data)):.0f} tokens")
        print(f"fitted: colocated-training factor {fit_colocated_train_factor(data):.2f}")
        return 0
    results = run_rows(data)
    print_rows(results)
    print_pairs(data, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
