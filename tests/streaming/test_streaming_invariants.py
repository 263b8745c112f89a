"""The checks staleness_window and streaming_step: quiet on a sound trace,
firing on each way of breaking it."""

from __future__ import annotations

import copy


from harness.logs.invariants import check_log
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import scenario_from_mapping

_BASE = None


def base():
    global _BASE
    if _BASE is None:
        s = scenario_from_mapping(
            {
                "name": "inv",
                "cluster": {"nodes": 1, "gpus_per_node": 2},
                "pipelines": [
                    {
                        "name": "sc",
                        "type": "single_controller",
                        "train_gpus": [0],
                        "infer_gpus": [1],
                        "steps": 3,
                        "workload": {"prompts_per_step": 3, "generations_per_prompt": 2},
                        "streaming": {"sampler": "windowed", "window": 1, "max_buffered_rollouts": 6},
                    }
                ],
            },
            "inv",
        )
        _BASE = Simulation(s).run().records
    return copy.deepcopy(_BASE)


def names(records, which):
    return [v.message for v in check_log(records, [which])]


def idx(records, pred, nth=0):
    return [i for i, r in enumerate(records) if pred(r)][nth]


def is_trainer(action):
    return lambda r: r["kind"] == "trainer_step" and r["action"] == action


def is_end(effect):
    return lambda r: r["kind"] == "effect_end" and r["effect"] == effect


def test_sound_trace_is_quiet():
    recs = base()
    assert check_log(recs, ["staleness_window", "streaming_step"]) == []
    assert any(r["kind"] == "trainer_step" for r in recs)


def test_begin_while_a_step_is_open():
    recs = base()
    del recs[idx(recs, is_trainer("finish"))]  # step 0 never closes
    msgs = names(recs, "streaming_step")
    assert any("step 1 begins while step 0 is open" in m for m in msgs), msgs


def test_microbatch_without_an_open_step():
    recs = base()
    del recs[idx(recs, is_trainer("begin"))]
    assert any("microbatch of step 0 with no open step" in m for m in names(recs, "streaming_step"))


def test_version_tick_outside_finish_and_a_finish_that_does_not_tick():
    recs = base()
    recs[idx(recs, is_trainer("microbatch"))]["version"] += 1
    assert any("ticks outside an applied finish" in m for m in names(recs, "streaming_step"))
    recs = base()
    i = idx(recs, is_trainer("finish"))
    for r in recs[i:]:
        if r["kind"] == "trainer_step":
            r["version"] -= 1  # the finish itself leaves the version where it was
    assert any("does not tick by exactly one at finish" in m for m in names(recs, "streaming_step"))


def test_abort_leaves_no_step_open_and_does_not_tick():
    recs = base()
    i = idx(recs, is_trainer("finish"))
    abort = dict(recs[i], action="abort", version=recs[i]["version"] - 1, aborted=True)
    abort.pop("applied", None)
    recs[i] = abort  # step 0 aborted: no tick...
    for r in recs[i + 1 :]:
        if r["kind"] == "trainer_step":
            r["version"] -= 1
    assert names(recs, "streaming_step") == [m for m in names(recs, "streaming_step") if "syncs weights" in m]
    recs[i]["version"] += 1  # ...and an abort that ticks is caught
    assert any("ticks outside an applied finish" in m for m in names(recs, "streaming_step"))


def test_clear_twice_clear_missing_and_clear_of_an_untrained_group():
    recs = base()
    i = idx(recs, is_end("ClearSamples"))
    recs.insert(i + 1, copy.deepcopy(recs[i]))
    assert any("cleared twice" in m for m in names(recs, "streaming_step"))
    recs = base()
    del recs[idx(recs, is_end("ClearSamples"))]
    assert any("finishes with trained groups never cleared" in m for m in names(recs, "streaming_step"))
    recs = base()
    recs[idx(recs, is_end("ClearSamples"))]["args"]["groups"] = [999]
    msgs = names(recs, "streaming_step")
    assert any("clears group 999, which the open step did not train" in m for m in msgs), msgs


def test_sync_of_a_version_the_trainer_does_not_hold_and_a_run_ending_open():
    recs = base()
    i = idx(recs, lambda r: r["kind"] == "effect_start" and r["effect"] == "SyncWeights")
    recs[i]["args"]["version"] = 7
    assert any("syncs weights version 7 but the trainer holds version 1" in m for m in names(recs, "streaming_step"))
    recs = base()
    del recs[idx(recs, is_trainer("finish"), -1)]
    assert any("run ends with step 2 still open" in m for m in names(recs, "streaming_step"))


def test_staleness_beyond_the_window_and_training_an_uncommitted_group():
    recs = base()
    mb = recs[idx(recs, is_trainer("microbatch"), -1)]
    gid = mb["groups"][0]
    reserve = next(r for r in recs if r["kind"] == "effect_end" and r["effect"] == "Reserve" and r["result"][0] == gid)
    reserve["result"][1] -= 2  # generated two versions earlier than it was: age window + 1
    msgs = names(recs, "staleness_window")
    assert any(f"group {gid} generated at version" in m and "window 1" in m for m in msgs), msgs
    recs = base()
    del recs[
        idx(recs, lambda r: r["kind"] == "effect_end" and r["effect"] == "Commit" and r["args"]["group_id"] == gid)
    ]
    assert any(f"trains group {gid}, which was never committed" in m for m in names(recs, "staleness_window"))


def test_a_sampler_without_a_bound_is_not_held_to_one():
    recs = base()
    next(r for r in recs if r["kind"] == "streaming_setup")["max_age"] = None
    mb = recs[idx(recs, is_trainer("microbatch"), -1)]
    reserve = next(
        r for r in recs if r["kind"] == "effect_end" and r["effect"] == "Reserve" and r["result"][0] == mb["groups"][0]
    )
    reserve["result"][1] -= 2
    assert names(recs, "staleness_window") == []
    reserve["result"][1] += 10  # from the future: never fine
    assert any("age -" in m for m in names(recs, "staleness_window"))
