"""Simulator outputs (summary table, Perfetto trace, PNG timeline) on hand-built logs.

The main log (``tests/sim/outputs_log.py``) is small enough to work every number out by
hand; the times are binary fractions, so the expected figures are exact floats.
"""

from __future__ import annotations

import json
import os
import struct
import zlib

import pytest

import matplotlib  # noqa: F401  (a hard dependency of the outputs: fail, do not skip, when missing)

from harness.control import effects as effects_mod
from harness.control import streaming_effects as streaming_effects_mod
from harness.logs.records import read_records
from harness.logs.outputs import chrome_trace, format_summary, summarize, write_chrome_trace, write_timeline_png
from harness.logs.outputs.perfetto import dumps_chrome_trace
from harness.logs.outputs.intervals import REFIT_EFFECTS, TRAIN_EFFECTS, WAITING_EFFECTS, gpu_slices, p95, union_length
from harness.logs.outputs.lanes import assign_lanes
from harness.logs.outputs.timeline import render_timeline_png, timeline_size_px
from tests.sim.outputs_log import Log, build_log


# ------------------------------------------------------------------------ summary
def test_fixture_is_a_valid_event_log(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in build_log()))
    assert len(read_records(str(path))) == len(build_log())  # schema, seq and t order all checked


def test_effect_kinds_name_real_effect_classes():
    for name in TRAIN_EFFECTS + REFIT_EFFECTS + WAITING_EFFECTS:
        assert isinstance(getattr(effects_mod, name, None) or getattr(streaming_effects_mod, name, None), type), name


def test_helpers():
    assert union_length([(0.0, 1.0), (0.5, 2.0), (3.0, 3.0), (4.0, 5.0)]) == 3.0
    assert p95([]) is None
    assert p95([5.0, 1.0]) == 5.0
    assert p95([float(i) for i in range(1, 21)]) == 19.0
    assert p95([float(i) for i in range(1, 101)]) == 95.0


def test_summary_numbers():
    s = summarize(build_log())
    assert s.scenario == "two_pipelines_demo"
    assert (s.t_start, s.t_end, s.end_reason) == (0.0, 10.0, "failed")
    assert (s.nodes, s.gpus_per_node) == (2, 2)

    p1, p2 = s.pipelines
    assert p1.pipeline_id == "ppl1" and p2.pipeline_id == "ppl2"
    assert p1.steps_done == 2
    assert p1.step_times == [5.0, 1.0]  # 2.0 -> 7.0 (first of step 2); 7.0 -> 8.0 (its last end)
    assert p1.mean_step_s == 3.0 and p1.p95_step_s == 5.0
    assert (p1.generate_s, p1.train_s, p1.refit_s, p1.waiting_s) == (9.0, 3.5, 1.75, 0.5)
    # ppl2's step 1 never finished (the Compute is cut at the end of the run)
    assert p2.steps_done == 0 and p2.step_times == [] and p2.mean_step_s is None and p2.p95_step_s is None
    assert (p2.generate_s, p2.train_s, p2.refit_s, p2.waiting_s) == (9.0, 1.0, 0.0, 6.0)

    got = [(g.gpu, g.node, g.train_s, g.refit_s, g.generate_s, g.idle_s) for g in s.gpus]
    assert got == [
        (0, 0, 3.5, 1.25, 1.5, 3.75),
        (1, 0, 0.0, 0.5, 8.5, 1.0),  # refit takes precedence over the rank still serving
        (2, 1, 1.0, 0.0, 8.0, 1.0),
        (3, 1, 0.0, 0.0, 9.0, 1.0),
    ]

    (r1,) = s.refit
    assert r1.pipeline_id == "ppl1"
    assert r1.syncs_by_path == {"active": 1, "expand": 1} and r1.syncs == 2
    assert r1.sync_s_by_path == {"active": 0.5, "expand": 0.5}
    assert (r1.total_sync_s, r1.mean_sync_s, r1.buckets) == (1.0, 0.5, 3)
    assert r1.bytes_by_transport == {"broadcast": 2048, "ipc": 1024}

    assert s.staleness == {0: 10, 1: 6, 2: 4}
    assert s.staleness_by_pipeline == {"ppl1": {0: 6, 1: 6, 2: 4}, "ppl2": {0: 4}}

    sc = s.scheduler
    assert (sc.cycles, sc.shrink_ops, sc.shrink_dp_ranks, sc.expand_ops, sc.expand_dp_ranks) == (3, 1, 1, 3, 5)
    assert (sc.signals, sc.rejected, sc.failures) == (1, 1, 0)
    assert s.ooms == [
        {"t": 9.5, "gpu": 2, "owner": "ppl2/train", "mem": "train_state", "requested": 100, "used": 80, "capacity": 160}
    ]
    assert s.faults == [{"t": 9.5, "name": "oom_kill", "pipeline_id": "ppl2", "step": 1}]


