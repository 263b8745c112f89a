"""The data-plane client contract: put, get (explicit fields), clear, close, and the
task-mediated reads (claim_meta, get_data, check_consumption_status) after NeMo RL's
``DataPlaneClient`` (NVIDIA-NeMo/RL ``nemo_rl/data_plane/interfaces.py`` @ 7ea279ab).

One class over any :class:`~gpu_gates.dataplane.store.RowStore`, so the in-process store
and TransferQueue obey the same contract and one test suite runs against both. Every
call validates all of its arguments (and encodes all of its fields) before the store is
touched, so a bad call leaves nothing half-written. Every call that moves bulk bytes
reports one ``dp_transfer`` record to the client's sink: the hop (``producer_to_store``,
``store_to_worker``, ``worker_to_store``, ``store_to_driver``, ...), who, which samples
and fields, and the bytes actually encoded or decoded — ``data_plane`` reads those.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from gpu_gates.dataplane.codec import Schema, decode, encode, rows_nbytes
from harness.dataplane.errors import (
    ClosedClientError,
    DataPlaneInputError,
    DuplicateWriteError,
    MissingSamplesError,
    UnknownPartitionError,
    UnknownTaskError,
    UnproducedFieldError,
    sample_list,
)
from harness.dataplane.meta import KVBatchMeta, check_sample_ids, check_tags
from gpu_gates.dataplane.store import RowStore

ROLES = ("producer", "worker", "driver")
Sink = Callable[[str, Dict[str, Any]], None]


def _check_partition_id(partition_id: Any) -> str:
    if not isinstance(partition_id, str) or not partition_id:
        raise DataPlaneInputError(f"partition_id: must be a non-empty string, got {partition_id!r}")
    return partition_id


class DataPlaneClient:
    """One process's view of the store; ``actor``/``role``/``dp_rank`` label its records."""

    def __init__(
        self, store: RowStore, *, actor: str, role: str, dp_rank: Optional[int] = None, sink: Optional[Sink] = None
    ) -> None:
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
        self._emit(
            "dp_transfer",
            hop="driver_meta",
            partition=meta.partition_id,
            samples=list(meta.sample_ids),
            fields=list(meta.fields),
            bytes=size,
            bulk=False,
            to=to,
        )
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
            raise UnknownPartitionError(
                f"partition_id: {partition_id!r} is not registered (never, or dropped by clear_samples(None))"
            )
        schema = self._schemas.get(partition_id)
        if schema is None or schema.to_json() != held[0]:
            schema = self._schemas[partition_id] = Schema.from_json(held[0])
        return schema

    # -- the contract --------------------------------------------------------------------
    def put_samples(
        self,
        sample_ids: Sequence[str],
        partition_id: str,
        fields: Mapping[str, Any],
        *,
        tags: Optional[List[dict]] = None,
        sequence_lengths: Optional[Sequence[int]] = None,
    ) -> KVBatchMeta:
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
            self._emit(
                "dp_write_refused",
                partition=partition_id,
                samples=list(ids),
                fields=sorted(batch.rows),
                code=exc.code,
                reason=str(exc),
            )
            raise
        self._emit(
            "dp_transfer",
            hop=f"{self.role}_to_store",
            partition=partition_id,
            samples=list(ids),
            fields=list(batch.rows),
            bytes=batch.nbytes,
            bulk=True,
        )
        lens = None if sequence_lengths is None else tuple(int(v) for v in list(sequence_lengths))
        return KVBatchMeta(
            partition_id, ids, tuple(batch.rows), lens, tuple(merged), {"object_fields": list(batch.object_fields)}
        )

    def get_samples(
        self,
        sample_ids: Sequence[str],
        partition_id: str,
        select_fields: Sequence[str],
        *,
        task_name: Optional[str] = None,
        pad_to: Optional[int] = None,
    ) -> Dict[str, Any]:
        """Only the named fields, never "everything": ``select_fields`` is required."""
        self._live()
        ids = check_sample_ids(sample_ids)
        schema = self.schema(partition_id)
        if task_name is not None:
            tasks = self.store.partition(partition_id)[1]
            if task_name not in tasks:
                raise UnknownTaskError(
                    f"task_name: {task_name!r} is not a consumer task of partition {partition_id!r} "
                    f"(tasks: {', '.join(tasks) or 'none'})"
                )
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
            raise MissingSamplesError(
                f"sample_ids: {sample_list(missing)} not in partition {partition_id!r} (never put, or cleared)"
            )
        for f in select_fields:
            lacking = [s for s in ids if f not in held[s][1]]
            if lacking:
                raise UnproducedFieldError(
                    f"select_fields: field {f!r} has not been produced for samples {sample_list(lacking)}"
                )
        rows = self.store.read(partition_id, ids, list(select_fields))
        self._emit(
            "dp_transfer",
            hop=f"store_to_{self.role}",
            partition=partition_id,
            samples=list(ids),
            fields=list(select_fields),
            bytes=sum(rows_nbytes(r) for r in rows.values()),
            bulk=True,
        )
        return decode(schema, rows, pad_to)

    # -- consumption (task-mediated reads) ---------------------------------------------
    def _task_of(self, partition_id: str, task_name: Any) -> str:
        if not isinstance(task_name, str) or not task_name:
            raise DataPlaneInputError(f"task_name: must be a non-empty string, got {task_name!r}")
        tasks = self.store.partition(partition_id)[1]
        if task_name not in tasks:
            raise UnknownTaskError(
                f"task_name: {task_name!r} is not a consumer task of partition {partition_id!r} "
                f"(tasks: {', '.join(tasks) or 'none'})"
            )
        return task_name

    def claim_meta(
        self, partition_id: str, task_name: str, required_fields: Sequence[str], batch_size: int
    ) -> KVBatchMeta:
        """Claim ``batch_size`` samples whose ``required_fields`` are all produced and that
        ``task_name`` has not claimed yet; they are never handed to that task again (other
        tasks keep their own cursor). Never blocks: with fewer ready than ``batch_size`` the
        meta comes back empty and nothing is claimed, and the caller decides when to ask
        again. The meta names the claimed samples, their tags and ``required_fields``;
        :meth:`get_data` reads them."""
        self._live()
        schema = self.schema(partition_id)
        task = self._task_of(partition_id, task_name)
        if isinstance(required_fields, str) or not isinstance(required_fields, (list, tuple)) or not required_fields:
            raise DataPlaneInputError("required_fields: must be a non-empty list of field names")
        for f in required_fields:
            if f not in schema:
                raise DataPlaneInputError(f"required_fields: {f!r} is not declared in partition {partition_id!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise DataPlaneInputError(f"batch_size: must be a positive int, got {batch_size!r}")
        ids = self.store.claim(partition_id, task, list(required_fields), batch_size)
        held = self.store.samples(partition_id, ids) if ids else {}
        tags = tuple(dict(held[s][0]) if s in held else {} for s in ids)
        lens = None  # as NeMo RL: lifted from an ``input_lengths`` tag when every row has one
        if ids and all("input_lengths" in t for t in tags):
            lens = tuple(int(t["input_lengths"]) for t in tags)
        return KVBatchMeta(
            partition_id, tuple(ids), tuple(dict.fromkeys(required_fields)), lens, tags, {"task_name": task}
        )

    def get_data(
        self, meta: KVBatchMeta, select_fields: Optional[Sequence[str]] = None, *, pad_to: Optional[int] = None
    ) -> Dict[str, Any]:
        """The rows a meta names: ``select_fields`` if given, else the meta's own fields —
        never every field (a meta with neither is refused)."""
        if not isinstance(meta, KVBatchMeta):
            raise DataPlaneInputError(f"meta: must be a KVBatchMeta, got {type(meta).__name__}")
        fields = select_fields if select_fields is not None else meta.fields
        if not fields:
            raise DataPlaneInputError("select_fields: none given and the meta names no fields (never implicit)")
        if not meta.sample_ids:
            raise DataPlaneInputError("meta: names no samples (an empty claim has nothing to read)")
        return self.get_samples(list(meta.sample_ids), meta.partition_id, list(fields), pad_to=pad_to)

    def check_consumption_status(self, partition_id: str, task_names: Sequence[str]) -> bool:
        """True iff every task in ``task_names`` has claimed every sample the partition holds
        (and it holds at least one: an empty partition is not "consumed", as in TQ)."""
        self._live()
        self.schema(partition_id)
        if isinstance(task_names, str) or not isinstance(task_names, (list, tuple)) or not task_names:
            raise DataPlaneInputError("task_names: must be a non-empty list of task names")
        tasks = [self._task_of(partition_id, t) for t in task_names]
        for task in tasks:
            done, total = self.store.consumption(partition_id, task)
            if total == 0 or done < total:
                return False
        return True

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
