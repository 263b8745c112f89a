"""Gate launches that spend most of their time waiting: a hung rank and the deadline that
ends it, a silent peer and its stream timeout, a crashed or killed rank and the grace
window its peers and the launcher give it.

They are one xdist work unit of their own (tests/conftest.py) and take turns on a lock of
their own (tests/gates/conftest.py), so they run beside the CPU-bound gate launches of
the other gate files instead of in the same queue: their waits overlap real work. Within
the module the launches run side by side too (``SideBySide``: every launch starts when
the module does, three at a time, the six-rank runs one at a time), so the module takes
about as long as its longest waits, not their sum; each test asserts on its own
launch's result. Deadlines and grace windows are as short as the behaviour allows: a
hang is ended by a deadline of a few seconds as surely as by one of twenty, and a run
whose hung rank did not reach its hang before the deadline (a machine loaded far past
its cores) says nothing about the hang, so it is tried again with a long deadline.
Each test keeps the gate it breaks in its name; the gate files hold that gate's other
tests.
"""

from __future__ import annotations

import os
import re
import tempfile

import pytest

from tests.gates.conftest import SideBySide, _one_gate_at_a_time

pytest.importorskip("torch")
pytest.importorskip("zmq")

pytestmark = [pytest.mark.gate, pytest.mark.waits_out_a_deadline]


# ---------------------------------------------------------------------------- the jobs
# Each job launches (and, where its run did not reach the point it breaks, relaunches)
# one gate run; `heavy`: a six-rank run that works through its steps.


def _hung_worker(launch):
    # The deadline must leave room for six ranks to reach the hang: if it fired first, the
    # driver would not yet stand at SyncFromCache (about 1.5 s into the run on a quiet
    # machine). Such a run says nothing about the hang, so it is tried once more with a
    # longer deadline. Both stay under the workload script's own wait
    # (gpu_gates/dual/script.py LIMIT_S, 20 s, which starts at about the hang): a deadline
    # past it would let the driver give up first and headline that instead.
    for deadline_s in (8, 18):
        run = launch(
            "dual_pipeline",
            6,
            "--steps",
            "3",
            "--timeout-s",
            str(deadline_s),
            hook="hang@sync_recv:2",
            timeout_s=deadline_s + 45,
        )
        activity = ((run.report or {}).get("summary") or {}).get("driver_activity") or {}
        if run.report is None or any("SyncFromCache" in what for what in activity.values()):
            break
    return run, deadline_s


def _aborted_in_flight(records):
    """Per Abort effect of the run, how many requests it found in flight (over its ranks)."""
    return [
        sum((r.get("result") or {}).get("in_flight") or [])
        for r in records
        if r["kind"] == "effect_end" and r["effect"] == "Abort"
    ]


def _drain_never_ends(launch):
    # The script holds ppl1's first abort until it has requests in flight or its first batch
    # is over; in the second case (a slow machine) nothing is left to hang, so the run says
    # nothing about the drain. That is read from the log (the Abort's in-flight result), and
    # the run is tried again: at most three times.
    for _attempt in range(3):
        run = launch(
            "dual_pipeline",
            6,
            "--steps",
            "3",
            "--timeout-s",
            "50",
            "--shrink-drain-timeout-s",
            "2",
            hook="abort_never_wakes",
            timeout_s=90,
        ).ended_cleanly()
        if run.report["status"] != "passed" or any(_aborted_in_flight(run.driver_records())):
            break
    return run


def _reached(run, rank: int, hook: str) -> bool:
    """Whether ``rank`` stood at the hang of ``hook`` when the deadline ended the run."""
    ranks = (run.report or {}).get("ranks") or []
    return any(r["rank"] == rank and f"test hook {hook}" in (r.get("phase") or "") for r in ranks)


