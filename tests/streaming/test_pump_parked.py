"""The in-order drop wedge: the train pump closes a step short when a drop lands while it
selects, on every seed of the bundled scenario; with the fault that restores the old
select, the ``pump_parked`` check names the parked pump. Crafted logs make both of the
check's rules fire and show what does not."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.logs.invariants import check_log
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario
from simulators.scenario.spec import FaultSpec

SCEN = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "in_order_drop_wedge.yaml"


def _run(seed, fault=False):
    base = load_scenario(SCEN)
    faults = (FaultSpec("stale_select_target", "sc"),) if fault else ()
    return Simulation(dataclasses.replace(base, seed=seed, faults=faults)).run()


def _finishes(records):
    return [r["step"] for r in records if r["kind"] == "trainer_step" and r["action"] == "finish"]


def _credited_drops(records):
    return [
        r
        for r in records
        if r["kind"] == "effect_end" and r["effect"] == "SkipPrompt" and r["args"]["target_step"] is not None
    ]


@pytest.mark.parametrize("seed", range(12))
def test_the_wedge_scenario_finishes_every_step(seed):
    res = _run(seed)
    steps = load_scenario(SCEN).pipelines[0].steps
    assert res.reason == "done" and _finishes(res.records) == list(range(steps))
    assert check_log(res.records) == []
    # a step closed short trains exactly what its drops left it
    trained = {}
    for r in res.records:
        if r["kind"] == "effect_end" and r["effect"] == "ClearSamples":
            trained[r["args"]["step"]] = trained.get(r["args"]["step"], 0) + len(r["args"]["groups"])
    for s in range(steps):
        drops = sum(1 for r in _credited_drops(res.records) if r["args"]["target_step"] == s)
        assert trained[s] == 4 - drops, (s, trained, drops)


def test_drops_land_while_the_pump_selects_on_these_seeds():
    """The scenario exercises the case: some drop ends while a select of its step is open."""
    hit = 0
    for seed in range(12):
        recs = _run(seed).records
        open_sel = {}
        for r in recs:
            if r["kind"] in ("effect_start", "effect_end") and r["effect"] == "SelectGroups":
                open_sel[r["args"]["step"]] = r["kind"] == "effect_start"
            elif r in _credited_drops([r]) and open_sel.get(r["args"]["target_step"]):
                hit += 1
    assert hit >= 3


def test_with_the_old_select_the_pump_parks_and_pump_parked_names_it():
    wedged = 0
    for seed in range(12):
        res = _run(seed, fault=True)
        found = [v for v in check_log(res.records) if v.invariant == "pump_parked"]
        if len(_finishes(res.records)) == 5:
            assert res.reason == "done" and not found
            continue
        wedged += 1
        assert res.reason == "horizon" and len(found) == 1, [str(v) for v in found]
        assert "never re-read it" in found[0].message
    assert wedged >= 1  # the issue saw 3 of seeds 0-5


# ---------------------------------------------------------------- crafted logs


def _log(*effects, end_t=500.0):
    out = [
        {
            "seq": 0,
            "t": 0.0,
            "kind": "streaming_setup",
            "pipeline_id": "p",
            "sampler": "in_order",
            "groups_per_step": 2,
            "max_buffered_rollouts": 4,
            "min_groups_for_streaming_train": 1,
        }
    ]
    for kind, t, effect, args, scope in effects:
        out.append(
            {
                "seq": len(out),
                "t": t,
                "kind": kind,
                "pipeline_id": "p",
                "effect": effect,
                "args": args,
                "scope": scope,
                "step": args.get("step") if scope == "step" else None,
            }
        )
    out.append({"seq": len(out), "t": end_t, "kind": "sim_end", "reason": "horizon"})
    return out


S, E = "effect_start", "effect_end"
SEL = {"min_groups": 1, "max_groups": 1, "step": 0, "target": 2}


def _trained_one_then_select(*more):
    return [
        (S, 1.0, "ClearSamples", {"step": 0, "groups": [0]}, "step"),
        (E, 1.0, "ClearSamples", {"step": 0, "groups": [0]}, "step"),
        (S, 2.0, "SelectGroups", SEL, "step"),
        *more,
    ]


def test_crafted_select_sized_before_a_drop_fires():
    drop = {"prompt_id": 1, "batch": 0, "reason": "data failure x1", "target_step": 0}
    log = _log(
        *_trained_one_then_select(
            (S, 3.0, "Generate", {"group_id": 1}, "rollout"),
            (E, 4.0, "Generate", {"group_id": 1}, "rollout"),
            (S, 4.0, "SkipPrompt", drop, "rollout"),
            (E, 4.0, "SkipPrompt", drop, "rollout"),
            (S, 5.0, "Generate", {"group_id": 9}, "rollout"),
        )
    )
    found = check_log(log, ["pump_parked"])
    assert len(found) == 1 and "at most 0" in found[0].message and "t=4.0s" in found[0].message
    # an unstamped drop is owed to no step: no finding while a rollout is still generating
    log2 = _log(
        *_trained_one_then_select(
            (S, 4.0, "SkipPrompt", {**drop, "target_step": None}, "rollout"),
            (E, 4.0, "SkipPrompt", {**drop, "target_step": None}, "rollout"),
            (S, 5.0, "Generate", {"group_id": 9}, "rollout"),
        )
    )
    assert check_log(log2, ["pump_parked"]) == []


def test_crafted_select_with_nothing_in_flight_and_the_gate_shut_fires():
    log = _log(
        *_trained_one_then_select(
            (S, 2.5, "AdmitBatch", {}, "rollout"),
            (S, 30.0, "WatchdogTick", {"interval_s": 30.0}, "watchdog"),
            (E, 60.0, "WatchdogTick", {"interval_s": 30.0}, "watchdog"),
        )
    )
    found = check_log(log, ["pump_parked"])
    assert len(found) == 1 and "waits in AdmitBatch" in found[0].message and "since t=1.0s" in found[0].message


def test_crafted_select_with_a_rollout_under_way_or_answered_is_no_finding():
    busy = _log(
        *_trained_one_then_select(
            (S, 2.5, "AdmitBatch", {}, "rollout"), (S, 3.0, "Generate", {"group_id": 1}, "rollout")
        )
    )
    assert check_log(busy, ["pump_parked"]) == []
    answered = _log(
        *_trained_one_then_select((E, 3.0, "SelectGroups", SEL, "step"), (S, 3.5, "AdmitBatch", {}, "rollout"))
    )
    assert check_log(answered, ["pump_parked"]) == []
    # the last move at the very end of the log: the select may still be answered
    last = _log(
        *_trained_one_then_select(
            (S, 2.5, "AdmitBatch", {}, "rollout"),
            (S, 3.0, "Backoff", {"seconds": 1.0}, "rollout"),
            (E, 9.0, "Backoff", {"seconds": 1.0}, "rollout"),
        ),
        end_t=9.0,
    )
    assert check_log(last, ["pump_parked"]) == []


def test_the_summary_reports_drops_and_steps_closed_short():
    from harness.logs.outputs.summary import summarize
    from harness.logs.outputs.summary_text import format_summary

    res = _run(1)
    drops = _credited_drops(res.records)
    row = summarize(res.records).streaming[0]
    assert row.dropped == row.dropped_owed == len(drops) > 0
    # each step that lost a stamped prompt closed short, and no other did
    assert row.short_steps == len({r["args"]["target_step"] for r in drops if r["args"]["target_step"] < 5}) > 0
    text = format_summary(summarize(res.records))
    assert "steps short" in text and f"{len(drops)} ({len(drops)} owed)" in text


def test_a_step_that_lost_every_prompt_fails_the_run_instead_of_parking():
    """One prompt per step and half of them dropped: a step with nothing to train cannot
    tick the version, so in_order's next step could never be selected; the run fails."""
    from tests.streaming.test_single_controller_sim import sc_scenario

    reasons = set()
    for seed in range(4):
        sc = sc_scenario(steps=4, seed=seed, data_failure_rate=0.5, max_data_attempts_per_prompt=1)
        sc = dataclasses.replace(
            sc,
            pipelines=(
                dataclasses.replace(
                    sc.pipelines[0],
                    workload=dataclasses.replace(sc.pipelines[0].workload, prompts_per_step=1),
                    streaming=dataclasses.replace(sc.pipelines[0].streaming, max_buffered_rollouts=2),
                ),
            ),
        )
        res = Simulation(sc).run()
        reasons.add(res.reason)
        if res.reason == "failed":
            assert "every prompt group was dropped" in res.detail
            assert {v.invariant for v in check_log(res.records)} == {"run_outcome"}
    assert "failed" in reasons and "horizon" not in reasons


def test_pump_parked_names_an_unstamped_wedge_for_real():
    """weight_fifo at window 0 with unlimited drops: a dropped prompt is owed to no step,
    the step waits for a group of its version that no one generates, the gate admits no
    more, and nothing is in flight (NeMo RL refuses drops under this sampler; the
    harness's unlimited-drop mode shows why)."""
    from tests.streaming.test_single_controller_sim import sc_scenario

    fired = 0
    for seed in range(3):
        res = Simulation(
            sc_scenario(
                steps=4,
                seed=seed,
                sampler="weight_fifo",
                window=0,
                data_failure_rate=0.3,
                max_data_attempts_per_prompt=2,
            )
        ).run()
        found = [v for v in check_log(res.records) if v.invariant == "pump_parked"]
        if res.reason == "horizon":
            fired += 1
            assert len(found) == 1 and "nothing in flight" in found[0].message
        else:
            assert not found
    assert fired
