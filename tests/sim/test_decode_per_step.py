"""Per-step decode timing (``workload.decode_timing: per_step``, simulators/pipelines/inference.py):
every decode step of a rank is charged at the concurrency of that step, so a batch's last
sequences decode at the low-batch step time; a mixture of experts' step reads only the
experts its tokens route to. References are hand-computed step sums, not the router's
helpers; the scenario-level checks use crafted files."""

from __future__ import annotations

import math

import pytest

from harness.control.rank_state import RankLifecycle, RankState
from simulators.runtime.env import SimEnv
from simulators.pipelines.inference import RankSim, Request, Router
from simulators.scenario.loader import ScenarioError, scenario_from_mapping

T, H = 1000.0, 4.0  # tokens/s asymptote, half point: a step of c sequences takes (4 + c) / 1000 s


def _router(step_time, max_concurrent=64):
    env, log, done = SimEnv(), [], []
    router = Router(
        env,
        "p",
        0,
        max_concurrent=max_concurrent,
        tokens_per_s=T,
        half_point=H,
        log=log.append,
        on_done=lambda req, rank: done.append((env.now, req.rid)),
        step_time=step_time,
    )
    rank = RankSim("p", 0, (0,), RankLifecycle("p", 0))
    rank.life.state = RankState.ROUTABLE
    router.ranks = {0: rank}
    router.activate([rank])
    return env, router, rank, log, done


def _step(c):
    return (H + c) / T


def test_a_draining_batch_is_charged_at_each_steps_concurrency():
    env, router, _, _, done = _router(_step)
    router.submit([Request(0, tokens=10), Request(1, tokens=20), Request(2, tokens=30)])
    env.run(until=100)
    # 10 steps at c=3 (0.007 s each), 10 at c=2 (0.006), 10 at c=1 (0.005)
    assert [rid for _, rid in done] == [0, 1, 2]
    expected = [0.07, 0.07 + 0.06, 0.07 + 0.06 + 0.05]
    assert all(math.isclose(t, e, rel_tol=1e-12) for (t, _), e in zip(done, expected))


def test_at_start_timing_keeps_its_meaning():
    """The default charges a request at the concurrency it found when it started (c
    before it, plus itself), whatever happens after: the last of three runs 30 tokens at
    (4 + 3)/1000 s each."""
    env, router, _, _, done = _router(None)
    router.submit([Request(0, tokens=10), Request(1, tokens=20), Request(2, tokens=30)])
    env.run(until=100)
    assert [round(t, 12) for t, _ in done] == [0.05, 0.12, 0.21]


def test_a_queued_request_starts_when_a_slot_frees_and_shares_the_steps():
    env, router, _, _, done = _router(_step, max_concurrent=2)
    router.submit([Request(0, tokens=10), Request(1, tokens=30), Request(2, tokens=10)])
    env.run(until=100)
    # 10 steps at c=2 (0.06 s): 0 ends, 2 starts; 10 more at c=2 (0.06 s): 2 ends; 1 runs 10 alone (0.05 s)
    assert [rid for _, rid in done] == [0, 2, 1]
    assert [round(t, 12) for t, _ in done] == [0.06, 0.12, 0.17]


def test_keep_pause_freezes_the_tokens_the_clock_has_not_reached():
    env, router, rank, log, done = _router(_step)
    router.submit([Request(0, tokens=100), Request(1, tokens=100)])
    env.run(until=0.3)  # 0.3 s at 0.006 s a step: 50 tokens each
    router.pause_ranks([rank], "keep")
    left = [r["tokens_left"] for r in log if r["kind"] == "request_pause"]
    assert left == [50, 50]
    router.activate([rank])
    router.resume_kept(rank)
    env.run(until=10)
    assert [round(t, 9) for t, _ in done] == [0.6, 0.6]  # 50 more steps at c=2 from 0.3 s


