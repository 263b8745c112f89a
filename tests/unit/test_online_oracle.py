"""The online oracle (harness/logs/invariants/online.py) finds exactly what the batch oracle
finds: on bundled scenarios' logs and replayed traces (broken ones with findings of many
checks), fed in chunks of many sizes down to one record, and on every broken trace the
checks' own firing tests build (each of their ``check_log`` calls is checked both ways).
And the streamed event log writes the bytes ``EventLog.write`` writes."""

from __future__ import annotations

import inspect
import io
import os

import pytest

from harness.logs.invariants import CHECKS, check_log, run_checks
from harness.logs.invariants.online import NotOnePass, OnePassView, OnlineOracle
from tests.unit.test_invariant_views import _logs
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# logs with findings of deadlock, lost_wakeup, hot_state, liveness (at the horizon),
# engine_weights, sync_groups, vram, handover, planned_release_ack, ...
SCENARIOS = (
    "wsg_trl6913_receiver_died",
    "wsg_vime329_slot_overwrite",
    "stuck_rollout_straggler",
    "level2_partial_reload",
    "stranded_sync_group",
    "handover_old_log_probs_oom",
    "miles_floor_reactivates_after_release",
    "starve_one_shot_generation",
)
#: firing tests left out: each simulates a scenario of its own several times (seconds each)
SLOW = ("test_in_flight_at_sleep_follows_rlix_premature_release_ack",)


def online(records, chunk, names=None):
    oracle = OnlineOracle(names)
    for i in range(0, len(records), chunk):
        oracle(records[i : i + chunk])
    return oracle.finish()


@pytest.mark.parametrize("name,records", list(_logs(SCENARIOS)), ids=lambda x: x if isinstance(x, str) else "")
def test_online_findings_are_the_batch_findings(name, records):
    records = records()
    want = run_checks(records, list(CHECKS))
    assert any(want.values()) or name.endswith(".jsonl")  # (the scenarios are chosen for their findings)
    for chunk in ((1, 7) if len(records) < 1000 else (97,)) + (8192,):  # (a thread hand-off per chunk and check)
        assert online(records, chunk) == want, chunk


def _firing_tests():
    """The zero-argument and simply parametrized tests of the checks' firing suites."""
    import importlib

    for mod_name in (
        "tests.unit.test_invariants",
        "tests.unit.test_effect_invariants",
        "tests.unit.test_serving_invariants",
        "tests.unit.test_plan_shape_invariants",
        "tests.unit.test_gpu_memory_invariants",
        "tests.unit.test_weight_sync_invariants",
        "tests.unit.test_engine_checks",
        "tests.unit.test_blind_spot_checks",
        "tests.unit.test_policy_checks",
    ):
        mod = importlib.import_module(mod_name)
        if not hasattr(mod, "check_log"):
            continue
        for name, fn in sorted(vars(mod).items()):
            if not name.startswith("test_") or not callable(fn) or name in SLOW:
                continue
            marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
            params = list(inspect.signature(fn).parameters)
            if not params:
                yield f"{mod_name.rsplit('.', 1)[1]}.{name}", mod, fn, {}
            elif len(marks) == 1 and set(params) == {p.strip() for p in marks[0].args[0].split(",")}:
                for i, values in enumerate(marks[0].args[1]):
                    values = values if len(params) > 1 else (values,)
                    yield f"{mod_name.rsplit('.', 1)[1]}.{name}[{i}]", mod, fn, dict(zip(params, values))


@pytest.mark.parametrize("name,mod,fn,kwargs", list(_firing_tests()), ids=lambda x: x if isinstance(x, str) else "")
def test_online_findings_on_the_firing_tests_traces(name, mod, fn, kwargs, monkeypatch):
    seen = []

    def both(records, names=None):
        found = check_log(records, names)
        selected = list(CHECKS) if names is None else list(names)
        by_check = online(list(records), 3 if len(records) < 300 else 997, selected)
        assert sorted((v for n in selected for v in by_check[n]), key=lambda v: (v.seq, v.invariant)) == found
        seen.append(len(found))
        return found

    monkeypatch.setattr(mod, "check_log", both)
    fn(**kwargs)


def test_the_firing_tests_were_found():
    assert len(list(_firing_tests())) > 40


