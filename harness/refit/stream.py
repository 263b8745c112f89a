"""The colocated refit stream protocol, once: a sans-IO sender and receiver.

NeMo RL streams the trainer's weights to the inference worker on the same GPU over a ZMQ
REQ/REP pair with two ping-pong staging buffers (docs/modelled-systems.md#nemo-rl-refit, PR #1267).
This module is that protocol and nothing else: no sockets, no tensors, no clock. The
sender is a generator that yields effects (pack these tensors into that buffer, send this
group, wait for that ACK, ...); a runtime performs each one and resumes it. The real
transport (:mod:`gpu_gates.transports.zmq_stream`), the refit gate and the simulator's refit
timing (``simulators/refit/sync.py``) all interpret this one generator, so the order below is
the order everywhere:

* the budget is halved: each of the two buffers holds at most ``budget // 2`` bytes of
  group (its capacity) and is allocated ``align_up(budget // 2)`` bytes;
* the wire format is NeMo RL's (``nemo_rl/models/policy/utils.py``, ``stream_weights_via_
  ipc_zmq_impl`` and the vLLM receiver, NVIDIA-NeMo/RL@7ea279ab): a tensor of *n* bytes
  occupies ``align_up(n)`` bytes, the tensors of a group sit back to back at the running
  aligned offset (the first at 0), and a group's ``used_bytes`` is the sum of its tensors'
  aligned sizes. A receiver needs only the names: it finds each tensor by adding up the
  aligned sizes of the ones before it (from its own shapes and dtypes) and requires the sum
  to equal ``used_bytes`` (:func:`slots_from_names`);
* a tensor joins the current group while ``used_bytes + align_up(n)`` stays within the
  capacity; otherwise the group is sent first. Group *g* lives in buffer ``g % 2``
  (counting only ping-pong groups), so a buffer is refilled only after its previous group
  was ACKed: the sender packs *g+1* while the receiver loads *g*, then collects ACK(*g*)
  just before sending *g+1* — at most one group is ever un-ACKed;
* a tensor whose aligned size exceeds the capacity is "oversized": the current group is
  flushed, the pending ACK collected, and the tensor goes alone (``used_bytes`` its aligned
  size) in a dedicated buffer of that size whose ACK is awaited at once (then the buffer
  is freed) — order is kept and every tensor is sent exactly once;
* after the last ACK the staging buffers are released (so they are not held during the
  receiver's post-load conversion), then COMPLETE is sent and its ACK awaited.

The receiver checks every group against the manifest of expected ``(name, shape, dtype)``
and ACKs every message, failed ones and COMPLETE included (a REP that does not reply
wedges the sender until its timeout). Missing, duplicate, unexpected and mismatched names
and per-group load errors are collected and reported together at COMPLETE; only a
complete, clean transfer is finalized — a partial one never is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Generator, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

ALIGNMENT_BYTES = 512
DEDICATED = "dedicated"  # the buffer id of an oversized tensor's one-off buffer
COMPLETE = "complete"  # the group id of the final message (and of its ACK)

BufferId = Union[int, str]
GroupId = Union[int, str]


def align_up(value: int, alignment: int = ALIGNMENT_BYTES) -> int:
    """Round ``value`` up to the next multiple of ``alignment``."""
    return (value + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class TensorSpec:
    """What the protocol needs to know of a tensor: its name, shape, dtype name and size."""

    name: str
    shape: Tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass(frozen=True)
class Slot:
    """A tensor's place in a staging buffer: ``[offset, offset + nbytes)``, offset aligned."""

    name: str
    shape: Tuple[int, ...]
    dtype: str
    offset: int
    nbytes: int

    def to_wire(self) -> list:
        return [self.name, list(self.shape), self.dtype, self.offset, self.nbytes]

    @classmethod
    def from_wire(cls, item: Sequence) -> "Slot":
        name, shape, dtype, offset, nbytes = item
        return cls(str(name), tuple(int(x) for x in shape), str(dtype), int(offset), int(nbytes))


