"""Gate 2.5 Part 2 on gloo: bit-exact selective sync, both transport paths, and its failures."""

import json
import socket

import pytest

from harness.exit_codes import ExitCode

pytest.importorskip("torch")

pytestmark = pytest.mark.gate


def test_selective_sync_passes_with_ipc_and_broadcast_paths(gate_runner):
    # forked (4 ranks under plain torchrun are 5 imports of torch); the gate's plain
    # torchrun launch is test_under_plain_torchrun_the_gate_file_runs_to_its_report_and_exit_code's
    run = gate_runner("selective_sync", 4, "--cycles", "3")
    report = run.report
    assert run.returncode == 0, run.output[-3000:]
    assert report["status"] == "passed" and report["exit_code"] == 0
    assert report["backend"] == "gloo" and report["world_size"] == 4 and report["missing_ranks"] == []
    cycles = report["summary"]["cycles"]
    assert list(cycles) == ["cycle 0", "cycle 1", "cycle 2"]
    # cycle 0: both paths; then targets alternate so each receiver is a non-target once.
    assert (cycles["cycle 0"]["ipc_ranks"], cycles["cycle 0"]["broadcast_ranks"]) == ([2], [3])
    assert cycles["cycle 1"]["targets"] == [3] and cycles["cycle 2"]["targets"] == [2]
    assert all(c["status"] == "passed" and c["buckets"] >= 2 for c in cycles.values())
    assert report["summary"]["ipc_transport"] == ["zmq_stream"]
    bit_exact = run.checks("bit_exact")
    assert len(bit_exact) == 4 and all(c["passed"] for c in bit_exact)
    untouched = run.checks("non_target_untouched")
    assert len(untouched) == 2 and all(c["passed"] for c in untouched)
    assert all(c["passed"] for c in run.checks("no_group_survives"))
    assert len(run.checks("no_group_survives")) == 12
    assert all(c["passed"] for c in run.checks("weights_changed"))
    assert all(c["passed"] for c in run.checks("sync_group_proper_subset"))
    cpu_samples = [m for r in report["ranks"] for m in r["memory"]]
    assert cpu_samples and all(m["informational"] for m in cpu_samples)
    _check_event_log(run)
    _check_same_sync_as_the_simulator(run)


def _sim_sync_sequence(model_bytes: int, bucket_bytes: int):
    """The simulator's first sync to dp ranks [0, 1] — dp 0 on the cache owner's GPU (IPC
    path), dp 1 on the other GPU (broadcast) — as (bucket, path, dp_ranks) records."""
    from simulators.runtime.simulation import Simulation
    from simulators.scenario.spec import ClusterSpec, CostSpec, ModelSpec, PipelineSpec, Scenario

    scenario = Scenario(
        name="parity",
        cluster=ClusterSpec(nodes=1, gpus_per_node=2),
        pipelines=(
            PipelineSpec(
                "p", "nemo_async", (0,), (0, 1), model=ModelSpec(params=model_bytes, bytes_per_param=1), steps=1
            ),
        ),
        costs=CostSpec(bucket_bytes=bucket_bytes),
    )
    records = Simulation(scenario).run().records
    return _first_sync(records, [0, 1])


def _first_sync(records, dp_ranks):
    """(bucket, path, dp_ranks) of the first sync to exactly ``dp_ranks``, in log order."""
    out, inside = [], False
    for r in records:
        if r["kind"] == "sync_start" and r["dp_ranks"] == dp_ranks and not out:
            inside = True
            assert (r["ipc_dp_ranks"], r["broadcast_dp_ranks"]) == ([0], [1])
        elif r["kind"] == "sync_bucket" and inside:
            out.append((r["bucket"], r["path"], r["dp_ranks"]))
        elif r["kind"] == "sync_end" and inside:
            return out
    return out


def _check_same_sync_as_the_simulator(run):
    """The same sync configuration — the gate's model bytes (its cache), its bucket size,
    one same-GPU and one broadcast target — gives the same (bucket, path, targets)
    sequence in the simulator as on the gate's 4 gloo ranks."""
    records = [json.loads(line) for line in open(run.event_log)]
    model_bytes = next(r["bytes"] for r in records if r["kind"] == "cache_build" and r["version"] == 0)
    gate = _first_sync(records, [0, 1])  # cycle 0: rank 2 = dp 0 (colocated), rank 3 = dp 1
    expected = [(b, path, [dp]) for b in range(3) for path, dp in (("ipc", 0), ("broadcast", 1))]
    assert gate == expected  # 3 buckets of 16 KiB for the tiny model, both paths per bucket
    assert _sim_sync_sequence(model_bytes, 16384) == gate