def test_format_summary_text():
    text = format_summary(summarize(build_log()))
    assert text == format_summary(summarize(build_log()))
    lines = text.splitlines()
    assert lines[0] == "rlharness simulation summary: two_pipelines_demo"
    assert "run 0.000 s .. 10.000 s (10.000 s simulated), end: failed" in lines[1]

    def row(first):
        return next(ln.split() for ln in lines if ln.split()[:1] == [first])

    assert row("ppl1")[:14] == [
        "ppl1",
        "2",
        "3.000",
        "5.000",
        "9.000",
        "90.0",
        "3.500",
        "35.0",
        "1.750",
        "17.5",
        "0.500",
        "5.0",
        "0",
        "0",
    ]
    assert row("ppl2")[:4] == ["ppl2", "0", "-", "-"]
    # GPU table: gpu node train% generate% refit% idle%
    gpu_rows = [
        ln.split()
        for ln in lines
        if ln.split()[:2] in (["0", "0"], ["1", "0"], ["2", "1"], ["3", "1"]) and len(ln.split()) == 6
    ]
    assert gpu_rows == [
        ["0", "0", "35.0", "15.0", "12.5", "37.5"],
        ["1", "0", "0.0", "85.0", "5.0", "10.0"],
        ["2", "1", "10.0", "80.0", "0.0", "10.0"],
        ["3", "1", "0.0", "90.0", "0.0", "10.0"],
    ]
    assert row("all") == ["all", "-", "11.2", "67.5", "4.4", "16.9"]
    assert "Trajectory staleness (20 trajectories, mean age 0.700 steps)" in lines
    assert any(ln.split() == ["0", "10", "50.0"] for ln in lines)
    assert any(ln.split() == ["2", "4", "20.0"] for ln in lines)
    refit_row = next(ln for ln in lines if ln.startswith("ppl1") and "active=1" in ln)
    assert "expand=1" in refit_row and "ipc=1024" in refit_row and "broadcast=2048" in refit_row
    assert "1.000" in refit_row and "0.500" in refit_row
    sched = lines[lines.index("Scheduler") + 3].split()
    assert sched == ["3", "1", "1", "3", "5", "1", "1", "0"]
    assert "t=9.500 s OOM on GPU 2: ppl2/train train_state requested 100 with 80 of 160 bytes used" in lines
    assert "t=9.500 s fault oom_kill fired in ppl2 step 1" in lines


def test_summary_of_a_bare_log_and_a_log_without_header():
    bare = Log(nodes=1, gpus_per_node=2).records + [
        {"seq": 1, "t": 4.0, "kind": "sim_end", "reason": "done", "sim_time": 4.0, "events": 2}
    ]
    s = summarize(bare)
    assert s.pipelines == [] and s.refit == [] and s.staleness == {}
    assert [(g.gpu, g.idle_s) for g in s.gpus] == [(0, 4.0), (1, 4.0)]
    text = format_summary(s)
    assert "(no pipelines)" in text and "(no weight syncs)" in text and "Faults" not in text
    with pytest.raises(ValueError):
        summarize(bare[1:])


