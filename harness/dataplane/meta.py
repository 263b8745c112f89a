"""Batch metadata: what the driver holds and hands out instead of tensors.

A :class:`KVBatchMeta` names the samples of a put (ids, partition, the fields this put
wrote, unpadded sequence lengths) and carries per-row tags, 1:1 with the ids, checked on
construction. ``shard_for_dp`` splits metadata only, never data: every DP rank gets a
disjoint shard and together they cover the batch, balanced by total sequence length
(greedy, longest first, ties by position) so the same batch always shards the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

from harness.dataplane.errors import DataPlaneInputError

TAG_TYPES = (str, int, float, bool, type(None))


def check_sample_ids(sample_ids: Any, what: str = "sample_ids") -> Tuple[str, ...]:
    if isinstance(sample_ids, (str, bytes)) or not isinstance(sample_ids, (list, tuple)):
        raise DataPlaneInputError(f"{what}: must be a list of strings")
    if not sample_ids:
        raise DataPlaneInputError(f"{what}: must not be empty")
    for s in sample_ids:
        if not isinstance(s, str) or not s or s.startswith("__"):
            raise DataPlaneInputError(f"{what}: {s!r} is not a sample id (non-empty string, not starting with '__')")
    if len(set(sample_ids)) != len(sample_ids):
        dup = next(s for s in sample_ids if list(sample_ids).count(s) > 1)
        raise DataPlaneInputError(f"{what}: {dup!r} appears more than once")
    return tuple(sample_ids)


def check_tags(tags: Any, n: int) -> List[Dict[str, Any]]:
    if tags is None:
        return [{} for _ in range(n)]
    if not isinstance(tags, (list, tuple)):
        raise DataPlaneInputError("tags: must be a list of dicts, one per sample")
    if len(tags) != n:
        raise DataPlaneInputError(f"tags: {len(tags)} tags for {n} samples (tags are 1:1 with rows)")
    for i, tag in enumerate(tags):
        if not isinstance(tag, dict):
            raise DataPlaneInputError(f"tags[{i}]: must be a dict, got {type(tag).__name__}")
        for k, v in tag.items():
            if not isinstance(k, str) or k.startswith("__"):
                raise DataPlaneInputError(f"tags[{i}]: key {k!r} must be a string not starting with '__'")
            if not isinstance(v, TAG_TYPES):
                raise DataPlaneInputError(
                    f"tags[{i}][{k!r}]: must be a primitive (str/int/float/bool/None), got {type(v).__name__}"
                )
    return [dict(t) for t in tags]


@dataclass(frozen=True)
class KVBatchMeta:
    partition_id: str
    sample_ids: Tuple[str, ...]
    fields: Tuple[str, ...]
    sequence_lengths: Optional[Tuple[int, ...]] = None
    tags: Tuple[Dict[str, Any], ...] = ()
    extra_info: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.sample_ids)
        if len(self.tags) != n:
            raise DataPlaneInputError(f"tags: {len(self.tags)} tags for {n} samples (tags are 1:1 with rows)")
        if self.sequence_lengths is not None and len(self.sequence_lengths) != n:
            raise DataPlaneInputError(f"sequence_lengths: {len(self.sequence_lengths)} entries for {n} samples")
        if len(set(self.sample_ids)) != n:
            raise DataPlaneInputError("sample_ids: duplicate ids in one batch")

    def __len__(self) -> int:
        return len(self.sample_ids)

    def _rows(self, idx: Sequence[int], **changes: Any) -> "KVBatchMeta":
        """A fresh meta of the rows at ``idx``: its ``extra_info`` and per-row tag dicts are
        copies, so a consumer that edits a derived meta (stamping tags, noting a step in
        ``extra_info``) never edits the batch it came from."""
        lens = None if self.sequence_lengths is None else tuple(self.sequence_lengths[i] for i in idx)
        return replace(
            self,
            sample_ids=tuple(self.sample_ids[i] for i in idx),
            sequence_lengths=lens,
            tags=tuple(dict(self.tags[i]) for i in idx),
            extra_info=dict(self.extra_info),
            **changes,
        )

    def _check_indices(self, indices: Any, what: str) -> List[int]:
        if isinstance(indices, (str, bytes)) or not isinstance(indices, (list, tuple, range)):
            raise DataPlaneInputError(f"{what}: must be a list of row indices")
        for i in indices:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self):
                raise DataPlaneInputError(f"{what}: {i!r} is not a row index of a {len(self)}-row batch")
        return list(indices)

    def subset(self, indices: Sequence[int]) -> "KVBatchMeta":
        """The rows at ``indices``, in that order (an index twice is refused when the meta
        is built: a sample id appears once per batch)."""
        return self._rows(self._check_indices(indices, "subset indices"))

    def slice(self, start: int, stop: int) -> "KVBatchMeta":
        """The contiguous rows ``[start, stop)`` (Python slice bounds, so past the end clips)."""
        return self._rows(range(len(self))[start:stop])

    def drop(self, indices: Sequence[int]) -> Optional["KVBatchMeta"]:
        """Every row except those at ``indices`` (any order, repeats allowed); ``None`` when
        nothing is left, so a caller's "nothing to train" branch is an ``is None`` test."""
        gone = set(self._check_indices(indices, "drop indices"))
        keep = [i for i in range(len(self)) if i not in gone]
        return self._rows(keep) if keep else None

    def concat(self, *others: "KVBatchMeta") -> "KVBatchMeta":
        """This batch's rows followed by the others' (same partition only). Sequence lengths
        survive only if every part has them; fields and ``extra_info`` are this meta's."""
        for o in others:
            if not isinstance(o, KVBatchMeta):
                raise DataPlaneInputError(f"concat: {type(o).__name__} is not a KVBatchMeta")
            if o.partition_id != self.partition_id:
                raise DataPlaneInputError(f"concat: partition {o.partition_id!r} differs from {self.partition_id!r}")
        parts = (self, *others)
        lens = None
        if all(m.sequence_lengths is not None for m in parts):
            lens = tuple(n for m in parts for n in m.sequence_lengths)
        return replace(
            self,
            sample_ids=tuple(s for m in parts for s in m.sample_ids),
            sequence_lengths=lens,
            tags=tuple(dict(t) for m in parts for t in m.tags),
            extra_info=dict(self.extra_info),
        )

    def with_fields(self, fields: Sequence[str]) -> "KVBatchMeta":
        """A copy whose field list is this one's followed by the new names not already in it
        (order kept, no duplicates): a later stage that wrote more fields extends what the
        meta names, it does not forget what earlier stages wrote."""
        if isinstance(fields, (str, bytes)) or not isinstance(fields, (list, tuple)):
            raise DataPlaneInputError("with_fields: must be a list of field names")
        merged = tuple(dict.fromkeys((*self.fields, *fields)))
        return self._rows(range(len(self)), fields=merged)

    def shard_for_dp(self, dp_size: int) -> List["KVBatchMeta"]:
        if not isinstance(dp_size, int) or isinstance(dp_size, bool) or dp_size <= 0:
            raise DataPlaneInputError(f"dp_size: must be a positive int, got {dp_size!r}")
        lens = self.sequence_lengths or tuple(1 for _ in self.sample_ids)
        order = sorted(range(len(self)), key=lambda i: (-lens[i], i))
        bins: List[List[int]] = [[] for _ in range(dp_size)]
        load = [0] * dp_size
        for i in order:
            b = min(range(dp_size), key=lambda k: (load[k], len(bins[k]), k))
            bins[b].append(i)
            load[b] += lens[i]
        return [self._rows(sorted(b)) for b in bins]

    def shard_for_dp_with_inverse(self, dp_size: int) -> Tuple[List["KVBatchMeta"], Optional[List[int]]]:
        """:meth:`shard_for_dp` plus the inverse permutation (NeMo RL's ``unsorted_indices``):
        ``inverse[i]`` is where original row ``i`` sits once the ranks' outputs are joined in
        rank order, so ``restore_order(joined, inverse)`` gives the rows back in batch order.
        ``None`` when the shards already are the batch order."""
        shards = self.shard_for_dp(dp_size)
        position = {sid: j for j, sid in enumerate(s for shard in shards for s in shard.sample_ids)}
        inverse = [position[sid] for sid in self.sample_ids]
        return shards, (None if inverse == list(range(len(self))) else inverse)

    def to_json(self) -> str:
        """The wire form the driver sends to workers (metadata only; its size is the driver hop)."""
        return json.dumps(
            {
                "partition_id": self.partition_id,
                "sample_ids": list(self.sample_ids),
                "fields": list(self.fields),
                "sequence_lengths": None if self.sequence_lengths is None else list(self.sequence_lengths),
                "tags": list(self.tags),
                "extra_info": self.extra_info,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> "KVBatchMeta":
        d = json.loads(text)
        lens = d.get("sequence_lengths")
        return cls(
            d["partition_id"],
            tuple(d["sample_ids"]),
            tuple(d["fields"]),
            None if lens is None else tuple(lens),
            tuple(d["tags"]),
            d.get("extra_info") or {},
        )


def restore_order(rows: Sequence[Any], inverse: Optional[Sequence[int]]) -> List[Any]:
    """Rows joined in DP-rank order, put back in the batch's order by the inverse
    permutation of :meth:`KVBatchMeta.shard_for_dp_with_inverse` (``None``: already in order)."""
    if inverse is None:
        return list(rows)
    if len(inverse) != len(rows) or sorted(inverse) != list(range(len(rows))):
        raise DataPlaneInputError(f"inverse: not a permutation of the {len(rows)} joined rows")
    return [rows[j] for j in inverse]
