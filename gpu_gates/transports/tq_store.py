"""TransferQueue as a row store: the real backend, TQ's simple storage on Ray actors.

Nothing outside this module imports ``transfer_queue`` (NeMo RL keeps the same boundary).
Rows travel as one TensorDict per put: a field whose rows share a shape is stacked, a
jagged one (per-token rows, object bytes) becomes a ``torch.nested`` jagged tensor.
The partition's schema rides on a placeholder key's tags (``__schema__``), which is also
how NeMo RL avoids TQ's field-registration race, and makes the registration visible to
every process attached to the same controller. TQ upserts, so a rewrite is silent: wrap
the store in :class:`~gpu_gates.dataplane.store.RefuseOverwrite` to get Mooncake's refusal.

``start()`` brings up TQ on the already-initialized Ray and bounds the wait: TQ's
controller and each storage unit ask Ray for a CPU, and with too few logical CPUs its
``init`` waits forever; with Ray's workers at its default nice 15 beside busy processes,
the controller's start-up can starve for minutes (the drivers here start Ray at nice 0).
A timeout names the TQ call the init thread was still in.

Other processes attach **without Ray**: TQ's client reaches the controller and the storage
units over ZMQ, and the addresses are in the config ``init`` returns. The starting process
writes that config to a file (:meth:`write_client_config`); a torchrun rank calls
:meth:`attach` on it, which builds the process's TQ client from the config the way TQ's own
``init`` does after it found the controller through Ray (``_maybe_create_tq_client``, the
one private TQ function used here). TQ keeps no record of who wrote a row and overwrites
silently, so a store opened with ``ledger=True`` also puts one tags-only key per written
(sample, field) into a ``__ledger__/<partition>`` partition, and :meth:`write_ledger` reads
the writes back from the store (the gate's one-write-per-(sample, field) check).

Each row's digest (``gpu_gates/dataplane/digest.py``) is written with it as a sample tag
``__digest/<field>`` — through TQ's controller, not the storage unit that carries the row —
and every read compares what came back with it (Relax #256: a transfer engine that
truncated reads and reported success). ``truncate_reads`` is that fault, for the tests.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import threading
import uuid
from typing import Dict, List, Sequence

import torch

from gpu_gates.dataplane import digest
from harness.dataplane.errors import DataPlaneError, DataPlaneInputError
from gpu_gates.dataplane.store import RowStore, Rows

SCHEMA_KEY = "__schema__"
LEDGER_PREFIX = "__ledger__/"


def _innermost_tq_call(thread: threading.Thread) -> str:
    """Where a stuck init thread waits: its innermost TransferQueue frame (the call that
    never returned, e.g. the controller actor's ZMQ info a starved Ray worker never sent)."""
    frame = sys._current_frames().get(thread.ident)
    where = "an unknown place"
    while frame is not None:
        if "transfer_queue" in frame.f_code.co_filename:
            name = frame.f_code.co_filename.split("transfer_queue", 1)[1].lstrip("/")
            where = f"transfer_queue/{name}:{frame.f_lineno} {frame.f_code.co_name}"
            break
        frame = frame.f_back
    return where


class TransferQueueStore(RowStore):
    def __init__(self, conf=None, ledger: bool = False, truncate_reads: bool = False) -> None:
        import transfer_queue as tq  # the one import of TQ in the project

        self.tq = tq
        self.truncate_reads = truncate_reads
        self.client = tq.get_client()
        self.conf = conf  # what init returned (None when attached): the client config to hand on
        self.ledger = ledger

    @classmethod
    def start(cls, *, num_storage_units: int = 1, timeout_s: float = 60.0) -> "TransferQueueStore":
        import ray
        import transfer_queue as tq
        from omegaconf import OmegaConf

        if not ray.is_initialized():
            raise DataPlaneError("TransferQueueStore.start: Ray is not initialized (ray.init(num_cpus=...) first)")
        # polling_mode: a fetch that finds fewer ready samples than asked returns nothing at
        # once, instead of the controller sleeping on it (claim never blocks; see claim())
        conf = OmegaConf.create(
            {
                "backend": {"SimpleStorage": {"num_data_storage_units": num_storage_units}},
                "controller": {"polling_mode": True},
            }
        )
        failure: List[BaseException] = []

        final: List = []

        def run() -> None:
            try:
                final.append(tq.init(conf))
            except BaseException as exc:  # reported below
                failure.append(exc)

        t = threading.Thread(target=run, name="tq-init", daemon=True)
        t.start()
        t.join(timeout_s)
        if t.is_alive():
            raise TimeoutError(
                f"TransferQueue init did not finish in {timeout_s:g} s, waiting in {_innermost_tq_call(t)} "
                "(does Ray have a logical CPU for the controller and each storage unit, "
                "and CPU time for its workers?)"
            )
        if failure:
            raise DataPlaneError(f"TransferQueue init failed: {failure[0]}") from failure[0]
        return cls(final[0] if final else None)

    def write_client_config(self, path: str) -> None:
        """The config a process needs to attach (controller and storage addresses), for
        :meth:`attach`; owner-only, as it names where to reach the store."""
        if self.conf is None:
            raise DataPlaneError("write_client_config: only the process that started TransferQueue has its config")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            pickle.dump(self.conf, f)

    @classmethod
    def attach(cls, path: str, *, ledger: bool = False) -> "TransferQueueStore":
        """A TQ client in this process, from the file :meth:`write_client_config` wrote;
        no Ray in this process (a torchrun rank is not a Ray driver)."""
        from transfer_queue import interface

        with open(path, "rb") as f:
            conf = pickle.load(f)  # written owner-only by the starting process
        interface._maybe_create_tq_client(conf)
        return cls(ledger=ledger)

    def detach(self) -> None:
        """Close this process's client only (the store lives on in the starting process)."""
        from transfer_queue import interface

        if interface._TQ_CLIENT is not None:
            interface._TQ_CLIENT.close()
            interface._TQ_CLIENT = None

    def shutdown(self) -> None:
        self.tq.close()

    # -- primitives ----------------------------------------------------------------------
    def _listing(self, partition_id: str) -> Dict[str, dict]:
        return self.tq.kv_list(partition_id).get(partition_id, {})

    def register(self, partition_id, schema, tasks):
        held = self.partition(partition_id)
        if held is not None:
            if held != (schema, list(tasks)):
                raise DataPlaneInputError(
                    f"partition_id: {partition_id!r} is already registered with a different schema or tasks"
                )
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
                tags = {k: v for k, v in (listing[s] or {}).items() if not k.startswith(digest.DIGEST_TAG)}
                out[s] = (tags, set(meta.field_names or []))
        return out

    def write(self, partition_id, sample_ids, rows, tags, writer):
        from tensordict import TensorDict

        columns = {name: _column(field_rows) for name, field_rows in rows.items()}
        td = TensorDict(columns, batch_size=[len(sample_ids)])
        sums = digest.digests_of(rows)
        listing = self._listing(partition_id)  # a put replaces a sample's tags: keep the other fields' digests
        full = [
            {
                **{k: v for k, v in (listing.get(s) or {}).items() if k.startswith(digest.DIGEST_TAG)},
                **dict(tags[i]),
                **{digest.DIGEST_TAG + name: sums[name][i] for name in rows},
            }
            for i, s in enumerate(sample_ids)
        ]
        self.tq.kv_batch_put(keys=list(sample_ids), partition_id=partition_id, fields=td, tags=full)
        if self.ledger:  # after the put returned: the store holds these rows now
            entries = [(s, f) for s in sample_ids for f in rows]
            self.tq.kv_batch_put(
                keys=[f"{s}/{f}/{uuid.uuid4().hex}" for s, f in entries],
                partition_id=LEDGER_PREFIX + partition_id,
                tags=[{"writer": writer, "sample": s, "field": f} for s, f in entries],
            )

    def write_ledger(self) -> List[tuple]:
        """(writer, partition, sample, field) of every write recorded in the store."""
        out = []
        for part, keys in sorted(self.tq.kv_list().items()):
            if part.startswith(LEDGER_PREFIX):
                out += [(t["writer"], part[len(LEDGER_PREFIX) :], t["sample"], t["field"]) for t in keys.values()]
        return out

    def read(self, partition_id, sample_ids, fields):
        td = self.tq.kv_batch_get(keys=list(sample_ids), partition_id=partition_id, select_fields=list(fields))
        out: Rows = {}
        for name in fields:
            value = td[name]
            out[name] = [r.clone() for r in value.unbind(0)]
            if len(out[name]) != len(sample_ids):
                raise DataPlaneError(
                    f"TransferQueue returned {len(out[name])} rows of {name!r} for {len(sample_ids)} samples"
                )
            if self.truncate_reads:
                out[name] = [digest.truncated(r) for r in out[name]]
        listing = self._listing(partition_id)
        digest.verify(partition_id, sample_ids, out, lambda s, f: (listing.get(s) or {}).get(digest.DIGEST_TAG + f))
        return out

    def drop(self, partition_id, sample_ids):
        keys = list(self._listing(partition_id)) if sample_ids is None else list(sample_ids)
        if keys:
            self.tq.kv_clear(keys=keys, partition_id=partition_id)

    def claim(self, partition_id, task, required_fields, batch_size):
        """TQ's own per-task consumption cursor (``get_meta`` in fetch mode), as NeMo RL's
        adapter claims: the controller marks the samples consumed, so claims from several
        processes never overlap. The placeholder schema key has no fields and is never ready."""
        meta = self.client.get_meta(
            data_fields=list(required_fields),
            batch_size=int(batch_size),
            partition_id=partition_id,
            mode="fetch",
            task_name=task,
        )
        indexes = list(getattr(meta, "global_indexes", None) or [])
        if not indexes:
            return []
        return list(self.client.kv_retrieve_keys(global_indexes=indexes, partition_id=partition_id))

    def consumption(self, partition_id, task):
        index, status = self.client.get_consumption_status(task_name=task, partition_id=partition_id)
        if index is None or index.numel() == 0:
            return 0, 0
        keys = self.client.kv_retrieve_keys(global_indexes=index.tolist(), partition_id=partition_id)
        pairs = [(k, int(v)) for k, v in zip(keys, status.tolist()) if k != SCHEMA_KEY]
        return sum(v for _, v in pairs), len(pairs)


def _column(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    shapes = {tuple(r.shape) for r in rows}
    if len(shapes) == 1:
        return torch.stack(list(rows))
    return torch.nested.nested_tensor(list(rows), layout=torch.jagged)
