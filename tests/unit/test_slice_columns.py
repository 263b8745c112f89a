"""GPU slices built, sorted and read as columns (harness/outputs/slice_columns.py) are
the slices the objects gave: the same fields in the same order, the same lanes, the
same per-GPU times in the summary and the same picture when some slices are left out."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from harness.outputs.intervals import EffectInterval, GpuSlice, RankInterval, effect_label
from harness.outputs.lanes import assign_lanes
from harness.outputs.slice_columns import SLICE_FIELDS, slice_columns_of


def _reference_slices(effects, ranks, include_other=True):
    """The slices the way they were built before columns: one object per GPU of every
    interval, sorted by GpuSlice.sort_key (a plain Python sort with the canonical args)."""
    out = []
    for iv in effects:
        if iv.kind == "other" and not include_other:
            continue
        args = {"pipeline_id": iv.pipeline_id, "effect": iv.effect, "args": iv.args, "scope": iv.scope,
                "step": iv.step, "cycle": iv.cycle, "gpus": list(iv.gpus)}
        if iv.open:
            args["open"] = True
        if iv.error is not None:
            args["error"] = iv.error
        out += [GpuSlice(g, iv.start, iv.end, iv.kind, iv.pipeline_id, effect_label(iv), args, iv.seq) for g in iv.gpus]
    for rv in ranks:
        args = {"pipeline_id": rv.pipeline_id, "dp_rank": rv.dp_rank, "version": rv.version, "gpus": list(rv.gpus)}
        if rv.open:
            args["open"] = True
        out += [GpuSlice(g, rv.start, rv.end, "generate", rv.pipeline_id, f"generate {rv.pipeline_id} dp{rv.dp_rank}",
                         args, rv.seq) for g in rv.gpus]
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
        effects.append(EffectInterval(rng.choice(["p0", "p1"]), rng.choice(names), {"what": "train", "k": rng.randint(0, 2)},
                                      None, rng.choice([None, 1]), 3, gpus, start, end, rng.random() < 0.1,
                                      rng.choice([None, None, "boom"]), rng.choice([0, i])))
    for i in range(60):
        start = float(rng.choice([0.0, 1.0]))
        ranks.append(RankInterval(rng.choice(["p0", "p1"]), rng.randint(0, 1), tuple(rng.sample(range(4), 2)), start,
                                  start + rng.choice([0.5, 1.0]), rng.choice([None, 1]), rng.random() < 0.1,
                                  rng.choice([0, i])))
    return effects, ranks


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("include_other", [True, False])
def test_columns_are_the_sorted_slices_field_by_field(seed, include_other):
    effects, ranks = _intervals(seed)
    want = _reference_slices(effects, ranks, include_other)
    columns = slice_columns_of(effects, ranks, include_other=include_other)
    assert columns.objects() == want
    assert [getattr(columns, f) for f in SLICE_FIELDS] == [[getattr(s, f) for s in want] for f in SLICE_FIELDS]
    assert columns.lanes() == assign_lanes(want)
    keep = [i % 3 != 0 for i in range(len(want))]
    assert columns.where(keep).objects() == [s for s, k in zip(want, keep) if k]


def test_no_intervals_no_slices():
    columns = slice_columns_of([], [])
    assert len(columns) == 0 and columns.objects() == [] and columns.lanes() == []


def _log(nodes=2, gpn=8):
    """A small run: training, a generating rank with a sync overlapping it (two lanes),
    a wake, a sleep and waiting, on ``nodes`` x ``gpn`` GPUs."""
    recs = [{"seq": 0, "t": 0.0, "kind": "header", "schema": "rlharness.eventlog", "version": 1,
             "cluster": {"nodes": nodes, "gpus_per_node": gpn}, "meta": {"scenario": "columns"}}]

    def add(t, kind, **f):
        recs.append({"seq": len(recs), "t": float(t), "kind": kind, **f})

    def effect(t0, t1, name, gpus, args=None):
        common = dict(pipeline_id="p0", effect=name, args=args or {}, scope="step", step=1, cycle=None, gpus=gpus)
        add(t0, "effect_start", **common)
        add(t1, "effect_end", **common)

    effect(0, 50, "Compute", list(range(8)), {"what": "train"})
    add(0, "rank_state", pipeline_id="p0", dp_rank=0, state="routable", gpus=list(range(8, 16)))
    effect(40, 60, "SyncFromCache", [9], {"path": "active"})
    effect(10, 30, "Wake", [10])
    effect(10, 30, "Sleep", [11])
    effect(55, 65, "RequestGpus", [3, 12])
    add(100, "rank_state", pipeline_id="p0", dp_rank=0, state="asleep", gpus=list(range(8, 16)))
    add(100, "sim_end", reason="done", sim_time=100.0, events=1, detail="")
    return recs


def test_the_summarys_per_gpu_times_are_those_of_each_gpus_slices():
    """The summary splits the columns into each GPU's run (they are sorted by GPU); the
    times must be those of the GPU's slices picked out one by one."""
    from harness.outputs.run_view import RunView
    from harness.outputs.summary import _exclusive_gpu_time, summarize

    view = RunView(_log())
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
    from harness.outputs import timeline

    recs = _log(nodes)
    # the same run with two waits more: one overlapping the training on GPU 0 (a lane of its own)
    waits = [dict(r, seq=0, effect="RequestGpus", args={}, gpus=[0]) for r in recs if r.get("effect") == "Compute"]
    with_waits = recs[:3] + waits + recs[3:]
    for seq, r in enumerate(with_waits):
        r = with_waits[seq] = dict(r, seq=seq)
    without = [r for r in recs if r.get("effect") != "RequestGpus"]
    assert timeline.render_timeline_png(with_waits) != timeline.render_timeline_png(without)  # waits drawn
    style = {k: v for k, v in timeline.KIND_STYLE.items() if k != "waiting"}
    monkeypatch.setattr(timeline, "KIND_STYLE", style)
    assert timeline.render_timeline_png(with_waits) == timeline.render_timeline_png(without)
