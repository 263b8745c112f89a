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
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import torch
import zmq

from gpu_gates.transports.staging import ShmBuffer, cuda_handle, open_cuda_handle
from harness.refit import stream as proto
from gpu_gates.sync.bucket_cache import dtype_from_name, dtype_name

Emit = Callable[..., None]


class StreamTimeout(TimeoutError):
    """A send or receive of the refit stream ran past its timeout."""


class StreamError(RuntimeError):
    """The socket failed (not a timeout), or the peer broke the protocol."""


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


def _socket(ctx: zmq.Context, kind: int, timeout_s: float) -> zmq.Socket:
    sock = ctx.socket(kind)
    ms = max(1, int(timeout_s * 1000))
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, ms)
    sock.setsockopt(zmq.RCVTIMEO, ms)
    return sock


class _Endpoint:
    def __init__(self, endpoint: str, peer: str, timeout_s: float, kind: int, bind: bool) -> None:
        if not endpoint.startswith("ipc://"):
            raise ValueError(f"refit endpoint must be ipc://, got {endpoint!r}")
        self.endpoint, self.peer, self.timeout_s = endpoint, peer, float(timeout_s)
        self._ctx = zmq.Context()
        self.sock: Optional[zmq.Socket] = _socket(self._ctx, kind, timeout_s)
        (self.sock.bind if bind else self.sock.connect)(endpoint)

    def _io(self, what: str, fn: Callable[[], Any]) -> Any:
        if self.sock is None:
            raise StreamError(f"refit stream to {self.peer}: socket already closed after an earlier failure ({what})")
        try:
            return fn()
        except zmq.Again:
            self.close()
            raise StreamTimeout(
                f"refit stream with {self.peer} ({self.endpoint}): {what}: nothing within "
                f"{self.timeout_s:g} s (the peer may be dead)"
            ) from None
        except zmq.ZMQError as exc:
            self.close()
            raise StreamError(
                f"refit stream with {self.peer} ({self.endpoint}): {what}: ZMQ error errno {exc.errno}: {exc}"
            ) from None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


# ------------------------------------------------------------------ sender
class RefitSender(_Endpoint):
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
        sources: Deque[Tuple[str, torch.Tensor]] = deque(named)
        buffers: Dict[Any, Any] = {}
        res = SendResult(step=step, groups=0, bytes=0, wall_s=0.0, staging_s=0.0, complete_s=0.0)
        timings: Dict[int, GroupTiming] = {}
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
                reply = self._perform(effect, step, sources, buffers, res, timings)
        except BaseException as exc:  # the receiver may still wait on this side: say it gave up
            self.emit("refit_stream_abort", step=step, role="sender", peer=self.peer, error=_describe(exc))
            raise
        finally:
            gen.close()
            for buf in buffers.values():
                if isinstance(buf, ShmBuffer):
                    buf.close()  # a failed stream's buffers are never reused: the peer may still map them
            buffers.clear()
        res.wall_s = time.monotonic() - t0
        res.timings = [timings[g] for g in sorted(timings)]
        return res

    def _perform(
        self,
        e: Any,
        step: int,
        sources: Deque,
        buffers: Dict[Any, Any],
        res: SendResult,
        timings: Dict[int, GroupTiming],
    ) -> Any:
        if isinstance(e, proto.AllocBuffers):
            t = time.monotonic()
            for b in (0, 1):
                buffers[b] = self._pooled(e.half_bytes)
            res.staging_s += time.monotonic() - t
        elif isinstance(e, proto.AllocDedicated):
            t = time.monotonic()
            buffers[proto.DEDICATED] = self._alloc(e.nbytes)
            res.dedicated_s += time.monotonic() - t
            res.dedicated_bytes += e.nbytes
        elif isinstance(e, proto.Pack):
            if self.single_buffer and isinstance(self._pending, int):
                self._await(step, self._pending, timings)  # benchmark variant only: no overlap at all
            t = time.monotonic()
            dst = self._tensor(buffers[e.buffer])
            for slot in e.slots:
                name, src = sources.popleft()
                if name != slot.name:
                    raise StreamError(
                        f"refit step {step}: protocol packs {slot.name!r} where the source yields {name!r}"
                    )
                dst[slot.offset : slot.offset + slot.nbytes].copy_(raw_bytes(src), non_blocking=dst.is_cuda)
            if dst.is_cuda:
                torch.cuda.current_stream(dst.device).synchronize()
            end = time.monotonic()
            timings[e.group] = GroupTiming(
                e.group, e.buffer, e.used_bytes, len(e.slots), pack_s=end - t, pack_interval=(t, end)
            )
        elif isinstance(e, proto.SendGroup):
            buf = buffers[e.buffer]
            header = {
                "type": "group",
                "step": step,
                "group": e.group,
                "buffer": e.buffer,
                "used": e.used_bytes,
                "names": [s.name for s in e.slots],
                "slots": [s.to_wire() for s in e.slots],
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
            timings[e.group].send_s = time.monotonic() - t
            self._pending = e.group
            res.bytes += e.used_bytes
            self.emit(
                "refit_group_send",
                step=step,
                role="sender",
                peer=self.peer,
                group=e.group,
                buffer=str(e.buffer),
                bytes=e.used_bytes,
                names=[s.name for s in e.slots],
                offsets=[s.offset for s in e.slots],
                sizes=[s.nbytes for s in e.slots],
            )
        elif isinstance(e, proto.AwaitAck):
            if e.group == proto.COMPLETE:
                self._await(step, proto.COMPLETE, timings)
                res.complete_s = time.monotonic() - self._complete_t
            elif self._pending == e.group:  # the single-buffer variant may have collected it already
                self._await(step, e.group, timings)
        elif isinstance(e, proto.FreeDedicated):
            buf = buffers.pop(proto.DEDICATED)
            if isinstance(buf, ShmBuffer):
                buf.close()
        elif isinstance(e, proto.ReleaseBuffers):
            for b in (0, 1):
                buf = buffers.pop(b)
                if self.leak_staging:
                    self._leaked.append(buf)
                elif isinstance(buf, ShmBuffer):
                    self._pool.append(buf)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        elif isinstance(e, proto.SendComplete):
            self._complete_t = time.monotonic()
            msg = json.dumps({"type": "complete", "step": step, "groups": e.groups}).encode()
            self._io(
                f"step {step}: sending COMPLETE after {e.groups} groups", lambda: self.sock.send_multipart([msg, b""])
            )
            self._pending = proto.COMPLETE
            self.emit("refit_complete_send", step=step, role="sender", peer=self.peer, groups=e.groups)
        else:  # pragma: no cover - a new effect without a runtime
            raise StreamError(f"refit sender has no handler for {type(e).__name__}")
        return None

    _pending: Any = None
    _complete_t: float = 0.0

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


# ------------------------------------------------------------------ receiver
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


class RefitReceiver(_Endpoint):
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
            self.emit("refit_stream_abort", step=step, role="receiver", peer=self.peer, error=_describe(exc))
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


def _describe(exc: BaseException) -> str:
    """One line for a ``refit_stream_abort`` record: the exception's type and first line."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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


def overlap_seconds(pack: Sequence[Tuple[float, float]], load: Sequence[Tuple[float, float]]) -> float:
    """Seconds during which the sender was packing while the receiver was loading."""
    total = 0.0
    for a0, a1 in pack:
        for b0, b1 in load:
            total += max(0.0, min(a1, b1) - max(a0, b0))
    return total
