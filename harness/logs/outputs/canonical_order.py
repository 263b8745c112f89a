"""A total, deterministic order for output records: cheap keys first, canonical JSON last.

Outputs sort slices and trace events by a tuple of plain fields, and break what is left
of a tie by the canonical JSON of their arguments (sorted keys, compact), so equal logs
always give equal files. Encoding that JSON for every item was most of the cost of the
outputs of a long run, and it almost never decides anything (a simulator log's seqs are
unique), so here it is encoded only where the cheap key ties.
"""

from __future__ import annotations

import json
import operator
from itertools import islice
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

# One encoder, built once: json.dumps with arguments builds a new JSONEncoder per call,
# which dominated the outputs of a long run (hundreds of thousands of sort keys).
canonical_json = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str).encode


class CanonKey:
    """A sort-key element ordered by the canonical JSON of ``obj``, encoded only if a sort
    ever compares it — it is the last tie-breaker, which a simulator log (unique seqs)
    never reaches, so most keys are never encoded. Same order as the encoded strings."""

    __slots__ = ("obj", "_text")

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self._text: Optional[str] = None

    def text(self) -> str:
        if self._text is None:
            self._text = canonical_json(self.obj)
        return self._text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CanonKey) and self.text() == other.text()

    def __lt__(self, other: "CanonKey") -> bool:
        return self.text() < other.text()

    __hash__ = None  # compared, never hashed


def sort_canon_last(items: List[Any], key: Callable[[Any], tuple], canon_of: Callable[[Any], Any]) -> None:
    """Sort ``items`` in place (stably) by ``key(x) + (CanonKey(canon_of(x)),)``, without
    building the CanonKey: sort by ``key``, then re-sort each run of equal keys by the
    canonical JSON. Same order; a simulator log (unique seqs) has no such runs."""
    keys = [key(x) for x in items]
    order = sorted(range(len(items)), key=keys.__getitem__)
    out = [items[i] for i in order]
    ranked = [keys[i] for i in order]
    if not any(map(operator.eq, ranked, islice(ranked, 1, None))):  # no ties (the usual case): done
        items[:] = out
        return
    i, n = 0, len(order)
    while i < n:
        j = i + 1
        k = keys[order[i]]
        while j < n and keys[order[j]] == k:
            j += 1
        if j - i > 1:
            out[i:j] = sorted(out[i:j], key=lambda x: canonical_json(canon_of(x)))
        i = j
    items[:] = out


def column_order(
    columns: Sequence[Sequence[Any]],
    tail: Callable[[int], tuple],
    canon_of: Callable[[int], Any],
    as_array: bool = False,
) -> Any:
    """The positions ``0..n-1`` sorted by ``tuple(c[i] for c in columns) + tail(i) +
    (CanonKey(canon_of(i)),)`` (stable), the columns numbers (ints or floats): sorted by
    numpy on the columns, then each run that ties on all of them (none in a simulator
    log) sorted by the tail and the canonical JSON — the order :func:`sort_canon_last`
    gives with that key, without a Python tuple per item. Columns that are not all plain
    numbers (or ints beyond 64 bits) take :func:`sort_canon_last` itself. ``as_array``:
    the positions as a numpy array (8 bytes each, not a Python int and a pointer)."""
    n = len(columns[0]) if columns else 0
    arrays = []
    for column in columns:
        try:
            array = np.asarray(column)
        except (OverflowError, ValueError, TypeError):
            array = None
        if (
            array is None
            or array.dtype.kind not in "iuf"
            or array.shape != (n,)
            or (array.dtype.kind == "f" and n and not np.abs(array).max() < 2.0**53)
        ):  # exact as floats
            order = list(range(n))
            sort_canon_last(order, lambda i: tuple(c[i] for c in columns) + tail(i), canon_of)
            return np.asarray(order, dtype=np.int64) if as_array else order
        arrays.append(array)
    order = np.lexsort(arrays[::-1]) if arrays else np.arange(n)
    if n < 2:
        return order if as_array else order.tolist()
    ties = np.ones(n - 1, dtype=bool)
    for array in arrays:
        ranked = array[order]
        ties &= ranked[1:] == ranked[:-1]
    del ranked
    if not ties.any():
        return order if as_array else order.tolist()
    out = order.tolist()
    starts = np.flatnonzero(ties & ~np.concatenate(([False], ties[:-1])))
    for start in starts.tolist():  # each run of ties: positions start .. end
        end = start + 1
        while end < n - 1 and ties[end]:
            end += 1
        run = out[start : end + 1]
        sort_canon_last(run, tail, canon_of)
        out[start : end + 1] = run
    return np.asarray(out, dtype=np.int64) if as_array else out
