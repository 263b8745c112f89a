"""The engine's transition table (harness/control/engine_table.py) and its check, engine_transition:
every illegal transition the table defines is reached by a log and named at its record; the
field's reports, written as logs by hand, are named; the legal sequences stay clean; the
runtime's engine refuses what the table refuses."""

from __future__ import annotations

from collections import deque
from typing import Dict, List, Optional, Tuple

import pytest

from harness.control import engine_table as table
from harness.control.engine import EngineStateError, EngineTags
from harness.logs.invariants import check_log

PID = "p"
ASLEEP = {"weights": ("offloaded", "discarded"), "kv_cache": ("asleep",)}


class Log:
    """Writes the records a runtime writes for each engine event of rank 0 (the check's
    vocabulary, docs/engine-lifecycle.md), keeping the tags the records must report."""

    def __init__(self) -> None:
        self.records: List[dict] = []
        self.state = dict(table.INITIAL)
        self.open: List[int] = []  # versions of the syncs still writing

    def add(self, kind: str, **fields) -> int:
        seq = len(self.records)
        self.records.append({"seq": seq, "t": float(seq), "kind": kind, "pipeline_id": PID, **fields})
        return seq

    def _asleep(self) -> List[str]:
        return [t for t in ("weights", "kv_cache") if self.state[t] in ASLEEP[t]]

    def event(self, event: str) -> int:
        """The records of ``event``; returns the seq of the one the check reads it from."""
        one = {"ranks": [0]}
        if event.startswith("pause("):
            mode = event[6:-1]
            seq = (
                self.add("effect_start", effect="Abort", args=one)
                if mode == "abort"
                else self.add("effect_start", effect="Pause", args={**one, "mode": mode})
            )
        elif event == "drained":
            seq = self.add("effect_end", effect="Drain", args=one)
        elif event.startswith("sleep("):
            seq = self.add("effect_start", effect="Sleep", args={**one, "level": int(event[6])})
        elif event.startswith("wake("):
            seq = self.add("engine_tag", dp_rank=0, tag=event[5:-1], state="awake")
        elif event == "invalidate":
            seq = self.add("engine_tag", dp_rank=0, tag="prefix_cache", state="invalidated")
        elif event in ("memo_use", "memo_invalidate"):
            state = "used" if event == "memo_use" else "invalidated"
            seq = self.add("engine_tag", dp_rank=0, tag="memo_cache", state=state)
        elif event == "load_start":
            self.open.append(len(self.records))
            seq = self.add("effect_start", effect="SyncFromCache", args={**one, "version": self.open[-1]})
        elif event == "load_end":
            seq = self.add("effect_end", effect="SyncFromCache", args={**one, "version": self.open.pop()})
        elif event == "load_failed":
            seq = self.add("sync_end", version=self.open.pop(), ok=False)
        elif event == "finalize":
            seq = self.add("effect_start", effect="Finalize", args=one)
        elif event == "resume":  # off routing, then routable: the engine resumes
            self.add("rank_state", dp_rank=0, state="awake_unrouted", asleep_tags=self._asleep())
            seq = self.add("rank_state", dp_rank=0, state="routable", asleep_tags=self._asleep())
        elif event == "generate":
            seq = self.add("request_dispatch", dp_rank=0, request=seq_id(self))
        else:
            raise AssertionError(event)
        table.apply(self.state, event)
        return seq


def seq_id(log: Log) -> int:
    return len(log.records)


def findings(records) -> List:
    return check_log(records, ["engine_transition"])


def paths() -> Dict[Tuple[Tuple[str, ...], int], List[str]]:
    """Breadth first from the initial state, over every event a log can record: the shortest
    event sequence to each (table state, open syncs) pair. A sync can end only when one is open."""
    start = (tuple(table.INITIAL.values()), 0)
    seen = {start: []}
    queue = deque([start])
    while queue:
        state, open_syncs = queue.popleft()
        for event in table.EVENTS:
            if event in ("load_end", "load_failed") and not open_syncs:
                continue
            if event == "load_start" and open_syncs == 2:
                continue
            moved = dict(zip(table.COMPONENTS, state))
            table.apply(moved, event)
            opened = open_syncs + (event == "load_start") - (event in ("load_end", "load_failed"))
            key = (tuple(moved.values()), opened)
            if key not in seen:
                seen[key] = seen[(state, open_syncs)] + [event]
                queue.append(key)
    return seen


