"""Every gate check can fail, and every exit path reports: each test breaks one thing on
purpose and sees the gate say so (gates that can fail, gate exit paths)."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.gate


# ---------------------------------------------------------------------------- selective_sync
def test_world_sized_sync_group_fails_the_proper_subset_check(gate_runner):
    run = gate_runner("selective_sync", 4, "--cycles", "1", hook="world_sync_group")
    assert run.returncode != 0 and run.report["status"] == "failed"
    assert "sync_group_proper_subset" in run.report["message"]
    assert "[0, 1, 2, 3] is the whole world" in run.report["message"]
    fired = [c for c in run.checks("sync_group_proper_subset") if not c["passed"]]
    assert len(fired) == 4  # every member of the world-sized group sees it


def test_a_deadline_during_the_send_leaves_no_tmpfs_file(private_shm, gate_launch):
    # the reproduction: a deadline too short for the sync (20 cycles take seconds on
    # any machine, so the 0.3 s deadline always lands mid-run, where the sends are)
    run = gate_launch(
        "selective_sync",
        4,
        "--cycles",
        "20",
        "--timeout-s",
        "0.3",
        extra_env={"RLHARNESS_SHM_DIR": private_shm},
        timeout_s=60,
    )
    assert run.returncode != 0
    assert os.listdir(private_shm) == []


# ---------------------------------------------------------------------------- exit paths
def test_a_bad_flag_prints_usage_once(gate_launch):
    # two ranks are enough to show it: a usage printed per rank would appear twice
    run = gate_launch("selective_sync", 2, "--no-such-flag", timeout_s=60)
    assert run.returncode != 0 and run.report is None
    assert run.output.count("usage: gpu_gates/selective_sync.py") == 1, run.output[-3000:]
    assert run.output.count("unrecognized arguments: --no-such-flag") == 1


def test_an_unwritable_report_path_is_a_usage_error_before_any_work(gate_launch, tmp_path):
    report = tmp_path / "missing" / "report.json"
    run = gate_launch("nccl_teardown", 2, "--report", str(report), timeout_s=60)
    assert run.returncode != 0 and not report.exists()
    assert run.output.count(f"folder {report.parent} does not exist") == 1, run.output[-3000:]
    assert "gate_start" not in run.output


def test_a_usage_error_is_printed_whole_however_late_rank_0_is(gate_launch, tmp_path):
    """Every rank exits 2 on a usage error and torchrun's agent ends the job at the first:
    the others wait until rank 0 has printed the message (rank 0 late here)."""
    report = tmp_path / "missing" / "report.json"
    run = gate_launch("nccl_teardown", 2, "--report", str(report), hook="late_usage_error:1.5", timeout_s=60)
    assert run.returncode != 0 and run.elapsed_s >= 1.5
    assert run.output.count("usage: gpu_gates/nccl_teardown.py") == 1, run.output[-3000:]
    assert run.output.count(f"error: {report}: folder {report.parent} does not exist") == 1, run.output[-3000:]


def test_a_report_that_cannot_be_written_is_a_non_zero_exit(gate_launch):
    run = gate_launch(
        "nccl_teardown",
        2,
        "--mode",
        "full",
        "--builder",
        "torch",
        "--cycles",
        "1",
        hook="fail_report_write",
        timeout_s=60,
    )
    assert run.report is None  # the gate itself passed, but nobody can read its verdict
    assert run.returncode != 0, run.output[-3000:]
    assert "could not write the report" in run.output and "test hook fail_report_write" in run.output


# ---------------------------------------------------------------------------- dual_pipeline
def test_dual_gate_fails_when_no_cycle_shrank_and_expanded(gate_runner):
    # ppl2 starts after ppl1 finished: no GPU ever changes hands between them, so the
    # T1 < T2 < T3 check has nothing to check — the gate itself must fail, not only a test
    run = gate_runner("dual_pipeline", 6, "--steps", "3", "--timeout-s", "90", hook="solo_pipelines", timeout_s=150)
    assert run.report["status"] == "failed" and run.returncode != 0
    assert "shrink_expand_cycle" in run.report["message"], run.report["message"]
    assert run.report["summary"]["steps_done"] == {"ppl1": 3, "ppl2": 3}


def test_dual_gate_names_a_sync_group_that_outlives_its_close(gate_runner):
    run = gate_runner("dual_pipeline", 6, "--steps", "3", "--timeout-s", "50", hook="leak_sync_group", timeout_s=120)
    assert run.report["status"] == "failed" and run.returncode != 0
    assert "still alive after its close" in run.report["message"], (
        run.report["message"],
        run.report.get("failures"),
        run.output[-6000:],
    )
    gate_log = [json.loads(line) for line in open(run.event_log)]
    destroyed = {r["name"] for r in gate_log if r["kind"] == "group_destroy"}
    created = {r["name"] for r in gate_log if r["kind"] == "group_create"}
    assert created and not (created & destroyed)  # no group_destroy logged for a group that is not gone
    survivors = [c for c in run.checks("no_group_survives") if not c["passed"]]
    assert survivors and "direct:" in survivors[0]["detail"]
