"""Backends for the data-plane contract suite: the in-process store and TransferQueue.

TransferQueue runs on the session's one local Ray (``local_ray`` in tests/conftest.py,
shared with the fuzz executor's Ray test: its files are one xdist work unit). Starting TQ
costs seconds, so the fixture is module-scoped and the TQ tests live in one module
(test_contract.py). Every TQ test carries the
``transferqueue`` marker and the ``xdist_group`` "transferqueue" (with ``--dist
loadgroup`` they all land on one worker). Ray gets more logical CPUs than the machine has
cores because TQ's controller and each storage unit reserve one, and with too few its init
waits forever; every wait is bounded. Nothing is left in /dev/shm (checked when Ray stops).
"""

from __future__ import annotations

import itertools
import time

import pytest

torch = pytest.importorskip("torch")

from gpu_gates.dataplane.client import DataPlaneClient  # noqa: E402
from gpu_gates.dataplane.store import InProcessStore, RefuseOverwrite  # noqa: E402

BACKENDS = ["inprocess", "transferqueue"]
_counter = itertools.count()


@pytest.fixture(scope="module")
def tq_store(local_ray):
    """TransferQueue on the session's local Ray (tests/conftest.py), for this module."""
    pytest.importorskip("transfer_queue")
    from gpu_gates.transports.tq_store import TransferQueueStore

    started = time.monotonic()
    store = TransferQueueStore.start(num_storage_units=1, timeout_s=180)
    store.startup_s = time.monotonic() - started
    try:
        yield store
    finally:
        store.shutdown()


@pytest.fixture(params=BACKENDS)
def backend(request):
    """A fresh store view per test: a new InProcessStore, or the session TQ with new partitions."""
    if request.param == "transferqueue":
        request.applymarker(pytest.mark.transferqueue)
        return request.getfixturevalue("tq_store")
    return InProcessStore()


@pytest.fixture
def partition():
    return f"p{next(_counter)}"


@pytest.fixture
def records():
    return []


@pytest.fixture
def make_client(backend, records):
    def make(role="producer", actor=None, refuse=False, dp_rank=None):
        store = RefuseOverwrite(backend) if refuse else backend
        return DataPlaneClient(
            store,
            actor=actor or role,
            role=role,
            dp_rank=dp_rank,
            sink=lambda kind, fields: records.append({"kind": kind, **fields}),
        )

    return make


def pytest_collection_modifyitems(items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("backend") == "transferqueue":
            item.add_marker(pytest.mark.transferqueue)
            item.add_marker(pytest.mark.xdist_group("transferqueue"))
