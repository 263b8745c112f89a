"""Refit calibration: the fit recovers known costs, the file feeds a scenario, bad files
are one clear error, and the CLI runs the real transport end to end."""

from __future__ import annotations

import json

import pytest

from gpu_gates.transports.measure import Measurement, synthetic_specs
from rlharness import refit_calibrate
from simulators.refit import fit as refit_fit
from simulators.refit.calibration import CALIBRATED_COSTS, load_calibration, write_calibration
from simulators.scenario.loader import ScenarioError, scenario_from_mapping

MiB = 1 << 20
KNOWN = {
    "refit_pack_bytes_per_s": 3e9,
    "receiver_load_bytes_per_s": 2e9,
    "refit_tensor_overhead_s": 2e-5,
    "refit_setup_s": 1e-3,
    "refit_staging_bytes_per_s": 5e8,
    "cache_pack_bytes_per_s": 1e9,
    "refit_group_overhead_s": 4e-4,
    "refit_complete_s": 2e-3,
}


def fake_points(grid, costs):
    """Grid points whose 'measurements' are what the model predicts for known costs."""
    points = []
    for model, budget in grid:
        specs = synthetic_specs(model)
        wall = refit_fit.predict(specs, budget, costs)
        m = Measurement(
            sum(s.nbytes for s in specs),
            budget,
            0,
            len(specs),
            wall_s=[wall, wall * 1.01],
            staging_s=[costs["refit_setup_s"]],
            cache_build_s=[sum(s.nbytes for s in specs) / 1e9],
            pack_s=[sum(s.nbytes for s in specs) / 3e9],
            load_s=[sum(s.nbytes for s in specs) / 2e9],
            dedicated_s=[1e-3],
            dedicated_bytes=int(5e5),
        )
        points.append((specs, m))
    return points


def test_fit_reproduces_held_out_predictions_of_known_costs():
    fitted = refit_fit.fit(fake_points(refit_calibrate.GRID, KNOWN))
    assert set(fitted) == set(CALIBRATED_COSTS)
    for model, budget in refit_calibrate.HELD_OUT:
        specs = synthetic_specs(model)
        truth, got = refit_fit.predict(specs, budget, KNOWN), refit_fit.predict(specs, budget, fitted)
        assert abs(got / truth - 1) < 0.10, (model, budget, truth, got)
    assert fitted["cache_pack_bytes_per_s"] == pytest.approx(1e9, rel=0.02)


def test_a_scenario_takes_calibrated_costs_unless_it_pins_them(tmp_path):
    cal = tmp_path / "cal.json"
    write_calibration(str(cal), KNOWN, machine={"host": "test"})
    body = {
        "name": "s",
        "cluster": {"nodes": 1, "gpus_per_node": 2},
        "refit_calibration": "cal.json",
        "costs": {"refit_setup_s": 0.5},
        "pipelines": [{"name": "p", "type": "nemo_async", "train_gpus": [0], "infer_gpus": [0, 1]}],
    }
    scenario_file = tmp_path / "scenario.yaml"
    scenario_file.write_text("x: 1\n")  # the source names a real file: the calibration is found beside it
    s = scenario_from_mapping(body, str(scenario_file))
    assert s.costs.receiver_load_bytes_per_s == 2e9 and s.costs.refit_group_overhead_s == 4e-4
    assert s.costs.refit_setup_s == 0.5  # the scenario's own value wins
    assert s.refit_calibration == str(cal)


@pytest.mark.parametrize(
    "content, problem",
    [
        ("{", "not JSON"),
        (json.dumps({"format": "other"}), "not a refit calibration file"),
        (
            json.dumps({"format": "rlharness-refit-calibration", "version": 1, "costs": {"wake_s": 1.0}}),
            "costs.wake_s: not a calibrated cost",
        ),
        (
            json.dumps({"format": "rlharness-refit-calibration", "version": 1, "costs": {"refit_setup_s": -1}}),
            "costs.refit_setup_s: expected a non-negative",
        ),
    ],
)
def test_a_bad_calibration_file_is_one_clear_scenario_error(tmp_path, content, problem):
    cal = tmp_path / "cal.json"
    cal.write_text(content)
    body = {
        "name": "s",
        "cluster": {"nodes": 1, "gpus_per_node": 1},
        "refit_calibration": str(cal),
        "pipelines": [{"name": "p", "type": "nemo_async", "train_gpus": [0], "infer_gpus": [0]}],
    }
    with pytest.raises(ScenarioError) as info:
        scenario_from_mapping(body, "x.yaml")
    assert "refit_calibration" in str(info.value) and problem in str(info.value)
    with pytest.raises(Exception):
        load_calibration(str(tmp_path / "missing.json"))


