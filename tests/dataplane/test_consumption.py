"""Task-mediated reads over both backends (in-process store and TransferQueue): claim_meta,
get_data, check_consumption_status — after NeMo RL's ``tests/unit/data_plane/``
(``test_interface_contract.py``, ``test_correctness.py``, ``test_tq_lifecycle.py`` at
NVIDIA-NeMo/RL @ 7ea279ab), in this project's own data and words."""

import pytest
import torch

from harness.dataplane.codec import FieldSpec, Schema
from harness.dataplane.errors import DataPlaneInputError, UnknownPartitionError, UnknownTaskError
from harness.dataplane.meta import KVBatchMeta

SCHEMA = Schema.of(FieldSpec("reward", "scalar", "float32"), FieldSpec("advantage", "scalar", "float32"))


@pytest.fixture
def producer(make_client, partition):
    c = make_client("producer", actor="rollout")
    c.register_partition(partition, SCHEMA, tasks=["train", "logprob"])
    return c


def put(client, partition, ids, **fields):
    values = {k: torch.tensor(v, dtype=torch.float32) for k, v in fields.items()}
    return client.put_samples(ids, partition, values, tags=[{"input_lengths": 10 + i} for i in range(len(ids))])


def test_claim_hands_each_ready_sample_to_a_task_once(producer, make_client, partition):
    put(producer, partition, ["a", "b", "c"], reward=[1.0, 2.0, 3.0])
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


def test_a_sample_is_claimable_only_once_its_required_fields_are_produced(producer, make_client, partition):
    put(producer, partition, ["a", "b"], reward=[1.0, 2.0])
    worker = make_client("worker", actor="train/dp0", dp_rank=0)
    assert len(worker.claim_meta(partition, "train", ["reward", "advantage"], 1)) == 0
    put(worker, partition, ["b"], advantage=[0.5])  # the write-back produces b's advantage
    meta = worker.claim_meta(partition, "train", ["reward", "advantage"], 1)
    assert meta.sample_ids == ("b",)
    got = worker.get_data(meta)
    assert got["advantage"].tolist() == [0.5] and got["reward"].tolist() == [2.0]
    assert worker.get_data(meta, ["reward"]).keys() == {"reward"}  # explicit selection wins over meta.fields


def test_get_data_never_reads_every_field_implicitly(producer, make_client, partition):
    put(producer, partition, ["a"], reward=[1.0])
    worker = make_client("worker", actor="train/dp0", dp_rank=0)
    bare = KVBatchMeta(partition, ("a",), (), None, ({},))
    with pytest.raises(DataPlaneInputError, match="select_fields: none given and the meta names no fields"):
        worker.get_data(bare)
    assert worker.get_data(bare, ["reward"])["reward"].tolist() == [1.0]
    with pytest.raises(DataPlaneInputError, match="meta: names no samples"):
        worker.get_data(KVBatchMeta(partition, (), ("reward",), None, ()))


def test_claim_refuses_an_unknown_task_partition_field_or_batch_size(producer, make_client, partition):
    put(producer, partition, ["a"], reward=[1.0])
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


def test_consumption_counts_the_samples_held_now(producer, make_client, partition):
    worker = make_client("worker", actor="train/dp0", dp_rank=0)
    assert not worker.check_consumption_status(partition, ["train"])  # nothing held: not "consumed"
    put(producer, partition, ["a", "b"], reward=[1.0, 2.0])
    worker.claim_meta(partition, "train", ["reward"], 1)
    producer.clear_samples(["b"], partition)  # the unclaimed one is gone: everything held is claimed
    assert worker.check_consumption_status(partition, ["train"])
    put(producer, partition, ["c"], reward=[3.0])  # a new sample arrives: not consumed any more
    assert not worker.check_consumption_status(partition, ["train"])


def test_registering_again_is_idempotent_and_a_different_schema_is_refused(producer, partition):
    producer.register_partition(partition, SCHEMA, tasks=["train", "logprob"])  # a retry: no change
    with pytest.raises(DataPlaneInputError, match="already registered with a different schema or tasks"):
        producer.register_partition(partition, Schema.of(FieldSpec("reward", "scalar", "float32")), tasks=["train"])
    with pytest.raises(DataPlaneInputError, match="already registered with a different schema or tasks"):
        producer.register_partition(partition, SCHEMA, tasks=["train"])
