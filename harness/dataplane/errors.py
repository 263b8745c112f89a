"""Errors of the data plane, each naming what was wrong (field, sample, partition, task).

Every public call validates its arguments before it touches a store, so a bad argument
raises :class:`DataPlaneInputError` and leaves the store exactly as it was. A duplicate
write refused by a store without upsert is :class:`DuplicateWriteError`, the class of
Mooncake's ``-601 ILLEGAL_CLIENT`` (docs/modelled-systems.md#nemo-rl-data-plane).
"""

from __future__ import annotations

from typing import Iterable


class DataPlaneError(RuntimeError):
    """Base class: something about a data-plane call was wrong; ``str()`` is one line."""


class DataPlaneInputError(DataPlaneError, ValueError):
    """A malformed argument; the message starts with the argument or field it names."""


class UnknownPartitionError(DataPlaneError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0] if self.args else ""


class UnknownTaskError(DataPlaneError, KeyError):
    def __str__(self) -> str:
        return self.args[0] if self.args else ""


class MissingSamplesError(DataPlaneError, KeyError):
    """Sample ids the partition does not hold: never put, or cleared."""

    def __str__(self) -> str:
        return self.args[0] if self.args else ""


class UnproducedFieldError(DataPlaneError, KeyError):
    """A field no put has produced yet for some of the requested samples."""

    def __str__(self) -> str:
        return self.args[0] if self.args else ""


class ClosedClientError(DataPlaneError):
    pass


DUPLICATE_WRITE_CODE = -601  # Mooncake ILLEGAL_CLIENT: a second writer of a key without upsert


class DuplicateWriteError(DataPlaneError):
    """A store without upsert refused a second write of (sample, field)."""

    code = DUPLICATE_WRITE_CODE

    def __init__(self, partition_id: str, conflicts: Iterable[tuple], writer: str) -> None:
        self.partition_id = partition_id
        self.conflicts = sorted(conflicts)
        self.writer = writer
        shown = ", ".join(f"{s}/{f}" for s, f in self.conflicts[:4])
        more = f" (+{len(self.conflicts) - 4} more)" if len(self.conflicts) > 4 else ""
        super().__init__(
            f"{DUPLICATE_WRITE_CODE} ILLEGAL_CLIENT class: {writer} wrote (sample/field) {shown}{more} "
            f"in partition {partition_id!r}, already written by another writer"
        )

    def __reduce__(self):  # survives pickling through a served store's proxy
        return (DuplicateWriteError, (self.partition_id, self.conflicts, self.writer))


def sample_list(ids: Iterable[str], limit: int = 4) -> str:
    ids = list(ids)
    shown = ", ".join(repr(s) for s in ids[:limit])
    return f"[{shown}{', ...' if len(ids) > limit else ''}] ({len(ids)})"
