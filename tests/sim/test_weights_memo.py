"""The engine's memo kept in its weights' region (sgl-project/sglang PR #28676): with the
fault ``memo_not_invalidated`` the finalize after a level-2 sleep reads it stale and
``engine_transition`` names it at that read; the fixed variant drops it at every load and is
clean. The reference is the log itself: which rank slept at level 2 before the read."""

from __future__ import annotations

import os

from harness.logs.invariants import check_log
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _run(name: str):
    return Simulation(load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))).run()


def _memo(records, state):
    return [r for r in records if r["kind"] == "engine_tag" and r["tag"] == "memo_cache" and r["state"] == state]


def _stale_reads(records):
    """Each memo read of a rank whose last level-2 sleep came after its last memo drop and its
    last read before that sleep (the memo was filled, then the region released)."""
    last_sleep, last_drop, filled_before_sleep, stale = {}, {}, set(), []
    for r in records:
        if r["kind"] == "effect_start" and r["effect"] == "Sleep" and r["args"]["level"] == 2:
            for dp in r["args"]["ranks"]:
                key = (r["pipeline_id"], dp)
                last_sleep[key] = r["seq"]
        elif r["kind"] == "engine_tag" and r["tag"] == "memo_cache":
            key = (r["pipeline_id"], r["dp_rank"])
            if r["state"] == "invalidated":
                last_drop[key] = r["seq"]
                filled_before_sleep.discard(key)
            elif key in last_sleep and last_sleep[key] > last_drop.get(key, -1) and key in filled_before_sleep:
                stale.append(r["seq"])
            else:
                filled_before_sleep.add(key)
    return stale


def test_the_memo_read_after_a_release_is_named_and_the_fixed_variant_is_clean():
    res = _run("sglang_stale_weights_memo")
    assert res.reason == "done"
    found = check_log(res.records, ["engine_transition"])
    stale = _stale_reads(res.records)
    assert stale and [v.seq for v in found] == stale
    assert all("memo_cache stale --memo_use-->" in v.message for v in found)
    assert not _memo(res.records, "invalidated") or {r["pipeline_id"] for r in _memo(res.records, "invalidated")} == {
        "ppl2"
    }
    fixed = _run("sglang_stale_weights_memo_fixed")
    assert fixed.reason == "done" and check_log(fixed.records) == []
    assert _memo(fixed.records, "used") and _stale_reads(fixed.records) == []
