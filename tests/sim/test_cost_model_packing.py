"""Sequence packing (NeMo RL's Megatron path): bins, microbatches, the padding of every
microbatch to the longest bin under pipeline parallelism, and what that costs a pass. Every
reference is worked out by hand from the packer's rule and the 1F1B bubble
(docs/cost-model.md), not by calling the code under test."""

from __future__ import annotations

import pytest

from simulators.costmodel import formulas as f
from simulators.costmodel.packing import PackedPass, first_fit_decreasing, packed_pass, quantile_lengths
from simulators.scenario.loader import ScenarioError, scenario_from_mapping
from tests.sim.test_cost_model_moe_training import DENSE, EFF, F, LINKS  # train_mfu 0.5


def test_first_fit_decreasing_places_the_longest_first_in_the_first_bin_with_room():
    # capacity 10: 7 opens bin 1, 6 opens bin 2, 5 opens bin 3, 3 -> bin 1 (10), 2 -> bin 2 (8),
    # 2 -> bin 2 (10: the first with room, not the emptiest), 1 -> bin 3 (6)
    assert first_fit_decreasing([2, 5, 1, 7, 3, 6, 2], 10) == [10, 10, 6]


def test_under_pipeline_stages_every_microbatch_computes_the_longest_bin():
    """Eight sequences, bins of 10 tokens, one global batch, 2 DP ranks. FFD: [8,2] [6,4]
    [5,5] [3] -> four bins of 10, 10, 10, 3 tokens, two a rank. With PP every microbatch is
    padded to the longest bin: 2 ranks x 2 microbatches x 10 = 40 tokens for 33; without PP
    the pass computes its 33."""
    lengths = [8, 6, 5, 5, 4, 3, 2]
    pp = packed_pass(lengths, 10, chunk=8, dp=2, pp=4)
    assert pp == PackedPass(microbatches=2, padding=pytest.approx(40 / 33))
    flat = packed_pass(lengths, 10, chunk=8, dp=2, pp=1)
    assert flat == PackedPass(microbatches=2, padding=pytest.approx(1.0))


def test_training_packs_each_global_batch_on_its_own():
    """Four sequences of 6 tokens in bins of 10 with a global batch of 2: each chunk of two
    packs into two bins of one sequence each (6 + 6 > 10), so a lone rank runs 2 microbatches
    a chunk. The chunks interleave the lengths: [9, 9, 1, 1] makes the chunks [9, 1] and
    [9, 1], one full bin each (in order they would be [9, 9] and [1, 1]: three bins)."""
    assert packed_pass([6, 6, 6, 6], 10, chunk=2, dp=1, pp=2) == PackedPass(2, pytest.approx(1.0))
    assert packed_pass([9, 9, 1, 1], 10, chunk=2, dp=1, pp=2) == PackedPass(1, pytest.approx(1.0))
    assert packed_pass([11, 1], 10, chunk=2, dp=1, pp=2) is None  # longer than a bin


def test_quantile_lengths_read_the_workload_at_mid_quantiles():
    """Two lengths of a log-normal with median 100 and sigma 1: the quantiles 1/4 and 3/4,
    z = -/+0.6745, so 100 e^(-0.6745) = 50.94 and 100 e^(0.6745) = 196.3, plus the prompt;
    the cap cuts the second; a share of 1/2 at the cap puts the upper half at it."""
    lo, hi = quantile_lengths(2, 10, 100, 1.0, 1000)
    assert lo == pytest.approx(10 + 50.94, rel=1e-3) and hi == pytest.approx(10 + 196.3, rel=1e-3)
    assert quantile_lengths(2, 10, 100, 1.0, 150)[1] == pytest.approx(160)
    assert quantile_lengths(2, 10, 100, 1.0, 1000, cap_share=0.5)[1] == pytest.approx(1010)


def test_a_packed_pass_bubbles_over_its_bins_and_computes_its_padding():
    """16 sequences of 1000 tokens on 8 GPUs at PP2 (DP 4), a global batch of 16: unpacked
    m = 16 / 4 = 4 microbatches a rank; packed into bins of two sequences, 2 a rank, padded
    by 1.25. Compute 2 x 3 x 16 x (1e9 x 1250 + 10 x 1000 x 1000^2) / (8 x 1e15 x 0.5); the
    bubble (p-1)/m of it with m = 2."""
    layout = f.Parallel(pp=2, global_batch=16)
    plain = f.train_pass_s(DENSE, layout, 16, 1000, 8, F, LINKS, EFF)
    packed = f.train_pass_s(DENSE, layout, 16, 1000, 8, F, LINKS, EFF, packed=PackedPass(2, 1.25))
    compute = 2 * 3 * 16 * (1e9 * 1250 + 1e10) / (8 * 1e15 * 0.5)
    assert packed["compute"] == pytest.approx(compute)
    assert packed["pp_bubble"] == pytest.approx(compute * 1 / 2)
    assert plain["pp_bubble"] == pytest.approx(plain["compute"] * 1 / 4)


def packed_scenario(pp: int, train_pack: int, log_prob_pack: int = 0) -> dict:
    """Llama 3.1-8B on 16 H100s (TP4, vLLM TP4), 256 answers of a 100-token prompt and a
    log-normal answer (median 1,500, cap 3,996) a step."""
    return {
        "name": "packing",
        "seed": 0,
        "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": "h100_sxm"},
        "pipelines": [
            {
                "name": "p",
                "type": "roll_sync",
                "train_gpus": list(range(16)),
                "infer_gpus": list(range(16)),
                "infer_tp": 4,
                "train_tp": 4,
                "train_pp": pp,
                "train_global_batch": 64,
                "train_pack_tokens": train_pack,
                "log_prob_pack_tokens": log_prob_pack,
                "model": {"preset": "llama3.1-8b"},
                "workload": {
                    "prompts_per_step": 16,
                    "generations_per_prompt": 16,
                    "prompt_tokens": 100,
                    "decode_tokens_median": 1500,
                    "decode_tokens_max": 3996,
                },
            }
        ],
    }


def test_a_scenario_that_packs_under_pipeline_stages_trains_slower_and_one_without_them_not():
    """Sequences near half a bin pack about one a bin under PP, each padded to the longest:
    the packed scenario's training costs more than the unpacked; at PP 1 packing charges nothing."""
    costs = lambda m: scenario_from_mapping(m).pipelines[0].costs  # noqa: E731
    assert (
        costs(packed_scenario(2, 4096, 8192)).train_s_per_trajectory
        > costs(packed_scenario(2, 0)).train_s_per_trajectory
    )
    assert (
        costs(packed_scenario(2, 4096, 8192)).old_log_probs_s_per_trajectory
        > costs(packed_scenario(2, 0)).old_log_probs_s_per_trajectory
    )
    assert costs(packed_scenario(1, 4096)).train_s_per_trajectory == costs(packed_scenario(1, 0)).train_s_per_trajectory


def test_a_bin_shorter_than_the_longest_trajectory_is_refused():
    with pytest.raises(ScenarioError, match=r"train_pack_tokens: a bin of 4000 tokens is shorter"):
        scenario_from_mapping(packed_scenario(2, 4000))
