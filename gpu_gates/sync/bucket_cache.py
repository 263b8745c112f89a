"""CPU bucket cache for weight refit: pack, unpack, plan, version, digest.

After a train step the single cache owner copies the model's weights into host RAM as a
few large contiguous ``uint8`` buckets (docs/modelled-systems.md#rlix-cpu-bucket-cache-and-cache-lock). Two things depend on the
exact layout, so it is defined here once and used by the gates and the simulator:

* every tensor starts at a 512-byte aligned offset, so a receiver can view its slice as
  any dtype without a misaligned read, and a bucket can be sent as one buffer;
* the bucket size is always explicit: RLix refuses an implicit default because the
  right size depends on free VRAM for the staging copy (a silent default was a real bug).

Two model copies at most live in host RAM: the cache keeps only the latest built
version and the active (promoted) one, and garbage-collects the rest after every build
or promote. Readers (transports) hold the cache lock for the whole sync, so a build or
promote can never swap buckets under a transfer (``cache_lock``).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

from harness.refit.stream import ALIGNMENT_BYTES, align_up  # noqa: F401  (one definition of the slot alignment)

if TYPE_CHECKING:
    from harness.control.cache_lock import CacheLockRecords

NamedTensors = Sequence[Tuple[str, torch.Tensor]]


def element_size(dtype: torch.dtype) -> int:
    """Bytes per element, asked of torch itself (hand tables went wrong for bf16 once)."""
    return torch.empty(0, dtype=dtype).element_size()


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat CPU ``uint8`` view of the tensor's raw bytes (0-dim tensors included)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8)


@dataclass
class BucketRecord:
    """One packed bucket: metadata per tensor plus one contiguous CPU ``uint8`` buffer.

    ``used_bytes`` is the length of the prefix that must be transmitted: the end of the
    last tensor, alignment gaps between tensors included, trailing padding excluded. The
    buffer is exactly that long. ``payload_bytes`` is the sum of the tensors' own bytes.
    """

    param_names: List[str]
    shapes: List[Tuple[int, ...]]
    dtypes: List[torch.dtype]
    offsets: List[int]
    used_bytes: int
    buffer: torch.Tensor

    @property
    def nbytes(self) -> List[int]:
        return [_numel(s) * element_size(d) for s, d in zip(self.shapes, self.dtypes)]

    @property
    def payload_bytes(self) -> int:
        return sum(self.nbytes)

    def metadata(self) -> dict:
        """JSON-friendly description (what a receiver needs besides the bytes)."""
        return {
            "param_names": list(self.param_names),
            "shapes": [list(s) for s in self.shapes],
            "dtypes": [dtype_name(d) for d in self.dtypes],
            "offsets": list(self.offsets),
            "used_bytes": self.used_bytes,
        }

    @classmethod
    def from_metadata(cls, meta: dict, buffer: torch.Tensor) -> "BucketRecord":
        """Rebuild a record from :meth:`metadata` and a received buffer."""
        return cls(
            param_names=list(meta["param_names"]),
            shapes=[tuple(int(x) for x in s) for s in meta["shapes"]],
            dtypes=[dtype_from_name(n) for n in meta["dtypes"]],
            offsets=[int(o) for o in meta["offsets"]],
            used_bytes=int(meta["used_bytes"]),
            buffer=buffer,
        )


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for dim in shape:
        n *= int(dim)
    return n


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (stable across torch versions)."""
    return str(dtype).replace("torch.", "")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype name {name!r}")
    return dtype


def _check_names(named_tensors: NamedTensors) -> None:
    seen = set()
    for name, tensor in named_tensors:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor {name!r} is a {type(tensor).__name__}, not a torch.Tensor")
        if name in seen:
            raise ValueError(f"duplicate tensor name {name!r} in bucket")
        seen.add(name)


