"""Outputs people use: validate, summary.json beside summary.txt, the run folder written
all at once (stale outputs removed), the legend, the scenario reference, the fault order."""

from __future__ import annotations

import json
import os
import re


from rlharness.cli import main
from harness.logs.outputs.summary import summarize
from harness.logs.outputs.summary_text import format_summary
from harness.logs.outputs.timeline import KIND_STYLE, legend_kinds, picture_kind

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCENARIOS = os.path.join(ROOT, "examples", "scenarios")


def test_validate_every_bundled_scenario_without_running_or_writing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths = sorted(os.path.join(SCENARIOS, f) for f in os.listdir(SCENARIOS) if f.endswith(".yaml"))
    assert main(["validate", *paths]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(paths) and all(": valid: scenario " in line for line in out)
    assert os.listdir(tmp_path) == []


def test_rerun_with_no_png_removes_the_old_picture_and_writes_summary_json(tmp_path, capsys):
    out = tmp_path / "run"
    scenario = os.path.join(SCENARIOS, "default.yaml")
    assert main(["simulate", scenario, "--out", str(out), "--quiet"]) == 0
    assert (out / "timeline.png").exists()
    (out / "notes.txt").write_text("mine")  # a user's file in the folder is not an output: kept
    assert main(["simulate", scenario, "--out", str(out), "--quiet", "--no-png"]) == 0
    assert sorted(os.listdir(out)) == [
        "events.jsonl",
        "notes.txt",
        "scenario.yaml",
        "summary.json",
        "summary.txt",
        "trace.json",
        "violations.txt",
    ]
    assert [p for p in os.listdir(tmp_path) if p != "run"] == []  # no staging folder left
    printed = capsys.readouterr().out
    assert "timeline.png" not in printed.splitlines()[-1]


def test_a_failed_write_leaves_the_folder_untouched(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    scenario = os.path.join(SCENARIOS, "default.yaml")
    assert main(["simulate", scenario, "--out", str(out), "--quiet", "--no-png"]) == 0
    before = {p: (out / p).read_bytes() for p in os.listdir(out)}
    import simulators.run
    import simulators.run_streamed

    def broken(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(simulators.run, "write_chrome_trace", broken)
    monkeypatch.setattr(simulators.run_streamed, "write_chrome_trace", broken)  # (the path the CLI takes)
    assert main(["simulate", scenario, "--out", str(out), "--quiet", "--seed", "7"]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert {p: (out / p).read_bytes() for p in os.listdir(out)} == before
    assert sorted(os.listdir(tmp_path)) == ["run"]
    assert main(["simulate", scenario, "--out", str(tmp_path / "new"), "--quiet"]) == 2
    assert sorted(os.listdir(tmp_path)) == ["run"]  # a new folder does not appear half-written


def _numbers(text):
    return [float(x) for x in re.findall(r"(?<![\w.])-?\d+\.\d{3}(?![\d])", text)]


def test_summary_json_has_the_figures_of_summary_txt(tmp_path, capsys):
    out = tmp_path / "run"
    main(
        ["simulate", os.path.join(SCENARIOS, "oom_wake_before_offload.yaml"), "--out", str(out), "--quiet", "--no-png"]
    )
    text = (out / "summary.txt").read_text()
    data = json.loads((out / "summary.json").read_text())
    assert data["time_unit"] == "simulated seconds"
    p = data["pipelines"][0]
    row = next(line for line in text.splitlines() if line.startswith(p["pipeline_id"] + " "))
    cells = row.split()
    assert cells[1] == str(p["steps_done"])
    assert cells[4] == f"{p['generate_s']:.3f}" and cells[5] == f"{p['generate_pct']:.1f}"
    assert cells[8] == f"{p['refit_s']:.3f}" and cells[10] == f"{p['waiting_s']:.3f}"
    assert cells[12:] == [str(p["requests_done"]), str(p["requests_aborted"]), str(p["requests_failed"])]
    assert f"{data['run']['simulated_s']:.3f} s simulated" in text
    for line in (f["line"] for f in data["faults"]):
        assert line in text
    # every 3-decimal figure of the text is some figure of the JSON
    flat = []

    def walk(x):
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            flat.append(round(float(x), 3))

    walk(data)
    missing = [x for x in _numbers(text) if round(x, 3) not in set(flat)]
    assert not missing, missing


def test_summary_labels_say_simulated_time_and_what_each_refit_figure_covers():
    text = format_summary(summarize(_records_with_faults()))
    assert "wall" not in text
    assert "simulated seconds" in text
    assert "refit s = weight sync" in text and "total sync s = SyncFromCache time" in text


def _records_with_faults():
    h = {
        "seq": 0,
        "t": 0.0,
        "kind": "header",
        "schema": "rlharness.eventlog",
        "version": 1,
        "cluster": {"nodes": 1, "gpus_per_node": 1},
    }
    return [
        h,
        {"seq": 1, "t": 5.0, "kind": "fault_fired", "name": "late", "pipeline_id": "p", "step": 1},
        {
            "seq": 2,
            "t": 9.0,
            "kind": "timeout",
            "what": "selective_sync",
            "pipeline_id": "p",
            "limit_s": 1.0,
            "since": 8.0,
        },
        {
            "seq": 3,
            "t": 1.0,
            "kind": "oom",
            "gpu": 0,
            "owner": "p",
            "mem": "kv",
            "requested": 2,
            "used": 1,
            "capacity": 2,
        },
        {"seq": 4, "t": 12.0, "kind": "sim_end", "reason": "failed", "sim_time": 12.0, "events": 1, "detail": "x"},
    ]


def test_fault_section_is_in_time_order():
    text = format_summary(summarize(_records_with_faults()))
    section = text.split("Faults\n", 1)[1].strip().splitlines()
    times = [float(line.split()[0][2:]) for line in section]
    assert times == sorted(times) == [1.0, 5.0, 9.0]


def test_legend_lists_only_what_is_drawn_and_phases_have_their_own_colours():
    colours = [c for _, c in KIND_STYLE.values()]
    assert len(set(colours)) == len(colours)
    assert (
        picture_kind("wake_sleep", "Wake ppl1 s0") == "wake" and picture_kind("wake_sleep", "Sleep ppl1 s0") == "sleep"
    )
    assert picture_kind("wake_sleep", "Drain ppl1") == "drain" and picture_kind("train", "Compute(train) p") == "train"
    assert legend_kinds({"sleep", "train"}) == ["train", "sleep"]
    from harness.logs.outputs.run_view import RunView

    records = [
        json.loads(line) for line in open(os.path.join(ROOT, "examples", "traces", "partial_overlap_2gpu.jsonl"))
    ]
    drawn = {picture_kind(s.kind, s.label) for s in RunView(records).work_slices}
    assert "waiting" not in legend_kinds(drawn)


def test_scenario_reference_is_current(capsys):
    from simulators.scenario import doc as scenario_doc

    assert scenario_doc.main(["--check"]) == 0, capsys.readouterr().err


def test_scenario_reference_covers_every_field():
    import dataclasses

    from simulators.scenario import spec
    from simulators.scenario.doc import render

    text = render()
    for cls, prefix in (
        (spec.ClusterSpec, "cluster."),
        (spec.CostSpec, "costs."),
        (spec.WorkloadSpec, "workload."),
        (spec.ModelSpec, "model."),
        (spec.PipelineSpec, ""),
        (spec.Scenario, ""),
        (spec.FaultSpec, ""),
    ):
        for f in dataclasses.fields(cls):
            assert f"| `{prefix}{f.name}` |" in text, (cls.__name__, f.name)
    assert "16,384" in text and "2,592,000" in text
