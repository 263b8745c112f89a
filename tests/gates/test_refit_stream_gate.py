"""The refit stream gate on gloo/CPU: sender and receiver processes under torchrun,
bit-exact syncs, per-group timings, ``refit_wire`` on its event log, and its failures."""

import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("zmq")

pytestmark = pytest.mark.gate


def test_refit_stream_gate_passes_bit_exact_with_timings_and_a_clean_wire(gate_runner, private_shm):
    run = gate_runner(
        "refit_stream",
        2,
        "--cycles",
        "3",
        timeout_s=180,
        extra_env={"RLHARNESS_SHM_DIR": private_shm},
        launcher="torchrun",
    )
    report = run.report
    assert run.returncode == 0, run.output[-3000:]
    assert report["status"] == "passed" and report["missing_ranks"] == []
    summary = report["summary"]
    assert summary["transport"] == ["cpu_shm"] and summary["refit_wire_violations"] == 0
    assert list(summary["cycles"]) == ["cycle 0", "cycle 1", "cycle 2"]
    for cycle in summary["cycles"].values():
        # default budget 16 KiB: the 16 KiB embedding and its transposed view go alone
        buffers = [g["buffer"] for g in cycle["per_group"]]
        assert buffers.count("dedicated") == 2 and {"0", "1"} <= set(buffers)
        for g in cycle["per_group"]:
            assert {"pack_s", "send_s", "ack_wait_s", "load_s"} <= set(g) and g["load_s"] is not None
        assert cycle["bytes_per_s"] > 0 and 0.0 <= cycle["overlap_share_of_load"] <= 1.0
    assert len(run.checks("bit_exact")) == 3 and all(c["passed"] for c in run.checks("bit_exact"))
    assert all(c["passed"] for c in run.checks("weights_changed"))
    # the oracle reads the merged event log: refit_wire holds on it
    from harness.logs.records import read_records
    from harness.logs.invariants import check_log

    records = [r.data for r in read_records(str(run.event_log))]
    kinds = {r["kind"] for r in records}
    assert {"refit_group_send", "refit_ack", "refit_complete_send", "refit_group_recv", "refit_finalize"} <= kinds
    assert check_log(records, ["refit_wire"]) == []
    assert os.listdir(private_shm) == []  # the gate removed its own staging files


def test_a_load_that_fails_is_acked_reported_at_complete_and_never_finalized(gate_runner):
    run = gate_runner("refit_stream", 2, "--cycles", "1", hook="raise@receiver_load:1", timeout_s=180)
    report = run.report
    assert report["status"] == "failed"
    text = " ".join(report["failures"])
    assert "rank 1" in text and "not finalized" in text and "test hook raise@receiver_load fired" in text, text
    assert not any(f.startswith("rank 0:") for f in report["failures"]), report["failures"]  # the sender got every ACK
