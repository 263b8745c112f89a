"""The client contract, run against both backends (in-process store and TransferQueue).

put/get/clear/close behave identically over either store; bad input to every public call
is one clear error naming the argument or field, raised before the store is touched.
"""

import numpy as np
import pytest
import torch

from gpu_gates.dataplane.codec import FieldSpec, Schema
from harness.dataplane.meta import KVBatchMeta
from harness.dataplane.errors import (
    ClosedClientError,
    DataPlaneInputError,
    DuplicateWriteError,
    MissingSamplesError,
    UnknownPartitionError,
    UnknownTaskError,
    UnproducedFieldError,
)

SCHEMA = Schema.of(
    FieldSpec("input_ids", "per_token", "int64", pad_value=0),
    FieldSpec("logprobs", "per_token", "bfloat16"),
    FieldSpec("advantage", "scalar", "float32"),
    FieldSpec("hidden", "rect", "float32", shape=(4,)),
    FieldSpec("info", "object"),
)
IDS = ["u0_g0", "u0_g1", "u1_g0", "u1_g1"]
LENS = [5, 2, 7, 3]


def rollout_fields():
    ids = torch.zeros(4, 8, dtype=torch.int64)
    for i, n in enumerate(LENS):
        ids[i, :n] = torch.arange(10 * i + 1, 10 * i + 1 + n)
    return {
        "input_ids": ids,
        "advantage": torch.tensor([0.5, -0.5, 1.0, -1.0]),
        "hidden": torch.arange(16, dtype=torch.float32).reshape(4, 4),
        "info": [{"g": 0}, {"g": 0}, "x", None],
    }


@pytest.fixture
def producer(make_client, partition):
    c = make_client("producer", actor="rollout")
    c.register_partition(partition, SCHEMA, tasks=["train", "logprob"])
    return c


def test_round_trip_with_metadata_tags_and_hop_records(producer, make_client, partition, records):
    meta = producer.put_samples(IDS, partition, rollout_fields(), tags=[{"version": 3}] * 4, sequence_lengths=LENS)
    assert meta.sample_ids == tuple(IDS) and set(meta.fields) == {"input_ids", "advantage", "hidden", "info"}
    assert meta.sequence_lengths == tuple(LENS) and [t["version"] for t in meta.tags] == [3] * 4
    assert meta.extra_info["object_fields"] == ["info"]
    worker = make_client("worker", actor="train/dp0", dp_rank=0)
    got = worker.get_samples(["u1_g0", "u0_g1"], partition, ["input_ids", "advantage", "info"], task_name="train")
    assert got["input_ids"].shape == (2, 7)
    assert got["input_ids"][1].tolist() == [11, 12, 0, 0, 0, 0, 0]
    assert torch.equal(got["advantage"], torch.tensor([1.0, -0.5]))
    assert list(got["info"]) == ["x", {"g": 0}]
    hops = [(r["hop"], r["bytes"]) for r in records if r["kind"] == "dp_transfer"]
    assert hops == [
        (
            "producer_to_store",
            sum(LENS) * 8 + 4 * 4 + 16 * 4 + sum(len(s) for s in ['{"g": 0}', '{"g": 0}', '"x"', "null"]),
        ),
        ("store_to_worker", (7 + 2) * 8 + 2 * 4 + len('"x"') + len('{"g": 0}')),
    ]


def test_write_back_of_a_per_token_field_in_bf16(producer, make_client, partition):
    producer.put_samples(IDS, partition, rollout_fields(), sequence_lengths=LENS)
    worker = make_client("worker", actor="train/dp0", dp_rank=0)
    lp = torch.randn(2, 7).to(torch.bfloat16)
    meta = worker.put_samples(["u0_g0", "u1_g0"], partition, {"logprobs": lp}, sequence_lengths=[5, 7])
    assert meta.fields == ("logprobs",)
    got = worker.get_samples(["u0_g0", "u1_g0"], partition, ["logprobs"])
    assert got["logprobs"].dtype == torch.bfloat16
    assert torch.equal(got["logprobs"][0, :5], lp[0, :5]) and torch.equal(got["logprobs"][1], lp[1])


def test_dp_shards_are_disjoint_and_cover_the_batch(producer, partition):
    meta = producer.put_samples(
        IDS, partition, rollout_fields(), tags=[{"i": i} for i in range(4)], sequence_lengths=LENS
    )
    shards = meta.shard_for_dp(2)
    seen = [s for sh in shards for s in sh.sample_ids]
    assert sorted(seen) == sorted(IDS) and len(seen) == len(set(seen))
    for sh in shards:  # tags stay 1:1 with their rows
        assert [t["i"] for t in sh.tags] == [IDS.index(s) for s in sh.sample_ids]
    assert sorted(sum(sh.sequence_lengths) for sh in shards) == [8, 9]
    with pytest.raises(DataPlaneInputError, match="dp_size"):
        meta.shard_for_dp(0)