def test_cli_calibrates_on_the_real_transport_and_checks_fidelity_with_the_file(tmp_path, capsys, monkeypatch):
    """calibrate on the real transport end to end; then fidelity with the file it wrote, on
    measurements that follow that file's costs exactly (the real transport under fidelity
    is the --fit-alongside test's: a third receiver process here proved nothing more)."""
    from rlharness.cli import main

    out = tmp_path / "cal.json"
    code = main(["calibrate", "refit", "--quick", "--repeats", "1", "--out", str(out)])
    if code == 0:
        costs = load_calibration(str(out))
        assert all(lo <= costs[k] <= hi or costs[k] == 0 for k, (lo, hi) in refit_fit.PHYSICAL_BOUNDS.items())
    else:  # a one-repeat fit on a loaded machine may be refused: one line, nothing written
        assert code == 1 and not out.exists()
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: calibrate refit: "), err
        print(captured.out, end="")  # the grid table was printed before the refusal
        write_calibration(str(out), KNOWN, machine={"host": "test"})
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.strip().endswith("%") and "MiB" not in line]
    assert len(rows) >= len(refit_calibrate.QUICK_GRID)  # the calibration table
    measured = []

    def follows_the_file(grid, repeats, progress):
        assert (list(grid), repeats) == (refit_calibrate.HELD_OUT, 1)
        measured.append(grid)
        return fake_points(grid, load_calibration(str(out)))

    monkeypatch.setattr(refit_calibrate, "_measure", follows_the_file)
    assert main(["fidelity", "refit", "--calibration", str(out), "--repeats", "1"]) == 0
    assert measured
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.strip().endswith("%") and "MiB" not in line]
    assert len(rows) == len(refit_calibrate.HELD_OUT) and all(r.endswith("+0.0%") for r in rows), (
        rows
    )  # the file's costs
    assert "median |error| 0.0 %" in text and "worst |error| 0.0 %" in text and ": met" in text
    assert main(["fidelity", "refit", "--calibration", str(tmp_path / "nope.json")]) == 2
    assert main(["calibrate", "refit", "--repeats", "0"]) == 2


def test_fidelity_can_fit_on_the_grid_measured_alongside_and_never_on_the_held_out_points(monkeypatch, capsys):
    """--fit-alongside: the grid and the held-out configurations are measured in the same
    interleaved rounds; the fit sees only the grid points. Each recorded sync follows an
    unrecorded warm-up, and the table compares the minimum."""
    from rlharness.cli import main

    monkeypatch.setattr(refit_calibrate, "GRID", refit_calibrate.QUICK_GRID)
    monkeypatch.setattr(refit_calibrate, "HELD_OUT", [(6 * MiB, 3 * MiB), (12 * MiB, 6 * MiB)])
    fitted_on, measured = [], []
    real_fit, real_measure = refit_calibrate.fit, refit_calibrate._measure

    def spy_fit(points):
        fitted_on.extend((m.model_bytes, m.budget_bytes) for _, m in points)
        return real_fit(points)

    def spy_measure(grid, repeats, progress):
        out = real_measure(grid, repeats, progress)
        measured.extend(m for _, m in out)
        return out

    monkeypatch.setattr(refit_calibrate, "fit", spy_fit)
    monkeypatch.setattr(refit_calibrate, "_measure", spy_measure)
    assert main(["fidelity", "refit", "--fit-alongside", "--repeats", "2"]) == 0
    n = len(refit_calibrate.QUICK_GRID)
    assert len(measured) == n + 2
    assert fitted_on == [
        (m.model_bytes, m.budget_bytes) for m in measured[:n]
    ]  # the held-out points were not fitted on
    assert [m.budget_bytes for m in measured[:n]] == [b for _, b in refit_calibrate.QUICK_GRID]
    assert [m.budget_bytes for m in measured[n:]] == [3 * MiB, 6 * MiB]
    assert all(len(m.wall_s) == 2 and len(m.load_s) == 2 for m in measured)  # the warm-ups are not recorded
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.strip().endswith("%") and "MiB" not in line]
    assert len(rows) == 2 and "median |error|" in text
    assert main(["fidelity", "refit", "--repeats", "1"]) == 2  # a file or --fit-alongside: one is required