def test_effect_without_gpus_on_start_uses_end_gpus_and_args_pair_concurrent_effects():
    L = Log(nodes=1, gpus_per_node=2)
    L.add(
        1.0,
        "effect_start",
        pipeline_id="p",
        effect="Wake",
        args={"ranks": [0]},
        scope="expand",
        step=None,
        cycle=1,
        gpus=[],
    )
    L.add(
        1.0,
        "effect_start",
        pipeline_id="p",
        effect="Wake",
        args={"ranks": [1]},
        scope="expand",
        step=None,
        cycle=1,
        gpus=[1],
    )
    L.add(
        2.0,
        "effect_end",
        pipeline_id="p",
        effect="Wake",
        args={"ranks": [1]},
        scope="expand",
        step=None,
        cycle=1,
        gpus=[1],
    )
    L.add(
        3.0,
        "effect_end",
        pipeline_id="p",
        effect="Wake",
        args={"ranks": [0]},
        scope="expand",
        step=None,
        cycle=1,
        gpus=[0],
    )
    sl = [(s.gpu, s.start, s.end) for s in gpu_slices(L.records)]
    assert sl == [(0, 1.0, 3.0), (1, 1.0, 2.0)]


# ------------------------------------------------------------------------ Perfetto


def _threads(trace):
    names = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    return names


