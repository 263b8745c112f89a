"""The inference side of the refit stream (:mod:`gpu_gates.transports.zmq_stream`):
connects the REP socket, maps the sender's staging buffers and loads each group through
the caller's loader, interpreting the receiver of :mod:`harness.refit.stream`; a clean,
complete transfer ends in ``finalize``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import zmq

from gpu_gates.sync.bucket_cache import dtype_from_name
from gpu_gates.transports.staging import ShmBuffer, open_cuda_handle
from gpu_gates.transports.zmq_endpoint import Emit, Endpoint, StreamError, describe
from harness.refit import stream as proto

Loader = Callable[[proto.Slot, torch.Tensor], None]


@dataclass
class ReceiveResult:
    step: int
    groups: int
    bytes: int
    wall_s: float
    load_s: List[float] = field(default_factory=list)
    load_intervals: List[Tuple[float, float]] = field(default_factory=list)
    finalized: bool = False


class RefitReceiver(Endpoint):
    """Inference side: connects REP and loads each group through ``load(slot, view)``.

    ``view`` aliases the staging buffer (valid only during the call): copy it into the
    weights. ``finalize(groups)`` runs only for a complete, clean transfer."""

    def __init__(
        self,
        endpoint: str,
        *,
        peer: str = "sender",
        timeout_s: float = 120.0,
        device: Optional[torch.device] = None,
        emit: Optional[Emit] = None,
    ) -> None:
        super().__init__(endpoint, peer, timeout_s, zmq.REP, bind=False)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.emit = emit or (lambda kind, **f: None)
        self._maps: Dict[str, ShmBuffer] = {}
        self._used: set = set()

    def receive(
        self,
        manifest: proto.Manifest,
        load: Loader,
        step: int = 0,
        half_bytes: Optional[int] = None,
        finalize: Optional[Callable[[int], None]] = None,
    ) -> ReceiveResult:
        res = ReceiveResult(step=step, groups=0, bytes=0, wall_s=0.0)
        self.emit("refit_stream_begin", step=step, role="receiver", peer=self.peer, expected=list(manifest))
        gen = proto.receiver(manifest, half_bytes)
        t0 = None
        current: Dict[str, Any] = {}
        reply: Any = None
        throw: Optional[BaseException] = None
        try:
            while True:
                try:
                    effect = gen.throw(throw) if throw is not None else gen.send(reply)
                except StopIteration:
                    break
                except proto.ManifestError as exc:
                    self.emit(
                        "refit_manifest_check", step=step, role="receiver", peer=self.peer, **_report_fields(exc.report)
                    )
                    raise proto.ManifestError(exc.report, f"step {step} from {self.peer}") from None
                throw, reply = None, None
                if isinstance(effect, proto.AwaitMessage):
                    reply = self._recv(step, effect.expect_group, current)
                    t0 = t0 if t0 is not None else time.monotonic()
                elif isinstance(effect, proto.LoadGroup):
                    try:
                        self._load(effect, current, load, res)
                    except Exception as exc:  # handed to the protocol: recorded and still ACKed
                        throw = exc
                elif isinstance(effect, proto.SendAck):
                    ack = json.dumps({"step": step, "group": effect.group}).encode()
                    self._io(f"step {step}: sending the ACK of group {effect.group}", lambda: self.sock.send(ack))
                    current.clear()
                elif isinstance(effect, proto.Finalize):
                    self.emit(
                        "refit_manifest_check",
                        step=step,
                        role="receiver",
                        peer=self.peer,
                        **_report_fields(proto.ManifestReport()),
                    )
                    if finalize is not None:
                        finalize(effect.groups)
                    res.finalized = True
                    res.groups = effect.groups
                    self.emit("refit_finalize", step=step, role="receiver", peer=self.peer, groups=effect.groups)
        except BaseException as exc:  # the sender may still wait on its ACK: say this side gave up
            self.emit("refit_stream_abort", step=step, role="receiver", peer=self.peer, error=describe(exc))
            raise
        finally:
            gen.close()
            for path in [p for p in self._maps if p not in self._used]:
                self._unmap(path)  # keep only the sender's current (pooled) pair mapped
            self._used.clear()
        res.wall_s = time.monotonic() - (t0 or time.monotonic())
        return res

    def _recv(self, step: int, expect: int, current: Dict[str, Any]) -> Any:
        frames = self._io(f"step {step}: waiting for group {expect} (or COMPLETE)", self.sock.recv_multipart)
        header = json.loads(frames[0])
        if header.get("step") != step:
            raise StreamError(
                f"refit stream from {self.peer}: step {step} expected, message is for step {header.get('step')}"
            )
        if header["type"] == "complete":
            return proto.CompleteMessage(int(header["groups"]))
        current["header"], current["blob"] = header, frames[1] if len(frames) > 1 else b""
        slots = tuple(proto.Slot.from_wire(s) for s in header["slots"])
        buffer = header["buffer"] if header["buffer"] == proto.DEDICATED else int(header["buffer"])
        self.emit(
            "refit_group_recv",
            step=step,
            role="receiver",
            peer=self.peer,
            group=int(header["group"]),
            buffer=str(buffer),
            bytes=int(header["used"]),
            names=[s.name for s in slots],
            offsets=[s.offset for s in slots],
        )
        return proto.GroupMessage(int(header["group"]), buffer, slots, int(header["used"]))

    def _staging(self, current: Dict[str, Any]) -> torch.Tensor:
        header = current["header"]
        if "shm" in header:
            path = header["shm"]
            self._used.add(path)
            buf = self._maps.get(path)
            if buf is None:
                buf = self._maps[path] = ShmBuffer(int(header["shm_bytes"]), path=path, create=False)
            return buf.tensor
        return open_cuda_handle(current["blob"])

    def _load(self, e: proto.LoadGroup, current: Dict[str, Any], load: Loader, res: ReceiveResult) -> None:
        t = time.monotonic()
        staging = self._staging(current)
        for slot in e.slots:
            view = (
                staging[slot.offset : slot.offset + slot.nbytes].view(dtype_from_name(slot.dtype)).reshape(slot.shape)
            )
            load(slot, view)
        if staging.is_cuda:
            torch.cuda.synchronize(staging.device)
        del staging
        if e.buffer == proto.DEDICATED:  # a one-off buffer: the sender frees it after this ACK
            self._unmap(current["header"].get("shm"))
        end = time.monotonic()
        res.load_s.append(end - t)
        res.load_intervals.append((t, end))
        res.bytes += int(current["header"]["used"])

    def close(self) -> None:
        self._unmap()
        super().close()

    def _unmap(self, path: Optional[str] = None) -> None:
        for p in [path] if path else list(self._maps):
            buf = self._maps.pop(p, None)
            if buf is not None:
                buf.close()


def _report_fields(report: proto.ManifestReport) -> Dict[str, Any]:
    return {
        "missing": report.missing,
        "duplicate": report.duplicate,
        "unexpected": report.unexpected,
        "mismatched": report.mismatched,
        "layout": report.layout,
        "load_errors": report.load_errors,
    }


def copy_into(weights: Dict[str, torch.Tensor]) -> Loader:
    """The usual loader: copy each view into the receiver's own tensor of that name."""

    def load(slot: proto.Slot, view: torch.Tensor) -> None:
        weights[slot.name].copy_(view)

    return load
