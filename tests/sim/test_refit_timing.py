"""The refit timing model: bucket count, ping-pong overlap, and the broadcast path's costs."""

from __future__ import annotations

import math

import pytest

from simulators.runtime import Simulation
from simulators.spec import ClusterSpec, CostSpec, ModelSpec, PipelineSpec, Scenario

MiB = 1 << 20


def one_pipeline(bucket_bytes=256 * MiB, params=1.0e9, tp=1):
    # 5 steps: with base-weight trajectories stamped as the published version 0 (as NeMo's
    # collector does), the always-serving rank on GPU 1 covers the first steps' demand and
    # the overlap rank on GPU 0 is first woken (a same-GPU sync) at a later step
    return Scenario(
        name="refit", cluster=ClusterSpec(nodes=1, gpus_per_node=2),
        pipelines=(PipelineSpec("p", "nemo_async", (0,), (0, 1), infer_tp=tp, model=ModelSpec(params=params), steps=5),),
        costs=CostSpec(bucket_bytes=bucket_bytes))


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


def test_same_gpu_sync_overlaps_staging_with_loading():
    s = one_pipeline()
    res = Simulation(s).run()
    assert res.reason == "done"
    w = s.pipelines[0].model.weight_bytes
    b = s.costs.bucket_bytes
    n = math.ceil(w / b)
    stage = b / s.cluster.pcie_bytes_per_s
    load = b / s.costs.receiver_load_bytes_per_s
    last = (w - (n - 1) * b)
    # stage 0; each later bucket waits max(stage, previous load); then the last load
    expected = stage + sum(max(min(b, w - i * b) / s.cluster.pcie_bytes_per_s, load) for i in range(1, n)) + last / s.costs.receiver_load_bytes_per_s
    ipc_syncs = syncs(res.records, [0])
    assert ipc_syncs
    for duration, _ in ipc_syncs:
        assert duration == pytest.approx(expected, rel=1e-9)
    serial = sum(min(b, w - i * b) / s.cluster.pcie_bytes_per_s + min(b, w - i * b) / s.costs.receiver_load_bytes_per_s for i in range(n))
    assert expected < serial  # the overlap is worth something
    buckets = [r for r in res.records if r["kind"] == "refit_bucket" and r["transport"] == "cpu_serialize"]
    assert len(buckets) % n == 0 and sum(r["bytes"] for r in buckets[:n]) == w


def test_cross_gpu_sync_pays_for_a_dynamic_group_and_the_link():
    s = one_pipeline()
    res = Simulation(s).run()
    bcast = syncs(res.records, [1])
    ipc = syncs(res.records, [0])
    assert bcast and ipc
    overhead = s.costs.nccl_group_create_s + s.costs.nccl_group_destroy_s
    assert min(d for d, _ in bcast) > max(d for d, _ in ipc) + overhead * 0.99
    groups = [r for r in res.records if r["kind"] == "nccl_group" and "/sync/" in r["name"]]
    creates = [r for r in groups if r["action"] == "create"]
    assert creates and len(creates) == len([r for r in groups if r["action"] == "destroy"])
    assert all(r["gpus"][0] == 0 and 1 in r["gpus"] for r in creates)  # owner + the broadcast target


def test_more_buckets_for_smaller_buckets():
    small = Simulation(one_pipeline(bucket_bytes=64 * MiB)).run()
    big = Simulation(one_pipeline(bucket_bytes=512 * MiB)).run()
    count = lambda res: len({(r["version"], r["bucket"]) for r in res.records if r["kind"] == "refit_bucket"})
    assert count(small) > count(big)
