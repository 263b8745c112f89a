"""A streamed event log: records leave memory as they are made, in bounded chunks.

:class:`~harness.logs.writer.EventLog` keeps every record for the run's lifetime (a
4,096-GPU run makes about five million, 2 GB as dicts). :class:`StreamedLog` is the same
log — the same ``emit``/``append``/``add``/``extend``, the same seq stamping — whose
``records`` list is only the chunk being filled: every ``per_chunk`` records the chunk
is encoded (:func:`~harness.logs.writer.encoded_chunks`, so the file is byte for byte
what ``EventLog.write`` writes), written to ``sink`` (a binary file or pipe), handed to
each consumer (an online check, an output's accumulator) and dropped. Memory is then one
chunk plus what the consumers keep.

A consumer is a callable taking a list of records (in log order, each once); it may
keep what it reads but must not change a record (the next consumer reads it too).
"""

from __future__ import annotations

from typing import IO, Any, Callable, Dict, List, Optional, Sequence

from harness.logs.writer import EventLog, _encode_lines

Consumer = Callable[[List[Dict[str, Any]]], None]

#: records per chunk: about 4 MB of dicts, a few ms to encode; large enough that the
#: per-chunk costs (a write, one call per consumer) vanish, small enough to be bounded
CHUNK_RECORDS = 8192


class StreamedLog(EventLog):
    """An :class:`EventLog` that writes its records to ``sink`` as they are made and
    hands them to ``consumers``; ``records`` holds only the current chunk."""

    def __init__(
        self,
        header: Dict[str, Any],
        sink: Optional[IO[bytes]] = None,
        consumers: Sequence[Consumer] = (),
        per_chunk: int = CHUNK_RECORDS,
    ) -> None:
        super().__init__(header)
        self.sink = sink
        self.consumers = list(consumers)
        self.per_chunk = per_chunk
        self.last: Dict[str, Any] = header  # the latest record (the run's end once closed)
        self.closed = False

    def _full(self) -> None:
        if len(self.records) >= self.per_chunk:
            self.flush()

    def append(self, kind: str, t: float, fields: Dict[str, Any]) -> Dict[str, Any]:
        self._full()
        return super().append(kind, t, fields)

    def add(self, rec: Dict[str, Any]) -> Dict[str, Any]:
        self._full()
        return super().add(rec)

    def extend(self, t: float, decisions) -> None:
        self._full()
        super().extend(t, decisions)

    def flush(self) -> None:
        """Write and hand on the records made so far (called when a chunk is full and at
        :meth:`close`; a record's producer is done with it by then)."""
        chunk = self.records
        if not chunk:
            return
        self.records = []
        self.last = chunk[-1]
        if self.sink is not None:
            self.sink.write(_encode_lines(chunk))
        for consume in self.consumers:
            consume(chunk)

    def close(self) -> None:
        """Flush the last chunk (the sink stays open: its owner closes or renames it)."""
        if not self.closed:
            self.flush()
            self.closed = True

    @property
    def seq(self) -> int:
        """The seq of the latest record."""
        return self._seq

    def chunks(self, per_chunk: int = 8192):  # pragma: no cover - nothing to re-read
        raise RuntimeError("a streamed log is written as it is made: there is nothing to write again")
