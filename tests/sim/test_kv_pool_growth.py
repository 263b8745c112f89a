"""KV pool sizing drift (NVIDIA-NeMo/RL PR #3280): a vLLM upgrade sizes the KV cache 14.46 GiB
larger (19.83 -> 34.29 GiB) at the same memory share, and the KV half of a staged wake no longer
fits beside what training keeps on its GPUs; pinned back to the old size, the same wake fits."""

from __future__ import annotations

import os

from harness.logs.invariants import check_log
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GiB = 1 << 30
GROWTH = (34.29 - 19.83) * GiB  # the report's two KV cache sizes


def run(name):
    res = Simulation(load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))).run()
    return res, {v.invariant for v in check_log(res.records)}


def first_kv_wakes(res):
    """Each GPU's first KV-cache wake (the one the grown pool fails at)."""
    first = {}
    for r in res.records:
        if r["kind"] == "vram" and r["mem"] == "kv_cache" and r["delta"] > 0:
            first.setdefault(r["gpu"], r)
    return first


def test_the_grown_kv_pool_ooms_on_a_training_gpu_and_the_pinned_pool_fits():
    grown, found = run("nemo_kv_pool_growth_oom")
    assert grown.reason == "failed" and found == {"handover", "handover_headroom", "vram", "run_outcome"}
    (oom,) = [r for r in grown.records if r["kind"] == "oom"]
    assert oom["mem"] == "kv_cache" and oom["gpu"] in (0, 1)  # a training GPU: the kept groups are on it
    assert oom["used"] + oom["requested"] > oom["capacity"]
    pinned, found = run("nemo_kv_pool_growth_pinned")
    assert pinned.reason == "done" and found == {"handover"}  # NeMo RL's kept Megatron groups, known upstream
    wake = first_kv_wakes(pinned)[oom["gpu"]]
    pool = wake["delta"]
    assert abs(oom["requested"] - pool - GROWTH) < 0.02 * GiB  # the same rank, the report's growth apart
    assert wake["used"] + oom["requested"] - pool > oom["capacity"]  # the grown pool would not fit
