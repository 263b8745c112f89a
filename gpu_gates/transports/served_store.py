"""One in-process store shared by several processes (the leader write-back gate).

The gate's ranks are separate processes, and the point of the gate is what the *store*
sees when several of them write: so one process hosts the store and the others reach the
same object through a ``multiprocessing`` manager proxy on localhost (authkey required).
A proxy call runs the store method in the host; exceptions (the ``-601`` refusal
included) come back as the same exception types, so the client code is unchanged. Rows
cross the socket as ``torch.save`` bytes: torch's own pickling of tensors for
``multiprocessing`` would hand over file descriptors, which needs the processes to share
a parent's authkey (torchrun's ranks do not).
"""

from __future__ import annotations

import io
import threading
from multiprocessing.managers import BaseManager
from typing import Callable, Tuple

import torch

from gpu_gates.dataplane.store import RowStore, Rows

METHODS = (
    "register",
    "partition",
    "samples",
    "write_bytes",
    "read_bytes",
    "drop",
    "claim",
    "consumption",
    "write_ledger",
)


def _dump(rows: Rows) -> bytes:
    buf = io.BytesIO()
    torch.save(rows, buf)
    return buf.getvalue()


def _load(data: bytes) -> Rows:
    return torch.load(io.BytesIO(data), weights_only=True)


class _Host:
    """What the host serves: the store's methods, with rows as bytes."""

    def __init__(self, store: RowStore) -> None:
        self.store = store

    def register(self, *a):
        return self.store.register(*a)

    def partition(self, *a):
        return self.store.partition(*a)

    def samples(self, *a):
        return self.store.samples(*a)

    def write_bytes(self, partition_id, sample_ids, data, tags, writer):
        return self.store.write(partition_id, sample_ids, _load(data), tags, writer)

    def read_bytes(self, partition_id, sample_ids, fields):
        return _dump(self.store.read(partition_id, sample_ids, fields))

    def drop(self, *a):
        return self.store.drop(*a)

    def claim(self, *a):
        return self.store.claim(*a)

    def consumption(self, *a):
        return self.store.consumption(*a)

    def write_ledger(self):
        return self.store.write_ledger()  # type: ignore[attr-defined]


class RemoteStore(RowStore):
    """A RowStore in another process, through a manager proxy."""

    def __init__(self, proxy) -> None:
        self.proxy = proxy

    def register(self, partition_id, schema, tasks):
        self.proxy.register(partition_id, schema, list(tasks))

    def partition(self, partition_id):
        return self.proxy.partition(partition_id)

    def samples(self, partition_id, sample_ids):
        return self.proxy.samples(partition_id, list(sample_ids))

    def write(self, partition_id, sample_ids, rows, tags, writer):
        self.proxy.write_bytes(partition_id, list(sample_ids), _dump(rows), tags, writer)

    def read(self, partition_id, sample_ids, fields):
        return _load(self.proxy.read_bytes(partition_id, list(sample_ids), list(fields)))

    def drop(self, partition_id, sample_ids):
        self.proxy.drop(partition_id, None if sample_ids is None else list(sample_ids))

    def claim(self, partition_id, task, required_fields, batch_size):
        return self.proxy.claim(partition_id, task, list(required_fields), batch_size)

    def consumption(self, partition_id, task):
        return tuple(self.proxy.consumption(partition_id, task))

    def write_ledger(self):
        return self.proxy.write_ledger()


class _HostManager(BaseManager):
    pass


class _ClientManager(BaseManager):
    pass


_ClientManager.register("store", exposed=METHODS)


def serve(store: RowStore, authkey: bytes) -> Tuple[Tuple[str, int], Callable[[], None]]:
    """Serve ``store`` on a free localhost port from a daemon thread; returns (address, stop)."""
    host = _Host(store)
    _HostManager.register("store", callable=lambda: host, exposed=METHODS)
    manager = _HostManager(address=("127.0.0.1", 0), authkey=authkey)
    server = manager.get_server()
    thread = threading.Thread(target=server.serve_forever, name="dataplane-store", daemon=True)
    thread.start()

    def stop() -> None:
        server.stop_event.set()
        thread.join(timeout=5.0)

    return server.address, stop


def connect(address: Tuple[str, int], authkey: bytes):
    manager = _ClientManager(address=tuple(address), authkey=authkey)
    manager.connect()
    return RemoteStore(manager.store())