def test_errors_for_unproduced_field_cleared_samples_unknown_task_and_dropped_partition(
    producer, make_client, partition
):
    producer.put_samples(IDS, partition, rollout_fields(), sequence_lengths=LENS)
    worker = make_client("worker", actor="train/dp0", dp_rank=0)
    with pytest.raises(UnproducedFieldError, match="select_fields: field 'logprobs' has not been produced"):
        worker.get_samples(IDS, partition, ["logprobs"])
    with pytest.raises(UnknownTaskError, match="task_name: 'critic' is not a consumer task"):
        worker.get_samples(IDS, partition, ["input_ids"], task_name="critic")
    producer.clear_samples(["u0_g0"], partition)
    with pytest.raises(
        MissingSamplesError, match=r"sample_ids: \['u0_g0'\] \(1\) not in partition .* \(never put, or cleared\)"
    ):
        worker.get_samples(["u0_g0", "u0_g1"], partition, ["input_ids"])
    assert worker.get_samples(["u0_g1"], partition, ["input_ids"])["input_ids"].shape == (1, 2)
    producer.clear_samples(None, partition)
    with pytest.raises(UnknownPartitionError, match="is not registered"):
        worker.get_samples(["u0_g1"], partition, ["input_ids"])
    with pytest.raises(UnknownPartitionError, match="is not registered"):
        producer.put_samples(IDS, partition, rollout_fields(), sequence_lengths=LENS)


def test_close_is_idempotent_and_a_closed_client_refuses_calls(producer, partition):
    producer.close()
    producer.close()
    with pytest.raises(ClosedClientError):
        producer.get_samples(IDS, partition, ["input_ids"])


def _store_view(client, partition):
    held = client.store.samples(partition, IDS)
    return {s: (tags, sorted(f)) for s, (tags, f) in held.items()}


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda c, p: c.put_samples("u0_g0", p, {}), "sample_ids: must be a list"),
        (
            lambda c, p: c.put_samples(["a", "a"], p, {"advantage": torch.zeros(2)}),
            "sample_ids: 'a' appears more than once",
        ),
        (
            lambda c, p: c.put_samples(["__schema__"], p, {"advantage": torch.zeros(1)}),
            "sample_ids: '__schema__' is not a sample id",
        ),
        (
            lambda c, p: c.put_samples(["a"], "", {"advantage": torch.zeros(1)}),
            "partition_id: must be a non-empty string",
        ),
        (
            lambda c, p: c.put_samples(["a"], "nope", {"advantage": torch.zeros(1)}),
            "partition_id: 'nope' is not registered",
        ),
        (
            lambda c, p: c.put_samples(["a"], p, {"advantage": torch.zeros(1)}, tags=[{}, {}]),
            "tags: 2 tags for 1 samples",
        ),
        (
            lambda c, p: c.put_samples(["a"], p, {"advantage": torch.zeros(1)}, tags=[{"x": [1]}]),
            r"tags\[0\]\['x'\]: must be a primitive",
        ),
        (
            lambda c, p: c.put_samples(
                IDS, p, {**rollout_fields(), "advantage": torch.zeros(4, 1)}, sequence_lengths=LENS
            ),
            "field 'advantage': 2-D tensor but the schema declares 1-D",
        ),
        (
            lambda c, p: c.put_samples(IDS, p, {**rollout_fields(), "extra": torch.zeros(4)}, sequence_lengths=LENS),
            "field 'extra': not declared",
        ),
        (lambda c, p: c.get_samples(IDS, p, None), "select_fields: must be a non-empty list"),
        (lambda c, p: c.get_samples(IDS, p, "input_ids"), "select_fields: must be a non-empty list"),
        (lambda c, p: c.get_samples(IDS, p, ["bogus"]), "select_fields: 'bogus' is not declared"),
        (lambda c, p: c.get_samples(IDS, p, ["input_ids"], pad_to=-1), "pad_to: must be a non-negative int"),
        (lambda c, p: c.get_samples([], p, ["input_ids"]), "sample_ids: must not be empty"),
        (lambda c, p: c.clear_samples([1], p), "sample_ids: 1 is not a sample id"),
        (lambda c, p: c.clear_samples(None, "nope"), "partition_id: 'nope' is not registered"),
        (lambda c, p: c.register_partition(p, {"x": {"kind": "rect"}}), "schema field 'x': dtype must be one of"),
        (lambda c, p: c.register_partition(p, SCHEMA, tasks="train"), "tasks: must be a list"),
    ],
)
def test_bad_input_to_every_public_call_names_the_field_and_leaves_the_store_unchanged(
    producer, partition, call, match
):
    producer.put_samples(IDS[:2], partition, {"advantage": torch.tensor([1.0, 2.0])}, tags=[{"v": 1}, {"v": 1}])
    before = _store_view(producer, partition)
    with pytest.raises((DataPlaneInputError, UnknownPartitionError)) as info:
        call(producer, partition)
    assert match and __import__("re").search(match, str(info.value)), str(info.value)
    assert "\n" not in str(info.value)
    assert _store_view(producer, partition) == before


