"""Leader-only write-back under torchrun (gloo, DP 2 x TP 2): clean with the leader gate,
a -601-class finding without it, whether the store refuses the rewrite or overwrites.
The four-rank runs are forked (tests/gates/launch_forked.py); the documented command
(each rank a ``python gpu_gates/dataplane_writeback.py`` of its own) runs on one rank."""

import json

import pytest

pytest.importorskip("torch")

from harness.exit_codes import ExitCode  # noqa: E402
from harness.logs.invariants import check_log  # noqa: E402

pytestmark = pytest.mark.gate


def oracle(run):
    records = [json.loads(line) for line in run.event_log.read_text().splitlines()]
    return records, [str(v) for v in check_log(records, ["data_plane"])]


def test_leader_gate_on_gives_one_write_per_sample_field_per_replica(gate_runner):
    run = gate_runner("dataplane_writeback", 4, "--tp", "2", "--cycles", "2")
    assert run.returncode == 0 and run.report["status"] == "passed", run.output[-3000:]
    s = run.report["summary"]
    assert (s["dp"], s["tp"], s["leader_gate"], s["refused_writes"]) == (2, 2, True, 0)
    assert s["ledger_writes"] == s["ledger_keys"] == 16 and s["ledger_max_writes_per_key"] == 1
    assert s["ledger_writers"] == ["dp0/tp0", "dp1/tp0"]
    assert len(run.checks("broadcast_matches_put")) == 4 * 2 and all(
        c["passed"] for c in run.checks("broadcast_matches_put")
    )
    records, violations = oracle(run)
    assert violations == []
    hops = {r["hop"] for r in records if r["kind"] == "dp_transfer"}
    assert hops == {"producer_to_store", "driver_meta", "store_to_worker", "leader_to_siblings", "worker_to_store"}
    # the siblings never read the store: only the two leaders did
    assert sorted(r["actor"] for r in records if r.get("hop") == "store_to_worker") == [
        "dp0/tp0",
        "dp0/tp0",
        "dp1/tp0",
        "dp1/tp0",
    ]
    assert (
        sum(
            r["bytes"]
            for r in records
            if r["kind"] == "dp_transfer" and r["role"] == "driver" and r["hop"] != "driver_meta"
        )
        == 0
    )


def test_under_plain_torchrun_the_gate_file_runs_to_its_report_and_exit_code(gate_runner):
    # the documented command on one rank: the gate file as a program, through its check of
    # the world (one rank is no TP pair), to its report and the skip exit code, which
    # torchrun passes on as a failure (four ranks would be five imports of torch)
    run = gate_runner("dataplane_writeback", 1, launcher="torchrun")
    assert run.report["status"] == "skipped" and "world size 1 is not a multiple of --tp 2" in run.report["message"]
    assert run.report["exit_code"] == ExitCode.SKIPPED and run.returncode != 0


def test_gate_off_with_a_refusing_store_is_reported_as_601(gate_runner):
    run = gate_runner("dataplane_writeback", 4, "--overwrite", "refuse", hook="leader_gate_off")
    assert run.returncode == 1 and run.report["status"] == "failed"
    # which sibling's put lands first is a race: the refused one may be the leader, and
    # then rank 0's ledger check names the non-leader writer; both are the -601 class
    assert "-601" in run.report["message"] and "class" in run.report["message"], run.report["message"]
    assert any("-601 ILLEGAL_CLIENT class" in c["detail"] for c in run.checks("no_duplicate_write"))
    assert run.report["summary"]["refused_writes"] == 4  # one sibling per replica per step
    _, violations = oracle(run)
    assert violations and all("-601 class" in v for v in violations)


def test_gate_off_with_a_silently_overwriting_store_is_still_caught(gate_runner):
    run = gate_runner("dataplane_writeback", 4, "--overwrite", "upsert", hook="leader_gate_off")
    assert run.returncode == 1 and run.report["status"] == "failed"
    assert "one_write_per_sample_field" in run.report["message"] and "-601 class" in run.report["message"]
    assert run.report["summary"]["ledger_max_writes_per_key"] == 2
    _, violations = oracle(run)
    assert any("wrote 4 row(s) already written" in v for v in violations)


def test_transferqueue_mode_needs_the_launcher_and_upsert(monkeypatch):
    """--store transferqueue: only under gpu_gates/tq_host.py, and never with a refusal TQ
    cannot make atomic across processes (checked before any rank starts work)."""
    import argparse

    from gpu_gates.dataplane_writeback import check_world
    from gpu_gates.tq_host import CONF_ENV

    def args(**kw):
        return argparse.Namespace(**{"tp": 2, "samples": 8, "overwrite": None, "store": "transferqueue", **kw})

    monkeypatch.delenv(CONF_ENV, raising=False)
    assert f"{CONF_ENV} is not set; run the gate under gpu_gates/tq_host.py" in check_world(args(), 4)
    assert "--overwrite refuse: needs --store served" in check_world(args(overwrite="refuse"), 4)
    monkeypatch.setenv(CONF_ENV, "/nonexistent/conf.pkl")
    a = args()
    assert check_world(a, 4) is None and a.overwrite == "upsert"
    s = args(store="served")
    assert check_world(s, 4) is None and s.overwrite == "refuse"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--"], "command: nothing to run"),
        (["--num-cpus", "1", "--", "true"], "--num-cpus: 1 leaves TQ's controller or storage unit without a CPU"),
    ],
)
def test_tq_host_usage_errors_exit_2_before_starting_ray(argv, message, capsys):
    from gpu_gates.tq_host import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err
