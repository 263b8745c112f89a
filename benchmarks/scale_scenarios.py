"""N-pipeline scenarios after ``examples/scenarios/large_1024gpu.yaml``, at any size.

Pipeline ``i`` of ``gpus // 32`` infers on the 32-GPU window starting at GPU
``32*i + 16`` (wrapping around the cluster), so half of each window is shared with each
neighbour, and trains on the first 8 GPUs of its window; even pipelines are
``nemo_async``, odd ones ``roll_sync``; every fourth pair uses TP=2 bundles; every
third pipeline from the second on has the larger, shorter workload. Starts are
staggered over four seconds (``start_s = i % 4``) as in the bundled scenario, so no more
than a quarter of the pipelines ask the scheduler for their first activation in the
same second: at 1,024 GPUs the result is the bundled scenario itself (the scale
benchmark checks that), at 4,096 GPUs four times its pipelines.

    python benchmarks/scale_scenarios.py GPUS [--steps N] > scenario.yaml
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List

import yaml

WINDOW, TRAIN, GPUS_PER_NODE = 32, 8, 8


def _flow_list(values: List[int]) -> str:
    return "[" + ", ".join(map(str, values)) + "]"


def scale_scenario(gpus: int, steps: int = 100) -> Dict[str, Any]:
    """The scenario mapping for ``gpus`` GPUs (a multiple of 32, at least 64)."""
    if gpus % WINDOW or gpus < 2 * WINDOW:
        raise ValueError(f"gpus: {gpus} is not a multiple of {WINDOW} of at least {2 * WINDOW}")
    pipelines = []
    for i in range(gpus // WINDOW):
        start = WINDOW * i + WINDOW // 2
        window = [(start + k) % gpus for k in range(WINDOW)]
        spec: Dict[str, Any] = {"name": f"p{i:02d}", "type": "nemo_async" if i % 2 == 0 else "roll_sync",
                                "train_gpus": window[:TRAIN], "infer_gpus": sorted(window),
                                "infer_tp": 2 if (i // 2) % 4 == 1 else 1, "steps": steps}
        if i % 3 == 1:
            spec["workload"] = {"prompts_per_step": 8, "decode_tokens_median": 128}
        spec["start_s"] = float(i % 4)
        pipelines.append(spec)
    return {"name": f"scale_{gpus}gpu", "seed": 0, "horizon_s": 86400,
            "description": f"{gpus // GPUS_PER_NODE} nodes x {GPUS_PER_NODE} GPUs, {len(pipelines)} pipelines x "
                           f"{WINDOW} GPUs with half-overlapping windows, {steps} small steps each",
            "cluster": {"nodes": gpus // GPUS_PER_NODE, "gpus_per_node": GPUS_PER_NODE},
            "defaults": {"model": {"params": 0.5e9, "bytes_per_param": 2},
                         "workload": {"prompts_per_step": 4, "generations_per_prompt": 4, "decode_tokens_median": 192,
                                      "decode_tokens_sigma": 0.6, "decode_tokens_max": 1024}},
            "pipelines": pipelines}


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