def _check_event_log(run):
    """The merged log validates against the harness schema and shows every group destroyed."""
    records_mod = pytest.importorskip("harness.logs.records")
    assert run.report["event_log"] == str(run.event_log)
    records = [r.data for r in records_mod.read_records(str(run.event_log))]
    assert records[0]["kind"] == "header" and records[0]["source"] == "gate:selective_sync"
    creates = [r for r in records if r["kind"] == "group_create"]
    destroys = [r for r in records if r["kind"] == "group_destroy"]
    assert creates and len(creates) == len(destroys)
    assert all(len(r["members"]) < 4 and 1 not in r["members"] for r in creates)
    published = [r["version"] for r in records if r["kind"] == "weights_publish"]
    assert published == [0, 1, 2]
    times = [(r["t"], r["seq"]) for r in records]
    assert times == sorted(times)
    _check_cache_lock(records)


def _check_cache_lock(records):
    """The owner's cache lock leaves the same ``cache_lock`` holds as in every runtime (a
    build, a promote and a sync per cycle, each acquired then released by rank 0), and
    the cache-lock check runs on this log: clean as run, and it fires once a build is
    moved inside a sync's hold."""
    from harness.logs.invariants import check_log

    holds = [(r["holder"], r["action"], r["version"]) for r in records if r["kind"] == "cache_lock"]
    assert holds == [(h, a, v) for v in (0, 1, 2) for h in ("build", "promote", "sync") for a in ("acquire", "release")]
    assert {r["rank"] for r in records if r["kind"] == "cache_lock"} == {0} and check_log(records, ["cache_lock"]) == []
    build = [r for r in records if r["kind"] == "cache_lock" and r["holder"] == "build" and r["version"] == 1]
    rest = [r for r in records if not any(r is b for b in build)]
    sync0 = next(i for i, r in enumerate(rest) if r["kind"] == "cache_lock" and r["holder"] == "sync")
    moved = rest[: sync0 + 1] + build + rest[sync0 + 1 :]  # v1's build while v0's sync holds the lock
    found = check_log([dict(r, seq=i) for i, r in enumerate(moved)], ["cache_lock"])
    assert len(found) == 1 and "rank 0: cache build of v1" in found[0].message and "sync of v0" in found[0].message


def test_corrupted_byte_fails_naming_tensor_and_bucket(gate_runner):
    run = gate_runner("selective_sync", 4, "--cycles", "2", hook="corrupt_byte")
    report = run.report
    assert run.returncode != 0
    assert report["status"] == "failed"
    assert "bit_exact" in report["message"] and "'proj_weight' (bucket 1, float16)" in report["message"]
    failed = {r["rank"] for r in report["ranks"] if r["status"] == "failed"}
    assert failed == {2, 3}  # both the IPC and the broadcast receiver saw the damage
    assert report["summary"]["cycles"]["cycle 0"]["status"] == "failed"
    assert report["summary"]["cycles"]["cycle 1"]["status"] == "passed"  # the next sync repairs it


def test_leaked_sync_group_is_reported(gate_runner):
    # the sync's teardown (shared with the dual gate, gpu_gates/sync/runtime.py) finds the
    # group alive after its close: a failed check naming it, no group_destroy logged, and
    # the oracle's sync_groups finds the group the sync left alive
    run = gate_runner("selective_sync", 4, "--cycles", "1", hook="leak_sync_group")
    assert run.report["status"] == "failed"
    assert "still alive after its close" in run.report["message"] and "selective_sync_c0" in run.report["message"]
    records = [json.loads(line) for line in open(run.event_log)]
    created = {r["name"] for r in records if r["kind"] == "group_create"}
    assert created == {"selective_sync_c0"} and not any(r["kind"] == "group_destroy" for r in records)
    assert [c for c in run.checks("no_group_survives") if not c["passed"]]
    from harness.logs.invariants import check_log

    found = check_log([{**r, "seq": i} for i, r in enumerate(records)], ["sync_groups"])
    assert found and "selective_sync_c0" in found[0].message


def test_too_small_world_is_a_skip_with_reason_even_when_its_first_port_is_taken(gate_runner):
    # Parallel test workers (and other checkouts' suites) launch gates side by side: a
    # rendezvous port taken between the probe and torchrun's bind is retried on a new one.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        run = gate_runner("selective_sync", 2, first_ports=[taken])
    assert run.port != taken
    assert run.report["status"] == "skipped"
    assert "needs 4+ ranks" in run.report["message"]


def test_under_plain_torchrun_the_gate_file_runs_to_its_report_and_exit_code(gate_runner):
    # the documented command (each rank a `python gpu_gates/selective_sync.py` of its own),
    # on one rank: the gate file as a program, through its checks of the world, to its
    # report and the skip exit code, which torchrun passes on as a failure
    run = gate_runner("selective_sync", 1, launcher="torchrun")
    assert run.report["status"] == "skipped" and "needs 4+ ranks" in run.report["message"]
    assert run.report["exit_code"] == ExitCode.SKIPPED and run.returncode != 0
