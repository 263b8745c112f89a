"""The refit stream on a real transport: pyzmq REQ/REP over ``ipc://``, ping-pong buffers.

This interprets :mod:`harness.refit.stream` (the protocol) with real sockets and real
bytes. It lives on the real-runtime side (``gpu_gates/transports/``), not in ``harness/``:
``harness/`` holds the protocol both runtimes interpret and may not touch sockets or the
wall clock. Besides the gates, ``rlharness calibrate refit`` / ``fidelity refit`` (the
simulator's refit costs are fitted to, and checked against, this transport) and the
benchmark use it; the simulator itself never does.

Topology as in NeMo RL (docs/modelled-systems.md#nemo-rl-refit): the trainer side binds a REQ socket on
an ``ipc://`` endpoint (one per GPU, or per test), the inference side connects a REP.
``LINGER`` is 0 and every send and receive has a timeout; a timeout becomes a
:class:`StreamTimeout` that names the peer, the step and the group, and the socket is
closed (a REQ that missed its reply cannot be reused).

Payload. Only a small JSON header travels on the socket: NeMo RL's group fields (the
tensor names and ``used_bytes``, the sum of their aligned sizes — the layout rule is in
:mod:`harness.refit.stream`) plus each slot's shape, dtype, offset and size, which a
NeMo RL receiver would not need (it sizes tensors from its own manifest) and which let
this receiver name a shape or dtype mismatch instead of an offset mismatch. The bytes stay in
the staging buffers (``gpu_gates/transports/staging.py``), which the receiver maps:

* GPU (torch sees CUDA): the buffers are device tensors and the header carries a CUDA IPC
  handle (torch's reducer, pickled); the receiver rebuilds the tensor on its local device
  index, views the slots at their aligned offsets, loads, synchronizes, then ACKs. **This
  path has not been run in any session so far (no GPU was available); it is guarded by
  ``torch.cuda.is_available()``.**
* CPU: the buffers are files on ``/dev/shm`` mapped by both processes — the faithful CPU
  analogue of the CUDA-IPC stream (the bytes never go through the socket; measured on a 2-core machine,
  the payload sent over the socket itself ran at ~7 % of memcpy). The sender owns the
  files and unlinks them when it releases the buffers and on every exit path; nothing is
  left in ``/dev/shm``.

The header is JSON; only the CUDA handle is pickled, and it comes from a socket in the
job's own private directory.

This module is the stream's one import for its users; each side is a module of its own:
the socket end and errors both share (``zmq_endpoint.py``), the trainer side
(``zmq_sender.py``) and the inference side (``zmq_receiver.py``).
"""

from __future__ import annotations

from typing import Sequence, Tuple

from gpu_gates.transports.zmq_endpoint import Emit, StreamError, StreamTimeout
from gpu_gates.transports.zmq_receiver import Loader, ReceiveResult, RefitReceiver, copy_into
from gpu_gates.transports.zmq_sender import GroupTiming, RefitSender, SendResult, raw_bytes, spec_of

__all__ = [
    "Emit",
    "GroupTiming",
    "Loader",
    "ReceiveResult",
    "RefitReceiver",
    "RefitSender",
    "SendResult",
    "StreamError",
    "StreamTimeout",
    "copy_into",
    "overlap_seconds",
    "raw_bytes",
    "spec_of",
]


def overlap_seconds(pack: Sequence[Tuple[float, float]], load: Sequence[Tuple[float, float]]) -> float:
    """Seconds during which the sender was packing while the receiver was loading."""
    total = 0.0
    for a0, a1 in pack:
        for b0, b1 in load:
            total += max(0.0, min(a1, b1) - max(a0, b0))
    return total