def test_a_view_read_as_a_list_fails_loudly():
    oracle = OnlineOracle(["vram"])
    oracle([{"seq": 0, "t": 0, "kind": "header", "cluster": {}}])
    view = OnePassView({"seq": 0}, oracle._runners["vram"])
    with pytest.raises(NotOnePass):
        len(view)
    with pytest.raises(NotOnePass):
        view[3]
    oracle.finish()


def test_a_check_that_raises_raises_from_finish():
    oracle = OnlineOracle(["vram"])
    oracle([{"seq": 0, "t": 0, "kind": "header", "cluster": {}}, {"seq": 1, "t": 0, "kind": "vram"}])  # no gpu field
    with pytest.raises(KeyError):
        oracle.finish()


def test_the_streamed_log_writes_the_bytes_the_in_memory_log_writes():
    scenario = load_scenario(os.path.join(ROOT, "examples", "scenarios", "stranded_sync_group.yaml"))
    whole = Simulation(scenario).run()
    sink, seen = io.BytesIO(), []
    streamed = Simulation(scenario, sink=sink, consumers=[seen.extend], per_chunk=7).run()
    assert sink.getvalue() == b"".join(whole.log.chunks())
    assert seen == whole.records and streamed.log.made == len(whole.records)
    assert streamed.log.records == [] and streamed.log.last == whole.records[-1]
    with pytest.raises(RuntimeError):
        streamed.records  # a streamed run keeps none: a caller that wants them must not get []


def test_completed_requests_kept_as_runs_answer_as_a_set():
    import random

    from harness.logs.invariants.routing import Completed

    rng = random.Random(5)
    for _ in range(100):
        completed, reference = Completed(), set()
        ids = list(range(40))
        rng.shuffle(ids)
        for n in ids[: rng.randint(0, 40)]:
            req = (rng.choice("ab"), n)
            completed.add(req)
            reference.add(req)
            assert all(((p, q) in completed) == ((p, q) in reference) for p in "ab" for q in range(-1, 42))
        for runs in completed.runs.values():  # disjoint, sorted, never two that touch
            assert all(runs[k][1] + 1 < runs[k + 1][0] for k in range(len(runs) - 1))
    completed.add(("a", "x"))
    assert ("a", "x") in completed and ("a", "y") not in completed


def test_a_check_kept_whole_finds_what_the_batch_oracle_finds(monkeypatch):
    from harness.logs.invariants import online as online_module

    monkeypatch.setitem(online_module.WHOLE_HISTORY, "vram", "(a test: the kept-records path)")
    monkeypatch.setitem(online_module.WHOLE_HISTORY, "handover", "(a test: the kept-records path)")
    records = (
        Simulation(load_scenario(os.path.join(ROOT, "examples", "scenarios", "handover_old_log_probs_oom.yaml")))
        .run()
        .records
    )
    want = run_checks(records, list(CHECKS))
    assert want["vram"] and want["handover"]
    assert online(records, 50) == want


def test_one_split_shared_by_two_readers_splits_each_chunk_once(monkeypatch):
    import harness.logs.one_pass as one_pass
    from harness.logs.outputs.streamed_view import StreamedRunView

    records = Simulation(load_scenario(os.path.join(ROOT, "examples", "scenarios", "default.yaml"))).run().records
    made = []
    real = one_pass.kind_codes
    monkeypatch.setattr(one_pass, "kind_codes", lambda chunk: made.append(len(chunk)) or real(chunk))
    split = one_pass.SplitOnce(readers=2)
    oracle, view = OnlineOracle(split=split), StreamedRunView(split=split)
    chunks = [records[i : i + 500] for i in range(0, len(records), 500)]
    for chunk in chunks:
        oracle(chunk)
        view(chunk)
    # the first chunk twice (the view splits it without its header), every other once
    assert made == [len(chunks[0]), len(chunks[0]) - 1] + [len(c) for c in chunks[1:]]
    view.finish()
    assert oracle.finish() == run_checks(records, list(CHECKS))
    # each chunk let go once both readers had it: asked again, it is split again
    split(chunks[-1])
    assert made[-1] == len(chunks[-1]) and len(made) == len(chunks) + 2
