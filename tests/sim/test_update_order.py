"""Weight updates out of order with what they update, from a named fault each:

* a version published before its receivers applied it (RLinf/RLinf #1456: a sync completed on
  the receiver's acknowledgement rather than on its apply): fault ``publish_on_ack`` publishes
  the active refresh's version between the sync's end and the finalize; ``versions`` names it;
* an update into running generation where the single controller pauses first
  (NVIDIA-NeMo/RL #3839, vllm-project/vime #168): fault ``refit_without_pause``;
  ``engine_transition`` names it (``update_unpaused``)."""

from __future__ import annotations

import os

from harness.logs.invariants import check_log
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(name):
    res = Simulation(load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))).run()
    return res, check_log(res.records)


def active_refreshes(res):
    """Per active refresh: the seqs of its sync's end, its finalize's start and its publish."""
    out, current = [], {}
    for r in res.records:
        if r["kind"] not in ("effect_start", "effect_end") or r.get("scope") != "step":
            continue
        if r["effect"] == "SyncFromCache" and r["kind"] == "effect_end":
            current = {"ack": r["seq"]}
            out.append(current)
        elif r["effect"] == "Finalize" and r["kind"] == "effect_start" and current:
            current["apply"] = r["seq"]
        elif r["effect"] == "PublishVersion" and r["kind"] == "effect_start" and current:
            current["publish"] = r["seq"]
    return out


def test_a_publish_on_the_acknowledgement_is_named_and_the_fixed_order_is_clean():
    res, found = run("publish_on_ack")
    assert res.reason == "done"
    refreshes = active_refreshes(res)
    early = [x for x in refreshes if x["ack"] < x["publish"] < x["apply"]]
    assert len(early) == 1 and len(refreshes) >= 2  # only the faulted step's refresh
    assert [(v.invariant, v.seq) for v in found] == [("versions", early[0]["publish"])]
    fixed, found = run("publish_on_ack_fixed")
    assert fixed.reason == "done" and found == []
    assert all(x["ack"] < x["apply"] < x["publish"] for x in active_refreshes(fixed))


def test_a_refit_into_running_generation_is_named_where_the_single_controller_pauses_first():
    """NVIDIA-NeMo/RL #3839, vllm-project/vime #168: fault refit_without_pause drops the
    single controller's PauseRollouts before the refit; generation is still running at each
    such SyncWeights and engine_transition names exactly those. RLix's active refresh
    (publish_on_ack_fixed.yaml: updates into serving ranks) stays legal."""
    res, found = run("nemo_refit_without_pause")
    running, unpaused = 0, []
    paused = False
    for r in res.records:
        if r["kind"] == "effect_start" and r["effect"] == "Generate":
            running += 1
        elif r["kind"] == "effect_end" and r["effect"] == "Generate":
            running -= 1
        elif r["kind"] == "effect_start" and r["effect"] in ("PauseRollouts", "ResumeRollouts"):
            paused = r["effect"] == "PauseRollouts"
        elif r["kind"] == "effect_start" and r["effect"] == "SyncWeights" and not paused:
            unpaused.append((r["seq"], running))
    # steps 1 and 2; at step 1's refit generation is in flight (at the last step's, nothing is left to generate)
    assert len(unpaused) == 2 and unpaused[0][1] > 0
    assert [(v.invariant, v.seq) for v in found] == [("engine_transition", s) for s, _ in unpaused]
    fixed, found = run("nemo_refit_without_pause_fixed")
    assert fixed.reason == "done" and found == []