def _hang_until_deadline(launch, gate, nproc, rank, hook, args, deadlines=(3, 20), **kwargs):
    """A run whose ``rank`` hangs at ``hook`` (``hang@POINT:RANK``), under a deadline of a
    few seconds, tried again with a long one if the rank had not reached the hang."""
    for deadline_s in deadlines:
        run = launch(gate, nproc, *args, "--timeout-s", str(deadline_s), hook=hook, timeout_s=deadline_s + 40, **kwargs)
        if run.report is None or _reached(run, rank, hook.split(":")[0]):
            break
    return run, deadline_s


def _in_private_shm(job):
    """``job(launch, folder)`` with a private staging folder, and what was left in it."""

    def run(launch):
        from tests.gates.conftest import private_shm_folder

        with private_shm_folder() as folder:
            result = job(launch, {"RLHARNESS_SHM_DIR": folder})
            return result, os.listdir(folder)

    return run


def _killed(hook, cycles):
    return lambda launch: launch(
        "refit_stream",
        2,
        "--cycles",
        cycles,
        "--stream-timeout-s",
        "5",
        "--timeout-s",
        "20",
        hook=hook,
        timeout_s=120,
        own_folders=False,
    )


KILLS = {
    "sender killed holding its staging buffers": ("kill@stream_cycle1:0", "2"),
    "receiver killed mid-stream": ("kill@receiver_load:1", "1"),
}

# Started in this order, three at a time (the longest waits first, the six-rank runs spread out).
JOBS = {
    "hung worker": (_hung_worker, True),
    "receiver stops answering": (
        lambda launch: launch(
            "refit_stream",
            2,
            "--cycles",
            "2",
            "--stream-timeout-s",
            "3",
            "--timeout-s",
            "20",
            hook="hang@receiver_load:1",
            timeout_s=120,
        ),
        False,
    ),
    "hung rank": (
        lambda launch: _hang_until_deadline(launch, "selective_sync", 4, 2, "hang@cycle_begin:2", ("--cycles", "2")),
        False,
    ),
    "timed-out sync": (
        _in_private_shm(
            lambda launch, env: _hang_until_deadline(
                launch, "selective_sync", 4, 2, "hang@sync:2", ("--cycles", "1"), extra_env=env
            )
        ),
        False,
    ),
    "killed: sender killed holding its staging buffers": (
        _killed(*KILLS["sender killed holding its staging buffers"]),
        False,
    ),
    "late receivers": (
        lambda launch: launch("dual_pipeline", 6, "--steps", "3", "--timeout-s", "50", hook="late_receivers:0.5"),
        True,
    ),
    "killed: receiver killed mid-stream": (_killed(*KILLS["receiver killed mid-stream"]), False),
    "drain never ends": (_drain_never_ends, True),
    "raise at sync": (
        _in_private_shm(
            lambda launch, env: launch(
                "selective_sync",
                4,
                "--cycles",
                "1",
                "--timeout-s",
                "20",
                hook="raise@sync:2",
                extra_env=env,
                timeout_s=60,
            )
        ),
        False,
    ),
    "raise at cycle begin": (
        lambda launch: launch("selective_sync", 4, "--cycles", "1", "--timeout-s", "20", hook="raise@cycle_begin:2"),
        False,
    ),
    "hang in teardown": (
        lambda launch: _hang_until_deadline(
            launch, "nccl_teardown", 2, 1, "hang@teardown:1", ("--mode", "full", "--builder", "torch")
        ),
        False,
    ),
}


@pytest.fixture(scope="module")
def waits(tmp_path_factory):
    """Every launch of this module, side by side, in one turn of the lane ``waits``."""
    with _one_gate_at_a_time(tmp_path_factory.mktemp("waits-lane"), "waits"):
        batch = SideBySide(tmp_path_factory, "waits", JOBS)
        try:
            yield batch
        finally:
            batch.close()


