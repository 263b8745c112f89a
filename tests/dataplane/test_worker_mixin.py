"""Worker mixin without torch.distributed: coordinates are required, leaders are tp=cp=pp=0,
siblings do not write back, and a size-1 replica fetches for itself."""

import pytest
import torch

from gpu_gates.dataplane.client import DataPlaneClient
from gpu_gates.dataplane.codec import FieldSpec, Schema
from gpu_gates.dataplane.store import InProcessStore
from gpu_gates.transports.worker_mixin import DataPlaneWorkerMixin, MissingCoordinatesError

SCHEMA = Schema.of(FieldSpec("input_ids", "per_token", "int64"), FieldSpec("logprobs", "per_token", "float32"))


class Worker(DataPlaneWorkerMixin):
    def __init__(self, client, coords, size=1):
        self.dp_client, self.coords, self.size = client, coords, size

    def _local_coords(self):
        return self.coords

    def _replica_group(self):
        return None, 0, self.size


class NoCoords(DataPlaneWorkerMixin):
    pass


def setup():
    store = InProcessStore()
    producer = DataPlaneClient(store, actor="rollout", role="producer")
    producer.register_partition("p", SCHEMA)
    meta = producer.put_samples(
        ["a", "b"], "p", {"input_ids": torch.tensor([[1, 2, 3], [4, 0, 0]])}, sequence_lengths=[3, 1]
    )
    return store, meta


def test_a_worker_without_local_coordinates_raises():
    with pytest.raises(MissingCoordinatesError, match="every rank would look like a replica leader"):
        NoCoords()._is_replica_leader()
    with pytest.raises(MissingCoordinatesError, match="no integer coordinate for axis cp"):
        Worker(None, {"dp": 0, "tp": 0, "pp": 0})._is_replica_leader()


def test_only_the_replica_leader_writes_back():
    store, meta = setup()
    fn = lambda ids: ids.to(torch.float32) * -0.5  # noqa: E731
    leader = Worker(DataPlaneClient(store, actor="dp0/tp0", role="worker"), {"dp": 0, "tp": 0, "cp": 0, "pp": 0})
    sibling = Worker(DataPlaneClient(store, actor="dp0/cp1", role="worker"), {"dp": 0, "tp": 0, "cp": 1, "pp": 0})
    assert sibling.get_logprobs_presharded(meta, fn) is None
    assert leader.get_logprobs_presharded(meta, fn).fields == ("logprobs",)
    assert [w[0] for w in store.write_ledger() if w[3] == "logprobs"] == ["dp0/tp0", "dp0/tp0"]
    got = leader.dp_client.get_samples(["a", "b"], "p", ["logprobs"])["logprobs"]
    assert got.tolist() == [[-0.5, -1.0, -1.5], [-2.0, 0.0, 0.0]]
    sibling.leader_gate = False  # the documented fault: the sibling writes too
    sibling.get_logprobs_presharded(meta, fn)
    assert [w[0] for w in store.write_ledger() if w[3] == "logprobs"][-2:] == ["dp0/cp1", "dp0/cp1"]
