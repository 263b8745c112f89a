"""Backends for the data-plane contract suite: the in-process store and TransferQueue.

TransferQueue runs on ONE local Ray (per xdist worker): starting Ray and TQ costs
seconds, so the fixture is module-scoped and the TQ tests live in one module
(test_contract.py). Ray starts with its first TQ test and is shut down after its last, so
later tests that start their own Ray (the fuzz executor's) find none running. Every TQ
test carries the
``transferqueue`` marker and the ``xdist_group`` "transferqueue" (with ``--dist
loadgroup`` they all land on one worker). Ray gets more logical CPUs than the machine has
cores because TQ's controller and each storage unit reserve one, and with too few its init
waits forever; every wait is bounded. Nothing is left in /dev/shm.
"""

from __future__ import annotations

import itertools
import os
import time

import pytest

torch = pytest.importorskip("torch")

from harness.dataplane.client import DataPlaneClient  # noqa: E402
from harness.dataplane.store import InProcessStore, RefuseOverwrite  # noqa: E402

BACKENDS = ["inprocess", "transferqueue"]
_counter = itertools.count()


def _shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


@pytest.fixture(scope="module")
def tq_store(one_ray_at_a_time):
    pytest.importorskip("transfer_queue")
    ray = pytest.importorskip("ray")
    from gpu_gates.transports.tq_store import TransferQueueStore

    shm_before = _shm_entries()
    started = time.monotonic()
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, namespace="rlharness-tests",
             configure_logging=False)
    try:
        store = TransferQueueStore.start(num_storage_units=1, timeout_s=180)
    except BaseException:
        ray.shutdown()
        raise
    store.startup_s = time.monotonic() - started
    try:
        yield store
    finally:
        store.shutdown()
        ray.shutdown()
        leaked = _shm_entries() - shm_before
        assert not [e for e in leaked if "ray" in e.lower() or "plasma" in e.lower()], f"/dev/shm leftovers: {leaked}"


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
        return DataPlaneClient(store, actor=actor or role, role=role, dp_rank=dp_rank,
                               sink=lambda kind, fields: records.append({"kind": kind, **fields}))
    return make


def pytest_collection_modifyitems(items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("backend") == "transferqueue":
            item.add_marker(pytest.mark.transferqueue)
            item.add_marker(pytest.mark.xdist_group("transferqueue"))
