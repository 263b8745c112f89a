"""rlharness preflight: the static memory plan against a simulated run's allocations, the
buffer rule against the simulator's pumps (the windowed cases NeMo RL's setup check gets
wrong both ways), the CLI's verdicts and exit codes."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from harness.streaming.capacity import required_capacity, upstream_requirement
from rlharness.cli import main
from simulators.preflight.questions import deadlock, fits
from simulators.preflight.memory import phase_peaks
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import scenario_from_mapping

COLOCATED = {
    "name": "pf_colocated",
    "horizon_s": 3600,
    "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "h100_sxm"},
    "pipelines": [
        {
            "name": "p",
            "type": "roll_sync",
            "train_gpus": [0, 1],
            "infer_gpus": [0, 1],
            "steps": 2,
            "model": {"preset": "qwen2.5-0.5b"},
            "costs": {"kv_cache_fraction": 0.5},
            "workload": {
                "prompts_per_step": 4,
                "generations_per_prompt": 2,
                "decode_tokens_max": 256,
                "decode_tokens_median": 96,
            },
        }
    ],
}

STREAMING = {
    "name": "pf_windowed",
    "horizon_s": 2000,
    "cluster": {"nodes": 1, "gpus_per_node": 4, "gpu": "h100_sxm"},
    "pipelines": [
        {
            "name": "sc",
            "type": "single_controller",
            "train_gpus": [0, 1],
            "infer_gpus": [2, 3],
            "steps": 3,
            "model": {"preset": "qwen2.5-0.5b"},
            "workload": {
                "prompts_per_step": 8,
                "generations_per_prompt": 2,
                "decode_tokens_max": 256,
                "decode_tokens_median": 96,
            },
            "streaming": {
                "sampler": "windowed",
                "window": 1,
                "min_groups_for_streaming_train": 2,
                "max_buffered_rollouts": 8,
                "max_inflight_prompts": 8,
            },
        }
    ],
}


def _streaming(min_groups: int, buffer: int):
    data = copy.deepcopy(STREAMING)
    data["pipelines"][0]["streaming"].update(min_groups_for_streaming_train=min_groups, max_buffered_rollouts=buffer)
    return scenario_from_mapping(data, "test")


def test_static_peaks_are_the_simulated_allocations():
    s = scenario_from_mapping(COLOCATED, "test")
    plan = {pk.phase: pk.peak_bytes for pk in phase_peaks(s)}
    records = Simulation(s).run().records
    used = [(r.get("phase"), r["used"]) for r in records if r["kind"] == "vram"]
    assert max(u for _, u in used) == max(plan.values()) == plan["refit"]
    assert max(u for ph, u in used if ph in ("init", "train", "old_log_probs")) == plan["training"]
    assert max(u for ph, u in used if ph == "wake") == plan["generation"]


@pytest.mark.parametrize(
    "min_groups,buffer,runs",
    [
        (2, 4, True),  # min_groups <= buffer < groups_per_step: runs, and NeMo RL's check (a whole step) refuses it
        (8, 6, False),  # min_groups = groups_per_step above the buffer: the old check passed it, it wedges
        (8, 8, True),
    ],
)
def test_the_buffer_rule_agrees_with_the_simulated_pumps(min_groups, buffer, runs):
    s = _streaming(min_groups, buffer)
    verdict = deadlock(s, lambda f: f)[0]
    assert verdict.ok is runs
    res = Simulation(s).run()
    assert res.reason == ("done" if runs else "horizon")  # a wedge: nothing moves until the horizon
    if min_groups < 8 and buffer < 8:
        assert upstream_requirement(False, 8, 1) > buffer >= required_capacity(False, 8, 1, min_groups).needed


def test_gated_samplers_need_window_plus_one_batches():
    assert required_capacity(True, 8, 2, 1).needed == 24 == upstream_requirement(True, 8, 2)


def test_a_phase_that_does_not_fit_names_the_field_and_what_fits():
    data = copy.deepcopy(COLOCATED)
    data["pipelines"][0].update(model={"preset": "qwen2.5-7b"}, train_gpus=[0])  # 8 x 15 GB of state on one GPU
    s = scenario_from_mapping(data, "test")
    refused = [v for v in fits(s, lambda f: f) if v.ok is False]
    assert [v.question for v in refused] == ["fits: p training"]
    assert refused[0].key == "pipelines[0].train_gpus" and "fits with at least 2 training GPUs" in refused[0].figure


def _write(tmp_path, data, name="s.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_cli_exit_codes_and_one_verdict_per_question(tmp_path, capsys):
    assert main(["preflight", _write(tmp_path, COLOCATED)]) == 0
    out = capsys.readouterr().out
    for question in (
        "fits: p training",
        "fits: p generation",
        "fits: p refit",
        "cannot deadlock",
        "staleness bound: p",
        "step time: p",
        "known upstream behaviours",
    ):
        assert question in out, question
    assert (
        main(
            [
                "preflight",
                _write(
                    tmp_path,
                    json.loads(json.dumps(STREAMING))
                    | {
                        "pipelines": [
                            dict(
                                STREAMING["pipelines"][0],
                                streaming=dict(
                                    STREAMING["pipelines"][0]["streaming"],
                                    min_groups_for_streaming_train=8,
                                    max_buffered_rollouts=6,
                                ),
                            )
                        ]
                    },
                    "wedge.yaml",
                ),
            ]
        )
        == 1
    )
    assert "change pipelines[0].streaming.max_buffered_rollouts" in capsys.readouterr().out
    assert main(["preflight", _write(tmp_path, COLOCATED), "--cluster", "1x2xtpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --cluster")
    assert main(["preflight", _write(tmp_path, {"hello": 1}, "x.yaml")]) == 2
