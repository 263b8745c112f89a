"""Gate launches that spend most of their time waiting: a hung rank and the deadline that
ends it, a silent peer and its stream timeout, a crashed or killed rank and the grace
window its peers and the launcher give it.

They are one xdist work unit of their own (tests/conftest.py) and take turns on a lock of
their own (tests/gates/conftest.py), so they run beside the CPU-bound gate launches of
the other gate files instead of in the same queue: their waits overlap real work. Each
test keeps the gate it breaks in its name; the gate files hold that gate's other tests.
"""

from __future__ import annotations

import os
import tempfile

import pytest

pytest.importorskip("torch")
pytest.importorskip("zmq")

pytestmark = [pytest.mark.gate, pytest.mark.waits_out_a_deadline]


# ---------------------------------------------------------------------------- dual_pipeline
def test_hung_worker_ends_in_a_failed_report_within_its_timeout(gate_runner):
    # The deadline must leave room for six ranks to reach the hang on a loaded 2-core
    # machine: if it fired first, the driver would not yet stand at SyncFromCache.
    # On a machine loaded far past its cores the ranks may not reach the hang before the
    # deadline; such a run says nothing about the hang (the driver never stood at the sync),
    # so it is tried once more with a longer deadline.
    for deadline_s in (15, 40):
        run = gate_runner("dual_pipeline", 6, "--steps", "3", "--timeout-s", str(deadline_s), hook="hang@sync_recv:2",
                          timeout_s=deadline_s + 45)
        assert run.report is not None, run.output[-3000:]
        activity = run.report["summary"].get("driver_activity") or {}
        if any("SyncFromCache" in what for what in activity.values()):
            break
    assert run.report["status"] == "failed", run.output[-3000:]
    assert "timed out" in run.report["message"] or "never reported" in run.report["message"], run.report["message"]
    assert run.elapsed_s < deadline_s + 40  # ended by its own deadline (+ grace), not by the launcher's kill
    # the report says where the driver stood and keeps its partial log
    summary = run.report["summary"]
    assert any("SyncFromCache" in what for what in summary["driver_activity"].values()), (summary["driver_activity"], run.output[-3000:])
    records = run.driver_records()
    assert any(r["kind"] == "effect_start" and r["effect"] == "SyncFromCache" for r in records)


def _aborted_in_flight(records):
    """Per Abort effect of the run, how many requests it found in flight (over its ranks)."""
    return [sum((r.get("result") or {}).get("in_flight") or []) for r in records
            if r["kind"] == "effect_end" and r["effect"] == "Abort"]


def test_a_drain_that_never_ends_fails_the_run_at_the_shrink_drain_timeout(gate_runner):
    # RLix's Bug 7: an aborted request never leaves the engine. The drain polls the rank's
    # in-flight count, gives up at the shrink-drain timeout, logs a `timeout` record and
    # fails the run (before the real drain, the shrink slept the rank with requests in it)
    # The script holds ppl1's first abort until it has requests in flight or its first batch
    # is over; in the second case (a slow machine) nothing is left to hang, so the run says
    # nothing about the drain. That is read from the log (the Abort's in-flight result), and
    # the run is tried again: at most three times.
    for _attempt in range(3):
        run = gate_runner("dual_pipeline", 6, "--steps", "3", "--timeout-s", "50", "--shrink-drain-timeout-s", "2",
                          hook="abort_never_wakes", timeout_s=90)
        if run.report["status"] != "passed" or any(_aborted_in_flight(run.driver_records())):
            break
    assert run.report["status"] == "failed" and run.returncode != 0
    assert "shrink_drain timed out after 2 s" in run.report["message"], run.report["message"]
    assert run.elapsed_s < 45, run.elapsed_s  # the drain's deadline ended it, not the gate's 50 s
    records = run.driver_records()
    timeouts = [r for r in records if r["kind"] == "timeout"]
    assert [(r["what"], r["limit_s"]) for r in timeouts] == [("shrink_drain", 2.0)]
    assert timeouts[0]["t"] - timeouts[0]["since"] >= 2.0
    pid = timeouts[0]["pipeline_id"]
    drain = [r for r in records if r["kind"] == "effect_start" and r["effect"] == "Drain" and r["pipeline_id"] == pid][-1]
    assert drain["t"] <= timeouts[0]["since"]
    assert not any(r["kind"] == "effect_end" and r["effect"] == "Drain" and r["seq"] > drain["seq"] for r in records)
    # no rank slept with requests in it: the shrink stopped at its drain
    assert not any(r["kind"] == "effect_start" and r["effect"] == "Sleep" and r["pipeline_id"] == pid
                   and r["seq"] > drain["seq"] for r in records)