def test_client_construction_rejects_bad_role(backend):
    from gpu_gates.dataplane.client import DataPlaneClient

    with pytest.raises(DataPlaneInputError, match="role: must be one of"):
        DataPlaneClient(backend, actor="x", role="trainer")


def test_refused_duplicate_write_is_601_class_and_writes_nothing(make_client, partition, records):
    leader = make_client("worker", actor="dp0/tp0", refuse=True, dp_rank=0)
    sibling = make_client("worker", actor="dp0/tp1", refuse=True, dp_rank=0)
    leader.register_partition(partition, SCHEMA, tasks=["train"])
    leader.put_samples(IDS[:2], partition, {"advantage": torch.zeros(2)})
    with pytest.raises(DuplicateWriteError) as info:
        # one new sample, one already written: the whole put is refused
        sibling.put_samples([IDS[1], IDS[2]], partition, {"advantage": torch.ones(2)})
    assert (
        info.value.code == -601
        and "-601 ILLEGAL_CLIENT class" in str(info.value)
        and "u0_g1/advantage" in str(info.value)
    )
    assert IDS[2] not in leader.store.samples(partition, IDS)
    assert leader.get_samples(IDS[:2], partition, ["advantage"])["advantage"].tolist() == [0.0, 0.0]
    assert [r["kind"] for r in records] == ["dp_transfer", "dp_write_refused", "dp_transfer"]
    assert records[1]["code"] == -601 and records[1]["actor"] == "dp0/tp1"


def test_plain_store_overwrites_silently(make_client, partition):
    """Why the refusal is injected: without it a second writer leaves no trace in the data."""
    a = make_client("worker", actor="dp0/tp0")
    b = make_client("worker", actor="dp0/tp1")
    a.register_partition(partition, SCHEMA)
    a.put_samples(IDS[:1], partition, {"advantage": torch.zeros(1)})
    b.put_samples(IDS[:1], partition, {"advantage": torch.full((1,), 99.0)})
    assert a.get_samples(IDS[:1], partition, ["advantage"])["advantage"].tolist() == [99.0]


def test_object_field_and_empty_row_survive_the_store(producer, partition):
    producer.put_samples(
        ["z0", "z1"],
        partition,
        {"input_ids": torch.tensor([[4, 5], [0, 0]]), "info": np.array([1.5, "s"], dtype=object)},
        sequence_lengths=[2, 0],
    )
    got = producer.get_samples(["z0", "z1"], partition, ["input_ids", "info"])
    assert got["input_ids"].tolist() == [[4, 5], [0, 0]] and list(got["info"]) == [1.5, "s"]


_ATTACH = """
import sys
import ray
import torch
from gpu_gates.transports.tq_store import TransferQueueStore
store = TransferQueueStore.attach(sys.argv[1], ledger=True)
store.write("attach", ["a", "b"], {"x": [torch.arange(3), torch.arange(5)]}, [{}, {}], "dp0/tp0")
store.write("attach", ["a"], {"x": [torch.arange(3) + 7]}, [{}], "dp0/tp1")  # a second writer: TQ upserts
print("ray initialized:", ray.is_initialized())
store.detach()
"""


