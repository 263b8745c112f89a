"""Scheduler waste from a crafted log: wasted expands, resize time, idle GPU-time while waiting."""

from __future__ import annotations

from harness.outputs.waste import scheduler_waste


def rs(t, kind, phase, ranks, cycle, pid="p"):
    return {"kind": kind, "t": t, "pipeline_id": pid, "phase": phase, "dp_ranks": ranks, "cycle": cycle}


def test_expands_that_serve_nothing_are_wasted():
    log = [
        rs(0.0, "resize_start", "expand", [0, 1], 1), rs(2.0, "resize_end", "expand", [0, 1], 1),
        {"kind": "request_dispatch", "t": 3.0, "pipeline_id": "p", "dp_rank": 1},  # served
        rs(5.0, "resize_start", "shrink", [0, 1], 2), rs(6.0, "resize_end", "shrink", [0, 1], 2),
        rs(7.0, "resize_start", "expand", [2], 3), rs(8.5, "resize_end", "expand", [2], 3),
        {"kind": "request_dispatch", "t": 9.0, "pipeline_id": "q", "dp_rank": 2},  # another pipeline's rank 2
        rs(10.0, "resize_start", "shrink", [2], 4), rs(10.5, "resize_end", "shrink", [2], 4),  # wasted
        rs(11.0, "resize_start", "expand", [3], 5), rs(12.0, "resize_end", "expand", [3], 5),  # up at the end: wasted
    ]
    (p,) = scheduler_waste(log, t_end=20.0).pipelines
    assert (p.expands, p.wasted_expands) == (3, 2)
    assert p.expand_s == 2.0 + 1.5 + 1.0 and p.shrink_s == 1.0 + 0.5


def test_idle_gpu_time_counts_only_while_a_request_is_queued():
    log = [
        {"kind": "commit", "t": 0.0, "idle_gpus": 4},
        {"kind": "enqueued", "t": 1.0, "request_id": 7},
        {"kind": "commit", "t": 3.0, "idle_gpus": 2},       # 4 idle for 2 s while waiting
        {"kind": "released", "t": 4.0, "gpus": [5]},         # 2 idle for 1 s, then 3
        {"kind": "signalled", "t": 6.0, "request_id": 7},   # 3 idle for 2 s
        {"kind": "commit", "t": 9.0, "idle_gpus": 8},       # nobody waits: not counted
    ]
    w = scheduler_waste(log, t_end=10.0)
    assert w.waiting_s == 5.0
    assert w.idle_gpu_s_while_waiting == 4 * 2 + 2 * 1 + 3 * 2