def test_an_aborted_request_starts_over_and_the_clock_forgets_it():
    env, router, rank, log, done = _router(_step)
    router.submit([Request(0, tokens=100)])
    env.run(until=0.5)  # 100 steps at c=1 take 0.5 s: request 0 is done
    router.submit([Request(1, tokens=100), Request(2, tokens=100)])
    env.run(until=0.5 + 0.06)  # 10 steps at c=2
    router.deactivate([rank])  # both aborted; their callers poll for an active rank
    router.activate([rank])
    env.run(until=10)
    assert [r["request"] for r in log if r["kind"] == "request_abort"] == [1, 2]
    again = [r["t"] for r in log if r["kind"] == "request_dispatch" and r["attempt"] == 1]
    assert len(again) == 2 and again[0] == again[1]
    # the retries decode all 100 tokens again, both at c=2: 100 steps of 0.006 s
    assert [rid for _, rid in done] == [0, 1, 2]
    assert all(math.isclose(t, again[0] + 0.6, rel_tol=1e-9) for t, _ in done[1:])


def test_moe_step_reads_only_the_experts_its_tokens_route_to():
    """k = 8 of E = 128 experts per token: a lone token misses an expert with probability
    15/16, so a step of one reads 1/16 of the routed experts' X = 0.003 s."""
    x = 0.003
    env, router, _, _, done = _router(lambda c: (H + c) / T - x * (15 / 16) ** c)
    router.submit([Request(0, tokens=100)])
    env.run(until=10)
    assert math.isclose(done[0][0], 100 * (0.005 - 0.003 * 15 / 16), rel_tol=1e-12)


def _scenario(**workload):
    return {
        "name": "x",
        "seed": 0,
        "horizon_s": 100,
        "cluster": {"nodes": 1, "gpus_per_node": 2},
        "pipelines": [
            {
                "name": "p",
                "type": "roll_sync",
                "train_gpus": [0],
                "infer_gpus": [0, 1],
                "steps": 1,
                "model": {"experts_per_token": 8, "num_experts": 128},
                "workload": {"prompts_per_step": 2, "generations_per_prompt": 2, **workload},
            }
        ],
    }


@pytest.mark.parametrize(
    "workload, field, words",
    [
        ({"decode_timing": "fast"}, "pipelines[0].workload.decode_timing", "at_start or per_step"),
        ({"decode_expert_read_s": 0.001}, "pipelines[0].workload.decode_expert_read_s", "only a per_step decode"),
        (
            {
                "decode_timing": "per_step",
                "decode_expert_read_s": 1.0,
                "tokens_per_s_per_rank": 1000.0,
                "batching_half_point": 4.0,
            },
            "pipelines[0].workload.decode_expert_read_s",
            "exceeds the step's fixed part",
        ),
    ],
)
def test_bad_decode_fields_name_the_field(workload, field, words):
    with pytest.raises(ScenarioError) as e:
        scenario_from_mapping(_scenario(**workload))
    assert field in str(e.value) and words in str(e.value) and "\n" not in str(e.value)


def test_an_expert_read_needs_a_mixture_of_experts():
    data = _scenario(decode_timing="per_step", decode_expert_read_s=0.001)
    data["pipelines"][0]["model"] = {}
    with pytest.raises(ScenarioError) as e:
        scenario_from_mapping(data)
    assert "pipelines[0].workload.decode_expert_read_s" in str(e.value) and "num_experts" in str(e.value)


def test_a_scenario_with_per_step_timing_finishes_its_steps():
    data = _scenario(
        decode_timing="per_step", decode_expert_read_s=0.001, tokens_per_s_per_rank=1000.0, batching_half_point=4.0
    )
    from simulators.runtime.simulation import Simulation

    result = Simulation(scenario_from_mapping(data)).run()
    done = [r for r in result.records if r["kind"] == "request_done"]
    assert len(done) == 4


def test_bad_expert_count_and_host_overhead_name_their_field():
    data = _scenario()
    data["pipelines"][0]["model"] = {"experts_per_token": 8, "num_experts": 4}
    with pytest.raises(ScenarioError) as e:
        scenario_from_mapping(data)
    assert "pipelines[0].model.experts_per_token" in str(e.value) and "num_experts 4" in str(e.value)
    data = _scenario()
    data["costs"] = {"decode_step_overhead_s": -0.001}
    data["cluster"]["gpu"] = "h100_sxm"
    data["pipelines"][0]["model"] = {"preset": "qwen3-30b-a3b"}
    with pytest.raises(ScenarioError) as e:
        scenario_from_mapping(data)
    assert "costs.decode_step_overhead_s" in str(e.value) and "\n" not in str(e.value)
