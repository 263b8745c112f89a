"""Per-row content digests: a row's hash is written with it and checked on every read.

A transfer engine can lose data while reporting success: Mooncake's memcpy path truncated
about half of fresh cross-node reads and returned them as complete (Relax issue #256), so
a reader got a row of the right shape whose tail was never copied. Nothing downstream can
tell such a row from a real one. So each store records a digest of every (sample, field)
row when it writes it, and compares the digest of what a read returned with it before
handing the row on; a mismatch is :class:`RowDigestError`, naming the partition, the
sample and the field.

The digest covers the dtype, the shape and the bytes (SHA-256, first 16 bytes in hex):
a row read back with another dtype or shape is as wrong as one with other bytes.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Dict, List, Optional, Sequence

import torch

from harness.dataplane.errors import DataPlaneError

DIGEST_TAG = "__digest/"  # a TransferQueue sample tag holding one field's row digest


class RowDigestError(DataPlaneError):
    """A row read back does not hash to the digest written with it (or has none)."""

    def __init__(
        self, partition_id: str, sample: str, field: str, written: Optional[str], read: str, row: torch.Tensor
    ) -> None:
        self.partition_id, self.sample, self.field = partition_id, sample, field
        self.written, self.read = written, read
        what = "no digest was written with it" if written is None else f"written with digest {written}"
        super().__init__(
            f"row digest mismatch: partition {partition_id!r} sample {sample!r} field {field!r}: "
            f"the read returned {str(row.dtype).replace('torch.', '')}{list(row.shape)} hashing to "
            f"{read}, {what} (a truncated or corrupted read)"
        )

    def __reduce__(self):  # survives pickling through a served store's proxy
        return (_rebuild, (self.args[0], self.partition_id, self.sample, self.field, self.written, self.read))


def _rebuild(message, partition_id, sample, field, written, read):
    err = RowDigestError.__new__(RowDigestError)
    DataPlaneError.__init__(err, message)
    err.partition_id, err.sample, err.field, err.written, err.read = partition_id, sample, field, written, read
    return err


def _raw_bytes(row: torch.Tensor) -> bytes:
    flat = row.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def row_digest(row: torch.Tensor) -> str:
    """SHA-256 of a row's dtype, shape and bytes (32 hex digits)."""
    h = hashlib.sha256()
    h.update(f"{row.dtype}|{tuple(row.shape)}|".encode())
    h.update(_raw_bytes(row))
    return h.hexdigest()[:32]


def digests_of(rows: Dict[str, List[torch.Tensor]]) -> Dict[str, List[str]]:
    return {name: [row_digest(r) for r in field_rows] for name, field_rows in rows.items()}


def verify(
    partition_id: str,
    sample_ids: Sequence[str],
    rows: Dict[str, List[torch.Tensor]],
    written: Callable[[str, str], Optional[str]],
) -> None:
    """Raise :class:`RowDigestError` for the first row whose digest is not the one written."""
    for name, field_rows in rows.items():
        for sample, row in zip(sample_ids, field_rows):
            expected = written(sample, name)
            got = row_digest(row)
            if got != expected:
                raise RowDigestError(partition_id, sample, name, expected, got, row)


def truncated(row: torch.Tensor) -> torch.Tensor:
    """The fault: a read whose copy stopped halfway and still reported success (Relax
    #256): a row of the right dtype and shape whose second half of bytes was never
    copied (zeros, as a fresh receive buffer holds)."""
    out = row.detach().clone().contiguous()
    flat = out.reshape(-1).view(torch.uint8)
    flat[flat.numel() // 2 :] = 0
    return out
