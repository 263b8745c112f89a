"""GPU slices built, sorted and read as columns (harness/logs/outputs/slice_columns.py) are
the slices the objects gave: the same fields in the same order, the same lanes, the
same per-GPU times in the summary and the same picture when some slices are left out."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from harness.logs.outputs.intervals import EffectInterval, GpuSlice, RankInterval, effect_label
from harness.logs.outputs.lanes import assign_lanes
from harness.logs.outputs.slice_columns import SLICE_FIELDS, slice_columns_of
from tests.unit.output_logs import dense_log


def _reference_slices(effects, ranks, include_other=True):
    """The slices the way they were built before columns: one object per GPU of every
    interval, sorted by GpuSlice.sort_key (a plain Python sort with the canonical args)."""
    out = []
    for iv in effects:
        if iv.kind == "other" and not include_other:
            continue
        args = {
            "pipeline_id": iv.pipeline_id,
            "effect": iv.effect,
            "args": iv.args,
            "scope": iv.scope,
            "step": iv.step,
            "cycle": iv.cycle,
            "gpus": list(iv.gpus),
        }
        if iv.open:
            args["open"] = True
        if iv.error is not None:
            args["error"] = iv.error
        out += [GpuSlice(g, iv.start, iv.end, iv.kind, iv.pipeline_id, effect_label(iv), args, iv.seq) for g in iv.gpus]
    for rv in ranks:
        args = {"pipeline_id": rv.pipeline_id, "dp_rank": rv.dp_rank, "version": rv.version, "gpus": list(rv.gpus)}
        if rv.open:
            args["open"] = True
        out += [
            GpuSlice(
                g,
                rv.start,
                rv.end,
                "generate",
                rv.pipeline_id,
                f"generate {rv.pipeline_id} dp{rv.dp_rank}",
                args,
                rv.seq,
            )
            for g in rv.gpus
        ]
    return sorted(out, key=GpuSlice.sort_key)


def _intervals(seed):
    """Effects and rank intervals with many ties: few GPUs, few start times, seq 0 for
    half of them (a hand-made log), equal labels with different args, "other" effects."""
    rng = random.Random(seed)
    effects, ranks = [], []
    names = ["Compute", "SyncFromCache", "Wake", "Sleep", "Activate", "RequestGpus"]  # Activate: kind "other"
    for i in range(120):
        start = float(rng.choice([0.0, 1.0, 2.5]))
        end = start + rng.choice([0.0, 1.0, 2.0])
        gpus = tuple(sorted(rng.sample(range(4), rng.randint(1, 3))))
        effects.append(
            EffectInterval(
                rng.choice(["p0", "p1"]),
                rng.choice(names),
                {"what": "train", "k": rng.randint(0, 2)},
                None,
                rng.choice([None, 1]),
                3,
                gpus,
                start,
                end,
                rng.random() < 0.1,
                rng.choice([None, None, "boom"]),
                rng.choice([0, i]),
            )
        )
    for i in range(60):
        start = float(rng.choice([0.0, 1.0]))
        ranks.append(
            RankInterval(
                rng.choice(["p0", "p1"]),
                rng.randint(0, 1),
                tuple(rng.sample(range(4), 2)),
                start,
                start + rng.choice([0.5, 1.0]),
                rng.choice([None, 1]),
                rng.random() < 0.1,
                rng.choice([0, i]),
            )
        )
    return effects, ranks


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("include_other", [True, False])
def test_columns_are_the_sorted_slices_field_by_field(seed, include_other):
    effects, ranks = _intervals(seed)
    want = _reference_slices(effects, ranks, include_other)
    columns = slice_columns_of(effects, ranks, include_other=include_other)
    assert columns.objects() == want
    assert [list(getattr(columns, f)) for f in SLICE_FIELDS] == [[getattr(s, f) for s in want] for f in SLICE_FIELDS]
    assert columns.lanes() == assign_lanes(want)
    keep = [i % 3 != 0 for i in range(len(want))]
    assert columns.where(keep).objects() == [s for s, k in zip(want, keep) if k]


def test_no_intervals_no_slices():
    columns = slice_columns_of([], [])
    assert len(columns) == 0 and columns.objects() == [] and columns.lanes() == []


def test_the_summarys_per_gpu_times_are_those_of_each_gpus_slices():
    """The summary splits the columns into each GPU's run (they are sorted by GPU); the
    times must be those of the GPU's slices picked out one by one."""
    from harness.logs.outputs.run_view import RunView
    from harness.logs.outputs.summary import _exclusive_gpu_time, summarize

    view = RunView(dense_log(nodes=2))
    by_gpu = defaultdict(list)
    for s in view.slices:
        by_gpu[s.gpu].append(s)
    t0, t1 = view.bounds
    got = {g.gpu: (g.train_s, g.refit_s, g.generate_s, g.idle_s) for g in summarize(view).gpus}
    for g in view.gpus:
        mine = by_gpu.get(g, [])
        x = _exclusive_gpu_time([s.kind for s in mine], [s.start for s in mine], [s.end for s in mine], t0, t1)
        assert got[g] == (x["train"], x["refit"], x["generate"], x["idle"])
    assert len(by_gpu) > 1 and any(v[0] > 0 for v in got.values()) and any(v[2] > 0 for v in got.values())


@pytest.mark.parametrize("nodes", [2, 9])  # bars as polygons, and as one image (above 64 GPUs)
def test_a_picture_that_leaves_slices_out_draws_the_rest(monkeypatch, nodes):
    """A slice whose picture kind has no style is left out of the picture (its columns
    filtered, its lanes assigned anew): the same picture as a log without it."""
    from harness.logs.outputs import timeline

    recs = dense_log(nodes)
    # the same run with a wait more, overlapping the training on GPU 0 (a lane of its own)
    waits = [dict(r, seq=0, effect="RequestGpus", args={}, gpus=[0]) for r in recs if r.get("effect") == "Compute"]
    with_waits = [dict(r, seq=seq) for seq, r in enumerate(recs[:2] + waits + recs[2:])]
    assert timeline.render_timeline_png(with_waits) != timeline.render_timeline_png(recs)  # the wait is drawn
    style = {k: v for k, v in timeline.KIND_STYLE.items() if k != "waiting"}
    monkeypatch.setattr(timeline, "KIND_STYLE", style)
    assert timeline.render_timeline_png(with_waits) == timeline.render_timeline_png(recs)