def expected_name(event: str, component: str, state: str, guard: Optional[str]) -> str:
    return f"{guard}: {event} with {component} {state}" if guard else f"{component} {state} --{event}-->"


def test_every_illegal_transition_is_reached_by_a_log_and_named():
    reach = paths()
    cases = table.illegal_cases()
    assert len(cases) > 40
    for event, component, state, guard in cases:
        path = next(
            (
                p
                for (s, n), p in reach.items()
                if (n or event not in ("load_end", "load_failed"))
                and _reports(dict(zip(table.COMPONENTS, s)), event, component, state, guard)
            ),
            None,
        )
        assert path is not None, (event, component, state, guard)
        log = Log()
        for e in path:
            log.event(e)
        before = {v.seq for v in findings(log.records)}
        at = log.event(event)
        new = [v for v in findings(log.records) if v.seq not in before]
        name = expected_name(event, component, state, guard)
        assert [v.seq for v in new] == [at] and name in new[0].message, (path, event, [str(v) for v in new])


def _reports(state, event, component, st, guard) -> bool:
    why = table.illegal(state, event)
    return why is not None and (why.component, why.state, why.guard.name if why.guard else None) == (
        component,
        st,
        guard,
    )


def run(events: List[str]) -> List:
    log = Log()
    for e in events:
        log.event(e)
    return findings(log.records)


RLIX_CYCLE = [
    "wake(weights)",
    "wake(kv_cache)",
    "load_start",
    "load_end",
    "finalize",
    "resume",
    "generate",
    "pause(abort)",
    "drained",
    "sleep(2)",
]
NEMO_STAGED = [
    "wake(weights)",
    "load_start",
    "load_end",
    "finalize",
    "wake(kv_cache)",
    "resume",
    "generate",
    "pause(wait)",
    "drained",
    "sleep(1)",
    "wake(weights)",
    "load_start",
    "load_end",
    "finalize",
    "wake(kv_cache)",
    "resume",
]
KEEP_IN_PLACE = RLIX_CYCLE[:7] + [
    "pause(keep)",
    "load_start",
    "load_end",
    "finalize",
    "invalidate",
    "resume",
    "generate",
    "load_start",
    "load_end",
    "generate",
]  # the last: RLix's active refresh


#: the RLix cycle of an engine that keeps a memo in its weights' region: each load drops it
#: (sglang PR #28676's fix), the finalize's post-load processing reads it
MEMO_CYCLE = RLIX_CYCLE[:3] + ["memo_invalidate"] + RLIX_CYCLE[3:5] + ["memo_use"] + RLIX_CYCLE[5:]
#: NeMo RL's level-1 cycle with the memo and no drop: the host copy brings the memo back whole
MEMO_LEVEL1 = NEMO_STAGED[:4] + ["memo_use"] + NEMO_STAGED[4:14] + ["memo_use"] + NEMO_STAGED[14:]


@pytest.mark.parametrize(
    "events",
    [RLIX_CYCLE * 2, NEMO_STAGED, KEEP_IN_PLACE, MEMO_CYCLE * 2, MEMO_LEVEL1],
    ids=["rlix", "nemo_staged", "keep", "memo_dropped_at_load", "memo_level1"],
)
def test_legal_sequences_are_clean(events):
    assert run(events) == []