def test_chrome_trace_structure(tmp_path):
    records = build_log()
    path = tmp_path / "trace.json"
    assert write_chrome_trace(records, path) == str(path)
    assert sorted(os.listdir(tmp_path)) == ["trace.json"]  # no temp file left behind
    trace = json.loads(path.read_text())
    assert trace["displayTimeUnit"] == "ms"
    assert trace["otherData"]["scenario"] == "two_pipelines_demo"
    evs = trace["traceEvents"]
    assert all({"name", "ph", "pid", "tid"} <= set(e) for e in evs)

    procs = {e["pid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(procs.values()) == ["node 0", "node 1", "scheduler"]
    pid_of = {v: k for k, v in procs.items()}
    threads = _threads(trace)
    gpu_tracks = {name: key for key, name in threads.items() if name.startswith("GPU")}
    assert sorted(gpu_tracks) == [
        "GPU 0 (node 0)",
        "GPU 1 (node 0)",
        "GPU 1 lane 2",
        "GPU 2 (node 1)",
        "GPU 3 (node 1)",
    ]
    assert gpu_tracks["GPU 2 (node 1)"][0] == pid_of["node 1"]
    assert gpu_tracks["GPU 1 lane 2"][0] == pid_of["node 0"]
    assert len({tid for _, tid in threads}) == len(threads)  # thread ids unique trace-wide

    _assert_time_ordered(evs)
    xs = [e for e in evs if e["ph"] == "X"]
    _assert_gpu_slices(xs, gpu_tracks)
    _assert_no_overlap_per_track(xs)
    _assert_scheduler_track(evs, xs, threads)


def _assert_time_ordered(evs):
    """Metadata first, then events sorted by time."""
    kinds = [e["ph"] for e in evs]
    n_meta = kinds.count("M")
    assert set(kinds[:n_meta]) == {"M"} and "M" not in kinds[n_meta:]
    ts = [e["ts"] for e in evs[n_meta:]]
    assert ts == sorted(ts)


def _assert_gpu_slices(xs, gpu_tracks):
    """The effects and the ranks' generation as slices on their GPUs' tracks."""
    by_name = {}
    for e in xs:
        by_name.setdefault(e["name"], []).append(e)
    (compute,) = by_name["Compute(train) ppl1 s1"]
    assert (compute["ts"], compute["dur"], compute["cat"]) == (2_500_000, 2_000_000, "train")
    assert (compute["pid"], compute["tid"]) == gpu_tracks["GPU 0 (node 0)"]
    assert compute["args"]["step"] == 1 and compute["args"]["args"] == {"what": "train", "global_step": 1}
    (sleep,) = by_name["Sleep ppl1"]
    assert (sleep["ts"], sleep["dur"]) == (2_000_000, 250_000)
    # the rank on GPU 1 serves 1.0 -> 10.0 (open at the end); the refresh overlapping it gets lane 2
    (gen1,) = by_name["generate ppl1 dp1"]
    assert (gen1["ts"], gen1["dur"], gen1["cat"]) == (1_000_000, 9_000_000, "generate")
    assert (gen1["pid"], gen1["tid"]) == gpu_tracks["GPU 1 (node 0)"] and gen1["args"]["open"] is True
    (sync_active,) = by_name["SyncFromCache(active) ppl1 s1"]
    assert (sync_active["pid"], sync_active["tid"]) == gpu_tracks["GPU 1 lane 2"]
    assert (sync_active["ts"], sync_active["dur"]) == (5_000_000, 500_000)
    assert len(by_name["generate ppl1 dp0"]) == 2
    (activate,) = by_name["Activate ppl1"]
    assert activate["dur"] == 0 and activate["cat"] == "other"
    (open_compute,) = by_name["Compute(train) ppl2 s1"]
    assert (open_compute["ts"], open_compute["dur"]) == (9_000_000, 1_000_000) and open_compute["args"]["open"]
    assert not any(e["name"].startswith(("RequestGpus", "WaitBatch")) for e in xs)  # no GPUs: no GPU slice


def _assert_no_overlap_per_track(xs):
    """No two slices on one track overlap."""
    per_track = {}
    for e in xs:
        per_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in per_track.values():
        spans.sort()
        for (a0, a1), (b0, _) in zip(spans, spans[1:]):
            assert a1 <= b0


def _assert_scheduler_track(evs, xs, threads):
    """One instant per planned cycle, the idle-GPU counter after each commit, the resizes
    and the instant marks (OOM, fault, rejected input)."""
    sched_tid = next(k for k, v in threads.items() if v == "scheduler")
    inst = [e for e in evs if e["ph"] == "i" and e["cat"] == "scheduler"]
    assert [e["name"] for e in inst] == ["cycle 1", "cycle 2", "cycle 3"]
    assert all((e["pid"], e["tid"]) == sched_tid for e in inst)
    assert inst[1]["args"]["shrinks"] == {"ppl1_actor_infer": [0]} and inst[1]["args"]["n_signals"] == 1
    assert inst[0]["args"]["expands"] == {"ppl1_actor_infer": [0, 1], "ppl2_actor_infer": [0, 1]}
    counters = [e for e in evs if e["ph"] == "C"]
    assert [(e["name"], e["ts"], e["args"]) for e in counters] == [
        ("idle GPUs", 500_000, {"idle": 0}),
        ("idle GPUs", 2_250_000, {"idle": 0}),
        ("idle GPUs", 6_500_000, {"idle": 0}),
    ]
    resize = [e for e in xs if e["cat"] == "resize"]
    assert [(e["name"], e["ts"], e["dur"]) for e in resize] == [
        ("shrink ppl1 dp0", 2_000_000, 250_000),
        ("expand ppl1 dp0", 5_500_000, 1_000_000),
    ]
    marks = sorted(e["name"] for e in evs if e["ph"] == "i" and e["cat"] != "scheduler")
    assert marks == ["OOM GPU 2 ppl2/train", "fault oom_kill ppl2", "rejected"]


def test_chrome_trace_is_deterministic(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_chrome_trace(build_log(), a)
    write_chrome_trace(build_log(), b)
    assert a.read_bytes() == b.read_bytes()
    assert chrome_trace(build_log()) == json.loads(dumps_chrome_trace(build_log()))


@pytest.mark.parametrize("extra", [{}, {"tiny": 1e-5}, {"tinier": [1.5e-7]}, {"name": "é"}, {"neg": -2, "s": "a-b"}])
def test_the_trace_text_is_the_canonical_json_whichever_encoder_writes_it(extra):
    """orjson writes a chunk only when its bytes are json's (ASCII, no float it spells
    otherwise); a chunk with a tiny float or a non-ASCII name goes to json instead."""
    records = build_log()
    for r in records:
        if r["kind"] == "effect_start":
            r["args"] = {**r.get("args", {}), **extra}
    want = json.dumps(chrome_trace(records), sort_keys=True, separators=(",", ":"), allow_nan=False)
    assert dumps_chrome_trace(records) == want
    assert ("1e-05" in want or "1.5e-07" in want) == ("tiny" in extra or "tinier" in extra)


def test_lanes_are_greedy_and_stable():
    L = Log(nodes=1, gpus_per_node=1)
    # three overlapping trainings on GPU 0 and one that fits after the first
    L.effect(0.0, 4.0, "a", "Compute", {"what": "train", "global_step": 1}, step=1, gpus=[0])
    L.effect(1.0, 2.0, "b", "Compute", {"what": "train", "global_step": 1}, step=1, gpus=[0])
    L.effect(1.5, 3.0, "c", "Compute", {"what": "train", "global_step": 1}, step=1, gpus=[0])
    L.effect(2.0, 5.0, "d", "Compute", {"what": "train", "global_step": 1}, step=1, gpus=[0])
    sl = gpu_slices(L.records)
    lanes = dict(zip((s.pipeline_id for s in sl), assign_lanes(sl)))
    assert lanes == {"a": 0, "b": 1, "c": 2, "d": 1}
    names = sorted(v for v in _threads(chrome_trace(L.records)).values() if v.startswith("GPU"))
    assert names == ["GPU 0 (node 0)", "GPU 0 lane 2", "GPU 0 lane 3"]


def test_slice_sort_breaks_full_ties_by_canonical_args_like_the_sort_key():
    import random

    from harness.logs.outputs.intervals import GpuSlice, sort_slices

    # seq 0 everywhere (a hand-made log): several slices tie on everything but their args
    base = [
        GpuSlice(g, start, start + 1.0, "train", "p", "Compute p", {"k": k, "x": [k, g]}, 0)
        for g in (1, 0)
        for start in (2.0, 0.0)
        for k in (3, 1, 2, 1)
    ]
    rng = random.Random(7)
    for _ in range(20):
        shuffled = base[:]
        rng.shuffle(shuffled)
        got = shuffled[:]
        sort_slices(got)
        assert got == sorted(shuffled, key=GpuSlice.sort_key)
    sort_slices(base)
    assert [(s.gpu, s.start, s.args["k"]) for s in base[:4]] == [(0, 0.0, 1), (0, 0.0, 1), (0, 0.0, 2), (0, 0.0, 3)]


def test_a_shared_run_view_gives_every_output_what_the_records_give(tmp_path):
    from harness.logs.outputs.run_view import RunView

    records = build_log()
    view = RunView(records)
    assert format_summary(summarize(view)) == format_summary(summarize(records))
    assert dumps_chrome_trace(view) == dumps_chrome_trace(records)
    assert render_timeline_png(view) == render_timeline_png(records)
    assert view.work_slices == gpu_slices(records, include_other=False)


# ------------------------------------------------------------------------ PNG


def _png_size(data: bytes):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, tag = struct.unpack(">I4s", data[8:16])
    assert tag == b"IHDR" and length == 13
    return struct.unpack(">II", data[16:24])


def _png_text_chunks(data: bytes):
    pos, out = 8, []
    while pos < len(data):
        length, tag = struct.unpack(">I4s", data[pos : pos + 8])
        if tag in (b"tEXt", b"iTXt", b"zTXt"):
            out.append(data[pos + 8 : pos + 8 + length])
        assert (
            zlib.crc32(data[pos + 4 : pos + 8 + length])
            == struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])[0]
        )
        pos += 12 + length
    return out


def test_timeline_png(tmp_path):
    import matplotlib.image as mpimg
    import numpy as np

    records = build_log()
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    assert write_timeline_png(records, a) == str(a)
    write_timeline_png(records, b)
    assert sorted(os.listdir(tmp_path)) == ["a.png", "b.png"]
    data = a.read_bytes()
    assert len(data) > 5000
    # 4 GPU rows x 0.45 in < the legend's 9 entries x 0.22 in; + 1.1 in margins, at 100 dpi
    assert _png_size(data) == timeline_size_px(records) == (1200, 308)
    assert not any(b"matplotlib" in c.lower() for c in _png_text_chunks(data))
    assert data == b.read_bytes()
    assert render_timeline_png(records) == data

    pa, pb = mpimg.imread(str(a)), mpimg.imread(str(b))
    assert pa.shape == (308, 1200, 4) and np.array_equal(pa, pb)
    rgb = (pa[:, :, :3] * 255).round().astype(int)
    for colour in ("#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd"):  # train, generate, sync, wake/sleep
        want = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
        assert (np.abs(rgb - want).sum(axis=2) <= 6).sum() > 20, colour
    red = (rgb[:, :, 0] > 200) & (rgb[:, :, 1] < 40) & (rgb[:, :, 2] < 40)
    assert red.sum() > 10  # the OOM cross and fault line


def test_timeline_png_size_options_and_empty_log(tmp_path):
    records = Log(nodes=2, gpus_per_node=8).records
    out = tmp_path / "t.png"
    write_timeline_png(records, out, width_in=10.0, row_height_in=0.25, dpi=80)
    assert _png_size(out.read_bytes()) == (800, round((16 * 0.25 + 1.1) * 80))
