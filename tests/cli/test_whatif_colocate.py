"""``rlharness what-if colocate``: one workload recast into four shapes on the same GPUs,
the table, results.json and picture written, and bad input refused before any run."""

from __future__ import annotations

import json

import yaml

from rlharness.cli import main
from simulators.whatif.colocate import variants

WORKLOAD = {
    "name": "w",
    "seed": 0,
    "horizon_s": 5000,
    "cluster": {"nodes": 1, "gpus_per_node": 4, "gpu": "h100_sxm"},
    "pipelines": [
        {
            "name": "p",
            "type": "disaggregated",
            "train_gpus": [0, 1],
            "infer_gpus": [2, 3],
            "steps": 3,
            "disaggregated": {"shape": "sync"},
            "model": {"preset": "qwen2.5-1.5b"},
            "workload": {
                "prompts_per_step": 8,
                "generations_per_prompt": 4,
                "prompt_tokens": 64,
                "decode_tokens_median": 256,
                "decode_tokens_sigma": 1.0,
                "decode_tokens_max": 2048,
            },
        }
    ],
}


def test_the_four_shapes_place_the_workload_on_the_same_gpus():
    shapes = {m["name"]: m["pipelines"][0] for m in variants(WORKLOAD)}
    assert {k: (p["type"], p["train_gpus"], p["infer_gpus"]) for k, p in shapes.items()} == {
        "w_colocated": ("roll_sync", [0, 1, 2, 3], [0, 1, 2, 3]),
        "w_partial_overlap": ("nemo_async", [0, 1], [0, 1, 2, 3]),
        "w_one_step_off": ("disaggregated", [0, 1], [2, 3]),
        "w_fully_async": ("disaggregated", [0, 1], [2, 3]),
    }
    assert all(p["workload"] == WORKLOAD["pipelines"][0]["workload"] for p in shapes.values())


def test_colocate_writes_the_comparison(tmp_path, capsys):
    src = tmp_path / "w.yaml"
    src.write_text(yaml.safe_dump(WORKLOAD))
    out = tmp_path / "out"
    assert main(["what-if", "colocate", str(src), "--out", str(out)]) == 0
    rows = json.loads((out / "results.json").read_text())["shapes"]
    assert [r["shape"] for r in rows] == ["colocated", "partial_overlap", "one_step_off", "fully_async"]
    for r in rows:
        assert r["end"] == "done" and r["steps_done"] == 3
        assert abs(r["gpu_hours_per_step"] - 4 * r["mean_step_s"] / 3600) < 1e-12
    assert rows[0]["mean_age_steps"] == 0 and rows[2]["mean_age_steps"] > 0  # one step off trains old batches
    assert (out / "colocate.png").stat().st_size > 0 and "fully_async" in (out / "table.txt").read_text()


def test_two_pipelines_are_refused_in_one_line(tmp_path, capsys):
    two = {**WORKLOAD, "pipelines": WORKLOAD["pipelines"] * 2}
    src = tmp_path / "two.yaml"
    src.write_text(yaml.safe_dump(two))
    out = tmp_path / "out"
    assert main(["what-if", "colocate", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "pipelines: what-if colocate needs exactly one pipeline" in err and err.count("\n") == 1
    assert not out.exists()