@pytest.mark.parametrize(
    "events,named",
    [
        # vllm #57853: /sleep then /update_weights
        (RLIX_CYCLE + ["load_start"], "weights discarded --load_start-->"),
        # verl #7846: a KV restore resumed the scheduler, resume_generation resumes again
        (RLIX_CYCLE[:7] + ["resume"], "scheduler running --resume-->"),
        # vllm-omni #4473: a repeated sleep
        (RLIX_CYCLE + ["sleep(2)"], "weights discarded --sleep(2)-->"),
        # MILES: a second onload ('Cannot resume allocation that is not paused')
        (RLIX_CYCLE[:1] + ["wake(weights)"], "weights blank --wake(weights)-->"),
        # verl-omni #380: an abort with no acknowledgement, then the update
        (
            RLIX_CYCLE[:7] + ["pause(abort)", "load_start"],
            "load_unacknowledged_abort: load_start with scheduler pausing",
        ),
        # verl-omni #380: default wake tags ['weights'] leave the KV cache asleep; generation resumes
        (
            ["wake(weights)", "load_start", "load_end", "finalize", "resume"],
            "resume_kv_asleep: resume with kv_cache asleep",
        ),
        # lmdeploy #4917: prefix-cache entries not invalidated by the update
        (KEEP_IN_PLACE[:11] + ["resume"], "resume_stale_prefix_cache: resume with prefix_cache stale"),
        # vllm #29341: serving a level-2 wake without the reload
        (["wake(weights)", "wake(kv_cache)", "resume"], "resume_weights_not_ready: resume with weights blank"),
        # the sleep before the drain acknowledged the pause
        (RLIX_CYCLE[:7] + ["pause(abort)", "sleep(2)"], "sleep_unquiesced: sleep(2) with scheduler pausing"),
        # sglang PR #28676: the memo in the weights' region, filled before a release/resume, read after it
        (MEMO_CYCLE + RLIX_CYCLE[:5] + ["memo_use"], "memo_cache stale --memo_use-->"),
    ],
)
def test_field_reports_are_named_at_their_record(events, named):
    out = run(events)
    assert len(out) == 1 and named in out[0].message, [str(v) for v in out]
    assert out[0].seq == len(Log().records) + _last_seq(events)


def _last_seq(events: List[str]) -> int:
    log = Log()
    seq = 0
    for e in events:
        seq = log.event(e)
    return seq


def test_every_row_and_guard_names_its_source():
    for item in table.ROWS + table.GUARDS:
        assert "/" in item.source and ("#" in item.source or " " in item.source), item


def test_the_runtime_engine_refuses_what_the_table_refuses():
    engine = EngineTags("p dp0")
    with pytest.raises(EngineStateError, match="load_start"):
        engine.begin_load()  # vllm #57853: into sleeping weights
    engine.wake(("weights", "kv_cache"))
    with pytest.raises(EngineStateError, match="wake"):
        engine.wake(("weights",))  # a second onload
    engine.begin_load()
    engine.load(complete=True)
    engine.finalize()
    engine.resume()
    with pytest.raises(EngineStateError, match="resume"):
        engine.resume()  # verl #7846
    engine.pause("abort")
    with pytest.raises(EngineStateError, match="sleep_unquiesced"):
        engine.sleep(2)
    engine.drained()
    engine.sleep(1)
    assert engine.tags == {"weights": "offloaded", "kv_cache": "asleep"} and engine.paused


def test_the_runtime_engine_refuses_a_stale_memo_until_a_load_drops_it():
    """sglang PR #28676: a level-2 release leaves the weights' memo stale; the engine refuses to
    read it, and the load funnel's drop makes it legal again."""
    engine = EngineTags("p dp0")
    for event in MEMO_CYCLE:  # legal (test_legal_sequences_are_clean): the memo filled, then a level-2 sleep
        engine.force(event)
    assert engine.state["memo_cache"] == "stale"
    engine.wake(("weights", "kv_cache"))
    with pytest.raises(EngineStateError, match="memo_cache stale --memo_use-->"):
        engine.memo_use()
    engine.memo_invalidate()
    engine.memo_use()
    assert engine.state["memo_cache"] == "filled"


def stood_down(events: List[str]) -> List:
    log = Log()
    for e in events:
        log.event(e)
    return check_log(log.records, ["engine_stood_down"])


