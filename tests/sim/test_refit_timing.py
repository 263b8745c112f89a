"""The refit timing model: bucket count, the per-bucket barrier, and the broadcast path's costs."""

from __future__ import annotations

import math

import pytest

from simulators.runtime.simulation import Simulation
from simulators.scenario.spec import ClusterSpec, CostSpec, ModelSpec, PipelineSpec, Scenario

MiB = 1 << 20


def one_pipeline(bucket_bytes=256 * MiB, params=1.0e9, tp=1):
    # 5 steps: with base-weight trajectories stamped as the published version 0 (as NeMo's
    # collector does), the always-serving rank on GPU 1 covers the first steps' demand and
    # the overlap rank on GPU 0 is first woken (a same-GPU sync) at a later step
    return Scenario(
        name="refit",
        cluster=ClusterSpec(nodes=1, gpus_per_node=2),
        pipelines=(
            PipelineSpec("p", "nemo_async", (0,), (0, 1), infer_tp=tp, model=ModelSpec(params=params), steps=5),
        ),
        costs=CostSpec(bucket_bytes=bucket_bytes),
    )


def syncs(records, transport_gpus):
    """(duration, start record) of every SyncFromCache whose GPUs are exactly transport_gpus."""
    out, open_ = [], {}
    for r in records:
        if r["kind"] == "effect_start" and r["effect"] == "SyncFromCache":
            open_[(r["scope"], tuple(r["args"]["ranks"]))] = r
        elif r["kind"] == "effect_end" and r["effect"] == "SyncFromCache":
            s = open_.pop((r["scope"], tuple(r["args"]["ranks"])))
            if s.get("gpus") == transport_gpus:
                out.append((r["t"] - s["t"], s))
    return out


def test_same_gpu_sync_stages_hands_and_waits_bucket_by_bucket():
    """RLix's selective sync: a barrier per bucket, so bucket b+1 is staged only once every
    target loaded bucket b — staging and loading add up, bucket after bucket."""
    s = one_pipeline()
    res = Simulation(s).run()
    assert res.reason == "done"
    w = s.pipelines[0].model.weight_bytes
    b = s.costs.bucket_bytes
    n = math.ceil(w / b)
    sizes = [min(b, w - i * b) for i in range(n)]
    expected = sum(x / s.cluster.pcie_bytes_per_s + x / s.costs.receiver_load_bytes_per_s for x in sizes)
    ipc_syncs = syncs(res.records, [0])
    assert ipc_syncs
    for duration, _ in ipc_syncs:
        assert duration == pytest.approx(expected, rel=1e-9)
    buckets = [r for r in res.records if r["kind"] == "sync_bucket" and r["path"] == "ipc"]
    assert len(buckets) % n == 0 and [r["bytes"] for r in buckets[:n]] == sizes


def test_cross_gpu_sync_pays_for_a_dynamic_group_and_the_link():
    s = one_pipeline()
    res = Simulation(s).run()
    bcast = syncs(res.records, [1])
    ipc = syncs(res.records, [0])
    assert bcast and ipc
    overhead = s.costs.nccl_group_create_s + s.costs.nccl_group_destroy_s
    assert min(d for d, _ in bcast) > max(d for d, _ in ipc) + overhead * 0.99
    creates = [r for r in res.records if r["kind"] == "group_create" and r.get("purpose") == "sync"]
    destroys = [r for r in res.records if r["kind"] == "group_destroy" and r.get("purpose") == "sync"]
    assert creates and len(creates) == len(destroys)
    assert all(r["members"][0] == 0 and 1 in r["members"] for r in creates)  # owner + the broadcast target


def test_more_buckets_for_smaller_buckets():
    small = Simulation(one_pipeline(bucket_bytes=64 * MiB)).run()
    big = Simulation(one_pipeline(bucket_bytes=512 * MiB)).run()
    count = lambda res: len({(r["version"], r["bucket"]) for r in res.records if r["kind"] == "sync_bucket"})
    assert count(small) > count(big)
