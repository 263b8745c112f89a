"""The trainer side of the refit stream (:mod:`gpu_gates.transports.zmq_stream`): binds the
REQ socket, packs named tensors into the ping-pong staging buffers and sends one header
per group, interpreting the sender of :mod:`harness.refit.stream` effect by effect.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import torch
import zmq

from gpu_gates.sync.bucket_cache import dtype_name
from gpu_gates.transports.staging import ShmBuffer, cuda_handle
from gpu_gates.transports.zmq_endpoint import Emit, Endpoint, StreamError, describe
from harness.refit import stream as proto


def spec_of(name: str, tensor: torch.Tensor) -> proto.TensorSpec:
    return proto.TensorSpec(name, tuple(tensor.shape), dtype_name(tensor.dtype), tensor.numel() * tensor.element_size())


def raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat ``uint8`` view of a tensor's bytes; ``reshape`` copies a non-contiguous one
    (exporters yield such tensors), as NeMo RL's ``reshape(-1).view(uint8)`` does."""
    return tensor.detach().reshape(-1).view(torch.uint8)


@dataclass
class GroupTiming:
    group: int
    buffer: Any
    bytes: int
    tensors: int
    pack_s: float = 0.0
    ack_wait_s: float = 0.0
    send_s: float = 0.0
    pack_interval: Tuple[float, float] = (0.0, 0.0)  # monotonic, comparable across processes on one host


@dataclass
class SendResult:
    step: int
    groups: int
    bytes: int
    wall_s: float
    staging_s: float  # the ping-pong pair (from the pool after the first sync)
    complete_s: float
    dedicated_s: float = 0.0  # fresh one-off buffers of oversized tensors
    dedicated_bytes: int = 0
    timings: List[GroupTiming] = field(default_factory=list)


@dataclass
class _Stream:
    """One call of :meth:`RefitSender.stream`: what its effects read and fill in."""

    step: int
    sources: Deque[Tuple[str, torch.Tensor]]
    buffers: Dict[Any, Any]
    res: SendResult
    timings: Dict[int, GroupTiming]


