"""A stood-down engine (engine_stood_down) for real: RLix's MILES refit pauses the serving
ranks around finalize; before rlops/rlix PR #14 a failed finalize left them paused, the fix
resumes them in a finally."""

from __future__ import annotations

import dataclasses
import os

from harness.logs.invariants import check_log
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(name, **changes):
    s = load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))
    res = Simulation(dataclasses.replace(s, **changes)).run()
    return res, check_log(res.records)


def test_before_pr14_a_failed_finalize_leaves_generation_paused():
    res, found = run("miles_finalize_fails_paused")
    assert res.reason == "failed" and {v.invariant for v in found} == {"engine_stood_down", "run_outcome"}
    (v,) = [v for v in found if v.invariant == "engine_stood_down"]
    pause = next(
        r for r in res.records if r["kind"] == "effect_start" and r["effect"] == "PauseGeneration" and r["step"] == 1
    )
    assert f"ppl1 dp1 paused at seq {pause['seq']}" in v.message
    assert not [
        r
        for r in res.records
        if r["kind"] == "effect_start" and r["effect"] == "ContinueGeneration" and r["seq"] > pause["seq"]
    ]
    # without the fault, every pause is continued and the run is clean
    clean, found = run("miles_finalize_fails_paused", faults=())
    assert clean.reason == "done" and found == []


def test_pr14_resumes_generation_in_a_finally():
    res, found = run("miles_finalize_fails_resumed")
    assert res.reason == "failed" and {v.invariant for v in found} == {"engine_transition", "run_outcome"}
    (v,) = [v for v in found if v.invariant == "engine_transition"]
    assert "resume_stale_prefix_cache" in v.message  # the failed finalize never flushed the cache
    clean, found = run("miles_finalize_fails_resumed", faults=())
    assert clean.reason == "done" and found == []
    flushes = [r for r in clean.records if r["kind"] == "engine_tag" and r["tag"] == "prefix_cache"]
    assert flushes and all(r["state"] == "invalidated" for r in flushes)


def test_a_pause_without_a_deadline_hangs_with_the_engine_paused_and_names_it_unbounded():
    res, found = run("unbounded_pause_hangs")
    assert res.reason == "horizon" and {v.invariant for v in found} == {"engine_stood_down", "liveness"}
    (v,) = [v for v in found if v.invariant == "engine_stood_down"]
    assert "ppl1 dp0 paused" in v.message and "unbounded pause" in v.message
    assert not [r for r in res.records if r["kind"] == "timeout"]
    # with RLix's 30 s deadline (abort_never_wakes.yaml) the run fails fast instead
    bounded, found = run("abort_never_wakes")
    assert bounded.reason == "failed" and [r["what"] for r in bounded.records if r["kind"] == "timeout"] == [
        "shrink_drain"
    ]
    assert "unbounded" not in next(v.message for v in found if v.invariant == "engine_stood_down")