# ---------------------------------------------------------------------------- dual_pipeline
def test_hung_worker_ends_in_a_failed_report_within_its_timeout(waits):
    run, deadline_s = waits["hung worker"]
    run.ended_cleanly()
    assert run.report["status"] == "failed", run.output[-3000:]
    assert "timed out" in run.report["message"] or "never reported" in run.report["message"], run.report["message"]
    assert run.elapsed_s < deadline_s + 40  # ended by its own deadline (+ grace), not by the launcher's kill
    # the report says where the driver stood and keeps its partial log
    summary = run.report["summary"]
    assert any("SyncFromCache" in what for what in summary["driver_activity"].values()), (
        summary["driver_activity"],
        run.output[-3000:],
    )
    records = run.driver_records()
    assert any(r["kind"] == "effect_start" and r["effect"] == "SyncFromCache" for r in records)


def test_a_drain_that_never_ends_fails_the_run_at_the_shrink_drain_timeout(waits):
    # RLix's Bug 7: an aborted request never leaves the engine. The drain polls the rank's
    # in-flight count, gives up at the shrink-drain timeout, logs a `timeout` record and
    # fails the run (before the real drain, the shrink slept the rank with requests in it)
    run = waits["drain never ends"]
    assert run.report["status"] == "failed" and run.returncode != 0
    # the driver's own error heads the report (rank 0 records it before its knock-on abort),
    # whether or not every peer reports before the collection window closes
    message = run.report["message"]
    assert message.startswith("rank 0: driver: ") and "shrink_drain timed out after 2 s" in message, (
        run.report["message"],
        run.report.get("failures"),
        run.output[-6000:],
    )
    assert run.elapsed_s < 45, run.elapsed_s  # the drain's deadline ended it, not the gate's 50 s
    records = run.driver_records()
    timeouts = [r for r in records if r["kind"] == "timeout"]
    assert [(r["what"], r["limit_s"]) for r in timeouts] == [("shrink_drain", 2.0)]
    assert timeouts[0]["t"] - timeouts[0]["since"] >= 2.0
    pid = timeouts[0]["pipeline_id"]
    drain = [r for r in records if r["kind"] == "effect_start" and r["effect"] == "Drain" and r["pipeline_id"] == pid][
        -1
    ]
    assert drain["t"] <= timeouts[0]["since"]
    assert not any(r["kind"] == "effect_end" and r["effect"] == "Drain" and r["seq"] > drain["seq"] for r in records)
    # no rank slept with requests in it: the shrink stopped at its drain
    assert not any(
        r["kind"] == "effect_start" and r["effect"] == "Sleep" and r["pipeline_id"] == pid and r["seq"] > drain["seq"]
        for r in records
    )


def test_receivers_posted_after_the_owner_still_complete_every_sync(waits):
    # What a loaded CI machine once did: the owner entered its group rendezvous before the
    # driver had posted the receivers' commands, and the run hung to its timeout.
    run = waits["late receivers"].ended_cleanly()
    assert run.report["status"] == "passed", run.report["message"]
    assert run.report["summary"]["steps_done"] == {"ppl1": 3, "ppl2": 3}


# ---------------------------------------------------------------------------- selective_sync
def test_hung_rank_ends_in_failed_report_within_timeout(waits):
    run, deadline_s = waits["hung rank"]
    report = run.ended_cleanly().report
    assert report["status"] == "failed" and run.returncode != 0
    assert "timed out" in report["message"]
    hung = next(r for r in report["ranks"] if r["rank"] == 2)
    assert "test hook hang@cycle_begin" in hung["phase"]
    assert report["elapsed_s"] < deadline_s + 8
    # the hung rank's watchdog printed where each of its threads was: the hook's sleep
    # (only rank 2 runs the hook, so its frame is rank 2's)
    assert re.search(
        r"rank 2 timed out: deadline passed while in phase '.*test hook hang@cycle_begin.*'; its threads:", run.output
    ), run.output[-4000:]
    assert re.search(r'File ".*/gpu_gates/runtime/hooks.py", line \d+ in act\n', run.output), run.output[-4000:]
    assert run.rank_report(2) is not None and run.rank_report(2)["status"] == "failed"
    # ended_cleanly: no orphan workers, the launch ended before the test timeout


