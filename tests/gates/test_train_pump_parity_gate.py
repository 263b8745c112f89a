"""The train-pump parity gate on gloo: streaming split-API training with data parallelism
equals the synchronous full-batch step (an independent reference); a wrong normalizer or a
wrong loss in the trainer fails it."""

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.gate


def test_streaming_split_api_under_dp_equals_the_synchronous_step(gate_runner):
    run = gate_runner("train_pump_parity", 2, "--cycles", "2", launcher="torchrun")
    report = run.report
    assert run.returncode == 0, run.output[-3000:]
    assert report["status"] == "passed" and report["backend"] == "gloo" and report["world_size"] == 2
    lt = report["summary"]["loss_types"]
    assert set(lt) == {"token", "sequence"}
    for info in lt.values():
        assert info["close"] and info["steps"] == 2 and info["max_abs_err"] <= 1e-6
    for name, per_rank_steps in (("parity", 4), ("loss", 4), ("leader_metrics", 4), ("version", 4), ("no_sync", 8)):
        got = run.checks(name)
        assert len(got) == 2 * per_rank_steps and all(c["passed"] for c in got), name
    records_mod = pytest.importorskip("harness.logs.records")
    from harness.logs.invariants import check_log

    records = [r.data for r in records_mod.read_records(str(run.event_log))]
    steps = [r for r in records if r["kind"] == "trainer_step"]
    assert {r["pipeline_id"] for r in steps} == {"token/rank0", "token/rank1", "sequence/rank0", "sequence/rank1"}
    assert check_log(records, ["streaming_step"]) == []  # on the gate's own log
    assert sorted({r["version"] for r in steps if r["action"] == "finish"}) == [1, 2]


def test_bf16_parity_within_the_documented_tolerance(gate_runner):
    run = gate_runner("train_pump_parity", 2, "--cycles", "2", "--dtype", "bf16", "--loss-type", "token")
    assert run.returncode == 0, run.output[-3000:]
    info = run.report["summary"]["loss_types"]["token"]
    assert info["close"] and (info["rtol"], info["atol"]) == (2e-2, 1e-2)
    assert 0 < info["max_abs_err"] <= 1e-2  # bf16 rounding shows, within tolerance


@pytest.mark.parametrize("fault", ["wrong_normalizer", "wrong_loss"])
def test_a_wrong_normalizer_or_loss_in_the_trainer_fails_parity(gate_runner, fault):
    """The faults are installed through the test-hook variable. ``wrong_loss`` breaks the
    trainer's loss helper itself: a reference calling that helper would have passed."""
    run = gate_runner("train_pump_parity", 2, "--cycles", "1", hook=fault)
    assert run.returncode == 1, run.output[-3000:]
    assert run.report["status"] == "failed" and "parity" in run.report["message"]
    assert not any(info["close"] for info in run.report["summary"]["loss_types"].values())
    assert any(not c["passed"] for c in run.checks("parity")) and any(not c["passed"] for c in run.checks("loss"))
    assert all(c["passed"] for c in run.checks("version"))  # the protocol itself was fine
    assert all(c["passed"] for c in run.checks("leader_metrics"))  # and so were the counts


@pytest.mark.parametrize("fault", [None, "chunk_grads_lost"])
def test_chunked_steps_pass_and_lost_chunk_gradients_fail_parity(gate_runner, fault):
    kw = {"hook": fault} if fault else {}
    run = gate_runner("train_pump_parity", 2, "--cycles", "1", "--chunks", "3", "--loss-type", "token", **kw)
    info = run.report["summary"]["loss_types"]["token"]
    if fault is None:
        assert run.returncode == 0, run.output[-3000:]
        assert info["close"] and info["max_abs_err"] <= 1e-6
    else:
        assert run.returncode == 1, run.output[-3000:]
        assert not info["close"] and any(not c["passed"] for c in run.checks("parity"))
        assert all(c["passed"] for c in run.checks("leader_metrics"))  # the counts still covered every chunk
