"""N-pipeline scenarios after ``examples/scenarios/large_1024gpu.yaml``, at any size.

Pipeline ``i`` of ``gpus // 32`` infers on the 32-GPU window starting at GPU
``32*i + 16`` (wrapping around the cluster), so half of each window is shared with each
neighbour, and trains on the first 8 GPUs of its window; even pipelines are
``nemo_async``, odd ones ``roll_sync``; every fourth pair uses TP=2 bundles; every
third pipeline from the second on has the larger, shorter workload. Starts are
staggered (``start_s = i % slots``): over four seconds up to 32 pipelines, as in the
bundled scenario (at 1,024 GPUs the result is that scenario itself), and beyond that
:data:`PER_SECOND` pipelines a second: the first requests of pipelines starting
together meet in one scheduler cycle, and RLix's planner fails fast past 1,000
activations in one cycle (128 pipelines started over four or even sixteen seconds do).

    python benchmarks/scale_scenarios.py GPUS [--steps N] > scenario.yaml
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List

import yaml

WINDOW, TRAIN, GPUS_PER_NODE = 32, 8, 8
#: pipelines starting in the same second at most, beyond the bundled scenario's 32
#: pipelines: the first requests of pipelines starting together meet in one scheduler
#: cycle, and RLix's gap-ratio planner fails fast past 1,000 activations in a cycle (the
#: bound harness/scheduler copies); at 4,096 GPUs 8 a second already trips it
PER_SECOND = 4


def _flow_list(values: List[int]) -> str:
    return "[" + ", ".join(map(str, values)) + "]"


def scale_scenario(gpus: int, steps: int = 100) -> Dict[str, Any]:
    """The scenario mapping for ``gpus`` GPUs (a multiple of 32, at least 64)."""
    if gpus % WINDOW or gpus < 2 * WINDOW:
        raise ValueError(f"gpus: {gpus} is not a multiple of {WINDOW} of at least {2 * WINDOW}")
    count = gpus // WINDOW
    slots = 4 if count <= 32 else -(-count // PER_SECOND)  # start seconds (4: the bundled scenario's)
    pipelines = []
    for i in range(count):
        start = WINDOW * i + WINDOW // 2
        window = [(start + k) % gpus for k in range(WINDOW)]
        spec: Dict[str, Any] = {
            "name": f"p{i:02d}",
            "type": "nemo_async" if i % 2 == 0 else "roll_sync",
            "train_gpus": window[:TRAIN],
            "infer_gpus": sorted(window),
            "infer_tp": 2 if (i // 2) % 4 == 1 else 1,
            "steps": steps,
        }
        if i % 3 == 1:
            spec["workload"] = {"prompts_per_step": 8, "decode_tokens_median": 128}
        spec["start_s"] = float(i % slots)
        pipelines.append(spec)
    return {
        "name": f"scale_{gpus}gpu",
        "seed": 0,
        "horizon_s": 86400,
        "description": f"{gpus // GPUS_PER_NODE} nodes x {GPUS_PER_NODE} GPUs, {len(pipelines)} pipelines x "
        f"{WINDOW} GPUs with half-overlapping windows, {steps} small steps each",
        "cluster": {"nodes": gpus // GPUS_PER_NODE, "gpus_per_node": GPUS_PER_NODE},
        "defaults": {
            "model": {"params": 0.5e9, "bytes_per_param": 2},
            "workload": {
                "prompts_per_step": 4,
                "generations_per_prompt": 4,
                "decode_tokens_median": 192,
                "decode_tokens_sigma": 0.6,
                "decode_tokens_max": 1024,
            },
        },
        "pipelines": pipelines,
    }


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gpus", type=int)
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args(argv)
    try:
        mapping = scale_scenario(args.gpus, args.steps)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(yaml.safe_dump(mapping, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
