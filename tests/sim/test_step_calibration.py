"""`rlharness calibrate step` / `fidelity step` on a synthetic run whose truth this file
computes itself (first-principles stage times with known efficiency factors), and the
training-parallelism formulas against the Megatron-LM paper's expressions."""

from __future__ import annotations

import json
import math

import pytest

from rlharness.cli import main
from simulators.costmodel import formulas as f
from simulators.scenario.loader import ScenarioError, scenario_from_mapping

F, B, NVL, VRAM = 989e12, 3.35e12, 450e9, 80 * (1 << 30)  # H100 SXM as the datasheet gives it
TRUTH = {"train_mfu": 0.42, "hbm_efficiency": 0.7, "decode_flops_efficiency": 0.35, "link_efficiency": 0.6}
# Qwen2.5-7B's config.json numbers
N, L, D, KV = 7.62e9, 28, 3584, 4 * 128


def _truth(gpus, infer_tp, tp, pp, n, prompt, decode, k):
    """One step's stage seconds, written out from the papers' expressions (not the code under test)."""
    t = prompt + decode
    dp = gpus // (tp * pp)
    m = 512 // dp  # global batch 512, micro-batch 1
    link = NVL * TRUTH["link_efficiency"]
    stages = {}
    for name, passes, allreduces in (("training_s", 3, 4), ("log_probs_s", 1, 2)):
        compute = 2 * passes * n * (N * t + L * D * t * t) / (gpus * F * TRUTH["train_mfu"])
        wall = compute * (m + pp - 1) / m
        if tp > 1:
            wall += allreduces * (L / pp) * (n * t / dp) * D * 2 * 2 * (tp - 1) / tp / link
        if name == "training_s" and dp > 1:
            wall += math.ceil(n / 512) * 2 * (dp - 1) / dp * (N / (tp * pp)) * 4 / link
        stages[name] = wall
    ranks = gpus // infer_tp
    seqs = n / ranks
    kv_tok = 2 * L * KV * 2
    cap = min(256, int((infer_tp * VRAM * 0.9 - 2 * N) // (kv_tok * t)))
    c = min(seqs, cap)
    hbm, dec = B * TRUTH["hbm_efficiency"], F * TRUTH["decode_flops_efficiency"]
    step = 2 * N / (infer_tp * hbm) + c * (2 * N / (infer_tp * dec) + kv_tok * (prompt + decode / 2) / (infer_tp * hbm))
    step += 0.004  # the engine's host work per decode step (vllm-project/vllm#6854), not fitted
    if infer_tp > 1:
        step += 4 * L * 10e-6 + c * 4 * L * D * 2 * (infer_tp - 1) / infer_tp / link
    stages["generation_s"] = seqs * decode / c * step
    # colocated refit: every tensor gathered whole in Megatron-Bridge's order, all inside the
    # node: the TP all-gather moves (tp-1)/tp of the 2N bytes, the PP broadcast the TP shard 2N/tp
    refit = (2 * N * (tp - 1) / tp if tp > 1 else 0.0) + (2 * N / tp if pp > 1 else 0.0)
    if refit:  # DP only: nothing to gather, so no link to measure
        stages["refit_s"] = refit / link
    wobble = 1 + 0.01 * math.sin(k)  # a measured run is never exactly the model
    return {s: v * wobble for s, v in stages.items()}


RUNS = [  # (name, gpus, infer_tp, train tp, train pp, trajectories, prompt, decode)
    ("tp1-dp8", 8, 1, 1, 1, 512, 256, 900),
    ("tp2-pp2", 8, 2, 2, 2, 1024, 512, 1400),
    ("tp4-long", 8, 4, 1, 2, 256, 256, 3000),
    ("held", 8, 2, 2, 1, 768, 300, 1200),
]


def _timings():
    runs = []
    for name, gpus, itp, tp, pp, n, prompt, decode in RUNS:
        runs.append(
            {
                "name": name,
                "gpu": "h100_sxm",
                "gpus_per_node": 8,
                "model": {"preset": "qwen2.5-7b"},
                "train_gpus": gpus,
                "infer_gpus": gpus,
                "infer_tp": itp,
                "colocated": True,
                "train": {"tp": tp, "pp": pp, "global_batch": 512},
                "batch": {"trajectories": n, "prompt_tokens": prompt, "decode_tokens": decode},
                "steps": [_truth(gpus, itp, tp, pp, n, prompt, decode, k) for k in range(3)],
            }
        )
    return {"format": "rlharness-step-timings", "version": 1, "runs": runs}


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    d = tmp_path_factory.mktemp("step")
    timings = d / "timings.json"
    timings.write_text(json.dumps(_timings()))
    out = d / "cal.json"
    assert main(["calibrate", "step", str(timings), "--out", str(out), "--hold-out", "held"]) == 0
    return timings, out


def test_calibrate_step_recovers_the_factors_the_run_was_made_with(calibrated):
    _, out = calibrated
    cal = json.loads(out.read_text())
    assert cal["held_out"] == ["held"]
    for key, value in TRUTH.items():
        assert cal["costs"][key] == pytest.approx(value, rel=0.03), key
    assert "moe_train_mfu" not in cal["costs"]  # no mixture of experts measured: default kept


def test_fidelity_step_reports_small_errors_on_the_held_out_run(calibrated, capsys):
    timings, out = calibrated
    assert main(["fidelity", "step", str(timings), "--calibration", str(out)]) == 0
    text = capsys.readouterr().out
    held = [line for line in text.splitlines() if line.startswith("held ")]
    assert len(held) == 4  # its four stages
    for line in held:
        assert abs(float(line.split()[-1].rstrip("%"))) < 3.0, line
    assert "held-out runs: 4 stage means" in text


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda t: t["runs"][1]["steps"][0].update(training_s=-1), "runs[1].steps[0].training_s"),
        (lambda t: t["runs"][0].update(gpu="h900"), "runs[0].gpu"),
        (lambda t: t["runs"][0]["train"].update(tp=3), "runs[0].train"),
        (lambda t: t["runs"][2]["batch"].pop("decode_tokens"), "runs[2].batch.decode_tokens"),
        (lambda t: t.update(format="x"), "format"),
        (lambda t: t["runs"][0]["model"].update(preset="gpt5"), "runs[0].model.preset"),
    ],
)
def test_bad_timings_are_one_line_naming_the_field_and_write_nothing(tmp_path, capsys, mutate, field):
    data = _timings()
    mutate(data)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "cal.json"
    assert main(["calibrate", "step", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f": {field}:" in err, err
    assert not out.exists()


def test_a_scenario_takes_the_calibration_and_explicit_costs_still_win(calibrated, tmp_path):
    _, out = calibrated
    pipe = {
        "name": "p",
        "type": "roll_sync",
        "train_gpus": list(range(8)),
        "infer_gpus": list(range(8)),
        "infer_tp": 2,
        "model": {"preset": "qwen2.5-7b"},
    }
    base = {"name": "s", "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "h100_sxm"}, "pipelines": [pipe]}
    plain = scenario_from_mapping(dict(base), str(tmp_path / "s.yaml"))
    cal = scenario_from_mapping({**base, "step_calibration": str(out)}, str(tmp_path / "s.yaml"))
    pinned = scenario_from_mapping(
        {**base, "step_calibration": str(out), "costs": {"train_mfu": 0.35}}, str(tmp_path / "s.yaml")
    )
    assert cal.costs.train_mfu == pytest.approx(TRUTH["train_mfu"], rel=0.03)
    # a higher MFU: a faster forward pass (the log-probs carry no gradient all-reduce to slow it)
    assert (
        cal.pipelines[0].costs.old_log_probs_s_per_trajectory < plain.pipelines[0].costs.old_log_probs_s_per_trajectory
    )
    assert pinned.costs.train_mfu == 0.35 and pinned.costs.hbm_efficiency == cal.costs.hbm_efficiency
    with pytest.raises(ScenarioError, match=r"step_calibration: .*format"):
        (tmp_path / "bad.json").write_text("{}")
        scenario_from_mapping({**base, "step_calibration": str(tmp_path / "bad.json")}, str(tmp_path / "s.yaml"))


def test_pipeline_bubble_and_tensor_parallel_bytes_follow_narayanan_et_al():
    arch = f.Arch(N, N, L, D, KV, 2)
    eff = f.Efficiency(0.4, 0.5, 0.8, 1e-5, 256, 0.5, 0.2)
    links = f.Links(NVL, 50e9, 8)
    one = f.train_pass_s(arch, f.Parallel(), 64, 2000, 8, F, links, eff)
    piped = f.train_pass_s(arch, f.Parallel(pp=4, global_batch=64), 64, 2000, 8, F, links, eff)
    m, p = 64 // 2, 4  # dp = 8 / 4 = 2
    assert piped["pp_bubble"] / piped["compute"] == pytest.approx((p - 1) / (m + p - 1) / (1 - (p - 1) / (m + p - 1)))
    assert one["pp_bubble"] == 0 and one["tp_comm"] == 0 and one["ep_comm"] == 0
    tp = f.train_pass_s(arch, f.Parallel(tp=2), 64, 2000, 8, F, links, eff)
    # 4 all-reduces a layer of the TP group's tokens (64·2000 / DP 4) x d x 2 B; a ring moves 2(t-1)/t = 1 of them
    assert tp["tp_comm"] == pytest.approx(4 * L * (64 * 2000 / 4) * D * 2 * (2 * (2 - 1) / 2) / NVL)
    assert f.layout_problem(8, f.Parallel(tp=3)) and f.layout_problem(8, f.Parallel(ep=16))
    assert f.layout_problem(8, f.Parallel(tp=2, pp=2, ep=4)) is None


def test_an_infeasible_training_layout_is_one_error_naming_the_field():
    pipe = {
        "name": "p",
        "type": "roll_sync",
        "train_gpus": list(range(8)),
        "infer_gpus": list(range(8)),
        "model": {"preset": "qwen2.5-7b"},
        "train_pp": 3,
    }
    with pytest.raises(ScenarioError, match=r"pipelines\[0\]\.train_tp: .*tp x pp x cp = 3"):
        scenario_from_mapping(
            {"name": "s", "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "h100_sxm"}, "pipelines": [pipe]}, "t.yaml"
        )


@pytest.mark.parametrize(
    "argv, text",
    [
        (["calibrate", "step"], "TIMINGS"),
        (["fidelity", "step", "t.yaml", "--fit-alongside"], "--calibration FILE"),
        (["calibrate", "refit", "t.yaml"], "takes no TIMINGS"),
    ],
)
def test_the_step_commands_refuse_a_wrong_call_in_one_line(capsys, argv, text):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and text in err, err


def test_the_bundled_example_timings_file_calibrates(tmp_path):
    out = tmp_path / "c.json"
    assert (
        main(
            [
                "calibrate",
                "step",
                "examples/calibration/step_timings_example.yaml",
                "--hold-out",
                "7b-tp2-long",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    # its two generation runs separate the two decode factors (after the per-step host work)
    assert set(json.loads(out.read_text())["costs"]) == {
        "train_mfu",
        "hbm_efficiency",
        "decode_flops_efficiency",
        "link_efficiency",
    }


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda d: d["pipelines"][0].update(train_pp=0), "pipelines[0].train_pp"),
        (lambda d: d["pipelines"][0].update(train_global_batch=-1), "pipelines[0].train_global_batch"),
        (lambda d: d["pipelines"][0]["model"].update(experts_per_token=-2), "pipelines[0].model.experts_per_token"),
        (lambda d: d.update(costs={"moe_train_mfu": 1.5}), "costs.moe_train_mfu"),
        (lambda d: d.update(costs={"link_efficiency": 0}), "costs.link_efficiency"),
        (lambda d: d.update(step_calibration=5), "step_calibration"),
    ],
)
def test_a_bad_new_field_is_one_error_naming_it(edit, field):
    data = {
        "name": "s",
        "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "h100_sxm"},
        "pipelines": [
            {
                "name": "p",
                "type": "roll_sync",
                "train_gpus": list(range(8)),
                "infer_gpus": list(range(8)),
                "model": {"preset": "qwen3-30b-a3b"},
            }
        ],
    }
    edit(data)
    with pytest.raises(ScenarioError) as e:
        scenario_from_mapping(data, "t.yaml")
    assert f": {field}:" in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_run_on_dedicated_training_gpus_calibrates_the_colocated_rate(tmp_path):
    """The simulator charges a dense model's training on GPUs of its own the colocated rate
    over the colocated-training factor (simulators/costmodel/colocation.py); a calibration on
    such a run must give back the colocated rate, or a scenario would apply the factor twice.
    The run's training seconds are written out here at train_mfu 0.42 / 1.86, DP only."""
    n, t, gpus = 512, 1200, 8
    compute = lambda passes: 2 * passes * n * (N * t + L * D * t * t) / (gpus * F * 0.42)  # noqa: E731
    dp_reduce = 2 * (gpus - 1) / gpus * N * 4 / NVL  # the gradient all-reduce (link efficiency 1)
    step = {"training_s": compute(3) / 1.86 + dp_reduce / 1.86, "log_probs_s": compute(1)}
    run = {
        "name": "dedicated",
        "gpu": "h100_sxm",
        "gpus_per_node": 8,
        "model": {"preset": "qwen2.5-7b"},
        "train_gpus": gpus,
        "infer_gpus": gpus,
        "infer_tp": 1,
        "colocated": False,
        "train": {"tp": 1, "pp": 1, "global_batch": 512},
        "batch": {"trajectories": n, "prompt_tokens": 200, "decode_tokens": t - 200},
        "steps": [step],
    }
    timings, out = tmp_path / "t.json", tmp_path / "c.json"
    timings.write_text(json.dumps({"format": "rlharness-step-timings", "version": 1, "runs": [run]}))
    assert main(["calibrate", "step", str(timings), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["costs"]["train_mfu"] == pytest.approx(0.42, rel=1e-6)