class RefitSender(Endpoint):
    """Trainer side: binds REQ and streams named tensors with ping-pong buffers.

    ``emit(kind, **fields)`` (optional) receives the wire records ``refit_wire`` reads.
    ``pause_after_group`` is a test hook: seconds to sleep after each send (so a test can
    kill the receiver mid-stream deterministically)."""

    def __init__(
        self,
        endpoint: str,
        *,
        peer: str = "receiver",
        timeout_s: float = 120.0,
        device: Optional[torch.device] = None,
        emit: Optional[Emit] = None,
        single_buffer: bool = False,
        leak_staging: bool = False,
    ) -> None:
        super().__init__(endpoint, peer, timeout_s, zmq.REQ, bind=True)
        # fault ``ipc_staging_leak`` of the cycle-trends gate (vLLM #51258): the released
        # ping-pong pair is kept (mapped, referenced) instead of pooled, so every sync
        # allocates a new pair and the producer's staging memory grows once per sync
        self.leak_staging = leak_staging
        self._leaked: List[Any] = []
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.emit = emit or (lambda kind, **f: None)
        self.single_buffer = single_buffer  # benchmark variant: wait for every ACK before packing the next group
        self._pool: List[ShmBuffer] = []

    def stream(self, named: Sequence[Tuple[str, torch.Tensor]], budget_bytes: int, step: int = 0) -> SendResult:
        specs = [spec_of(n, t) for n, t in named]
        res = SendResult(step=step, groups=0, bytes=0, wall_s=0.0, staging_s=0.0, complete_s=0.0)
        s = _Stream(step, deque(named), {}, res, {})
        self._pending, self._complete_t = None, 0.0
        t0 = time.monotonic()
        self.emit(
            "refit_stream_begin",
            step=step,
            role="sender",
            peer=self.peer,
            budget_bytes=budget_bytes,
            half_bytes=proto.half_buffer_bytes(budget_bytes),
            tensors=len(specs),
        )
        gen = proto.sender(specs, budget_bytes)
        reply: Any = None
        try:
            while True:
                try:
                    effect = gen.send(reply)
                except StopIteration as stop:
                    res.groups = stop.value
                    break
                reply = self._perform(effect, s)
        except BaseException as exc:  # the receiver may still wait on this side: say it gave up
            self.emit("refit_stream_abort", step=step, role="sender", peer=self.peer, error=describe(exc))
            raise
        finally:
            gen.close()
            for buf in s.buffers.values():
                if isinstance(buf, ShmBuffer):
                    buf.close()  # a failed stream's buffers are never reused: the peer may still map them
            s.buffers.clear()
        res.wall_s = time.monotonic() - t0
        res.timings = [s.timings[g] for g in sorted(s.timings)]
        return res

    def _perform(self, e: Any, s: _Stream) -> Any:
        if isinstance(e, proto.AllocBuffers):
            t = time.monotonic()
            for b in (0, 1):
                s.buffers[b] = self._pooled(e.half_bytes)
            s.res.staging_s += time.monotonic() - t
        elif isinstance(e, proto.AllocDedicated):
            t = time.monotonic()
            s.buffers[proto.DEDICATED] = self._alloc(e.nbytes)
            s.res.dedicated_s += time.monotonic() - t
            s.res.dedicated_bytes += e.nbytes
        elif isinstance(e, proto.Pack):
            self._pack(e, s)
        elif isinstance(e, proto.SendGroup):
            self._send_group(e, s)
        elif isinstance(e, proto.AwaitAck):
            if e.group == proto.COMPLETE:
                self._await(s.step, proto.COMPLETE, s.timings)
                s.res.complete_s = time.monotonic() - self._complete_t
            elif self._pending == e.group:  # the single-buffer variant may have collected it already
                self._await(s.step, e.group, s.timings)
        elif isinstance(e, proto.FreeDedicated):
            buf = s.buffers.pop(proto.DEDICATED)
            if isinstance(buf, ShmBuffer):
                buf.close()
        elif isinstance(e, proto.ReleaseBuffers):
            self._release(s.buffers)
        elif isinstance(e, proto.SendComplete):
            self._send_complete(e, s.step)
        else:  # pragma: no cover - a new effect without a runtime
            raise StreamError(f"refit sender has no handler for {type(e).__name__}")
        return None

    _pending: Any = None
    _complete_t: float = 0.0

    def _pack(self, e: proto.Pack, s: _Stream) -> None:
        """Copy the group's tensors into its staging buffer at their aligned offsets."""
        if self.single_buffer and isinstance(self._pending, int):
            self._await(s.step, self._pending, s.timings)  # benchmark variant only: no overlap at all
        t = time.monotonic()
        dst = self._tensor(s.buffers[e.buffer])
        for slot in e.slots:
            name, src = s.sources.popleft()
            if name != slot.name:
                raise StreamError(f"refit step {s.step}: protocol packs {slot.name!r} where the source yields {name!r}")
            dst[slot.offset : slot.offset + slot.nbytes].copy_(raw_bytes(src), non_blocking=dst.is_cuda)
        if dst.is_cuda:
            torch.cuda.current_stream(dst.device).synchronize()
        end = time.monotonic()
        s.timings[e.group] = GroupTiming(
            e.group, e.buffer, e.used_bytes, len(e.slots), pack_s=end - t, pack_interval=(t, end)
        )

    def _send_group(self, e: proto.SendGroup, s: _Stream) -> None:
        """The group's header on the socket; the bytes stay in the buffer the receiver maps."""
        step = s.step
        buf = s.buffers[e.buffer]
        header = {
            "type": "group",
            "step": step,
            "group": e.group,
            "buffer": e.buffer,
            "used": e.used_bytes,
            "names": [slot.name for slot in e.slots],
            "slots": [slot.to_wire() for slot in e.slots],
        }
        frames = [b""]
        if isinstance(buf, ShmBuffer):
            header["shm"], header["shm_bytes"] = buf.path, buf.nbytes
        else:
            frames = [cuda_handle(buf)]
        t = time.monotonic()
        self._io(
            f"step {step}: sending group {e.group}",
            lambda: self.sock.send_multipart([json.dumps(header).encode()] + frames),
        )
        s.timings[e.group].send_s = time.monotonic() - t
        self._pending = e.group
        s.res.bytes += e.used_bytes
        self.emit(
            "refit_group_send",
            step=step,
            role="sender",
            peer=self.peer,
            group=e.group,
            buffer=str(e.buffer),
            bytes=e.used_bytes,
            names=[slot.name for slot in e.slots],
            offsets=[slot.offset for slot in e.slots],
            sizes=[slot.nbytes for slot in e.slots],
        )

    def _release(self, buffers: Dict[Any, Any]) -> None:
        """The ping-pong pair back to the pool (or kept, under the staging-leak fault)."""
        for b in (0, 1):
            buf = buffers.pop(b)
            if self.leak_staging:
                self._leaked.append(buf)
            elif isinstance(buf, ShmBuffer):
                self._pool.append(buf)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _send_complete(self, e: proto.SendComplete, step: int) -> None:
        self._complete_t = time.monotonic()
        msg = json.dumps({"type": "complete", "step": step, "groups": e.groups}).encode()
        self._io(f"step {step}: sending COMPLETE after {e.groups} groups", lambda: self.sock.send_multipart([msg, b""]))
        self._pending = proto.COMPLETE
        self.emit("refit_complete_send", step=step, role="sender", peer=self.peer, groups=e.groups)

    def _await(self, step: int, group: Any, timings: Dict[int, GroupTiming]) -> None:
        what = "COMPLETE" if group == proto.COMPLETE else f"group {group}"
        t = time.monotonic()
        raw = self._io(f"step {step}: waiting for the ACK of {what}", self.sock.recv)
        if isinstance(group, int):
            timings[group].ack_wait_s = time.monotonic() - t
        ack = json.loads(raw)
        if ack.get("group") != group or ack.get("step") != step:
            self.close()
            raise StreamError(f"refit stream with {self.peer}: step {step}: expected the ACK of {what}, got {ack}")
        self._pending = None
        self.emit("refit_ack", step=step, role="sender", peer=self.peer, group=str(group))

    def _pooled(self, nbytes: int) -> Any:
        """A ping-pong buffer: on CPU from the pool of the previous sync's buffers (the CPU
        stand-in for torch's caching allocator, which makes NeMo RL's per-sync GPU allocation
        cheap; allocating and faulting in fresh /dev/shm pages costs tens of ms per MiB-sized
        buffer here). Buffers of another size are freed, so at most one pair is kept."""
        if self.device.type == "cuda":
            return self._alloc(nbytes)
        for buf in [b for b in self._pool if b.nbytes != nbytes]:
            self._pool.remove(buf)
            buf.close()
        return self._pool.pop() if self._pool else self._alloc(nbytes)

    def close(self) -> None:
        for buf in getattr(self, "_pool", []) + getattr(self, "_leaked", []):
            if isinstance(buf, ShmBuffer):
                buf.close()
        self._pool, self._leaked = [], []
        super().close()

    def _alloc(self, nbytes: int) -> Any:
        if self.device.type == "cuda":
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        buf = ShmBuffer(nbytes)
        buf.tensor.fill_(0)  # pre-touch: a fresh mapping's page faults would otherwise land in the first pack
        return buf

    @staticmethod
    def _tensor(buf: Any) -> torch.Tensor:
        return buf.tensor if isinstance(buf, ShmBuffer) else buf
