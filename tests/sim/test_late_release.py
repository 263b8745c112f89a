"""Memory released late (simulators/pipelines/late_release.py): an engine's release answers before its
memory leaves the VRAM ledger (slime #579, miles #86); RLix PR #11's wait saves the trainer's
onload, or times out and proceeds into the OOM; a second onload is refused as in MILES."""

from __future__ import annotations

import dataclasses
import os

from harness.logs.invariants import check_log
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def scenario(name):
    return load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))


def run(s):
    res = Simulation(s).run()
    return res, {v.invariant for v in check_log(res.records)}


def kinds(res, kind):
    return [r for r in res.records if r["kind"] == kind]


def test_a_late_release_keeps_the_engines_memory_past_its_sleep_and_the_onload_ooms():
    res, found = run(scenario("late_release_wake_oom"))
    assert res.reason == "failed" and found == {"handover", "handover_headroom", "vram", "run_outcome"}
    (oom,) = kinds(res, "oom")
    assert oom["gpu"] == 0 and oom["owner"] == "ppl1/train"
    releasing = [r for r in kinds(res, "vram") if r["mem"] == "releasing" and r["gpu"] == 0]
    assert releasing and releasing[0]["delta"] > 70e9 and releasing[0]["seq"] < oom["seq"]
    assert not [r for r in releasing if r["delta"] < 0]  # the onload came before the driver freed it
    # released at once (the default, vLLM's sleep) the same run completes clean of memory findings
    s = scenario("late_release_wake_oom")
    at_once = dataclasses.replace(s, costs=dataclasses.replace(s.costs, release_to_freed_s=0.0))
    fixed, found = run(at_once)
    assert fixed.reason == "done" and found == set()
    assert not [r for r in kinds(fixed, "vram") if r["mem"] == "releasing"]


def test_rlix_pr11s_wait_lets_the_release_finish_before_the_onload():
    res, found = run(scenario("late_release_wait_saves_wake"))
    assert res.reason == "done" and found == {"handover"}  # the grant still comes at the release's answer
    waits = kinds(res, "offload_wait")
    assert [w["outcome"] for w in waits] == ["ok"] * 3
    first = waits[0]
    assert 20.0 <= first["memory_wait_s"] <= 20.5 + 1e-9 and first["max_used"] <= first["threshold"] == 10 * 2**30
    freed = next(r for r in kinds(res, "vram") if r["mem"] == "releasing" and r["delta"] < 0 and r["gpu"] == 0)
    onload = next(
        r
        for r in kinds(res, "vram")
        if r["owner"] == "ppl1/train" and r["mem"] == "grads" and r["delta"] > 0 and r["seq"] > first["seq"]
    )  # step 0's onload, after the wait
    assert freed["seq"] < first["seq"] and onload["t"] == first["t"]


def test_the_wait_times_out_warns_and_proceeds_into_the_oom():
    res, found = run(scenario("late_release_wait_times_out"))
    assert res.reason == "failed" and found == {"handover", "handover_headroom", "vram", "run_outcome"}
    (wait,) = kinds(res, "offload_wait")
    assert wait["outcome"] == "timeout" and wait["memory_wait_s"] >= 60.0 and wait["max_used"] > wait["threshold"]
    (oom,) = kinds(res, "oom")
    assert oom["seq"] > wait["seq"] and oom["owner"] == "ppl1/train"


def test_a_second_onload_is_refused_as_miles_refuses_it():
    s = scenario("miles_double_onload")
    res, found = run(s)
    assert res.reason == "failed" and found == {"run_outcome"}
    assert "Cannot resume allocation that is not paused" in res.detail
    fixed, found = run(dataclasses.replace(s, faults=()))
    assert fixed.reason == "done" and found == set()
