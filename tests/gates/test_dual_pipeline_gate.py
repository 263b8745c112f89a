"""Gate 4 on gloo: two pipelines time-share GPUs under the harness scheduler and control
logic; the harness invariants read the gate's own event log."""

import json

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.gate


def _driver_records(report):
    from harness.eventlog.records import read_records
    return [r.data for r in read_records(report["summary"]["outputs"]["driver_log"])]


def test_dual_pipeline_time_shares_with_every_invariant_holding(gate_runner):
    run = gate_runner("dual_pipeline", 6, "--steps", "3", "--timeout-s", "50", launcher="torchrun")
    report = run.report
    assert run.returncode == 0, run.output[-3000:]
    assert report["status"] == "passed", report["message"]
    summary = report["summary"]
    assert summary["steps_done"] == {"ppl1": 3, "ppl2": 3}
    assert summary["published_versions"] == {"ppl1": 3, "ppl2": 3}  # one bump per cache: 0 (base) .. 3
    # a cycle moved a GPU from a donor to a recipient: T1 < T2 < T3 shown in the report
    assert any("T2" in line and "T3" in line for line in summary["resize_order"]), summary["resize_order"]
    checks = {c["name"]: c["passed"] for c in run.checks("invariant:resize_order") + run.checks("invariant:versions")
              + run.checks("invariant:gpu_ownership") + run.checks("invariant:activate_after_sync")}
    assert checks and all(checks.values())
    # the event log is the harness schema and the same oracle finds nothing
    records = _driver_records(report)
    from harness.invariants import check_log
    found = check_log(records)
    # The gate runs RLix's default planned releases. A finished pipeline's end-of-run
    # await_release can land in a cycle whose gap-ratio plan re-expands that pipeline (its
    # progress stream is still open), and RLix acks it although the cluster is not at
    # zero: the premature ack the oracle reports (timing-dependent on threads). It is the
    # documented RLix hazard, not a gate fault; every other check must hold.
    assert [v for v in found if v.invariant != "planned_release_ack"] == []
    assert all("acked in cycle" in v.message and "expanded dp [" in v.message for v in found), found
    both = [r for r in records if r["kind"] == "plan" and r["shrinks"] and r["expands"]]
    assert both
    # refits really moved weights over both paths and every synced rank matched bit for bit
    gate_log = [json.loads(line) for line in open(run.event_log)]
    digests = [r for r in gate_log if r["kind"] == "digest_check"]
    assert digests and all(r["ok"] for r in digests)
    assert {r["path"] for r in gate_log if r["kind"] == "bucket_recv"} == {"broadcast"}
    assert any(r["kind"] == "refit_finalize" for r in gate_log)  # the same-GPU path is the refit stream
    from harness.invariants import check_log
    assert check_log([{**r, "seq": i} for i, r in enumerate(gate_log)], ["refit_wire"]) == []
    creates = [r for r in gate_log if r["kind"] == "group_create"]
    destroys = [r for r in gate_log if r["kind"] == "group_destroy"]
    assert creates and len(creates) == len(destroys)
    outputs = summary["outputs"]
    assert outputs["perfetto"].endswith(".trace.json") and outputs["png"].endswith(".timeline.png")
    trace = json.load(open(outputs["perfetto"]))
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])


def test_expand_before_shrink_is_caught_by_the_order_check(gate_runner):
    run = gate_runner("dual_pipeline", 6, "--steps", "3", "--timeout-s", "50", hook="swap_resize_order")
    assert run.returncode != 0
    assert run.report["status"] == "failed"
    assert "invariant:resize_order" in run.report["message"]
    assert "T1 < T2 broken" in run.report["message"] or "shrink of" in run.report["message"]


def test_receivers_posted_after_the_owner_still_complete_every_sync(gate_runner):
    # What a loaded CI machine once did: the owner entered its group rendezvous before the
    # driver had posted the receivers' commands, and the run hung to its timeout.
    run = gate_runner("dual_pipeline", 6, "--steps", "3", "--timeout-s", "50", hook="late_receivers:0.5")
    assert run.report["status"] == "passed", run.report["message"]
    assert run.report["summary"]["steps_done"] == {"ppl1": 3, "ppl2": 3}


@pytest.mark.waits_out_a_deadline
def test_hung_worker_ends_in_a_failed_report_within_its_timeout(gate_runner):
    # The deadline must leave room for six ranks to reach the hang on a loaded 2-core
    # machine: if it fired first, the driver would not yet stand at SyncFromCache.
    run = gate_runner("dual_pipeline", 6, "--steps", "3", "--timeout-s", "15", hook="hang@sync_recv:2", timeout_s=60)
    assert run.report is not None, run.output[-3000:]
    assert run.report["status"] == "failed", run.output[-3000:]
    assert "timed out" in run.report["message"] or "never reported" in run.report["message"], run.report["message"]
    assert run.elapsed_s < 55  # ended by its own deadline (15 s + grace), not by the launcher's kill
    # the report says where the driver stood and keeps its partial log
    summary = run.report["summary"]
    assert any("SyncFromCache" in what for what in summary["driver_activity"].values()), (summary["driver_activity"], run.output[-3000:])
    records = _driver_records(run.report)
    assert any(r["kind"] == "effect_start" and r["effect"] == "SyncFromCache" for r in records)


def test_wrong_world_size_is_a_skip_with_reason(gate_runner):
    run = gate_runner("dual_pipeline", 2, "--steps", "3")  # any world but 6; 2 ranks start fastest
    assert run.report["status"] == "skipped" and "exactly 6 ranks" in run.report["message"]
