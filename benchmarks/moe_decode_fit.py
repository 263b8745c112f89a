"""The routed experts' decode efficiency, fitted on published vLLM latencies (a printed fit,
not a test).

Source (``simulators/costmodel/moe.py``, ``MOE_DECODE_SOURCE``): the ML.ENERGY leaderboard
(ml-energy/leaderboard, ``public/data/models/*__lm-arena-chat.json`` at
0cd52dab897c5d91a45f4d413038f3b8b4251b0f), vLLM serving each model in BF16 on H100s: per
configuration the GPU count, the mean batch size (``avg_batch_size``), the mean output length
(``avg_output_len``) and the median inter-token latency (``median_itl_ms``), copied below for
every H100 configuration whose mean batch is 60 or more (where the per-sequence term is most of
a step; below it the engine's fixed work per step dominates and says nothing of the experts).

For each efficiency on a grid, the cost model's decode step t(c) (``formulas.decode_curve`` at
the configuration's GPUs as TP, the mean context = 200 prompt tokens + half the mean output)
against the measured latency, least squares on the log. The MoE fit varies
``moe_decode_flops_efficiency`` with everything else at its default; the same procedure on the
dense Qwen3-32B varies ``decode_flops_efficiency`` — a check that the method recovers the dense
default (0.5) — and Qwen3-235B-A22B is a check of the MoE figure on a second model. Each
configuration is modelled as one rank over all its GPUs (the fitted Qwen3-30B-A3B rows' layout
field gives expert parallelism 2 on two GPUs, which spreads the experts as TP2 does; the
Qwen3-235B-A22B rows' gives expert parallelism 4 on eight, which the file does not explain:
one more reason it is a check only).

    python benchmarks/moe_decode_fit.py
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rows(gpus: int, text: str) -> list:
    """[(GPUs, mean batch, mean output tokens, median ITL ms)] from "batch/output/ms" triples."""
    return [(gpus, *map(float, triple.split("/"))) for triple in text.split()]


#: model preset -> [(GPUs, mean batch, mean output tokens, median ITL ms)], H100, batch >= 60,
#: each triple avg_batch_size / avg_output_len / median_itl_ms of one configuration (rounded)
MEASURED = {
    # Qwen__Qwen3-30B-A3B-Instruct-2507__lm-arena-chat.json, the 2-GPU rows
    "qwen3-30b-a3b": _rows(
        2,
        "63.9/918/18.70 95.9/921/24.59 127.9/919/27.42 191.8/915/31.26 255.8/920/34.58 255.7/918/33.66 "
        "383.5/940/42.93 511.1/927/47.39 511.3/926/50.20 767.2/924/65.00 1018.8/920/74.82",
    ),
    # Qwen__Qwen3-235B-A22B-Instruct-2507__lm-arena-chat.json (8 GPUs)
    "qwen3-235b-a22b": _rows(8, "63.9/879/40.34 95.9/872/43.68 127.8/863/46.64 191.8/880/52.36 228.5/874/55.48"),
    # Qwen__Qwen3-32B__lm-arena-chat.json, the 2-GPU rows
    "qwen3-32b": _rows(
        2, "63.9/635/22.45 95.8/635/26.10 127.8/624/29.66 191.7/632/37.02 255.6/634/44.45 340.2/628/54.90"
    ),
}
PROMPT_TOKENS = 200  # not published per configuration; a chat prompt's order of size
GRID = [x / 1000 for x in range(10, 601, 2)]


def _arch(preset: str):
    from simulators.costmodel import formulas as f
    from simulators.costmodel.models import MODEL_PRESETS

    m = MODEL_PRESETS[preset]
    kv = m.num_kv_heads * m.head_dim
    return f.Arch(m.params, m.active_params, m.layers, m.hidden_size, kv, 2, m.experts_per_token, m.num_experts)


def step_ms(preset: str, gpus: int, batch: float, out_tokens: float, e) -> float:
    """The cost model's decode step (ms) at ``batch`` sequences on one ``gpus``-GPU H100 rank."""
    from simulators.costmodel import formulas as f
    from simulators.costmodel.hardware import GPU_PRESETS

    a, g = _arch(preset), GPU_PRESETS["h100_sxm"]
    curve = f.decode_curve(
        a, gpus, PROMPT_TOKENS + out_tokens / 2.0, g.bf16_flops, g.hbm_bytes_per_s, g.nvlink_bytes_per_s, e
    )
    t = (curve["batching_half_point"] + batch) / curve["tokens_per_s_per_rank"]
    if a.num_experts:
        t -= curve["decode_expert_read_s"] * (1.0 - f.expected_experts_read(a, int(batch)))
    return 1000.0 * t


def _efficiency(**kw):
    from simulators.costmodel import formulas as f
    from simulators.scenario.spec import CostSpec as C

    base = f.Efficiency(
        C.train_mfu,
        C.decode_flops_efficiency,
        C.hbm_efficiency,
        C.tp_allreduce_latency_s,
        C.max_num_seqs,
        0.0,
        0.0,
        C.moe_train_mfu,
        decode_step_overhead_s=C.decode_step_overhead_s,
        moe_decode_flops_efficiency=C.moe_decode_flops_efficiency,
    )
    return replace(base, **kw)


def fit(preset: str, field: str) -> float:
    """The grid value of ``field`` with the least squared log error on ``preset``'s rows."""

    def loss(value: float) -> float:
        e = _efficiency(**{field: value})
        return sum(math.log(step_ms(preset, n, b, out, e) / ms) ** 2 for n, b, out, ms in MEASURED[preset])

    return min(GRID, key=loss)


def main() -> int:
    from simulators.scenario.spec import CostSpec

    print(f"source: ml-energy/leaderboard lm-arena-chat, H100, batch >= 60; grid {GRID[0]}-{GRID[-1]}")
    for preset, field in (
        ("qwen3-30b-a3b", "moe_decode_flops_efficiency"),
        ("qwen3-235b-a22b", "moe_decode_flops_efficiency"),
        ("qwen3-32b", "decode_flops_efficiency"),
    ):
        print(f"  {preset:16} fitted {field} {fit(preset, field):.3f}")
    e = _efficiency()
    default = CostSpec.moe_decode_flops_efficiency
    print(f"simulated / measured step at the defaults (moe_decode_flops_efficiency {default}):")
    for preset, rows in MEASURED.items():
        ratios = " ".join(f"{step_ms(preset, n, b, out, e) / ms:.2f}" for n, b, out, ms in rows)
        print(f"  {preset:16} {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