def used_bytes(slots: Sequence[Slot]) -> int:
    """A group's ``used_bytes`` on the wire: the sum of its tensors' aligned sizes (NeMo
    RL's definition; its receiver asserts the running aligned offset ends exactly here,
    so the end of the last tensor would be refused whenever that tensor is unaligned)."""
    return sum(align_up(s.nbytes) for s in slots)


def span_bytes(slots: Sequence[Slot]) -> int:
    """The bytes a group spans up to the end of its last tensor (no trailing padding):
    what the simulator times packing and loading by."""
    return slots[-1].offset + slots[-1].nbytes if slots else 0


# Bytes per element of the dtype names the stream carries (torch's names without
# ``torch.``); the receiver sizes a tensor from its manifest with them, as NeMo RL does.
ITEMSIZE = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "int16": 2,
    "uint16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "float32": 4,
    "complex32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "complex64": 8,
    "complex128": 16,
}


def tensor_nbytes(shape: Sequence[int], dtype: str) -> int:
    """Bytes of a dense tensor of this shape and dtype name."""
    if dtype not in ITEMSIZE:
        raise ValueError(f"unknown dtype name {dtype!r}")
    count = 1
    for d in shape:
        count *= int(d)
    return count * ITEMSIZE[dtype]


def slots_from_names(names: Sequence[str], used: int, manifest: "Manifest") -> Tuple["Slot", ...]:
    """Decode a group the way NeMo RL's receiver does: from the names alone and the
    receiver's own shapes and dtypes, each tensor at the running aligned offset; the final
    running offset must equal ``used`` (raises ``ValueError`` naming the problem)."""
    slots, cursor = [], 0
    for name in names:
        if name not in manifest:
            raise ValueError(f"{name!r} is not in the manifest: its size, and every later offset, is unknown")
        shape, dtype = tuple(manifest[name][0]), manifest[name][1]
        nbytes = tensor_nbytes(shape, dtype)
        slots.append(Slot(name, shape, dtype, cursor, nbytes))
        cursor += align_up(nbytes)
    if cursor != used:
        raise ValueError(f"running aligned offset {cursor} != used_bytes {used}")
    return tuple(slots)


# ------------------------------------------------------------------ sender effects
@dataclass(frozen=True)
class AllocBuffers:
    """Allocate the two ping-pong staging buffers, ``half_bytes`` each."""

    half_bytes: int


@dataclass(frozen=True)
class AllocDedicated:
    """Allocate a one-off buffer for an oversized tensor (group ``group``)."""

    group: int
    nbytes: int


@dataclass(frozen=True)
class _GroupEffect:
    group: int
    buffer: BufferId
    slots: Tuple[Slot, ...]

    @property
    def used_bytes(self) -> int:
        return used_bytes(self.slots)

    @property
    def span_bytes(self) -> int:
        return span_bytes(self.slots)


@dataclass(frozen=True)
class Pack(_GroupEffect):
    """Copy these tensors into ``buffer`` at their slots (the sender's copy)."""


@dataclass(frozen=True)
class SendGroup(_GroupEffect):
    """Send one data group: the buffer and its slots; the receiver loads, then ACKs."""


@dataclass(frozen=True)
class AwaitAck:
    """Block until the ACK of ``group`` (an int, or :data:`COMPLETE`) arrives."""

    group: GroupId


@dataclass(frozen=True)
class FreeDedicated:
    group: int


@dataclass(frozen=True)
class ReleaseBuffers:
    """Free both ping-pong buffers (before COMPLETE, as NeMo RL does)."""


@dataclass(frozen=True)
class SendComplete:
    groups: int


SenderEffect = Union[
    AllocBuffers, AllocDedicated, Pack, SendGroup, AwaitAck, FreeDedicated, ReleaseBuffers, SendComplete
]