def test_receivers_posted_after_the_owner_still_complete_every_sync(gate_runner):
    # What a loaded CI machine once did: the owner entered its group rendezvous before the
    # driver had posted the receivers' commands, and the run hung to its timeout.
    run = gate_runner("dual_pipeline", 6, "--steps", "3", "--timeout-s", "50", hook="late_receivers:0.5")
    assert run.report["status"] == "passed", run.report["message"]
    assert run.report["summary"]["steps_done"] == {"ppl1": 3, "ppl2": 3}


# ---------------------------------------------------------------------------- selective_sync
def test_hung_rank_ends_in_failed_report_within_timeout(gate_runner):
    run = gate_runner("selective_sync", 4, "--cycles", "2", "--timeout-s", "6", hook="hang@cycle_begin:2",
                      timeout_s=45)
    report = run.report
    assert report["status"] == "failed" and run.returncode != 0
    assert "timed out" in report["message"]
    hung = next(r for r in report["ranks"] if r["rank"] == 2)
    assert "test hook hang@cycle_begin" in hung["phase"]
    assert report["elapsed_s"] < 6 + 8
    assert run.rank_report(2) is not None and run.rank_report(2)["status"] == "failed"
    # gate runner already asserted: no orphan workers, the launch ended before the test timeout


def test_a_timed_out_sync_leaves_no_tmpfs_file(gate_runner, private_shm):
    # the IPC receiver (rank 2) hangs at the sync: the owner has already written its staging
    # file and never gets the ACK; the file goes with the owner on its way out (before:
    # rlharness_bucket_* files stayed in /dev/shm)
    run = gate_runner("selective_sync", 4, "--cycles", "1", "--timeout-s", "8", hook="hang@sync:2",
                      extra_env={"RLHARNESS_SHM_DIR": private_shm}, timeout_s=60)
    assert run.report["status"] == "failed"
    assert os.listdir(private_shm) == []


@pytest.fixture(scope="module")
def raise_at_sync(module_gate_launch, module_private_shm):
    """One launch shared by the tests about the IPC receiver (rank 2) raising at the sync:
    the run is the same, each test asserts its own part of it. (Its staging folder is
    listed right after the launch, before any other test can run.)"""
    run = module_gate_launch("selective_sync", 4, "--cycles", "1", "--timeout-s", "30", hook="raise@sync:2",
                             extra_env={"RLHARNESS_SHM_DIR": module_private_shm}, timeout_s=60)
    return run, os.listdir(module_private_shm)


def test_a_failed_sync_leaves_no_tmpfs_file(raise_at_sync):
    # as above, the receiver raising instead of hanging
    run, staged = raise_at_sync
    run.ended_cleanly()
    assert run.report["status"] == "failed"
    assert staged == []


def test_raising_rank_is_headlined_and_every_rank_reports(raise_at_sync):
    run, _ = raise_at_sync
    report = run.ended_cleanly().report
    assert report["status"] == "failed"
    assert report["message"].startswith("rank 2: rank 2 RuntimeError") and "raise@sync" in report["message"]
    assert report["missing_ranks"] == [] and len(report["ranks"]) == 4
    assert report["elapsed_s"] < 20  # well before the 30 s deadline: a crash does not wait for the watchdog


def test_ranks_are_separate_processes_in_one_gloo_group_none_the_launcher(raise_at_sync):
    # the forked launcher (the default here) changes only how a rank process starts: each
    # rank is still a process of its own in the job's gloo group, and none is the launcher
    run, _ = raise_at_sync
    report = run.ended_cleanly().report
    pids = [r["pid"] for r in report["ranks"]]
    assert len(set(pids)) == report["world_size"] == 4 and run.launcher_pid not in pids
    assert report["backend"] == "gloo"


