"""TransferQueue's start-up is bounded, and a timeout says where TQ's init was stuck.

The stuck init is a stand-in: TQ's ``init`` replaced by one that blocks in a frame whose
file is TQ's (where a starved controller actor left the real one, waiting for its ZMQ
address), so the test needs neither a starved Ray nor minutes."""

import importlib.util
import threading

import pytest

# find_spec, not importorskip: importing TransferQueue and Ray costs each xdist worker about
# 1.8 CPU s at collection, and every worker collects every file
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transfer_queue") is None or importlib.util.find_spec("ray") is None,
    reason="TransferQueue or Ray is not installed",
)

STUCK = """
def process_zmq_server_info(release):
    release.wait(30)

def init(conf):
    process_zmq_server_info(RELEASE)
"""


def test_a_start_that_times_out_names_the_tq_call_it_waits_in(monkeypatch):
    import ray
    import transfer_queue

    from gpu_gates.transports.tq_store import TransferQueueStore

    release = threading.Event()
    fake = {"RELEASE": release}
    exec(compile(STUCK, "/site-packages/transfer_queue/utils/zmq_utils.py", "exec"), fake)
    monkeypatch.setattr(transfer_queue, "init", fake["init"])
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    try:
        with pytest.raises(TimeoutError) as caught:
            TransferQueueStore.start(timeout_s=0.2)
    finally:
        release.set()
    message = str(caught.value)
    assert "did not finish in 0.2 s, waiting in transfer_queue/utils/zmq_utils.py:3 process_zmq_server_info" in message
    assert "CPU time for its workers" in message
