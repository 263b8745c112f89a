"""The engine lifecycle on real simulator runs (docs/engine-lifecycle.md): each class's
bundled scenario makes its check fire and the fixed variant stays clean, and the pause
modes' lost work reaches the summary. The checks on hand-broken logs are
tests/unit/test_engine_checks.py."""

from __future__ import annotations

import dataclasses
import os

import pytest

from harness.logs.invariants import check_log
from harness.logs.outputs.summary import summarize
from harness.logs.outputs.summary_text import format_summary, summary_json
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def scenario(name):
    return load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))


def run(s):
    res = Simulation(s).run()
    return res, {v.invariant for v in check_log(res.records)}


def without_faults(s):
    return dataclasses.replace(s, faults=())


@pytest.fixture(scope="module")
def pause_modes():
    res, found = run(scenario("engine_pause_modes"))
    # a wait pause drains inside one scheduling cycle (RLix runs them one at a time): the
    # other pipelines wait beside idle GPUs longer than the derived bound
    assert res.reason == "done" and found == {"idle_bundle_starvation"}
    return res.records


def _dropped_inside_pauses(records, pid):
    """Reference count, written apart from the summary: aborts logged between a shrink's
    pause effect start and its end."""
    inside, n = False, 0
    for r in records:
        if r.get("pipeline_id") != pid:
            continue
        if (
            r["kind"] in ("effect_start", "effect_end")
            and r["effect"] in ("Abort", "Pause")
            and r.get("scope") == "shrink"
        ):
            inside = r["kind"] == "effect_start"
        elif r["kind"] == "request_abort" and inside:
            n += 1
    return n


def test_lost_work_per_pause_mode_reaches_the_summary(pause_modes):
    summary = summarize(pause_modes)
    rows = {r.mode: r for r in summary.pauses}
    assert set(rows) == {"abort", "wait", "keep"}
    abort, wait, keep = rows["abort"], rows["wait"], rows["keep"]
    # abort drops everything its pauses find in flight; wait and keep drop nothing
    assert abort.dropped == abort.in_flight == _dropped_inside_pauses(pause_modes, "ppl_abort") > 0
    assert abort.lost_engine_s > 0 and abort.retried + abort.failed <= abort.dropped
    assert wait.dropped == _dropped_inside_pauses(pause_modes, "ppl_wait") == 0 and wait.waited == wait.in_flight > 0
    assert keep.dropped == 0 and keep.kept == keep.in_flight > 0 and 0 < keep.resumed <= keep.kept
    kinds = [r["kind"] for r in pause_modes if r.get("pipeline_id") == "ppl_keep"]
    assert kinds.count("request_pause") == keep.kept and kinds.count("request_resume") == keep.resumed
    text = format_summary(summary)
    assert f"lost work, pause mode abort: {abort.dropped} of {abort.in_flight} in-flight requests dropped" in text
    assert f"lost work, pause mode wait: 0 of {wait.in_flight} in-flight requests dropped" in text
    assert summary_json(summary)["lost_work_by_pause_mode"]["keep"]["dropped"] == 0


def test_a_wait_pause_drains_longer_than_an_abort(pause_modes):
    """What wait costs instead of lost work: its shrinks' drains last as long as the
    requests it lets finish (the abort pipeline's drains are the fixed drain time)."""

    def drains(pid):
        starts = {}
        out = []
        for r in pause_modes:
            if r.get("pipeline_id") == pid and r["kind"] in ("effect_start", "effect_end") and r["effect"] == "Drain":
                if r["kind"] == "effect_start":
                    starts[r["cycle"]] = r["t"]
                else:
                    out.append(r["t"] - starts.pop(r["cycle"]))
        return out

    assert max(drains("ppl_wait")) > 10 * max(drains("ppl_abort"))


def test_a_level2_wake_with_a_partial_reload_fires_engine_weights_and_level1_or_a_full_reload_does_not():
    s = scenario("level2_partial_reload")
    res, found = run(s)
    assert res.reason == "done" and found == {"engine_weights"}
    msg = next(v.message for v in check_log(res.records, ["engine_weights"]))
    assert "after a level-2 wake holding 1 of the 4 weight buckets" in msg
    level1 = dataclasses.replace(s, pipelines=tuple(dataclasses.replace(p, sleep_level=1) for p in s.pipelines))
    assert run(level1)[1] == set()  # the whole old model came back from host RAM
    assert run(without_faults(s))[1] == set()


def test_resuming_before_the_kv_wake_fires_and_the_staged_wake_in_order_is_clean():
    res, found = run(scenario("resume_before_kv_wake"))
    assert res.reason == "done" and found == {"engine_resume", "kv_cache_asleep", "engine_transition"}
    assert run(scenario("kv_wake_before_weights"))[1] == {"engine_resume", "engine_transition"}
    fixed, found = run(scenario("nemo_level1_staged_wake"))
    assert fixed.reason == "done" and found == set()
    # the staged wake charges the KV cache to the VRAM ledger only after the refit
    recs = fixed.records
    wake = next(i for i, r in enumerate(recs) if r["kind"] == "effect_start" and r["effect"] == "WakeTags")
    kv = next(i for i in range(wake, len(recs)) if recs[i]["kind"] == "vram" and recs[i]["mem"] == "kv_cache")
    sync = next(i for i in range(wake, len(recs)) if recs[i]["kind"] == "sync_end")
    assert sync < kv and recs[kv]["delta"] > 0
    assert any(r["kind"] == "engine_tag" for r in recs) and any(r.get("asleep_tags") == ["kv_cache"] for r in recs)
    # level 1: the weights went to host RAM at the sleep and came back at the wake
    host = [r for r in recs if r["kind"] == "host_ram" and "/dp" in r["owner"]]
    assert host and any(r["delta"] > 0 for r in host) and any(r["delta"] < 0 for r in host)


def test_a_wait_pause_that_aborts_anyway_is_lost_work_named_and_counted():
    s = scenario("pause_wait_aborted")
    res, found = run(s)
    assert res.reason == "done" and found == {"pause_lost_work", "idle_bundle_starvation"}
    row = next(r for r in summarize(res.records).pauses if r.pipeline_id == "ppl1")
    assert row.mode == "wait" and row.dropped == len(check_log(res.records, ["pause_lost_work"])) > 0
    assert run(without_faults(s))[1] == set()


def test_a_version_stamped_at_completion_fires_version_at_dispatch():
    s = scenario("version_stamped_at_completion")
    res, found = run(s)
    assert res.reason == "done" and found == {"version_at_dispatch"}
    assert run(without_faults(s))[1] == set()