def _rank_tracebacks(output: str) -> int:
    """Tracebacks printed by gate ranks (torchrun's own summary of failed children is not a rank's)."""
    count = 0
    for block in output.split("Traceback (most recent call last):")[1:]:
        frames = []
        for line in block.splitlines()[1:]:
            if not line.startswith("  "):
                break
            frames.append(line)
        count += any("/gpu_gates/" in line for line in frames if line.lstrip().startswith("File "))
    return count


def test_one_traceback_per_failing_rank_headlined_by_its_message(gate_runner):
    run = gate_runner("selective_sync", 4, "--cycles", "1", hook="raise@cycle_begin:2")
    assert run.report["status"] == "failed"
    assert "rank 2 RuntimeError" in run.report["message"]
    failed = [r["rank"] for r in run.report["ranks"] if r["status"] == "failed"]
    # at most one traceback per failing rank (a peer that only gave up prints a line, not a
    # traceback), and the raising rank's comes after its headline
    assert 1 <= _rank_tracebacks(run.output) <= len(failed), run.output[-4000:]
    for rank in failed:
        assert run.output.count(f"rank {rank} FAILED:") <= 1
    # the headline and its traceback are one block: no other rank's line inside it, though
    # the peers print theirs at the same moment (they are told of the failure right after)
    block = run.output[run.output.index("rank 2 FAILED: rank 2 RuntimeError"):].splitlines()
    assert block[1] == "Traceback (most recent call last):", block[:3]
    end = block.index("RuntimeError: test hook raise@cycle_begin fired")
    assert all(line.startswith("  ") for line in block[2:end]), block[:end + 1]
    assert "raise RuntimeError(f\"test hook raise@" in "\n".join(block[2:end])


# ---------------------------------------------------------------------------- refit_stream
def test_a_receiver_that_stops_answering_fails_the_sender_within_its_stream_timeout(gate_runner):
    run = gate_runner("refit_stream", 2, "--cycles", "2", "--stream-timeout-s", "3", "--timeout-s", "60",
                      hook="hang@receiver_load:1", timeout_s=180)
    report = run.report
    assert report["status"] == "failed" and run.returncode == 1
    text = " ".join(report["failures"])
    assert "refit stream with rank 1" in text and "step 0" in text and "ACK of group 0" in text, text
    assert "nothing within 3 s" in text
    assert run.elapsed_s < 120


def _run_folders(port):
    """The socket and staging folders a hand-launched gate derives for its rendezvous port."""
    from gpu_gates.transports import private_dirs

    found = []
    for base in (tempfile.gettempdir(), private_dirs.shm_base()):
        found += [os.path.join(base, n) for n in os.listdir(base) if n.startswith("rlh-") and n.endswith(f"gate-{port}")]
    return found


@pytest.mark.parametrize("hook,cycles", [("kill@stream_cycle1:0", "2"), ("kill@receiver_load:1", "1")],
                         ids=["sender killed holding its staging buffers", "receiver killed mid-stream"])
def test_a_killed_rank_leaves_no_socket_or_staging_file(gate_launch, hook, cycles):
    """Launched as by hand (no launcher-owned folders): the gate derives its run's socket
    and staging folders, and the rank that survives a SIGKILLed peer removes them, the
    dead rank's bound socket and pooled staging files included."""
    run = gate_launch("refit_stream", 2, "--cycles", cycles, "--stream-timeout-s", "5", "--timeout-s", "60",
                      hook=hook, timeout_s=180, own_folders=False)
    assert run.returncode != 0
    assert "SIGKILL" in run.output or "Signal 9" in run.output or "-9" in run.output, run.output[-2000:]
    assert _run_folders(run.port) == [], run.output[-4000:]


# ---------------------------------------------------------------------------- nccl_teardown
def test_hang_in_teardown_fails_within_timeout(gate_runner):
    run = gate_runner("nccl_teardown", 2, "--mode", "full", "--builder", "torch", "--timeout-s", "5",
                      hook="hang@teardown:1", timeout_s=40)
    report = run.report
    assert report["status"] == "failed" and run.returncode != 0
    assert "timed out" in report["message"] or "terminated" in report["message"]
    hung = next(r for r in report["ranks"] if r["rank"] == 1)
    assert "test hook hang@teardown" in hung["phase"]
