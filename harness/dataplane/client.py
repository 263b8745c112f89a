"""The data-plane client contract: put, get (explicit fields), clear, close.

One class over any :class:`~harness.dataplane.store.RowStore`, so the in-process store
and TransferQueue obey the same contract and one test suite runs against both. Every
call validates all of its arguments (and encodes all of its fields) before the store is
touched, so a bad call leaves nothing half-written. Every call that moves bulk bytes
reports one ``dp_transfer`` record to the client's sink: the hop (``producer_to_store``,
``store_to_worker``, ``worker_to_store``, ``store_to_driver``, ...), who, which samples
and fields, and the bytes actually encoded or decoded — invariant 16 reads those.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from harness.dataplane.codec import Schema, decode, encode, rows_nbytes
from harness.dataplane.errors import (ClosedClientError, DataPlaneInputError, DuplicateWriteError,
                                      MissingSamplesError, UnknownPartitionError, UnknownTaskError,
                                      UnproducedFieldError, sample_list)
from harness.dataplane.meta import KVBatchMeta, check_sample_ids, check_tags
from harness.dataplane.store import RowStore

ROLES = ("producer", "worker", "driver")
Sink = Callable[[str, Dict[str, Any]], None]


def _check_partition_id(partition_id: Any) -> str:
    if not isinstance(partition_id, str) or not partition_id:
        raise DataPlaneInputError(f"partition_id: must be a non-empty string, got {partition_id!r}")
    return partition_id


class DataPlaneClient:
    """One process's view of the store; ``actor``/``role``/``dp_rank`` label its records."""

    def __init__(self, store: RowStore, *, actor: str, role: str, dp_rank: Optional[int] = None,
                 sink: Optional[Sink] = None) -> None:
        if role not in ROLES:
            raise DataPlaneInputError(f"role: must be one of {', '.join(ROLES)}, got {role!r}")
        if not isinstance(actor, str) or not actor:
            raise DataPlaneInputError("actor: must be a non-empty string")
        self.store, self.actor, self.role, self.dp_rank = store, actor, role, dp_rank
        self.sink = sink
        self.closed = False
        self._schemas: Dict[str, Schema] = {}

    # -- records -------------------------------------------------------------------------
    def _emit(self, kind: str, **fields: Any) -> None:
        if self.sink is not None:
            fields = {"actor": self.actor, "role": self.role, **fields}
            if self.dp_rank is not None:
                fields["dp_rank"] = self.dp_rank
            self.sink(kind, fields)

    def record_meta_dispatch(self, meta: KVBatchMeta, to: str) -> int:
        """The driver handing metadata to a worker: the only thing the driver may move."""
        size = len(meta.to_json().encode())
        self._emit("dp_transfer", hop="driver_meta", partition=meta.partition_id, samples=list(meta.sample_ids),
                   fields=list(meta.fields), bytes=size, bulk=False, to=to)
        return size

    # -- lifecycle -----------------------------------------------------------------------
    def _live(self) -> None:
        if self.closed:
            raise ClosedClientError(f"client {self.actor!r} is closed")

    def close(self) -> None:
        """Idempotent; the store itself belongs to whoever created it."""
        self.closed = True

    def register_partition(self, partition_id: str, schema: Schema | Mapping, tasks: Sequence[str] = ()) -> None:
        self._live()
        _check_partition_id(partition_id)
        if not isinstance(schema, Schema):
            schema = Schema.from_json(schema)
        if isinstance(tasks, str) or any(not isinstance(t, str) or not t for t in tasks):
            raise DataPlaneInputError("tasks: must be a list of non-empty task names")
        self.store.register(partition_id, schema.to_json(), list(tasks))
        self._schemas[partition_id] = schema

    def schema(self, partition_id: str) -> Schema:
        _check_partition_id(partition_id)
        held = self.store.partition(partition_id)
        if held is None:
            self._schemas.pop(partition_id, None)
            raise UnknownPartitionError(f"partition_id: {partition_id!r} is not registered (never, or dropped by clear_samples(None))")
        schema = self._schemas.get(partition_id)
        if schema is None or schema.to_json() != held[0]:
            schema = self._schemas[partition_id] = Schema.from_json(held[0])
        return schema

    # -- the contract --------------------------------------------------------------------
    def put_samples(self, sample_ids: Sequence[str], partition_id: str, fields: Mapping[str, Any], *,
                    tags: Optional[List[dict]] = None, sequence_lengths: Optional[Sequence[int]] = None) -> KVBatchMeta:
        self._live()
        ids = check_sample_ids(sample_ids)
        schema = self.schema(partition_id)
        new_tags = check_tags(tags, len(ids))
        batch = encode(schema, fields, len(ids), sequence_lengths)
        held = self.store.samples(partition_id, ids)
        merged = [{**held.get(s, ({}, set()))[0], **new_tags[i]} for i, s in enumerate(ids)]
        try:
            self.store.write(partition_id, ids, batch.rows, merged, self.actor)
        except DuplicateWriteError as exc:
            self._emit("dp_write_refused", partition=partition_id, samples=list(ids), fields=sorted(batch.rows),
                       code=exc.code, reason=str(exc))
            raise
        self._emit("dp_transfer", hop=f"{self.role}_to_store", partition=partition_id, samples=list(ids),
                   fields=list(batch.rows), bytes=batch.nbytes, bulk=True)
        lens = None if sequence_lengths is None else tuple(int(v) for v in list(sequence_lengths))
        return KVBatchMeta(partition_id, ids, tuple(batch.rows), lens, tuple(merged),
                           {"object_fields": list(batch.object_fields)})

    def get_samples(self, sample_ids: Sequence[str], partition_id: str, select_fields: Sequence[str], *,
                    task_name: Optional[str] = None, pad_to: Optional[int] = None) -> Dict[str, Any]:
        """Only the named fields, never "everything": ``select_fields`` is required."""
        self._live()
        ids = check_sample_ids(sample_ids)
        schema = self.schema(partition_id)
        if task_name is not None:
            tasks = self.store.partition(partition_id)[1]
            if task_name not in tasks:
                raise UnknownTaskError(f"task_name: {task_name!r} is not a consumer task of partition {partition_id!r} "
                                       f"(tasks: {', '.join(tasks) or 'none'})")
        if isinstance(select_fields, str) or not isinstance(select_fields, (list, tuple)) or not select_fields:
            raise DataPlaneInputError("select_fields: must be a non-empty list of field names (never implicit)")
        for f in select_fields:
            if f not in schema:
                raise DataPlaneInputError(f"select_fields: {f!r} is not declared in partition {partition_id!r}")
        if pad_to is not None and (not isinstance(pad_to, int) or isinstance(pad_to, bool) or pad_to < 0):
            raise DataPlaneInputError(f"pad_to: must be a non-negative int, got {pad_to!r}")
        held = self.store.samples(partition_id, ids)
        missing = [s for s in ids if s not in held]
        if missing:
            raise MissingSamplesError(f"sample_ids: {sample_list(missing)} not in partition {partition_id!r} "
                                      "(never put, or cleared)")
        for f in select_fields:
            lacking = [s for s in ids if f not in held[s][1]]
            if lacking:
                raise UnproducedFieldError(f"select_fields: field {f!r} has not been produced for samples {sample_list(lacking)}")
        rows = self.store.read(partition_id, ids, list(select_fields))
        self._emit("dp_transfer", hop=f"store_to_{self.role}", partition=partition_id, samples=list(ids),
                   fields=list(select_fields), bytes=sum(rows_nbytes(r) for r in rows.values()), bulk=True)
        return decode(schema, rows, pad_to)

    def clear_samples(self, sample_ids: Optional[Sequence[str]], partition_id: str) -> None:
        """Drop samples; ``None`` drops the whole partition (its registration too)."""
        self._live()
        _check_partition_id(partition_id)
        ids = None if sample_ids is None else check_sample_ids(sample_ids)
        if self.store.partition(partition_id) is None:
            raise UnknownPartitionError(f"partition_id: {partition_id!r} is not registered")
        self.store.drop(partition_id, ids)
        if ids is None:
            self._schemas.pop(partition_id, None)
        self._emit("dp_clear", partition=partition_id, samples=None if ids is None else list(ids))
