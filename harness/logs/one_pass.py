"""A function written over a list of records, run over records that arrive in batches.

Most readers of an event log — the oracle's checks, the outputs' interval and table
builders — are one pass: ``for r in records``, after reading ``records[0]`` (the
header), and the log's end only once the loop is over. :class:`OnePassRun` runs such a
function unchanged while the log is being made or read: it gets a
:class:`OnePassView`, an iterable that yields the records as the caller pushes them, in
a greenlet of its own (a coroutine with its own stack, in the caller's thread). The
caller and the function strictly alternate, so the function sees exactly what it would
see in a list, in the same order; what it keeps is what its loop keeps, and each batch
can be dropped once pushed. A hand-off is two greenlet switches per batch, in one OS
thread: no thread wake-ups, no handover of the interpreter lock, no thread moved
between cores (with a thread per function those cost about a quarter of the readers'
CPU: docs/benchmarks.md, "Runs larger than memory"). A
function that breaks the one-pass rules (a second loop, ``len()``, an index other than
the first before the end) fails loudly with :class:`NotOnePass`.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Callable, Dict, FrozenSet, Iterable, Iterator, List, Optional

import greenlet
import numpy as np


class NotOnePass(RuntimeError):
    """A function read a :class:`OnePassView` as a list (twice, backwards, or its length)."""


class OnePassView:
    """The records one function reads, yielded once as they arrive: iterable once, with
    ``view[0]`` (``first``: the oracle's views start with the log's header), truth
    (true: an oracle's view is never empty) and, once the pass has ended, ``view[-1]``
    (the last record pushed: in the oracle's views, the log's last)."""

    def __init__(self, first: Optional[Dict[str, Any]], runner: "OnePassRun") -> None:
        self._first = first
        self._runner = runner
        self._iterated = False

    def __bool__(self) -> bool:
        return True

    def __getitem__(self, index: Any) -> Dict[str, Any]:
        if index == 0 and type(index) is int and self._first is not None:
            return self._first
        if index == -1 and type(index) is int and self._runner.ended:
            return self._runner.last
        raise NotOnePass(f"records[{index!r}] of an online view: only records[0], and records[-1] after the pass")

    def __len__(self) -> int:
        raise NotOnePass("len() of an online view: the log's length is known only at its end")

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        if self._iterated:
            raise NotOnePass("a second pass over an online view")
        self._iterated = True
        return self._runner.records()


_END = object()


class OnePassRun:
    """``fn(view)`` in a greenlet of its own, fed batches of records by its caller: the
    two strictly alternate (:meth:`push` returns when ``fn`` asks for the next batch or
    has returned), so ``fn`` runs exactly as over a list, one record at a time, and
    :meth:`finish` returns what it returned (or raises what it raised). It is made and
    pushed to from one greenlet (a program's main one, unless it makes its own)."""

    def __init__(self, fn: Callable[[Any], Any], first: Optional[Dict[str, Any]] = None, name: str = "") -> None:
        self.fn = fn
        self.name = name
        self._done = False
        self.ended = False  # the pass has reached the end
        self.last: Optional[Dict[str, Any]] = None  # the last record pushed
        self.value: Any = None
        self.error: Optional[BaseException] = None
        self._caller = greenlet.getcurrent()
        self._fn_side = greenlet.greenlet(self._main)  # (its parent: the caller, where it returns to)
        self._fn_side.switch(first)  # runs fn until it asks for the first batch (or returns)

    def _main(self, first: Optional[Dict[str, Any]]) -> None:
        try:
            self.value = self.fn(OnePassView(first, self))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's greenlet by finish()
            self.error = e
        self._done = True

    def records(self) -> Iterator[Dict[str, Any]]:
        """The function's side: each batch's records, waiting for the next batch between
        (the records of a batch are handed out by ``itertools.chain``, in C: a Python
        generator resumed once per record cost about as much again per record read)."""
        return chain.from_iterable(self._batches())

    def _batches(self) -> Iterator[List[Dict[str, Any]]]:
        caller = self._caller
        while True:
            batch = caller.switch()  # back to push(), until it hands the next batch
            if batch is _END:
                self.ended = True
                return
            self.last = batch[-1]
            yield batch

    def push(self, batch: Any) -> None:
        """Hand ``fn`` ``batch`` (a list, or the end) and return once it is done with it."""
        if not self._done:
            self._fn_side.switch(batch)

    def finish(self) -> Any:
        """End the pass; ``fn``'s value (what it raised is raised here)."""
        self.push(_END)
        if self.error is not None:
            raise self.error
        return self.value


def abandon(runs: Iterable["OnePassRun"]) -> None:
    """End every run's pass without reading its value: the caller is already handling a
    failure (a run that died before its end), and no function is left suspended."""
    for run in runs:
        try:
            run.finish()
        except BaseException:  # noqa: BLE001 - the failure being handled is the caller's
            pass


# ---- splitting a batch by kind, for the readers of each set of kinds


def kind_codes(chunk: List[Dict[str, Any]]) -> tuple:
    """The distinct kinds of ``chunk`` (a list), each record's position among them (an
    array), and the records as a numpy object array (what :func:`pick_kinds` indexes)."""
    kinds = [r.get("kind") for r in chunk]
    code_of = {kind: i for i, kind in enumerate(dict.fromkeys(kinds))}
    codes = np.fromiter(map(code_of.__getitem__, kinds), dtype=np.int64, count=len(kinds))
    records = np.empty(len(chunk), dtype=object)
    records[:] = chunk
    return list(code_of), codes, records


class SplitOnce:
    """:func:`kind_codes` of a chunk, made once for its ``readers``: the readers of a
    streamed log's chunks (the oracle, the outputs' view) are handed the same list one
    after the other, and one instance shared by them splits it once. The chunk is kept
    until that many readers have asked for it (or another chunk is asked for), then let
    go: a chunk outlives its flush only in a reader's hands."""

    def __init__(self, readers: int = 1) -> None:
        self.readers = readers
        self._chunk: Optional[List[Dict[str, Any]]] = None
        self._split: Optional[tuple] = None
        self._asked = 0

    def __call__(self, chunk: List[Dict[str, Any]]) -> tuple:
        if chunk is not self._chunk:  # (the chunk is kept: its id is not reused meanwhile)
            self._chunk, self._split, self._asked = chunk, kind_codes(chunk), 0
        split = self._split
        self._asked += 1
        if self._asked >= self.readers:
            self.forget()
        return split

    def forget(self) -> None:
        """Drop the chunk kept."""
        self._chunk = self._split = None


def pick_kinds(chunk: tuple, kinds: Optional[FrozenSet[str]]) -> List[Dict[str, Any]]:
    """The records of ``chunk`` (:func:`kind_codes` of a list) whose kind is in
    ``kinds`` (every record for None), in order."""
    kinds_read, codes, records = chunk
    if kinds is None:
        return records.tolist()
    wanted = np.fromiter((k in kinds for k in kinds_read), dtype=bool, count=len(kinds_read))
    if not wanted.any():
        return []
    if wanted.all():
        return records.tolist()
    return records[wanted[codes]].tolist()
