"""The decode step's KV-cache read at each running sequence's own context
(``workload.decode_kv_s_per_token``, simulators/pipelines/decode_clock.py): a step of c
sequences costs t(c) − γ·c·ctx_mean + γ·Σ ctx_i, each context one token longer a step.
References are hand-computed integrals of that step over the tokens, not the clock's helpers."""

from __future__ import annotations

import math

import pytest

from harness.control.rank_state import RankLifecycle, RankState
from simulators.pipelines.decode_clock import LiveKv
from simulators.pipelines.inference import RankSim, Request, Router
from simulators.runtime.env import SimEnv
from simulators.scenario.loader import ScenarioError, scenario_from_mapping
from tests.sim.test_cost_model_packing import packed_scenario

T, H = 1000.0, 4.0  # a step of c sequences: (4 + c) / 1000 s at the mean context
G, P, MEAN = 2e-6, 100.0, 200.0  # 2 µs a cached token a step; a 100-token prompt; the curve's mean context 200


def _router(kv):
    env, done = SimEnv(), []
    router = Router(
        env,
        "p",
        0,
        max_concurrent=64,
        tokens_per_s=T,
        half_point=H,
        log=lambda rec: None,
        on_done=lambda req, rank: done.append((env.now, req.rid)),
        step_time=lambda c: (H + c) / T,
        live_kv=kv,
    )
    rank = RankSim("p", 0, (0,), RankLifecycle("p", 0))
    rank.life.state = RankState.ROUTABLE
    router.ranks = {0: rank}
    router.activate([rank])
    return env, router, done


def test_a_lone_sequence_pays_its_own_growing_context():
    """One sequence of 50 tokens: each step (4 + 1)/1000 − γ·200 + γ·(100 + x) at x tokens
    decoded, integrated over x from 0 to 50: 50 × (0.005 − 200γ + 100γ) + γ × 50² / 2."""
    env, router, done = _router(LiveKv(G, P, MEAN))
    router.submit([Request(0, tokens=50)])
    env.run(until=100)
    assert done[0][0] == pytest.approx(50 * (0.005 - G * MEAN + G * P) + G * 50**2 / 2, rel=1e-12)


def test_two_sequences_then_one_each_at_its_context():
    """Sequences of 10 and 30 tokens started together: while both run a step is
    0.006 − 2γ·200 + γ·(2·100 + 2x); after the first ends (x = 10) the second's step is
    0.005 − γ·200 + γ·(100 + x). Integrals: 10 × (0.006 − 400γ + 200γ) + γ·10², then
    20 × (0.005 − 200γ + 100γ) + γ·(30² − 10²)/2."""
    env, router, done = _router(LiveKv(G, P, MEAN))
    router.submit([Request(0, tokens=10), Request(1, tokens=30)])
    env.run(until=100)
    first = 10 * (0.006 - 2 * G * MEAN + 2 * G * P) + G * 10**2
    second = first + 20 * (0.005 - G * MEAN + G * P) + G * (30**2 - 10**2) / 2
    assert [rid for _, rid in done] == [0, 1]
    assert done[0][0] == pytest.approx(first, rel=1e-12) and done[1][0] == pytest.approx(second, rel=1e-12)


def test_without_it_the_step_is_the_curves():
    env, router, done = _router(None)
    router.submit([Request(0, tokens=50)])
    env.run(until=100)
    assert math.isclose(done[0][0], 50 * 0.005, rel_tol=1e-12)


def _scenario(kv: float, timing: str = "per_step"):
    return {
        "name": "kv",
        "seed": 0,
        "cluster": {"nodes": 1, "gpus_per_node": 2},
        "pipelines": [
            {
                "name": "p",
                "type": "roll_sync",
                "train_gpus": [0, 1],
                "infer_gpus": [0, 1],
                "workload": {
                    "prompt_tokens": 100,
                    "decode_tokens_median": 300,
                    "decode_timing": timing,
                    "tokens_per_s_per_rank": 1000.0,
                    "decode_kv_s_per_token": kv,
                },
            }
        ],
    }


def test_the_field_needs_per_step_and_no_more_than_the_per_sequence_step():
    scenario_from_mapping(_scenario(1e-6))
    with pytest.raises(ScenarioError, match=r"decode_kv_s_per_token: only a per_step decode"):
        scenario_from_mapping(_scenario(1e-6, "at_start"))
    with pytest.raises(ScenarioError, match=r"decode_kv_s_per_token: .* exceeds the per-sequence step"):
        scenario_from_mapping(_scenario(1e-3))


def test_the_cost_model_derives_one_cached_tokens_read():
    """Llama 3.1-8B with vLLM at TP 4 on H100 SXMs: 2 × 32 layers × 1024 (8 KV heads × 128) ×
    2 B = 131,072 B a cached token, split over 4 GPUs each reading 3.35 TB/s × 0.8
    (hbm_efficiency)."""
    w = scenario_from_mapping(packed_scenario(1, 0)).pipelines[0].workload
    assert w.decode_kv_s_per_token == pytest.approx(131072 / (4 * 3.35e12 * 0.8), rel=1e-3)


def _disaggregated(kv: float):
    from simulators.runtime.simulation import Simulation

    w = {
        "prompts_per_step": 1,
        "generations_per_prompt": 1,
        "prompt_tokens": 100,
        "decode_tokens_median": 256,
        "decode_tokens_sigma": 0.0,
        "decode_tokens_max": 2048,
        "decode_tokens_cap_share": 0.25,
        "decode_timing": "per_step",
        "tokens_per_s_per_rank": 1000.0,
        "batching_half_point": 4.0,
        "decode_kv_s_per_token": kv,
    }
    pipe = {
        "name": "p",
        "type": "disaggregated",
        "train_gpus": [0],
        "infer_gpus": [1],
        "steps": 1,
        "disaggregated": {"shape": "sync"},
        "workload": w,
    }
    data = {"name": "s", "horizon_s": 5000, "cluster": {"nodes": 1, "gpus_per_node": 2}, "pipelines": [pipe]}
    res = Simulation(scenario_from_mapping(data, "t.yaml")).run()
    starts = [r["t"] for r in res.records if r["kind"] == "effect_start" and r.get("effect") == "Generate"]
    ends = [r["t"] for r in res.records if r["kind"] == "effect_end" and r.get("effect") == "Generate"]
    return ends[0] - starts[0]


def test_a_disaggregated_rank_reads_its_sequences_contexts_too():
    """One answer a step, of 256 or 2,048 tokens (a quarter run to the cap): the workload's
    mean answer is 0.75 × 256 + 0.25 × 2048 = 704, so the curve charges the context
    100 + 352 = 452. Without the live read the answer takes L × 0.005 s; with it
    L × (0.005 − γ·452) + γ·(100·L + L²/2)."""
    off, on = _disaggregated(0.0), _disaggregated(G)  # γ·452 = 0.9 ms, under the 1 ms per-sequence step
    length = round(off / 0.005)
    assert length in (256, 2048)
    assert on == pytest.approx(length * (0.005 - G * 452) + G * (100 * length + length**2 / 2), rel=1e-9)