@pytest.mark.transferqueue
def test_a_process_without_ray_attaches_as_a_client_and_the_ledger_records_each_write(tq_store, tmp_path):
    """What gpu_gates/tq_host.py relies on: a process that never starts or joins Ray (a
    torchrun rank) attaches from the client config alone; the ledger partition records
    both writers of row 'a' although TransferQueue itself kept only the last value."""
    import os
    import subprocess
    import sys

    conf = str(tmp_path / "client_conf.pkl")
    tq_store.write_client_config(conf)
    assert os.stat(conf).st_mode & 0o077 == 0  # owner-only: it names where the store listens
    done = subprocess.run([sys.executable, "-c", _ATTACH, conf], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ray initialized: False" in done.stdout
    assert sorted(w for w in tq_store.write_ledger() if w[1] == "attach") == [
        ("dp0/tp0", "attach", "a", "x"),
        ("dp0/tp0", "attach", "b", "x"),
        ("dp0/tp1", "attach", "a", "x"),
    ]
    rows = tq_store.read("attach", ["a", "b"], ["x"])["x"]
    assert torch.equal(rows[0], torch.arange(3) + 7) and torch.equal(rows[1], torch.arange(5))


# ---- task-mediated reads: claim_meta, get_data, check_consumption_status, after NeMo RL's
# tests/unit/data_plane/ (test_interface_contract.py, test_correctness.py,
# test_tq_lifecycle.py at NVIDIA-NeMo/RL @ 7ea279ab), in this project's own data and words.
# In this module so the TransferQueue cases share its one Ray (conftest.py).

CONSUMPTION_SCHEMA = Schema.of(FieldSpec("reward", "scalar", "float32"), FieldSpec("advantage", "scalar", "float32"))


@pytest.fixture
def scalar_producer(make_client, partition):
    c = make_client("producer", actor="rollout")
    c.register_partition(partition, CONSUMPTION_SCHEMA, tasks=["train", "logprob"])
    return c


def put_scalars(client, partition, ids, **fields):
    values = {k: torch.tensor(v, dtype=torch.float32) for k, v in fields.items()}
    return client.put_samples(ids, partition, values, tags=[{"input_lengths": 10 + i} for i in range(len(ids))])


def test_claim_hands_each_ready_sample_to_a_task_once(scalar_producer, make_client, partition):
    put_scalars(scalar_producer, partition, ["a", "b", "c"], reward=[1.0, 2.0, 3.0])
    worker = make_client("worker", actor="train/dp0", dp_rank=0)
    assert not worker.check_consumption_status(partition, ["train"])
    first = worker.claim_meta(partition, "train", ["reward"], 2)
    assert first.sample_ids == ("a", "b") and first.fields == ("reward",)
    assert first.sequence_lengths == (10, 11) and first.tags[1]["input_lengths"] == 11
    assert first.extra_info == {"task_name": "train"}
    assert worker.get_data(first)["reward"].tolist() == [1.0, 2.0]
    assert not worker.check_consumption_status(partition, ["train"])  # c is still unclaimed
    # fewer ready than asked: nothing claimed, empty meta, no block
    empty = worker.claim_meta(partition, "train", ["reward"], 2)
    assert len(empty) == 0 and empty.partition_id == partition
    last = worker.claim_meta(partition, "train", ["reward"], 1)
    assert last.sample_ids == ("c",)
    assert worker.check_consumption_status(partition, ["train"])
    assert not worker.check_consumption_status(partition, ["train", "logprob"])  # each task has its own cursor
    assert worker.claim_meta(partition, "logprob", ["reward"], 3).sample_ids == ("a", "b", "c")
    assert worker.check_consumption_status(partition, ["train", "logprob"])


def test_a_sample_is_claimable_only_once_its_required_fields_are_produced(scalar_producer, make_client, partition):
    put_scalars(scalar_producer, partition, ["a", "b"], reward=[1.0, 2.0])
    worker = make_client("worker", actor="train/dp0", dp_rank=0)
    assert len(worker.claim_meta(partition, "train", ["reward", "advantage"], 1)) == 0
    put_scalars(worker, partition, ["b"], advantage=[0.5])  # the write-back produces b's advantage
    meta = worker.claim_meta(partition, "train", ["reward", "advantage"], 1)
    assert meta.sample_ids == ("b",)
    got = worker.get_data(meta)
    assert got["advantage"].tolist() == [0.5] and got["reward"].tolist() == [2.0]
    assert worker.get_data(meta, ["reward"]).keys() == {"reward"}  # explicit selection wins over meta.fields


def test_get_data_never_reads_every_field_implicitly(scalar_producer, make_client, partition):
    put_scalars(scalar_producer, partition, ["a"], reward=[1.0])
    worker = make_client("worker", actor="train/dp0", dp_rank=0)
    bare = KVBatchMeta(partition, ("a",), (), None, ({},))
    with pytest.raises(DataPlaneInputError, match="select_fields: none given and the meta names no fields"):
        worker.get_data(bare)
    assert worker.get_data(bare, ["reward"])["reward"].tolist() == [1.0]
    with pytest.raises(DataPlaneInputError, match="meta: names no samples"):
        worker.get_data(KVBatchMeta(partition, (), ("reward",), None, ()))


def test_claim_refuses_an_unknown_task_partition_field_or_batch_size(scalar_producer, make_client, partition):
    put_scalars(scalar_producer, partition, ["a"], reward=[1.0])
    worker = make_client("worker", actor="train/dp0", dp_rank=0)
    with pytest.raises(UnknownTaskError, match="'trian' is not a consumer task"):
        worker.claim_meta(partition, "trian", ["reward"], 1)
    with pytest.raises(UnknownTaskError, match="'trian' is not a consumer task"):
        worker.check_consumption_status(partition, ["train", "trian"])
    with pytest.raises(UnknownPartitionError):
        worker.claim_meta(partition + "x", "train", ["reward"], 1)
    with pytest.raises(DataPlaneInputError, match="required_fields: 'value' is not declared"):
        worker.claim_meta(partition, "train", ["value"], 1)
    with pytest.raises(DataPlaneInputError, match="required_fields: must be a non-empty list"):
        worker.claim_meta(partition, "train", [], 1)
    with pytest.raises(DataPlaneInputError, match="batch_size: must be a positive int, got 0"):
        worker.claim_meta(partition, "train", ["reward"], 0)
    # none of the refused calls claimed anything
    assert worker.claim_meta(partition, "train", ["reward"], 1).sample_ids == ("a",)


def test_consumption_counts_the_samples_held_now(scalar_producer, make_client, partition):
    worker = make_client("worker", actor="train/dp0", dp_rank=0)
    assert not worker.check_consumption_status(partition, ["train"])  # nothing held: not "consumed"
    put_scalars(scalar_producer, partition, ["a", "b"], reward=[1.0, 2.0])
    worker.claim_meta(partition, "train", ["reward"], 1)
    scalar_producer.clear_samples(["b"], partition)  # the unclaimed one is gone: everything held is claimed
    assert worker.check_consumption_status(partition, ["train"])
    put_scalars(scalar_producer, partition, ["c"], reward=[3.0])  # a new sample arrives: not consumed any more
    assert not worker.check_consumption_status(partition, ["train"])


def test_registering_again_is_idempotent_and_a_different_schema_is_refused(scalar_producer, partition):
    scalar_producer.register_partition(partition, CONSUMPTION_SCHEMA, tasks=["train", "logprob"])  # a retry: no change
    with pytest.raises(DataPlaneInputError, match="already registered with a different schema or tasks"):
        scalar_producer.register_partition(
            partition, Schema.of(FieldSpec("reward", "scalar", "float32")), tasks=["train"]
        )
    with pytest.raises(DataPlaneInputError, match="already registered with a different schema or tasks"):
        scalar_producer.register_partition(partition, CONSUMPTION_SCHEMA, tasks=["train"])


def test_a_truncated_read_fails_naming_the_row_and_field(producer, make_client, backend, partition):
    """Per-row digests: the fault truncates every read (Relax #256:
    half the bytes never copied, success reported); the store's digest check names the
    partition, the sample and the field; the clean read of the same rows passes."""
    from gpu_gates.dataplane.digest import RowDigestError

    producer.put_samples(IDS, partition, rollout_fields(), sequence_lengths=LENS)
    worker = make_client("worker", actor="train/dp0", dp_rank=0)
    got = worker.get_samples(["u1_g0"], partition, ["advantage", "hidden"])
    assert torch.equal(got["hidden"][0], torch.arange(8, 12, dtype=torch.float32))
    backend.truncate_reads = True
    try:
        with pytest.raises(RowDigestError) as err:
            worker.get_samples(["u1_g0"], partition, ["hidden"])
    finally:
        backend.truncate_reads = False
    msg = str(err.value)
    assert f"partition {partition!r} sample 'u1_g0' field 'hidden'" in msg and "float32[4]" in msg
    assert (err.value.sample, err.value.field) == ("u1_g0", "hidden")
    # digests of earlier fields survive a later write of another field (TQ replaces a sample's tags)
    lp = torch.randn(1, 7).to(torch.bfloat16)
    worker.put_samples(["u1_g0"], partition, {"logprobs": lp}, sequence_lengths=[7])
    again = worker.get_samples(["u1_g0"], partition, ["hidden", "logprobs"])
    assert torch.equal(again["logprobs"][0], lp[0]) and "__digest/hidden" not in str(
        producer.store.samples(partition, ["u1_g0"])
    )
