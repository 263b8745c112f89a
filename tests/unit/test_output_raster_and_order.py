"""The dense timeline's bar image (coverage per pixel) and the numeric sort of the outputs.

The bar image replaces one polygon per bar on pictures of more than 32 GPUs
(``DETAIL_GPUS``): its pixels must be the covered area of each pixel, coloured by kind;
a dense picture must still show every kind in its own colour, lanes inside a GPU's row
(below the row's pipeline band), the markers and a legend of what is drawn. ``column_order`` must give exactly the order ``sort_canon_last`` gives.
"""

from __future__ import annotations

import io
import random

import numpy as np
import pytest

from harness.logs.outputs.canonical_order import column_order, sort_canon_last
from harness.logs.outputs.timeline import DETAIL_GPUS, KIND_STYLE, render_timeline_png
from harness.logs.outputs.timeline_raster import bar_image, coverage
from tests.unit.output_logs import dense_log as _dense_log


def _exact_coverage(rects, width, height):
    out = np.zeros((height, width))
    for x0, x1, y0, y1 in rects:
        for r in range(height):
            for c in range(width):
                dx = max(0.0, min(x1, c + 1) - max(x0, c))
                dy = max(0.0, min(y1, r + 1) - max(y0, r))
                out[r, c] += dx * dy
    return np.clip(out, 0.0, 1.0)


def test_coverage_is_the_covered_area_of_each_pixel():
    rng = random.Random(3)
    width, height = 9, 6
    rects = []
    for _ in range(40):
        x0, y0 = rng.uniform(-1, width), rng.uniform(-1, height)
        rects.append((x0, x0 + rng.choice([0.0, 0.05, 0.4, 1.0, 3.7]), y0, y0 + rng.choice([0.25, 0.5, 1.3])))
    rects.append((2.0, 2.0, 1.0, 2.0))  # zero width: nothing
    rects.append((8.5, 9.0, 5.5, 6.0))  # on the right and bottom edges
    want = np.zeros((height, width))
    for rect in rects:  # one at a time: no overlap clipping in the reference
        want += _exact_coverage([rect], width, height)
    x0, x1, y0, y1 = (np.array(v, dtype=float) for v in zip(*rects))
    got = coverage(x0, x1, y0, y1, width, height)
    assert np.allclose(got, np.clip(want, 0.0, 1.0), atol=1e-9)
    assert got.shape == (height, width)
    empty = np.array([], dtype=float)
    assert not coverage(empty, empty, empty, empty, 4, 3).any()


def test_bar_image_mixes_the_colours_by_coverage():
    red, blue = (1.0, 0.0, 0.0), (0.0, 0.0, 1.0)
    # pixel (0, 0): red covers its left half, blue its right half; pixel (0, 1): red a quarter
    x0, x1 = np.array([0.0, 0.5, 1.0]), np.array([0.5, 1.0, 1.25])
    y0, y1 = np.zeros(3), np.ones(3)
    image = bar_image(x0, x1, y0, y1, np.array([0, 1, 0]), [red, blue], 3, 1)
    assert image.dtype == np.uint8
    assert image[0, 0].tolist() == [128, 0, 128, 255]
    assert image[0, 1].tolist() == [255, 0, 0, 64]
    assert image[0, 2, 3] == 0  # nothing there: transparent


def test_column_order_is_the_order_sort_canon_last_gives():
    rng = random.Random(5)
    n = 3000
    items = [
        {
            "g": rng.randrange(4),
            "t": rng.choice([0.0, -0.0, 0.5, 1.25, 3.0]),
            "s": rng.randrange(3),
            "label": rng.choice("ab"),
            "args": {"x": rng.randrange(3)},
        }
        for _ in range(n)
    ]

    def want(key):
        order = list(range(n))
        sort_canon_last(order, key, lambda i: items[i]["args"])
        return order

    got = column_order(
        [[it["g"] for it in items], [it["t"] for it in items], [it["s"] for it in items]],
        lambda i: (items[i]["label"],),
        lambda i: items[i]["args"],
    )
    assert got == want(lambda i: (items[i]["g"], items[i]["t"], items[i]["s"], items[i]["label"]))
    # a column numpy cannot sort as numbers (strings), or floats beyond exact integers: the slow path
    got = column_order(
        [[it["label"] for it in items], [it["g"] for it in items]], lambda i: (), lambda i: items[i]["args"]
    )
    assert got == want(lambda i: (items[i]["label"], items[i]["g"]))
    big = [2.0**60 + i % 3 for i in range(n)]
    got = column_order([big, [it["g"] for it in items]], lambda i: (), lambda i: items[i]["args"])
    assert got == want(lambda i: (big[i], items[i]["g"]))
    assert column_order([[]], lambda i: (), lambda i: None) == []