def pack_bucket(named_tensors: NamedTensors) -> BucketRecord:
    """Copy tensors into one contiguous CPU ``uint8`` buffer, each at a 512-aligned offset."""
    _check_names(named_tensors)
    offsets: List[int] = []
    cursor = 0
    for _, tensor in named_tensors:
        start = align_up(cursor)
        offsets.append(start)
        cursor = start + tensor.numel() * tensor.element_size()
    used_bytes = cursor
    buffer = torch.zeros(used_bytes, dtype=torch.uint8)
    for (_, tensor), start in zip(named_tensors, offsets):
        raw = _as_bytes(tensor)
        buffer[start : start + raw.numel()].copy_(raw)
    return BucketRecord(
        param_names=[name for name, _ in named_tensors],
        shapes=[tuple(t.shape) for _, t in named_tensors],
        dtypes=[t.dtype for _, t in named_tensors],
        offsets=offsets,
        used_bytes=used_bytes,
        buffer=buffer,
    )


def unpack_bucket(record: BucketRecord) -> List[Tuple[str, torch.Tensor]]:
    """Return ``(name, tensor)`` pairs, bit-exact copies of what was packed.

    Each slice is cloned so the result does not alias the (reusable) bucket buffer.
    """
    buffer = record.buffer
    if buffer.dtype != torch.uint8 or buffer.dim() != 1:
        raise ValueError("bucket buffer must be a 1-D uint8 tensor")
    if buffer.numel() < record.used_bytes:
        raise ValueError(f"bucket buffer has {buffer.numel()} bytes, record needs {record.used_bytes}")
    out: List[Tuple[str, torch.Tensor]] = []
    for name, shape, dtype, start in zip(record.param_names, record.shapes, record.dtypes, record.offsets):
        size = _numel(shape) * element_size(dtype)
        if start % ALIGNMENT_BYTES or start + size > record.used_bytes:
            raise ValueError(f"tensor {name!r}: slot [{start}, {start + size}) is misaligned or outside the bucket")
        raw = buffer[start : start + size].clone()
        out.append((name, raw.view(dtype).reshape(shape)))
    return out


def packed_size(named_tensors: NamedTensors) -> int:
    """Bytes a bucket holding exactly these tensors would use (``used_bytes``)."""
    cursor = 0
    for _, tensor in named_tensors:
        cursor = align_up(cursor) + tensor.numel() * tensor.element_size()
    return cursor


def plan_buckets(named_tensors: NamedTensors, bucket_size_bytes: Optional[int]) -> List[List[Tuple[str, torch.Tensor]]]:
    """Split tensors, in order, into groups whose packed size fits ``bucket_size_bytes``.

    There is deliberately no default size: a missing size is an error, as is a single
    tensor larger than a bucket (it could never be staged).
    """
    if bucket_size_bytes is None:
        raise ValueError("bucket_size_bytes is required (no implicit default: size it against free VRAM for staging)")
    if isinstance(bucket_size_bytes, bool) or not isinstance(bucket_size_bytes, int) or bucket_size_bytes <= 0:
        raise ValueError(f"bucket_size_bytes must be a positive integer, got {bucket_size_bytes!r}")
    _check_names(named_tensors)
    groups: List[List[Tuple[str, torch.Tensor]]] = []
    current: List[Tuple[str, torch.Tensor]] = []
    cursor = 0
    for name, tensor in named_tensors:
        size = tensor.numel() * tensor.element_size()
        if size > bucket_size_bytes:
            raise ValueError(
                f"tensor {name!r} needs {size} bytes, more than bucket_size_bytes={bucket_size_bytes}; "
                "raise the bucket size"
            )
        start = align_up(cursor) if current else 0
        if current and start + size > bucket_size_bytes:
            groups.append(current)
            current, start = [], 0
        current.append((name, tensor))
        cursor = start + size
    if current:
        groups.append(current)
    return groups


def build_buckets(named_tensors: NamedTensors, bucket_size_bytes: Optional[int]) -> List[BucketRecord]:
    """:func:`plan_buckets` then :func:`pack_bucket` each group."""
    return [pack_bucket(group) for group in plan_buckets(named_tensors, bucket_size_bytes)]


