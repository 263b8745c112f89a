"""The handover_headroom check and the summary's memory headroom, on hand-made logs: a
residue that leaves the wake under the margin fires (named with its headroom), the same
wake with a smaller margin or no residue does not; the figures per GPU, phase and
handover are the log's own arithmetic."""

from __future__ import annotations

from harness.logs.invariants import check_log
from harness.logs.invariants.handover_headroom import handover_windows
from harness.logs.outputs.headroom import HEADROOM_KINDS, headroom, headroom_brief, headroom_findings_of

GIB = 1 << 30


def _log(margin=None, residue=GIB // 2):
    """GPU 0 of 10 GiB: p's trainer leaves ``residue`` of nccl at init, p's rank 0 wakes
    there (plan, resize_start, 8 GiB of weights and KV, resize_end), then sleeps."""
    meta = {} if margin is None else {"handover_margin_bytes": margin}
    recs = [
        {
            "seq": 0,
            "t": 0.0,
            "kind": "header",
            "cluster": {"nodes": 1, "gpus_per_node": 1, "vram_gib": 10.0},
            "meta": meta,
        }
    ]
    used = 0

    def vram(owner, mem, delta, phase):
        nonlocal used
        used += delta
        recs.append(
            {
                "seq": len(recs),
                "t": float(len(recs)),
                "kind": "vram",
                "gpu": 0,
                "owner": owner,
                "mem": mem,
                "delta": delta,
                "used": used,
                "phase": phase,
            }
        )

    vram("p/ctx", "cuda_context", GIB // 2, None)
    vram("p/train", "params", 4 * GIB, "init")
    if residue:
        vram("p/train", "nccl", residue, "init")
    vram("p/train", "params", -4 * GIB, "init")
    recs.append(
        {
            "seq": len(recs),
            "t": 10.0,
            "kind": "plan",
            "cycle": 1,
            "shrinks": [],
            "expands": [{"cluster_id": "p_actor_infer", "bundles": [{"dp_rank": 0, "gpus": [0]}]}],
        }
    )
    recs.append(
        {
            "seq": len(recs),
            "t": 10.0,
            "kind": "resize_start",
            "cycle": 1,
            "pipeline_id": "p",
            "phase": "expand",
            "dp_ranks": [0],
        }
    )
    vram("p/dp0", "weights", 4 * GIB, "wake")
    vram("p/dp0", "kv_cache", 4 * GIB, "wake")
    recs.append(
        {
            "seq": len(recs),
            "t": 12.0,
            "kind": "resize_end",
            "cycle": 1,
            "pipeline_id": "p",
            "phase": "expand",
            "dp_ranks": [0],
        }
    )
    vram("p/dp0", "kv_cache", -4 * GIB, "sleep")  # after the window: not counted in it
    return recs


def test_a_residue_that_leaves_the_wake_under_the_margin_fires_naming_the_headroom():
    # the default margin (1 GiB): 1 GiB left is not under it
    assert not check_log(_log(residue=GIB // 2 - 1), ["handover_headroom"])
    tight = check_log(_log(margin=2 * GIB), ["handover_headroom"])
    assert len(tight) == 1 and "headroom fell to 1073741824 B (1.00 GiB)" in tight[0].message
    assert "p_actor_train's 536870912 B (phase init)" in tight[0].message and "margin 2147483648 B" in tight[0].message
    # no residue, no handover window: nothing, whatever the margin
    assert not check_log(_log(margin=9 * GIB, residue=0), ["handover_headroom"])


def test_the_summary_figures_per_gpu_phase_and_handover():
    recs = _log(margin=2 * GIB)
    h = headroom([r for r in recs if r["kind"] in HEADROOM_KINDS])
    assert h.capacity_bytes == 10 * GIB and h.margin_bytes == 2 * GIB
    (g,) = h.gpus
    assert (g.peak_bytes, g.headroom_bytes, g.phase) == (9 * GIB, GIB, "wake")
    assert g.owners == {"p/ctx": GIB // 2, "p/dp0": 8 * GIB, "p/train": GIB // 2}
    assert h.phases["init"]["peak_bytes"] == 5 * GIB and h.phases["wake"]["headroom_bytes"] == GIB
    (w,) = handover_windows(recs)
    assert (w.gpu, w.cluster, w.residue, w.headroom) == (0, "p_actor_infer", {"p_actor_train": GIB // 2}, GIB)
    assert (
        headroom_brief(h)
        == "memory headroom: tightest GPU 0 1.00 GiB (wake), least after a handover 1.00 GiB (margin 2.00 GiB)"
    )


def test_an_oom_inside_the_window_is_below_zero_headroom():
    recs = _log(margin=0)
    i = next(i for i, r in enumerate(recs) if r.get("mem") == "kv_cache")
    recs[i] = {
        "seq": recs[i]["seq"],
        "t": recs[i]["t"],
        "kind": "oom",
        "gpu": 0,
        "owner": "p/dp0",
        "mem": "kv_cache",
        "requested": 6 * GIB,
        "used": 5 * GIB,
        "capacity": 10 * GIB,
    }
    for r in recs[i + 1 :]:
        if r["kind"] == "vram":
            r["used"] -= 4 * GIB
    (w,) = handover_windows(recs)
    assert w.headroom == -GIB
    assert [v for v in check_log(recs, ["handover_headroom"])]


def test_the_findings_judged_from_the_summary_table_are_the_checks():
    # the streamed run judges the headroom table's windows instead of walking the log twice:
    # on logs where the check fires, passes, or has no capacity to judge, the two agree
    no_capacity = _log(margin=2 * GIB)
    del no_capacity[0]["cluster"]["vram_gib"]
    for recs in (_log(margin=2 * GIB), _log(margin=0), _log(residue=GIB // 2 - 1), no_capacity):
        table = headroom([r for r in recs if r["kind"] in HEADROOM_KINDS])
        assert headroom_findings_of(table) == check_log(recs, ["handover_headroom"])
    assert headroom_findings_of(headroom([r for r in _log(margin=2 * GIB) if r["kind"] in HEADROOM_KINDS]))
