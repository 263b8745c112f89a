"""Row stores: where (sample, field) rows live. One interface, several backends.

A row store knows nothing of schemas' meaning or padding; the client (client.py) encodes
and validates, then calls these primitives. ``InProcessStore`` is a dict in this process
(also servable to other processes, see gpu_gates/transports/served_store.py);
``TransferQueueStore`` (gpu_gates/transports/tq_store.py) is the real TransferQueue on Ray. ``RefuseOverwrite`` wraps any store with Mooncake's
no-upsert rule: a second write of a (sample, field) is refused with the ``-601`` class
error instead of silently replacing the row, which is how a duplicate writer shows up.

Every store writes a digest with each row and checks it on every read
(``gpu_gates/dataplane/digest.py``): a read that came back truncated while reporting success
(Relax #256) is a ``RowDigestError`` naming the row and field, never a wrong row handed on.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Dict, List, Optional, Sequence, Set, Tuple

import torch

from gpu_gates.dataplane import digest
from harness.dataplane.errors import DataPlaneInputError, DuplicateWriteError

Rows = Dict[str, List[torch.Tensor]]


class RowStore(ABC):
    """Backend primitives; every call is all-or-nothing for its batch."""

    @abstractmethod
    def register(self, partition_id: str, schema: dict, tasks: Sequence[str]) -> None: ...

    @abstractmethod
    def partition(self, partition_id: str) -> Optional[Tuple[dict, List[str]]]:
        """(schema JSON, consumer tasks) of a registered partition, or None."""

    @abstractmethod
    def samples(self, partition_id: str, sample_ids: Sequence[str]) -> Dict[str, Tuple[dict, Set[str]]]:
        """For each of ``sample_ids`` the store holds: (tags, produced fields)."""

    @abstractmethod
    def write(
        self, partition_id: str, sample_ids: Sequence[str], rows: Rows, tags: List[dict], writer: str
    ) -> None: ...

    @abstractmethod
    def read(self, partition_id: str, sample_ids: Sequence[str], fields: Sequence[str]) -> Rows: ...

    @abstractmethod
    def drop(self, partition_id: str, sample_ids: Optional[Sequence[str]]) -> None:
        """Remove samples, or (None) the whole partition including its registration."""

    @abstractmethod
    def claim(self, partition_id: str, task: str, required_fields: Sequence[str], batch_size: int) -> List[str]:
        """Atomically claim ``batch_size`` samples for ``task``: samples whose required fields
        are all produced and that ``task`` has not claimed, oldest put first. Fewer ready
        than ``batch_size``: nothing is claimed and ``[]`` comes back (TransferQueue's fetch
        rule: a batch is claimed whole or not at all)."""

    @abstractmethod
    def consumption(self, partition_id: str, task: str) -> Tuple[int, int]:
        """(samples ``task`` has claimed, samples held) over the samples the partition holds now."""

    def close(self) -> None:
        pass


class InProcessStore(RowStore):
    """A dict of partitions guarded by a lock; ``writes`` is its ledger of every row write.

    ``truncate_reads`` is a test fault (Relax #256): every read returns its rows with the
    second half of their bytes never copied, and reports success; the digest check must
    catch it."""

    def __init__(self, truncate_reads: bool = False) -> None:
        self.truncate_reads = truncate_reads
        self._digests: Dict[str, Dict[Tuple[str, str], str]] = {}  # partition -> (sample, field) -> digest
        self._lock = threading.Lock()
        self._partitions: Dict[str, Tuple[dict, List[str]]] = {}
        self._rows: Dict[str, Dict[str, Dict[str, torch.Tensor]]] = {}
        self._tags: Dict[str, Dict[str, dict]] = {}
        self._claimed: Dict[Tuple[str, str], Set[str]] = {}  # (partition, task) -> claimed sample ids
        self.writes: List[Tuple[str, str, str, str]] = []  # (writer, partition, sample, field)

    def register(self, partition_id, schema, tasks):
        with self._lock:
            held = self._partitions.get(partition_id)
            if held is not None and held != (schema, list(tasks)):
                raise DataPlaneInputError(
                    f"partition_id: {partition_id!r} is already registered with a different schema or tasks"
                )
            self._partitions[partition_id] = (schema, list(tasks))
            self._rows.setdefault(partition_id, {})
            self._tags.setdefault(partition_id, {})

    def partition(self, partition_id):
        with self._lock:
            return self._partitions.get(partition_id)

    def samples(self, partition_id, sample_ids):
        with self._lock:
            rows, tags = self._rows.get(partition_id, {}), self._tags.get(partition_id, {})
            return {s: (dict(tags[s]), set(rows[s])) for s in sample_ids if s in tags}

    def write(self, partition_id, sample_ids, rows, tags, writer):
        with self._lock:
            self._write_locked(partition_id, sample_ids, rows, tags, writer)

    def _write_locked(self, partition_id, sample_ids, rows, tags, writer):
        if partition_id not in self._partitions:
            raise DataPlaneInputError(f"partition_id: {partition_id!r} is not registered")
        part_rows, part_tags = self._rows[partition_id], self._tags[partition_id]
        sums = digest.digests_of(rows)  # before any update: hashing is the one step that could fail
        part_sums = self._digests.setdefault(partition_id, {})
        for i, s in enumerate(sample_ids):  # everything below is plain dict updates: cannot fail half-way
            part_tags[s] = dict(tags[i])
            sample_rows = part_rows.setdefault(s, {})
            for name, field_rows in rows.items():
                sample_rows[name] = field_rows[i]
                part_sums[(s, name)] = sums[name][i]
                self.writes.append((writer, partition_id, s, name))

    def read(self, partition_id, sample_ids, fields):
        with self._lock:
            part = self._rows[partition_id]
            rows = {f: [part[s][f] for s in sample_ids] for f in fields}
            sums = dict(self._digests.get(partition_id, {}))
        if self.truncate_reads:
            rows = {f: [digest.truncated(r) for r in field_rows] for f, field_rows in rows.items()}
        digest.verify(partition_id, sample_ids, rows, lambda s, f: sums.get((s, f)))
        return rows

    def drop(self, partition_id, sample_ids):
        with self._lock:
            if sample_ids is None:
                self._partitions.pop(partition_id, None)
                self._rows.pop(partition_id, None)
                self._tags.pop(partition_id, None)
                self._digests.pop(partition_id, None)
                for key in [k for k in self._claimed if k[0] == partition_id]:
                    del self._claimed[key]
                return
            sums = self._digests.get(partition_id, {})
            for s in sample_ids:
                self._rows.get(partition_id, {}).pop(s, None)
                self._tags.get(partition_id, {}).pop(s, None)
                for key in [k for k in sums if k[0] == s]:
                    del sums[key]
                for key, claimed in self._claimed.items():
                    if key[0] == partition_id:
                        claimed.discard(s)

    def claim(self, partition_id, task, required_fields, batch_size):
        with self._lock:  # the readiness scan and the marking are one step: two claimers never share a sample
            claimed = self._claimed.setdefault((partition_id, task), set())
            rows = self._rows.get(partition_id, {})  # insertion order = first put order
            ready = [s for s, held in rows.items() if s not in claimed and all(f in held for f in required_fields)]
            if len(ready) < batch_size:
                return []
            take = ready[:batch_size]
            claimed.update(take)
            return take

    def consumption(self, partition_id, task):
        with self._lock:
            rows = self._rows.get(partition_id, {})
            claimed = self._claimed.get((partition_id, task), set())
            return sum(1 for s in rows if s in claimed), len(rows)

    def write_ledger(self) -> List[Tuple[str, str, str, str]]:
        with self._lock:
            return list(self.writes)


class RefuseOverwrite(RowStore):
    """Mooncake's semantics over any store: no upsert; a rewrite of a row raises -601.

    Plain TransferQueue (and the in-process store) silently overwrite, so a duplicate
    writer leaves no trace in the data; wrapping the store injects the refusal that real
    Mooncake would give. The conflict check and the write happen under one lock so two
    racing writers cannot both pass it (within one process or one served store).
    """

    def __init__(self, inner: RowStore) -> None:
        self.inner = inner
        self._lock = threading.Lock()

    def register(self, partition_id, schema, tasks):
        self.inner.register(partition_id, schema, tasks)

    def partition(self, partition_id):
        return self.inner.partition(partition_id)

    def samples(self, partition_id, sample_ids):
        return self.inner.samples(partition_id, sample_ids)

    def write(self, partition_id, sample_ids, rows, tags, writer):
        with self._lock:
            held = self.inner.samples(partition_id, sample_ids)
            conflicts = [(s, f) for s in sample_ids if s in held for f in rows if f in held[s][1]]
            if conflicts:
                raise DuplicateWriteError(partition_id, conflicts, writer)
            self.inner.write(partition_id, sample_ids, rows, tags, writer)

    def read(self, partition_id, sample_ids, fields):
        return self.inner.read(partition_id, sample_ids, fields)

    def drop(self, partition_id, sample_ids):
        self.inner.drop(partition_id, sample_ids)

    def claim(self, partition_id, task, required_fields, batch_size):
        return self.inner.claim(partition_id, task, required_fields, batch_size)

    def consumption(self, partition_id, task):
        return self.inner.consumption(partition_id, task)

    def close(self):
        self.inner.close()

    def write_ledger(self):
        return self.inner.write_ledger()