def tensor_digest(tensor: torch.Tensor) -> str:
    """SHA-256 over dtype, shape and raw bytes: equal digests mean bit-identical tensors.

    dtype and shape are hashed too, so a bf16 and an fp16 tensor with the same bits, or a
    reshaped tensor, never compare equal.
    """
    h = hashlib.sha256()
    h.update(dtype_name(tensor.dtype).encode())
    h.update(repr(tuple(tensor.shape)).encode())
    h.update(_as_bytes(tensor).numpy().tobytes())
    return h.hexdigest()


def state_digests(named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> Dict[str, str]:
    """``{name: tensor_digest}`` for a whole state."""
    return {name: tensor_digest(t) for name, t in named_tensors}


class VersionedBucketCache:
    """Bucket lists keyed by version, with a *latest* (built) and an *active* (promoted) pointer.

    Versions are the training step whose weights the buckets hold (``-1`` = base weights)
    and must strictly increase from build to build, so one build is one version. Only
    latest and active survive a build or promote, which bounds host RAM to two copies.

    Its lock is RLix's ``_cache_lock``: a build, a promote and a whole transfer
    (:meth:`reading`) each hold it. ``lock_records`` (optional) records each hold as it is
    taken and let go (``harness.control.cache_lock``), where no other part of the runtime
    records them.
    """

    def __init__(self, lock_records: Optional[CacheLockRecords] = None) -> None:
        self._lock = threading.Lock()
        self._records = lock_records
        self._versions: Dict[int, List[BucketRecord]] = {}
        self._latest: Optional[int] = None
        self._active: Optional[int] = None

    @property
    def latest_version(self) -> Optional[int]:
        return self._latest

    @property
    def active_version(self) -> Optional[int]:
        return self._active

    @property
    def cache_ready_step(self) -> Optional[int]:
        """RLix's name for the newest built version."""
        return self._latest

    def is_version_built(self, version: int) -> bool:
        return version in self._versions

    def versions_held(self) -> List[int]:
        return sorted(self._versions)

    def host_bytes(self) -> int:
        """Host RAM held by all kept versions' buffers."""
        return sum(b.buffer.numel() for buckets in self._versions.values() for b in buckets)

    def build_latest(self, version: int, buckets: Sequence[BucketRecord]) -> None:
        """Store ``buckets`` as ``version`` and make it the latest; waits for readers."""
        if isinstance(version, bool) or not isinstance(version, int):
            raise TypeError(f"version must be an int, got {version!r}")
        with self._held("build", version):
            if self._latest is not None and version <= self._latest:
                raise ValueError(f"version {version} is not newer than the latest built version {self._latest}")
            self._versions[version] = list(buckets)
            self._latest = version
            self._gc()

    def promote(self, version: int) -> None:
        """Make a built version the active one (what transports send)."""
        with self._held("promote", version):
            if version not in self._versions:
                raise KeyError(f"version {version} is not built (held: {sorted(self._versions)})")
            self._active = version
            self._gc()

    def get_active_buckets(self) -> List[BucketRecord]:
        """Active buckets; the caller must be inside :meth:`reading`."""
        if not self._lock.locked():
            raise RuntimeError("get_active_buckets() called without holding the cache lock; use cache.reading()")
        if self._active is None:
            raise RuntimeError("no version has been promoted yet")
        return self._versions[self._active]

    @contextlib.contextmanager
    def reading(self) -> Iterator[List[BucketRecord]]:
        """Hold the cache lock for a whole transfer; yields the active buckets."""
        with self._held("sync", None):
            yield self.get_active_buckets()

    @contextlib.contextmanager
    def _held(self, holder: str, version: Optional[int]) -> Iterator[None]:
        """The lock, its hold recorded (``version`` None: the active one, read under the lock)."""
        with self._lock:
            if version is None:
                version = self._active
            if self._records is not None:
                self._records.acquired(holder, version)
            try:
                yield
            finally:
                if self._records is not None:
                    self._records.released(holder, version)

    def _gc(self) -> None:
        keep = {v for v in (self._latest, self._active) if v is not None}
        for version in [v for v in self._versions if v not in keep]:
            del self._versions[version]
