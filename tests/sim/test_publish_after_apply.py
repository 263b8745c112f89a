"""A version published before its receivers applied it (RLinf #1456: a sync completed on the
receiver's acknowledgement rather than on its apply): fault ``publish_on_ack`` publishes the
active refresh's version between the sync's end and the finalize; ``versions`` names it."""

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
