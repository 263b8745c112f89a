"""Pictures a user can read: allocation timelines of scheduler-only logs, the right time
axis for real runs, large runs in rows per node with pipelines told apart.

A fresh-clone trial found ``export`` of a ``replay --out`` log drawing empty axes with
exit 0, a gate's timeline labelled "simulated time (s)", and the 1024-GPU picture's
rows unreadable with no pipeline to tell apart.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

from harness.logs.outputs.allocation_timeline import PRIORITY_STYLE, Hold, allocation_holds, render_allocation_png
from harness.logs.outputs.run_view import RunView
from harness.logs.outputs.timeline import time_label
from harness.logs.outputs.timeline_rows import PIPELINE_BAND, row_image, row_layout
from rlharness.cli import main
from tests.cli.test_cli_error_contract import ROOT, run_error

HEADER = {
    "seq": 0,
    "t": 0.0,
    "kind": "header",
    "schema": "rlharness.eventlog",
    "version": 1,
    "cluster": {"nodes": 1, "gpus_per_node": 2},
    "source": "replay",
}


def _decisions():
    """Cycle 1 (t=1): a's GEN cluster expands onto GPUs 0 and 1; cycle 2 (t=3): its rank on
    GPU 1 shrinks and b's training cluster is granted GPU 1; t=5: a releases GPU 0; the
    log ends at t=8."""
    recs = [dict(HEADER)]

    def add(t, kind, **f):
        recs.append({"seq": len(recs), "t": float(t), "kind": kind, **f})

    add(
        1,
        "plan",
        cycle=1,
        shrinks=[],
        signals=[],
        expands=[
            {
                "cluster_id": "a_actor_infer",
                "has_pending_request": True,
                "bundles": [{"dp_rank": 0, "gpus": [0]}, {"dp_rank": 1, "gpus": [1]}],
            }
        ],
    )
    add(1, "commit", cycle=1, idle_gpus=0, skipped_stale=[])
    add(
        3,
        "plan",
        cycle=2,
        shrinks=[{"cluster_id": "a_actor_infer", "bundles": [{"dp_rank": 1, "gpus": [1]}]}],
        signals=[{"cluster_id": "b_actor_train", "gpus": [1], "priority": "ACTOR_TRAINING"}],
        expands=[],
    )
    add(3, "commit", cycle=2, idle_gpus=0, skipped_stale=[])
    add(5, "released", cluster_id="a_actor_infer", gpus=[0], reason="release")
    add(8, "enqueued", request_id=9, cluster_id="a_actor_infer", priority="GENERATION")
    return recs


def test_holds_are_rebuilt_from_the_decisions():
    assert allocation_holds(_decisions()) == [
        Hold(0, 1.0, 5.0, "a_actor_infer", "GENERATION"),
        Hold(1, 1.0, 3.0, "a_actor_infer", "GENERATION"),
        Hold(1, 3.0, 8.0, "b_actor_train", "ACTOR_TRAINING"),
    ]


def _rgb(png: bytes) -> np.ndarray:
    import matplotlib.image as mpimg

    return (mpimg.imread(io.BytesIO(png))[:, :, :3] * 255).round().astype(int)


def _count(rgb, colour: str) -> int:
    want = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(rgb - want).sum(axis=2) <= 6).sum())


def test_the_allocation_picture_draws_each_priority():
    png = render_allocation_png(_decisions(), title="t", time_label="time (s)")
    assert png == render_allocation_png(_decisions(), title="t", time_label="time (s)")
    rgb = _rgb(png)
    plot = rgb[:, 130:-220]  # the axes, without the legend's swatches
    gen, train = _count(plot, PRIORITY_STYLE["GENERATION"]), _count(plot, PRIORITY_STYLE["ACTOR_TRAINING"])
    # GPU 0 holds GENERATION 1..5 and GPU 1 1..3: 6 GPU-seconds; ACTOR_TRAINING 3..8 on GPU 1: 5
    assert gen > 5000 and train > 5000
    assert 0.9 < (gen / 6) / (train / 5) < 1.25


def test_export_of_a_replay_log_draws_allocations(tmp_path, capsys):
    log = tmp_path / "d.jsonl"
    log.write_text("".join(__import__("json").dumps(r) + "\n" for r in _decisions()))
    png = tmp_path / "d.png"
    assert main(["export", str(log), "--png", str(png)]) == 0
    assert "GPU allocations" in capsys.readouterr().out
    assert _count(_rgb(png.read_bytes()), PRIORITY_STYLE["ACTOR_TRAINING"]) > 5000


def test_export_of_an_input_trace_replays_it(tmp_path, capsys):
    trace = os.path.join(ROOT, "examples", "traces", "roll_dual_4gpu.jsonl")
    png = tmp_path / "t.png"
    assert main(["export", trace, "--png", str(png)]) == 0
    assert "as replayed by the scheduler model" in capsys.readouterr().out
    rgb = _rgb(png.read_bytes())
    assert _count(rgb, PRIORITY_STYLE["GENERATION"]) > 10000 and _count(rgb, PRIORITY_STYLE["ACTOR_TRAINING"]) > 2000


def test_a_log_with_nothing_to_draw_is_refused(tmp_path, capsys):
    log = tmp_path / "h.jsonl"
    log.write_text(__import__("json").dumps(HEADER) + "\n")
    run_error(
        ["export", str(log), "--png", str(tmp_path / "h.png"), "--perfetto", str(tmp_path / "h.json")],
        capsys,
        "--png",
        "no work intervals and no scheduler records to draw",
    )
    assert sorted(os.listdir(tmp_path)) == ["h.jsonl"]


@pytest.mark.parametrize(
    "source,label",
    [
        ("simulator", "simulated time (s)"),
        ("gate:dual_pipeline", "time (s)"),
        ("replay", "time (s)"),
        ("rlix-log", "time (s)"),
    ],
)
def test_only_a_simulators_log_has_simulated_time(source, label):
    assert time_label(RunView([dict(HEADER, source=source)])) == label


def test_rows_per_node_past_the_row_limit():
    row_of, labels, members = row_layout(list(range(1024)), 8)
    assert len(labels) == 128 and labels[0] == "node 0" and labels[-1] == "node 127"
    assert row_of[0] == row_of[7] == 0 and row_of[8] == 1 and (members == 8).all()
    row_of, labels, members = row_layout(list(range(16384)), 8)  # 2048 nodes: 16 per row
    assert len(labels) == 128 and labels[1] == "nodes 16-31" and row_of[16 * 8] == 1 and (members == 128).all()
    row_of, labels, members = row_layout(list(range(64)), 8)  # within the limit: a row per GPU
    assert labels[9] == "GPU 9 (node 1)" and (members == 1).all()


def test_a_node_row_mixes_its_gpus():
    """Row 0 (2 GPUs): one GPU busy with kind 0 for the whole width; row 1: both GPUs busy,
    one with kind 0 and one with kind 1, over the left half only."""
    red, blue, pale, grey = (1.0, 0, 0), (0, 0, 1.0), (0.5, 1.0, 0.5), (0.5, 0.5, 0.5)
    x0, x1 = np.array([0.0, 0.0, 0.0]), np.array([10.0, 5.0, 5.0])
    rows = np.array([0, 1, 1])
    image = row_image(
        x0,
        x1,
        rows.astype(float),
        rows + 1.0,
        rows,
        np.array([2, 2]),
        np.array([0, 0, 1]),
        [red, blue],
        np.array([0, 1, 1]),
        [pale, grey],
        10,
        8,
    )
    assert image.shape == (8, 10, 4)
    band = int(PIPELINE_BAND * 4)  # pixel rows 0..band-1 of each 4-pixel row are the pipeline band
    assert image[0, 0].tolist() == [128, 255, 128, 128]  # row 0's band: pipeline 0, half its GPUs busy
    assert image[band, 0].tolist() == [255, 0, 0, 128]  # row 0's kinds: red, half busy
    assert image[4 + band, 2].tolist() == [128, 0, 128, 255]  # row 1: red and blue mixed, fully busy
    assert image[4 + band, 7, 3] == 0  # row 1's right half: idle, transparent
