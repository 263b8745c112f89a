"""Helpers for refit-stream tests: unique ipc:// endpoints, a sender/receiver pair, a
protocol driver without I/O. Socket files live in a private temp dir (short path: a unix
socket path is limited to ~107 bytes) that is removed afterwards; xdist-safe."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
import torch

from gpu_gates.transports import private_dirs
from harness.refit import stream as proto
from gpu_gates.transports import zmq_stream as zs


@pytest.fixture
def endpoint():
    d = private_dirs.make_private("refit-test")
    try:
        yield f"ipc://{d}/s.sock"
    finally:
        private_dirs.remove(d)


class Log:
    """Collects the transport's wire records as an event log (seq, t, kind, fields)."""

    def __init__(self) -> None:
        self.records: List[dict] = []
        self._lock = threading.Lock()

    def emit(self, kind: str, **fields: Any) -> None:
        with self._lock:
            self.records.append({"seq": len(self.records), "t": 0.0, "kind": kind, **fields})


def run_pair(
    endpoint: str,
    named: Sequence[Tuple[str, torch.Tensor]],
    budget: int,
    *,
    step: int = 0,
    manifest: Optional[Dict] = None,
    log: Optional[Log] = None,
    timeout_s: float = 10.0,
    load=None,
) -> Tuple[zs.SendResult, Dict[str, Any], Dict[str, torch.Tensor]]:
    """Receiver in a thread, sender here; returns (send result, receiver outcome, received tensors)."""
    if manifest is None:
        manifest = proto.manifest_of(zs.spec_of(n, t) for n, t in named)
    dst = {n: torch.empty(shape, dtype=getattr(torch, dt)) for n, (shape, dt) in manifest.items()}
    outcome: Dict[str, Any] = {}
    emit = log.emit if log else None

    def rx() -> None:
        r = zs.RefitReceiver(endpoint, timeout_s=timeout_s, emit=emit)
        try:
            outcome["result"] = r.receive(
                manifest, load or zs.copy_into(dst), step=step, half_bytes=proto.half_buffer_bytes(budget)
            )
        except Exception as exc:
            outcome["error"] = exc
        finally:
            r.close()

    th = threading.Thread(target=rx, daemon=True)
    th.start()
    s = zs.RefitSender(endpoint, timeout_s=timeout_s, emit=emit)
    try:
        res = s.stream(named, budget, step=step)
    finally:
        s.close()
        th.join(timeout_s + 5)
    assert not th.is_alive(), "receiver thread hung"
    return res, outcome, dst


def drive_sender(specs: Sequence[proto.TensorSpec], budget: int) -> List[Any]:
    """Run the sender protocol with an instant runtime; return its effects in order."""
    gen = proto.sender(specs, budget)
    effects = []
    try:
        while True:
            effects.append(gen.send(None))
    except StopIteration as stop:
        effects.append(("return", stop.value))
    return effects


def specs_of_sizes(sizes: Sequence[int]) -> List[proto.TensorSpec]:
    return [proto.TensorSpec(f"t{i}", (n,), "uint8", n) for i, n in enumerate(sizes)]
