"""``data_plane`` over logs written by real clients: clean 1-hop traffic passes; the driver
fetching bulk, a second writer (refused or silent) each make it fire; a clear resets."""

import torch

from gpu_gates.dataplane.client import DataPlaneClient
from gpu_gates.dataplane.codec import FieldSpec, Schema
from gpu_gates.dataplane.store import InProcessStore, RefuseOverwrite
from harness.dataplane.errors import DuplicateWriteError
from harness.logs.writer import EventLog, header_record
from harness.logs.invariants import check_log

SCHEMA = Schema.of(FieldSpec("input_ids", "per_token", "int64"), FieldSpec("logprobs", "per_token", "float32"))
IDS = ["a", "b", "c", "d"]


def world(refuse=False):
    log = EventLog(header_record({"nodes": 1, "gpus_per_node": 4}))
    sink = lambda kind, fields: log.emit(kind, float(len(log.records)), **fields)  # noqa: E731
    store = RefuseOverwrite(InProcessStore()) if refuse else InProcessStore()
    c = {
        name: DataPlaneClient(store, actor=name, role=role, dp_rank=dp, sink=sink)
        for name, role, dp in [
            ("rollout", "producer", None),
            ("driver", "driver", None),
            ("dp0/tp0", "worker", 0),
            ("dp0/tp1", "worker", 0),
            ("dp1/tp0", "worker", 1),
        ]
    }
    c["rollout"].register_partition("p", SCHEMA)
    meta = c["rollout"].put_samples(
        IDS, "p", {"input_ids": torch.ones(4, 5, dtype=torch.int64)}, sequence_lengths=[5, 4, 3, 2]
    )
    return log, c, meta.shard_for_dp(2)


def one_step(c, shards, writers=("dp0/tp0", "dp1/tp0")):
    for d, shard in enumerate(shards):
        c["driver"].record_meta_dispatch(shard, to=f"dp{d}")
        leader = c[f"dp{d}/tp0"]
        data = leader.get_samples(list(shard.sample_ids), "p", ["input_ids"])
        for w in writers:
            if c[w].dp_rank == d:
                c[w].put_samples(
                    list(shard.sample_ids),
                    "p",
                    {"logprobs": data["input_ids"].float()},
                    sequence_lengths=shard.sequence_lengths,
                )


def violations(log):
    return [str(v) for v in check_log(log.records, ["data_plane"])]


def test_clean_one_hop_step_passes_and_a_clear_allows_the_next_write():
    log, c, shards = world()
    one_step(c, shards)
    c["driver"].clear_samples(None, "p")
    c["rollout"].register_partition("p", SCHEMA)
    c["rollout"].put_samples(
        IDS, "p", {"input_ids": torch.ones(4, 5, dtype=torch.int64)}, sequence_lengths=[5, 4, 3, 2]
    )
    assert violations(log) == []


def test_mutation_driver_fetches_bulk_fires():
    log, c, shards = world()
    one_step(c, shards)
    c["driver"].get_samples(IDS, "p", ["input_ids"])  # the mutation: bulk through the driver
    found = violations(log)
    assert len(found) == 1 and "the driver held bulk tensors: store_to_driver moved 112 B" in found[0]


def test_second_writer_fires_whether_overwritten_or_refused():
    log, c, shards = world()
    one_step(c, shards, writers=("dp0/tp0", "dp0/tp1", "dp1/tp0"))
    found = violations(log)
    assert len(found) == 1 and "-601 class: dp0/tp1 (dp 0) wrote" in found[0] and "first by dp0/tp0 (dp 0)" in found[0]

    log, c, shards = world(refuse=True)
    try:
        one_step(c, shards, writers=("dp0/tp0", "dp0/tp1", "dp1/tp0"))
    except DuplicateWriteError:
        pass
    found = violations(log)
    assert len(found) == 1 and "the store refused (code -601)" in found[0]