def test_an_engine_left_paused_and_awake_is_named_at_the_logs_end():
    # NeMo RL #3730 / rlix PR #14: paused, never resumed nor put to sleep
    events = RLIX_CYCLE[:7] + ["pause(keep)", "load_start", "load_end"]
    (v,) = stood_down(events)
    assert f"p dp0 paused at seq {_last_seq(events[:8])}" in v.message and "nothing in the log wakes it" in v.message
    assert v.seq == _last_seq(events)  # named at the log's last record
    # a pause that was acknowledged but never followed by the sleep is stood down too
    assert len(stood_down(RLIX_CYCLE[:7] + ["pause(abort)", "drained"])) == 1


@pytest.mark.parametrize(
    "events", [RLIX_CYCLE, NEMO_STAGED, KEEP_IN_PLACE, RLIX_CYCLE[:7]], ids=["slept", "staged", "resumed", "serving"]
)
def test_an_engine_that_resumed_or_slept_is_not_stood_down(events):
    assert stood_down(events) == []


def _rollouts(seq: int, effect: str) -> dict:
    return {
        "seq": seq,
        "t": float(seq),
        "kind": "effect_start",
        "pipeline_id": "sc",
        "effect": effect,
        "args": {},
        "scope": "step",
        "step": 0,
    }


def test_a_single_controllers_generation_left_paused_is_stood_down():
    """PauseRollouts stands a single controller's whole generation side down; only a
    ResumeRollouts wakes it (NVIDIA-NeMo/RL #3730's review)."""
    end = {"seq": 9, "t": 9.0, "kind": "sim_end", "reason": "horizon", "sim_time": 9.0, "events": 9}
    (v,) = check_log([_rollouts(1, "PauseRollouts"), end], ["engine_stood_down"])
    assert v.seq == 9 and "sc generation paused at seq 1" in v.message
    assert check_log([_rollouts(1, "PauseRollouts"), _rollouts(2, "ResumeRollouts"), end], ["engine_stood_down"]) == []


def _header(pipeline_type: str) -> dict:
    return {"seq": 0, "t": 0.0, "kind": "header", "meta": {"pipeline_types": {"sc": pipeline_type}}}


def _sync_weights(seq: int) -> dict:
    return {**_rollouts(seq, "SyncWeights"), "args": {"version": 1}}


def test_an_update_into_running_generation_is_illegal_where_the_pipeline_pauses_first():
    """NVIDIA-NeMo/RL #3839, vllm-project/vime #168: NeMo RL's single controller pauses its
    rollouts before every refit; a SyncWeights with no PauseRollouts open is named. The same
    log of a pipeline type that updates serving engines by design is not."""
    (v,) = check_log([_header("single_controller"), _sync_weights(1)], ["engine_transition"])
    assert v.seq == 1 and "sc: illegal update_unpaused: SyncWeights (version 1)" in v.message
    assert "NVIDIA-NeMo/RL #3839" in v.message
    paused = [_header("single_controller"), _rollouts(1, "PauseRollouts"), _sync_weights(2)]
    assert check_log(paused + [_rollouts(3, "ResumeRollouts")], ["engine_transition"]) == []
    resumed = paused + [_rollouts(3, "ResumeRollouts"), _sync_weights(4)]  # the pause ended before this one
    assert [v.seq for v in check_log(resumed, ["engine_transition"])] == [4]
    assert check_log([_header("disaggregated"), _sync_weights(1)], ["engine_transition"]) == []


@pytest.mark.parametrize(
    "name, fires", [("nemo_critic_warmup_no_wake", True), ("nemo_critic_warmup_no_wake_fixed", False)]
)
def test_nemo_rl_3730_critic_warmup_stands_generation_down(name, fires):
    import os

    from simulators.runtime.simulation import Simulation
    from simulators.scenario.loader import load_scenario

    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    res = Simulation(load_scenario(os.path.join(root, "examples", "scenarios", f"{name}.yaml"))).run()
    found = check_log(res.records, ["engine_stood_down"])
    assert res.reason == ("horizon" if fires else "done")
    assert bool(found) == fires and all("ppo generation paused" in v.message for v in found)