def test_a_dense_picture_shows_kinds_lanes_markers_and_a_legend_of_what_is_drawn():
    import matplotlib.image as mpimg

    recs = _dense_log()
    assert recs[0]["cluster"]["nodes"] * recs[0]["cluster"]["gpus_per_node"] > DETAIL_GPUS
    data = render_timeline_png(recs)
    assert data == render_timeline_png(recs)
    rgb = (mpimg.imread(io.BytesIO(data))[:, :, :3] * 255).round().astype(int)
    height, width = rgb.shape[:2]
    left, top, plot_w, plot_h = 130, 50, width - 350, height - 110  # the layout's margins at 100 dpi
    row_h = plot_h / 72

    def at(t, gpu, frac=0.5):
        return rgb[int(top + (gpu + frac) * row_h), int(left + t / 100 * plot_w)]

    def colour(kind):
        c = KIND_STYLE[kind][1]
        return np.array([int(c[i : i + 2], 16) for i in (1, 3, 5)])

    def near(pixel, kind):
        return np.abs(pixel - colour(kind)).sum() <= 6

    assert near(at(25, 3), "train") and near(at(80, 12), "generate")
    assert near(at(20, 16), "wake") and near(at(20, 17), "sleep")
    # GPU 20: the rank in the upper lane all along, the sync in the lower lane from 40 to 60
    # (the top quarter of the row is the pipeline band)
    assert near(at(50, 20, 0.4), "generate") and near(at(50, 20, 0.75), "sync")
    assert near(at(20, 20, 0.4), "generate") and not near(at(20, 20, 0.75), "sync")
    assert (at(25, 60) >= 230).all()  # an idle GPU: background
    red = (rgb[:, :, 0] > 200) & (rgb[:, :, 1] < 40) & (rgb[:, :, 2] < 40)
    assert red[:, : left + plot_w + 5].sum() > 10  # the OOM cross on its GPU
    legend = rgb[:, left + plot_w + 10 :]
    for kind in ("train", "generate", "sync", "wake", "sleep"):
        assert (np.abs(legend - colour(kind)).sum(axis=2) <= 6).sum() > 20, kind
    # not drawn, not listed (the grey of "waiting" is also the grey of antialiased text)
    assert (np.abs(legend - colour("drain")).sum(axis=2) <= 6).sum() == 0


def test_up_to_the_detail_limit_bars_are_polygons(monkeypatch):
    """At the detail limit and below, bars stay polygons (hatching, labels); one GPU more
    and the picture is one image (the bundled 64-GPU scenario's is: its polygons cost 17x
    the simulation)."""
    from harness.logs.outputs import timeline
    from harness.logs.outputs.run_view import RunView

    log = _dense_log()
    n = len(RunView(log).gpus)
    calls = []
    real = timeline._bar_image
    monkeypatch.setattr(timeline, "_bar_image", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(timeline, "DETAIL_GPUS", n)
    render_timeline_png(log)
    assert calls == []
    monkeypatch.setattr(timeline, "DETAIL_GPUS", n - 1)
    render_timeline_png(log)
    assert calls == [1]


def test_effect_intervals_are_built_with_every_field_of_the_dataclass():
    import dataclasses

    from harness.logs.outputs.intervals import EffectInterval, effect_intervals

    assert not hasattr(EffectInterval("p", "e", {}, None, None, None, (), 0.0, 1.0), "__dict__")  # slotted
    (iv,) = effect_intervals([r for r in _dense_log() if r["kind"] != "rank_state"][:3])
    assert iv == EffectInterval(
        "p0", "Compute", {"what": "train"}, "step", 1, None, tuple(range(8)), 0.0, 50.0, False, None, 1
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        iv.start = 1.0


def test_rank_intervals_are_built_with_every_field_of_the_dataclass():
    import dataclasses

    from harness.logs.outputs.intervals import RankInterval, rank_intervals

    assert not hasattr(RankInterval("p", 0, (), 0.0, 1.0), "__dict__")  # slotted
    recs = [r for r in _dense_log() if r["kind"] == "rank_state"]
    (closed,) = rank_intervals(recs, 90.0)
    (still_open,) = rank_intervals(recs[:1], 80.0)
    gpus = tuple(range(8, 16)) + (20,)
    assert closed == RankInterval("p0", 0, gpus, 0.0, 100.0, None, False, recs[0]["seq"])
    assert still_open == RankInterval("p0", 0, gpus, 0.0, 80.0, None, True, recs[0]["seq"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        closed.start = 1.0


def test_new_slice_is_the_dataclass_with_every_field():
    import dataclasses

    from harness.logs.outputs.intervals import GpuSlice, new_slice

    fields = dict(gpu=3, start=1.5, end=2.0, kind="train", pipeline_id="p", label="Compute p", args={"a": 1}, seq=9)
    made = new_slice(*fields.values())
    assert (
        made == GpuSlice(**fields)
        and dataclasses.asdict(made) == fields
        and list(fields) == [f.name for f in dataclasses.fields(GpuSlice)]
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.gpu = 4


def test_a_views_two_lane_sets_are_each_assign_lanes_of_its_slices():
    """The trace's lanes (every slice) and the picture's (without kind "other") share one
    sort; each must still be assign_lanes of its own slices."""
    from harness.logs.outputs.lanes import assign_lanes
    from harness.logs.outputs.run_view import RunView

    recs = _dense_log(nodes=1, gpn=8)
    sim_end = recs.pop()

    def effect(t0, t1, name, gpus):
        common = dict(pipeline_id="p0", effect=name, args={}, scope="expand", step=None, cycle=3, gpus=gpus)
        recs.append({"seq": len(recs), "t": float(t0), "kind": "effect_start", **common})
        recs.append({"seq": len(recs), "t": float(t1), "kind": "effect_end", **common})

    effect(5, 45, "Activate", [0, 1, 2])  # "other": a lane of its own beside the training
    effect(50, 55, "MarkInactive", [3])
    effect(20, 70, "SyncFromCache", [0, 3])
    recs.append(dict(sim_end, seq=len(recs)))
    view = RunView(recs)
    assert any(s.kind == "other" for s in view.slices)
    assert view.lanes == assign_lanes(view.slices) and max(view.lanes) >= 2
    assert view.work_lanes == assign_lanes(view.work_slices) != view.lanes
