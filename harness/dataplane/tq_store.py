"""TransferQueue as a row store: the real backend, TQ's simple storage on Ray actors.

Nothing outside this module imports ``transfer_queue`` (NeMo RL keeps the same boundary).
Rows travel as one TensorDict per put: a field whose rows share a shape is stacked, a
jagged one (per-token rows, object bytes) becomes a ``torch.nested`` jagged tensor.
The partition's schema rides on a placeholder key's tags (``__schema__``), which is also
how NeMo RL avoids TQ's field-registration race, and makes the registration visible to
every process attached to the same controller. TQ upserts, so a rewrite is silent: wrap
the store in :class:`~harness.dataplane.store.RefuseOverwrite` to get Mooncake's refusal.

``start()`` brings up TQ on the already-initialized Ray and bounds the wait: TQ's
controller and each storage unit ask Ray for a CPU, and with too few logical CPUs its
``init`` waits forever.
"""

from __future__ import annotations

import json
import threading
from typing import Dict, List, Optional, Sequence

import torch

from harness.dataplane.errors import DataPlaneError, DataPlaneInputError
from harness.dataplane.store import RowStore, Rows

SCHEMA_KEY = "__schema__"


class TransferQueueStore(RowStore):
    def __init__(self) -> None:
        import transfer_queue as tq  # the one import of TQ in the project
        self.tq = tq
        self.client = tq.get_client()

    @classmethod
    def start(cls, *, num_storage_units: int = 1, timeout_s: float = 60.0) -> "TransferQueueStore":
        import ray
        import transfer_queue as tq
        from omegaconf import OmegaConf

        if not ray.is_initialized():
            raise DataPlaneError("TransferQueueStore.start: Ray is not initialized (ray.init(num_cpus=...) first)")
        conf = OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": num_storage_units}}})
        failure: List[BaseException] = []

        def run() -> None:
            try:
                tq.init(conf)
            except BaseException as exc:  # reported below
                failure.append(exc)

        t = threading.Thread(target=run, name="tq-init", daemon=True)
        t.start()
        t.join(timeout_s)
        if t.is_alive():
            raise TimeoutError(f"TransferQueue init did not finish in {timeout_s:.0f} s "
                               "(does Ray have a logical CPU for the controller and each storage unit?)")
        if failure:
            raise DataPlaneError(f"TransferQueue init failed: {failure[0]}") from failure[0]
        return cls()

    def shutdown(self) -> None:
        self.tq.close()

    # -- primitives ----------------------------------------------------------------------
    def _listing(self, partition_id: str) -> Dict[str, dict]:
        return self.tq.kv_list(partition_id).get(partition_id, {})

    def register(self, partition_id, schema, tasks):
        held = self.partition(partition_id)
        if held is not None:
            if held != (schema, list(tasks)):
                raise DataPlaneInputError(f"partition_id: {partition_id!r} is already registered with a different schema or tasks")
            return
        tag = {"__schema": json.dumps(schema, sort_keys=True), "__tasks": json.dumps(list(tasks))}
        self.tq.kv_batch_put(keys=[SCHEMA_KEY], partition_id=partition_id, tags=[tag])

    def partition(self, partition_id):
        tag = self._listing(partition_id).get(SCHEMA_KEY)
        if not tag or "__schema" not in tag:
            return None
        return json.loads(tag["__schema"]), json.loads(tag["__tasks"])

    def samples(self, partition_id, sample_ids):
        listing = self._listing(partition_id)
        out = {}
        for s in sample_ids:
            if s in listing:
                meta = self.client.kv_retrieve_meta(keys=[s], partition_id=partition_id, create=False)
                out[s] = (dict(listing[s] or {}), set(meta.field_names or []))
        return out

    def write(self, partition_id, sample_ids, rows, tags, writer):
        from tensordict import TensorDict

        columns = {name: _column(field_rows) for name, field_rows in rows.items()}
        td = TensorDict(columns, batch_size=[len(sample_ids)])
        self.tq.kv_batch_put(keys=list(sample_ids), partition_id=partition_id, fields=td, tags=[dict(t) for t in tags])

    def read(self, partition_id, sample_ids, fields):
        td = self.tq.kv_batch_get(keys=list(sample_ids), partition_id=partition_id, select_fields=list(fields))
        out: Rows = {}
        for name in fields:
            value = td[name]
            out[name] = [r.clone() for r in value.unbind(0)]
            if len(out[name]) != len(sample_ids):
                raise DataPlaneError(f"TransferQueue returned {len(out[name])} rows of {name!r} for {len(sample_ids)} samples")
        return out

    def drop(self, partition_id, sample_ids):
        keys = list(self._listing(partition_id)) if sample_ids is None else list(sample_ids)
        if keys:
            self.tq.kv_clear(keys=keys, partition_id=partition_id)


def _column(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    shapes = {tuple(r.shape) for r in rows}
    if len(shapes) == 1:
        return torch.stack(list(rows))
    return torch.nested.nested_tensor(list(rows), layout=torch.jagged)