def test_a_timed_out_sync_leaves_no_tmpfs_file(waits):
    # the IPC receiver (rank 2) hangs at the sync: the owner has already written its staging
    # file and never gets the ACK; the file goes with the owner on its way out (before:
    # rlharness_bucket_* files stayed in /dev/shm)
    (run, _deadline_s), staged = waits["timed-out sync"]
    run.ended_cleanly()
    assert run.report["status"] == "failed"
    assert _reached(run, 2, "hang@sync"), run.report["ranks"]
    assert staged == []


def test_a_failed_sync_leaves_no_tmpfs_file(waits):
    # as above, the receiver (rank 2) raising instead of hanging; the tests below read the
    # same run, each its own part of it
    run, staged = waits["raise at sync"]
    run.ended_cleanly()
    assert run.report["status"] == "failed"
    assert staged == []


def test_raising_rank_is_headlined_and_every_rank_reports(waits):
    run, _ = waits["raise at sync"]
    report = run.ended_cleanly().report
    assert report["status"] == "failed"
    assert report["message"].startswith("rank 2: rank 2 RuntimeError") and "raise@sync" in report["message"]
    assert report["missing_ranks"] == [] and len(report["ranks"]) == 4
    assert report["elapsed_s"] < 14  # well before the 20 s deadline: a crash does not wait for the watchdog


def test_ranks_are_separate_processes_in_one_gloo_group_none_the_launcher(waits):
    # the forked launcher (the default here) changes only how a rank process starts: each
    # rank is still a process of its own in the job's gloo group, and none is the launcher
    run, _ = waits["raise at sync"]
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


def test_one_traceback_per_failing_rank_headlined_by_its_message(waits):
    run = waits["raise at cycle begin"].ended_cleanly()
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
    block = run.output[run.output.index("rank 2 FAILED: rank 2 RuntimeError") :].splitlines()
    assert block[1] == "Traceback (most recent call last):", block[:3]
    end = block.index("RuntimeError: test hook raise@cycle_begin fired")
    assert all(line.startswith("  ") for line in block[2:end]), block[: end + 1]
    assert 'raise RuntimeError(f"test hook raise@' in "\n".join(block[2:end])


# ---------------------------------------------------------------------------- refit_stream
def test_a_receiver_that_stops_answering_fails_the_sender_within_its_stream_timeout(waits):
    run = waits["receiver stops answering"]
    report = run.ended_cleanly().report
    assert report["status"] == "failed" and run.returncode == 1
    text = " ".join(report["failures"])
    assert "refit stream with rank 1" in text and "step 0" in text and "ACK of group 0" in text, text
    assert "nothing within 3 s" in text
    assert run.elapsed_s < 60


def _run_folders(port):
    """The socket and staging folders a hand-launched gate derives for its rendezvous port."""
    from gpu_gates.transports import private_dirs

    found = []
    for base in (tempfile.gettempdir(), private_dirs.shm_base()):
        found += [
            os.path.join(base, n) for n in os.listdir(base) if n.startswith("rlh-") and n.endswith(f"gate-{port}")
        ]
    return found


@pytest.mark.parametrize("name", list(KILLS))
def test_a_killed_rank_leaves_no_socket_or_staging_file(waits, name):
    """Launched as by hand (no launcher-owned folders): the gate derives its run's socket
    and staging folders, and the rank that survives a SIGKILLed peer removes them, the
    dead rank's bound socket and pooled staging files included."""
    run = waits[f"killed: {name}"].ended_cleanly(report=False)
    assert run.returncode != 0
    assert "SIGKILL" in run.output or "Signal 9" in run.output or "-9" in run.output, run.output[-2000:]
    assert _run_folders(run.port) == [], run.output[-4000:]


# ---------------------------------------------------------------------------- nccl_teardown
def test_hang_in_teardown_fails_within_timeout(waits):
    run, _deadline_s = waits["hang in teardown"]
    report = run.ended_cleanly().report
    assert report["status"] == "failed" and run.returncode != 0
    assert "timed out" in report["message"] or "terminated" in report["message"]
    hung = next(r for r in report["ranks"] if r["rank"] == 1)
    assert "test hook hang@teardown" in hung["phase"]