def half_capacity_bytes(budget_bytes: int) -> int:
    """The most group bytes one ping-pong buffer takes: half the budget, unrounded (NeMo RL
    compares ``used_bytes + align_up(n)`` with ``budget // 2``)."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 2 * ALIGNMENT_BYTES:
        raise ValueError(f"buffer budget must be an int of at least {2 * ALIGNMENT_BYTES} bytes, got {budget_bytes!r}")
    return budget_bytes // 2


def half_buffer_bytes(budget_bytes: int) -> int:
    """Allocated size of each of the two ping-pong buffers: the capacity rounded up to the
    alignment (NeMo RL allocates ``align_up(budget // 2)``); never less than the capacity."""
    return align_up(half_capacity_bytes(budget_bytes))


def is_oversized(nbytes: int, capacity_bytes: int) -> bool:
    return align_up(nbytes) > capacity_bytes


def sender(specs: Iterable[TensorSpec], budget_bytes: int) -> Generator[SenderEffect, object, int]:
    """The sender's side of one stream; returns the number of data groups sent.

    Names are not checked here on purpose: the receiver owns the manifest check, so a
    sender that streams a duplicate or an unexpected name is caught where NeMo RL catches
    it, and the tests can make it do so.
    """
    capacity = half_capacity_bytes(budget_bytes)
    yield AllocBuffers(half_buffer_bytes(budget_bytes))
    state = _SenderState()
    for spec in specs:
        if is_oversized(spec.nbytes, capacity):
            yield from state.flush()
            yield from state.drain()
            g = state.next_group
            slot = (Slot(spec.name, tuple(spec.shape), spec.dtype, 0, spec.nbytes),)
            yield AllocDedicated(g, align_up(spec.nbytes))
            yield Pack(g, DEDICATED, slot)
            yield SendGroup(g, DEDICATED, slot)
            yield AwaitAck(g)
            yield FreeDedicated(g)
            state.next_group += 1
            continue
        if state.slots and state.cursor + align_up(spec.nbytes) > capacity:
            yield from state.flush()
        state.slots.append(Slot(spec.name, tuple(spec.shape), spec.dtype, state.cursor, spec.nbytes))
        state.cursor += align_up(spec.nbytes)  # the running aligned offset == the group's used_bytes
    yield from state.flush()
    yield from state.drain()
    yield ReleaseBuffers()
    yield SendComplete(state.next_group)
    yield AwaitAck(COMPLETE)
    return state.next_group


@dataclass
class _SenderState:
    slots: List[Slot] = field(default_factory=list)
    cursor: int = 0
    next_group: int = 0
    next_buffer: int = 0
    pending: Optional[int] = None  # the one group sent and not yet ACKed

    def flush(self):
        """Pack the current group, collect the previous group's ACK, send this one."""
        if not self.slots:
            return
        g, buf, slots = self.next_group, self.next_buffer, tuple(self.slots)
        yield Pack(g, buf, slots)
        yield from self.drain()
        yield SendGroup(g, buf, slots)
        self.pending = g
        self.next_group += 1
        self.next_buffer ^= 1
        self.slots, self.cursor = [], 0

    def drain(self):
        if self.pending is not None:
            yield AwaitAck(self.pending)
            self.pending = None


# ------------------------------------------------------------------ receiver side
@dataclass(frozen=True)
class GroupMessage:
    """What a data-group message tells the receiver (the payload handle stays with the runtime)."""

    group: int
    buffer: BufferId
    slots: Tuple[Slot, ...]
    used_bytes: int


@dataclass(frozen=True)
class CompleteMessage:
    groups: int


@dataclass(frozen=True)
class AwaitMessage:
    """Block until the next message; resume with a :class:`GroupMessage` or :class:`CompleteMessage`."""

    expect_group: int


@dataclass(frozen=True)
class LoadGroup:
    """Load these (manifest-checked) slots of the group's buffer into the weights, then
    synchronize. A failure is thrown back into the generator, recorded, and still ACKed."""

    group: int
    buffer: BufferId
    slots: Tuple[Slot, ...]


@dataclass(frozen=True)
class SendAck:
    group: GroupId


@dataclass(frozen=True)
class Finalize:
    """Post-load processing; yielded only for a complete, clean transfer."""

    groups: int


ReceiverEffect = Union[AwaitMessage, LoadGroup, SendAck, Finalize]


@dataclass
class ManifestReport:
    """Everything wrong with one transfer, collected so it can be reported at once."""

    missing: List[str] = field(default_factory=list)
    duplicate: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)
    mismatched: List[str] = field(default_factory=list)
    layout: List[str] = field(default_factory=list)
    load_errors: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any((self.missing, self.duplicate, self.unexpected, self.mismatched, self.layout, self.load_errors))

    def describe(self) -> str:
        parts = [
            f"{label}: {', '.join(repr(x) if label != 'load errors' else x for x in items)}"
            for label, items in (
                ("missing", self.missing),
                ("duplicate", self.duplicate),
                ("unexpected", self.unexpected),
                ("shape/dtype mismatch", self.mismatched),
                ("bad layout", self.layout),
                ("load errors", self.load_errors),
            )
            if items
        ]
        return "; ".join(parts) if parts else "ok"


class ManifestError(RuntimeError):
    """A transfer that ended (COMPLETE) but is not the expected set of tensors."""

    def __init__(self, report: ManifestReport, context: str = "") -> None:
        self.report = report
        prefix = f"{context}: " if context else ""
        super().__init__(f"{prefix}refit manifest check failed, transfer not finalized ({report.describe()})")


Manifest = Mapping[str, Tuple[Tuple[int, ...], str]]


def manifest_of(specs: Iterable[TensorSpec]) -> Dict[str, Tuple[Tuple[int, ...], str]]:
    return {s.name: (tuple(s.shape), s.dtype) for s in specs}


def check_layout(msg: GroupMessage, half_bytes: Optional[int]) -> List[str]:
    """Slots must sit at the running aligned offsets (the sum of the aligned sizes before
    them) and that running offset must end exactly at ``used_bytes`` — NeMo RL's receiver
    rule, so a group this accepts is one NeMo RL's receiver reads the same way."""
    problems: List[str] = []
    cursor = 0
    for slot in msg.slots:
        if slot.offset != cursor:
            problems.append(f"group {msg.group}: {slot.name!r} at offset {slot.offset}, expected {cursor}")
        cursor += align_up(slot.nbytes)
    if cursor != msg.used_bytes:
        problems.append(
            f"group {msg.group}: running aligned offset {cursor} but the message says {msg.used_bytes} used bytes"
        )
    if half_bytes is not None and msg.buffer != DEDICATED and msg.used_bytes > half_bytes:
        problems.append(f"group {msg.group}: {msg.used_bytes} bytes exceed the {half_bytes}-byte buffer")
    return problems


def receiver(manifest: Manifest, half_bytes: Optional[int] = None) -> Generator[ReceiverEffect, Any, ManifestReport]:
    """The receiver's side of one stream; returns the (clean) report or raises
    :class:`ManifestError` after COMPLETE was ACKed. Loads only slots that match the
    manifest; a slot already seen, unknown, or of another shape/dtype is not loaded."""
    report = ManifestReport()
    seen: set = set()
    expect = 0
    while True:
        msg = yield AwaitMessage(expect)
        if isinstance(msg, CompleteMessage):
            report.missing = [n for n in manifest if n not in seen]
            if msg.groups != expect:
                report.layout.append(f"COMPLETE says {msg.groups} groups, {expect} received")
            yield SendAck(COMPLETE)  # always: the sender must not wait out its timeout
            if not report.ok:
                raise ManifestError(report)
            yield Finalize(expect)
            return report
        if msg.group != expect:
            report.layout.append(f"group {msg.group} arrived where group {expect} was expected")
        report.layout.extend(check_layout(msg, half_bytes))
        loadable: List[Slot] = []
        for slot in msg.slots:
            if slot.name not in manifest:
                report.unexpected.append(slot.name)
            elif slot.name in seen:
                report.duplicate.append(slot.name)
            elif (tuple(slot.shape), slot.dtype) != (tuple(manifest[slot.name][0]), manifest[slot.name][1]):
                report.mismatched.append(slot.name)
                seen.add(slot.name)
            else:
                loadable.append(slot)
                seen.add(slot.name)
        try:
            yield LoadGroup(msg.group, msg.buffer, tuple(loadable))
        except Exception as exc:  # recorded, reported at COMPLETE; the group is still ACKed
            report.load_errors.append(f"group {msg.group}: {type(exc).__name__}: {exc}")
        yield SendAck(msg.group)
        expect = msg.group + 1