# ----------------------------------------------------------------------------- refusing a fit


def test_a_fit_of_known_costs_is_accepted():
    points = fake_points(refit_calibrate.GRID, KNOWN)
    assert refit_fit.fit_problem(points, refit_fit.fit(points)) is None
    assert refit_fit.fit_problem(points, KNOWN) is None


@pytest.mark.parametrize(
    "key,value",
    [
        ("receiver_load_bytes_per_s", 7.8e16),
        ("refit_tensor_overhead_s", 1.4e-15),
        ("refit_pack_bytes_per_s", 10.0),
        ("refit_complete_s", 30.0),
    ],
)
def test_costs_outside_physical_bounds_are_refused(key, value):
    """The first two are what `calibrate refit --quick` once wrote without a word."""
    problem = refit_fit.fit_problem(fake_points(refit_calibrate.QUICK_GRID, KNOWN), {**KNOWN, key: value})
    assert problem is not None and problem.startswith(f"{key} = {value:.3g} is outside physical bounds")


def test_a_fit_no_better_than_one_rate_is_refused():
    """Syncs that take exactly bytes / 2 GB/s: one rate explains them all, so a fit of
    eight costs can only be as good or worse."""
    points = []
    for model, budget in refit_calibrate.GRID:
        specs = synthetic_specs(model)
        nbytes = sum(s.nbytes for s in specs)
        points.append((specs, Measurement(nbytes, budget, 0, len(specs), wall_s=[nbytes / 2e9])))
    assert refit_fit.rate_only_loss(points) == pytest.approx(0.0, abs=1e-20)
    problem = refit_fit.fit_problem(points, KNOWN)
    assert problem is not None and "no better than one bytes/s rate" in problem


def test_calibrate_refuses_in_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    from rlharness.cli import main

    points = fake_points(refit_calibrate.QUICK_GRID, KNOWN)
    monkeypatch.setattr(refit_calibrate, "_measure", lambda grid, repeats, progress: points)
    monkeypatch.setattr(refit_calibrate, "fit", lambda pts: {**KNOWN, "receiver_load_bytes_per_s": 7.8e16})
    out = tmp_path / "cal.json"
    assert main(["calibrate", "refit", "--quick", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: calibrate refit: receiver_load_bytes_per_s = 7.8e+16 is outside physical bounds "
        f"[1e+06, 1e+12]; {out} not written (measure again: without --quick, with more --repeats, "
        "on a quieter machine)"
    ]
    assert not out.exists()
    monkeypatch.setattr(refit_calibrate, "fit", lambda pts: dict(KNOWN))  # the same points, a sound fit: written
    assert main(["calibrate", "refit", "--quick", "--out", str(out)]) == 0 and load_calibration(str(out))


# ----------------------------------------------------------------------------- the lone-stream clock


def test_a_lone_stream_predicts_the_float_a_simpy_environment_ends_at():
    """``predict_sync_seconds`` drives ``stream_sync`` by hand (the fit calls it thousands
    of times); a simpy environment running the same body must end at the same float, bit
    for bit, on every grid point and with every cost zero or not."""
    import simpy

    from simulators.refit.sync import predict_sync_seconds, stream_sync

    def on_simpy(specs, budget, costs):
        env = simpy.Environment()
        env.process(stream_sync(env, specs, budget, costs))
        env.run()
        return env.now

    zero = dict.fromkeys(KNOWN, 0.0) | {"refit_pack_bytes_per_s": 3e9, "receiver_load_bytes_per_s": 2e9}
    for costs in (KNOWN, zero, {**KNOWN, "refit_tensor_overhead_s": 3.3e-7, "refit_setup_s": 0.0}):
        sc = refit_fit.stream_costs(costs)
        for model, budget in refit_calibrate.GRID + refit_calibrate.HELD_OUT:
            specs = synthetic_specs(model)
            got, want = predict_sync_seconds(specs, budget, sc), on_simpy(specs, budget, sc)
            assert got == want and type(got) is type(want), (model, budget, costs, got, want)
