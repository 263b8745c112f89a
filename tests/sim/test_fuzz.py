"""``rlharness fuzz``: the seed -> scenario generator, signatures, isolation of seeds that
crash or hang, minimized reproducers, and results independent of the executor."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import pytest
import yaml

from rlharness.cli import main
from harness.logs.expect import from_signature
from harness.logs.invariants import Violation
from simulators.fuzz.executors import Job, run_isolated, seed_job
from simulators.fuzz.generate import scenario_for_seed, scenario_mapping
from simulators.fuzz.minimize import minimize
from simulators.fuzz.seed_run import run_scenario, run_seed
from simulators.fuzz.signature import CLEAN, signature
from simulators.fuzz.sweep import SweepConfig, results_json, run_sweep
from simulators.scenario.loader import load_scenario
from simulators.runtime.simulation import Simulation
from simulators.scenario.spec import PIPELINE_TYPES

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


# ---------------------------------------------------------------- generator


def test_every_seed_gives_a_valid_scenario_and_the_same_one_twice():
    seen_types, tps, nodes, faults = set(), set(), set(), 0
    for seed in range(400):
        s = scenario_for_seed(seed)  # raises ScenarioError if the generator broke a rule
        assert scenario_mapping(seed) == scenario_mapping(seed)
        assert s.seed == seed
        seen_types.update(p.type for p in s.pipelines)
        tps.update(p.infer_tp for p in s.pipelines)
        nodes.add(s.cluster.nodes)
        faults += bool(s.faults)
    assert seen_types == set(PIPELINE_TYPES)  # every type the simulator supports is drawn
    assert tps == {1, 2} and nodes == {1, 2}
    assert 100 < faults < 300  # about half the seeds carry a fault mix


def test_partial_overlap_is_drawn_for_nemo_pipelines():
    overlaps = 0
    for seed in range(100):
        for p in scenario_for_seed(seed).pipelines:
            if p.type in ("single_controller", "disaggregated"):  # non-colocated, on GPUs of its own (no scheduler)
                assert not set(p.train_gpus) & set(p.infer_gpus)
                others = {
                    g
                    for q in scenario_for_seed(seed).pipelines
                    if q.name != p.name
                    for g in q.train_gpus + q.infer_gpus
                }
                assert not (set(p.train_gpus) | set(p.infer_gpus)) & others
                continue
            assert set(p.train_gpus) <= set(p.infer_gpus)
            if p.type == "nemo_async":
                assert len(set(p.infer_gpus) - set(p.train_gpus)) >= p.infer_tp
                overlaps += 1
    assert overlaps > 20


# ---------------------------------------------------------------- signatures

TYPES = {"p0": "nemo_async", "p1": "roll_sync"}


def _rec(seq, kind, **fields):
    return {"seq": seq, "t": float(seq), "kind": kind, **fields}


def test_a_clean_run_has_the_clean_signature():
    records = [_rec(0, "header"), _rec(5, "sim_end", reason="done", sim_time=5.0, events=9, detail="")]
    assert signature(records, [], TYPES) == CLEAN


def test_the_first_finding_in_log_order_names_the_signature_with_roles_not_names():
    records = [
        _rec(0, "header"),
        _rec(3, "oom", gpu=1, owner="p1/dp0", mem="kv_cache", requested=1, used=1, capacity=1),
        _rec(4, "sim_end", reason="failed", sim_time=4.0, events=9, detail="p1: OOM"),
    ]
    late = Violation("stale_serving", 4, "p0 dp1 serves version 2 after 3 was published")
    early = Violation("stale_serving", 2, "p0 dp1 serves version 2 after 3 was published")
    assert signature(records, [late], TYPES) == "oom:kv_cache[roll_sync]"
    assert signature(records, [early], TYPES) == "stale_serving[nemo_async]"
    on_cluster = Violation("handover", 2, "GPU 0 granted to p0_actor_infer while p1_actor_train keeps 512 MiB")
    assert signature(records, [on_cluster], TYPES) == "handover[nemo_async,roll_sync]"


def test_fired_faults_are_part_of_the_signature_and_numbers_are_dropped():
    records = [
        _rec(0, "header"),
        _rec(1, "fault_fired", name="cache_after_offload", pipeline_id="p0"),
        _rec(2, "sim_end", reason="failed", sim_time=2.0, events=3, detail="p0: cache v3 built on GPU [0, 1]"),
    ]
    assert signature(records, [], TYPES) == "failed:nemo_async: cache vN built on GPU [..] +cache_after_offload"
    # a fault that fired after the finding did not cause it
    early = Violation("liveness", 0, "p0 stuck")
    assert signature(records, [early], TYPES) == "liveness[nemo_async]"


def test_timeouts_and_horizon_have_their_own_signatures():
    timeout = [
        _rec(0, "header"),
        _rec(1, "timeout", pipeline_id="p0", what="shrink_drain", limit_s=30, since=1.0),
        _rec(2, "sim_end", reason="failed", sim_time=31.0, events=3, detail="timeout"),
    ]
    assert signature(timeout, [], TYPES) == "timeout:shrink_drain[nemo_async]"
    horizon = [
        _rec(0, "header"),
        _rec(1, "batch_consumed", pipeline_id="p1", step=0, trajectories=1, staleness={}),
        _rec(2, "sim_end", reason="horizon", sim_time=9.0, events=3, detail=""),
    ]
    assert signature(horizon, [], TYPES) == "horizon:never_trained[nemo_async]"
    horizon[1]["pipeline_id"] = "p0"
    assert signature(horizon, [], {"p0": "nemo_async"}) == "horizon:unfinished[nemo_async]"


# ---------------------------------------------------------------- one seed


def test_a_seed_result_depends_on_the_seed_alone():
    a, b = run_seed(1), run_seed(1)
    assert a == b
    assert set(a) >= {"seed", "status", "signature", "reason", "log_sha256", "scenario"}
    assert "wall" not in json.dumps(a)


def test_check_determinism_compares_with_a_fresh_process(fresh_process_decodes_one_more_token):
    # three seeds from one whose pipelines all draw requests through the colocated collector
    start = next(s for s in range(100) if {p.type for p in scenario_for_seed(s).pipelines} == {"nemo_async"})
    cfg = SweepConfig(seeds=3, start=start, workers=2, check_determinism=True)
    assert [r["determinism"] for r in run_sweep(cfg, minimize_findings=False).results] == [{"status": "identical"}] * 3
    fresh_process_decodes_one_more_token()
    (res,) = run_sweep(dataclasses.replace(cfg, seeds=1), minimize_findings=False).results  # one fresh process shows it
    det = res["determinism"]
    assert det["status"] == "diverged" and res["signature"] == "nondeterministic"
    assert det["line"] > 1 and det["ours"] != det["theirs"] and '"kind":"request_' in det["ours"]


# ---------------------------------------------------------------- isolation


def _raise(seed):
    raise ZeroDivisionError("boom")


def _die(seed):
    os._exit(7)


def _hang(seed):
    time.sleep(600)


def test_a_seed_that_raises_dies_or_hangs_becomes_a_result_and_the_sweep_goes_on():
    jobs = [Job(1, _raise, (1,)), Job(2, _die, (2,)), Job(3, _hang, (3,)), seed_job(23)]
    t0 = time.monotonic()
    results = {r["seed"]: r for r in run_isolated(jobs, workers=4, budget=1.0, clock=time.monotonic)}
    assert time.monotonic() - t0 < 60
    assert results[1]["status"] == "crashed" and results[1]["signature"] == "crashed:ZeroDivisionError"
    assert "boom" in results[1]["detail"]
    assert results[2]["status"] == "crashed" and "exit code 7" in results[2]["detail"]
    assert results[3]["status"] == "timeout" and "1 s" in results[3]["detail"]
    assert results[23]["status"] in ("clean", "finding")


def test_no_child_process_outlives_the_sweep():
    import multiprocessing

    list(run_isolated([Job(1, _hang, (1,))], workers=1, budget=0.5, clock=time.monotonic))
    assert multiprocessing.active_children() == []


# ---------------------------------------------------------------- minimization


def test_minimize_keeps_only_what_the_signature_needs():
    seed = next(
        s for s in range(200) if len(scenario_mapping(s)["pipelines"]) == 4 and scenario_mapping(s).get("faults")
    )
    big = scenario_mapping(seed)
    fault = big["faults"][0]["name"]

    def fake_signature(m):  # the "finding" is: this fault is in the scenario
        return "x" if any(f["name"] == fault for f in m.get("faults", [])) else "clean"

    small, runs = minimize(big, "x", signature_fn=fake_signature, max_runs=500)
    assert len(small["pipelines"]) == 1 and [f["name"] for f in small["faults"]] == [fault]
    p = small["pipelines"][0]
    assert p["steps"] == small["faults"][0]["at_step"] + 1
    assert p["workload"]["prompts_per_step"] == 1 and "scheduler" not in small and "costs" not in small
    assert runs <= 500


def test_a_minimized_reproducer_reproduces_its_finding(tmp_path):
    # seeds 0-4 hold findings of three kinds (a handover with a fault, a planned-release
    # ack, a failed run), each minimized (about 0.3 CPU s a finding)
    cfg = SweepConfig(seeds=5, workers=2, out_dir=str(tmp_path), time_budget_s=60)
    sweep = run_sweep(cfg)
    written = [f for f in sweep.findings if f.minimized]
    assert written, [f.signature for f in sweep.findings]
    for f in written:
        scenario = load_scenario(f.minimized)
        assert run_scenario(scenario)["signature"] == f.signature
        original = scenario_for_seed(f.smallest_seed)
        assert scenario.cluster.num_gpus <= original.cluster.num_gpus
        assert len(scenario.pipelines) <= len(original.pipelines)


# ---------------------------------------------------------------- executors and CLI


def test_results_are_byte_identical_whatever_the_worker_count_and_completion_order():
    one = results_json(run_sweep(SweepConfig(seeds=10, workers=1), minimize_findings=False).results)
    two = results_json(run_sweep(SweepConfig(seeds=10, workers=3), minimize_findings=False).results)
    assert one == two


@pytest.mark.slow
def test_results_on_a_local_ray_instance_equal_the_local_ones(local_ray):
    # on the session's Ray (tests/conftest.py: one Ray start per session), which the sweep
    # uses as a caller's Ray and leaves running; starting and stopping its own: below
    cfg = dict(seeds=4, workers=2, explore=1, explore_strategy="random")  # fixed order and a schedule seed each
    local = results_json(run_sweep(SweepConfig(**cfg), minimize_findings=False).results)
    on_ray = results_json(run_sweep(SweepConfig(**cfg, ray_address="local"), minimize_findings=False).results)
    assert local == on_ray
    assert [(r["seed"], r.get("explore")) for r in json.loads(on_ray)] == [
        (s, x) for s in range(4) for x in (None, {"seed": 0, "strategy": "random"})
    ]
    assert local_ray.is_initialized()


class _RayStandIn:
    """The few calls of Ray's API that run_on_ray makes, run in this process, recording
    init and shutdown: whether the executor starts and stops a Ray of its own is its own
    logic, which the real-Ray test above (on a caller's Ray) does not reach."""

    def __init__(self, initialized):
        self.initialized, self.calls = initialized, []

    def is_initialized(self):
        return self.initialized

    def init(self, **kwargs):
        self.calls.append(("init", kwargs))
        self.initialized = True

    def shutdown(self):
        self.calls.append(("shutdown", {}))
        self.initialized = False

    def remote(self, **_options):
        def wrap(fn):
            class Task:
                @staticmethod
                def remote(*args):
                    return fn(*args)

            return Task

        return wrap

    def wait(self, refs, num_returns):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        return ref

    def cancel(self, ref, force):
        pass


@pytest.mark.parametrize(
    "address, caller_has_ray, calls",
    [
        ("local", False, [("init", {"num_cpus": 2}), ("shutdown", {})]),
        ("ray://head:10001", False, [("init", {"address": "ray://head:10001"}), ("shutdown", {})]),
        ("local", True, []),  # a caller's Ray is used as it is and left running
    ],
)
def test_the_ray_executor_starts_and_stops_only_a_ray_of_its_own(monkeypatch, address, caller_has_ray, calls):
    from simulators.fuzz import executors

    stand_in = _RayStandIn(caller_has_ray)
    monkeypatch.setitem(sys.modules, "ray", stand_in)
    jobs = [object(), object()]
    monkeypatch.setattr(executors, "isolated_job", lambda job, budget: ("ran", jobs.index(job)))
    got = list(executors.run_on_ray(jobs, address=address, workers=2, budget=None))
    assert sorted(got) == [("ran", 0), ("ran", 1)]
    assert [
        (name, {k: v for k, v in kw.items() if k in ("num_cpus", "address")}) for name, kw in stand_in.calls
    ] == calls
    assert stand_in.initialized == caller_has_ray


def test_fuzz_cli_writes_results_and_exits_by_the_allow_list(tmp_path, capsys):
    out = tmp_path / "out"

    def sweep(*extra):  # the same four seeds on two workers each time
        return main(["fuzz", "--seeds", "4", "--workers", "2", "--out", str(out), "--quiet", "--no-minimize", *extra])

    rc = sweep()
    text = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert [r["seed"] for r in results] == list(range(4))
    findings = {r["signature"] for r in results} - {CLEAN}
    assert (rc == 1) == bool(findings), text
    assert (out / "signatures.txt").read_text().strip() == text.split("\nresults:")[0].strip()
    allow = tmp_path / "allow.yaml"
    heads = sorted({from_signature(s).check for s in findings})
    entries = [{"check": h, "reason": "found by seeds 0-3"} for h in heads]
    allow.write_text(
        "# everything this range finds\n"
        + yaml.safe_dump({"expect": entries + [{"check": "oom:never", "reason": "a finding no seed makes"}]})
    )
    for flag in ("--baseline", "--expect"):  # --expect: the old name of the same option
        assert sweep(flag, str(allow)) == 0
    # --strict: the expectation no seed matched fails the sweep, and is named in the table
    assert sweep("--baseline", str(allow), "--strict") == 1
    assert "expected, not found: oom:never" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["fuzz", "--seeds", "0"], "--seeds: must be between 1 and"),
        (["fuzz", "--seeds", "5", "--workers", "0"], "--workers: must be between 1 and"),
        (["fuzz", "--seeds", "5", "--time-budget", "-1"], "--time-budget: must be in"),
        (["fuzz", "--seeds", "5", "--ray-cpus", "2"], "--ray-cpus: only with --ray local"),
        (
            ["fuzz", "--seeds", "5", "--baseline", "/nonexistent/allow.yaml"],
            "--baseline: /nonexistent/allow.yaml: cannot read",
        ),
    ],
)
def test_bad_fuzz_arguments_are_one_line_and_exit_2(argv, message, capsys, tmp_path):
    assert main(argv + ["--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_the_age0_reproducer_trains_now():
    """Fuzz's first finding (seed 4, minimized): a NeMo async pipeline with
    max_trajectory_age_steps 0 livelocked, stamping base-weight trajectories -1 while the
    published base version is 0. Stamped with the published version it trains; with more
    steps each batch is of the current version (age 0 is all the bound allows)."""
    scenario = load_scenario(os.path.join(ROOT, "examples", "fuzz", "nemo_age0_never_trains.yaml"))
    res = run_scenario(scenario)
    assert res["signature"] == CLEAN
    assert run_seed(4)["signature"] != "horizon:never_trained[nemo_async]"  # the seed it was minimized from
    longer = dataclasses.replace(scenario, pipelines=(dataclasses.replace(scenario.pipelines[0], steps=3),))
    sim = Simulation(longer).run()
    batches = [r for r in sim.records if r["kind"] == "batch_consumed"]
    assert sim.reason == "done" and [b["step"] for b in batches] == [0, 1, 2]
    assert all(set(b["staleness"]) == {"0"} for b in batches)


def test_the_known_findings_baseline_covers_a_fault_pattern_for_every_fault():
    from simulators.verdict.baseline import read_baseline
    from simulators.fuzz.sweep import _is_expected
    from simulators.scenario.spec import FAULT_NAMES, ORACLE_FAULT_NAMES

    allowed = read_baseline(os.path.join(ROOT, "examples", "fuzz", "known-findings.yaml"))
    for fault in FAULT_NAMES:
        if fault in ORACLE_FAULT_NAMES:  # fuzz never draws the oracle's own fault hooks
            assert not _is_expected(f"oom:kv_cache[nemo_async] +{fault}", allowed), fault
            continue
        assert _is_expected(f"oom:kv_cache[nemo_async] +{fault}", allowed), fault
    assert _is_expected("oom:staging[roll_sync]", allowed)
    assert _is_expected("handover[nemo_async,roll_sync]", allowed)
    # the wildcard does not swallow the rest: an unexplained finding stays unexpected
    assert not _is_expected("oom:kv_cache[nemo_async]", allowed)
    assert not _is_expected("horizon:never_trained[nemo_async]", allowed)  # the age-0 bug is fixed
    assert not _is_expected("stale_serving[nemo_async]", allowed)
    assert not _is_expected("crashed:KeyError", allowed)
