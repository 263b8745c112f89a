"""Writing event logs: sequence numbers, canonical JSON, and all-or-nothing files.

Byte-identical logs for identical runs are a feature, so serialization is fixed:
compact separators, keys in insertion order (seq, t, kind, then the fields as emitted),
floats through ``repr``. A log is written to a temporary file beside the target and
renamed into place on :meth:`EventLogWriter.close`; a run that dies leaves no partial log.
"""

from __future__ import annotations

import json
import os
import tempfile
from itertools import islice
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from harness.eventlog.kinds import ALL_KINDS, SCHEMA_NAME, SCHEMA_VERSION


# The canonical encoder, built once: json.dumps with arguments builds a new encoder on
# every call (a third of the time it takes to write a million-record log).
_json_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode

try:
    # orjson (a runtime dependency) encodes a record about 6x faster than the json
    # module's C encoder: writing the 1024-GPU scenario's 1.3 M-record log went from about
    # 3.5 s to under 1 s. Its output is used only where it is byte-identical to the
    # canonical encoding above; every other record is encoded by json (see _encode).
    import orjson
except ImportError:  # pragma: no cover - the json path alone is correct, only slower
    orjson = None


# What orjson (3.11.7 or later: positive exponents written "1e+16", as json writes them)
# writes differently from json, found in its output: a float below 1e-4 (orjson
# "0.00001" or "1.5e-7", json "1e-05", "1.5e-07"), and null (json writes None as null
# too, but orjson also writes NaN and infinity as null where json refuses them). A line
# holding one of these (b"null", b"e-", b"0.0000") is re-encoded by json: a string that happens to hold one costs
# time, never correctness. tests/unit/test_eventlog_encoding.py holds the two encoders
# to the same bytes on floats of every magnitude.
def _refuse(obj: Any) -> Any:
    raise TypeError  # not a plain JSON type: json decides (it encodes or refuses it)


if orjson is not None:
    _orjson_dumps = orjson.dumps
    # subclasses (an IntEnum, a str subclass), dataclasses and datetimes go to _refuse,
    # so json's rules apply to them; numpy arrays do by default
    _ORJSON_OPTIONS = (
        orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
    )

    def encode(rec: Any) -> bytes:
        """One record in the canonical encoding, as UTF-8 bytes (no newline)."""
        try:
            line = _orjson_dumps(rec, default=_refuse, option=_ORJSON_OPTIONS)
        except TypeError:  # orjson.JSONEncodeError: an int over 64 bits, a non-str key, ...
            return _json_encode(rec).encode("utf-8")
        if b"null" in line or b"e-" in line or b"0.0000" in line:  # see above
            return _json_encode(rec).encode("utf-8")
        return line
else:  # pragma: no cover

    def encode(rec: Any) -> bytes:
        """One record in the canonical encoding, as UTF-8 bytes (no newline)."""
        return _json_encode(rec).encode("utf-8")


def dumps(rec: Any) -> str:
    """One record in the canonical encoding: compact separators, keys in insertion order,
    non-ASCII kept, floats as ``repr`` writes them, NaN and infinity refused."""
    return encode(rec).decode("utf-8")


def header_record(
    cluster: Dict[str, Any],
    *,
    scheduler: Optional[Dict[str, Any]] = None,
    source: Optional[str] = None,
    meta: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    rec: Dict[str, Any] = {
        "seq": 0,
        "t": 0.0,
        "kind": "header",
        "schema": SCHEMA_NAME,
        "version": SCHEMA_VERSION,
        "cluster": dict(cluster),
    }
    if scheduler is not None:
        rec["scheduler"] = dict(scheduler)
    if source is not None:
        rec["source"] = source
    if meta is not None:
        rec["meta"] = dict(meta)
    return rec


def _require_registered(kind: str) -> None:
    if kind not in ALL_KINDS:
        raise KeyError(f"record kind {kind!r} is not registered in harness.eventlog.kinds")


class EventLog:
    """An in-memory log that stamps seq numbers; ``records`` is the list written out."""

    def __init__(self, header: Dict[str, Any]) -> None:
        self.records: List[Dict[str, Any]] = [header]
        self._seq = header["seq"]

    def emit(self, kind: str, t: float, **fields: Any) -> Dict[str, Any]:
        return self.append(kind, t, fields)

    def append(self, kind: str, t: float, fields: Dict[str, Any]) -> Dict[str, Any]:
        """:meth:`emit` with the fields as a dict (hot callers: no kwargs re-packing).
        The record is a new dict; ``fields`` itself is not kept."""
        if kind not in ALL_KINDS:  # the check of _require_registered, inlined (hot path)
            _require_registered(kind)
        self._seq = seq = self._seq + 1
        rec: Dict[str, Any] = {"seq": seq, "t": t, "kind": kind, **fields}
        self.records.append(rec)
        return rec

    def add(self, rec: Dict[str, Any]) -> Dict[str, Any]:
        """Append a record the caller built whole, ``{"seq": 0, "t": t, "kind": kind, ...}``
        (keys in their final order), stamping its seq: the hottest producers use it so a
        record is one dict built once. The dict becomes the record (do not reuse it)."""
        if rec["kind"] not in ALL_KINDS:  # the check of _require_registered, inlined (hot path)
            _require_registered(rec["kind"])
        self._seq = rec["seq"] = self._seq + 1
        self.records.append(rec)
        return rec

    def extend(self, t: float, decisions: Iterable[Dict[str, Any]]) -> None:
        """Stamp and append records produced without seq/t (e.g. the scheduler outbox)."""
        records = self.records
        for d in decisions:
            kind = d["kind"]
            if kind not in ALL_KINDS:  # the check of _require_registered, inlined (hot path)
                _require_registered(kind)
            if "t" in d:  # as emit(kind, t, **fields) would refuse it
                raise TypeError("a decision may not carry its own 't'")
            self._seq = seq = self._seq + 1
            # "kind" is already in place, so unpacking ``d`` keeps the key order
            # seq, t, kind, then d's other fields in their order (as emit would)
            records.append({"seq": seq, "t": t, "kind": kind, **d})

    @property
    def made(self) -> int:
        """How many records the log has made, the header (seq 0) included: ``len(records)``
        here, more than the current chunk in a streamed log."""
        return self._seq + 1

    def lines(self) -> Iterable[str]:
        for rec in self.records:
            yield dumps(rec)

    def chunks(self, per_chunk: int = 8192) -> Iterator[bytes]:
        """The log file's bytes, ``per_chunk`` lines at a time (what :meth:`write` writes):
        never the whole file as one string, never a str to encode again."""
        return encoded_chunks(self.records, per_chunk)

    def write(self, path: str) -> str:
        """Write the log to ``path`` atomically (see :func:`atomic_write`)."""
        return atomic_write(path, self.chunks())


def encoded_chunks(records: List[Dict[str, Any]], per_chunk: int = 8192) -> Iterator[bytes]:
    """JSONL bytes of ``records``, ``per_chunk`` newline-terminated lines per chunk: each
    line is :func:`encode` of its record."""
    for start in range(0, len(records), per_chunk):
        yield _encode_lines(records[start : start + per_chunk])


def _encode_lines(records: List[Dict[str, Any]]) -> bytes:
    """``b"".join(encode(r) + b"\n" for r in records)``, faster: orjson encodes the whole
    chunk in one call (:func:`_orjson_lines`), the chunk is joined, and only then searched
    for what marks a line json must encode instead (see :func:`encode`) — one search per
    marker of one buffer, not three per line — and those lines alone are re-encoded."""
    if orjson is None:  # pragma: no cover
        return b"".join([encode(rec) + b"\n" for rec in records])
    try:
        lines = _orjson_lines(records)
    except TypeError:  # a record orjson refuses: each record on its own (encode decides)
        return b"".join([encode(rec) + b"\n" for rec in records])
    lines.append(b"")  # the last line's newline
    data = b"\n".join(lines)
    redo, nulls = _marked_lines(data, lines)
    # a null is json's too unless orjson wrote it for NaN or infinity (json refuses those):
    # a record without one keeps orjson's line
    redo.update(i for i in nulls - redo if not _all_finite(records[i]))
    for i in redo:
        lines[i] = _json_encode(records[i]).encode("utf-8")
    return b"\n".join(lines) if redo else data


#: what goes between two records in :func:`_orjson_lines`' one call, and its encoding
#: there (the comma after a record, the separator, the comma before the next)
_BETWEEN = "\x00"
_BETWEEN_ENCODED = b',"\\u0000",'


def _orjson_lines(records: List[Dict[str, Any]]) -> List[bytes]:
    """orjson's line of each record (raises TypeError where it refuses one), from one call
    on the records with a separator between them, split at the separators: the bytes of
    each record are those of its own call, without a call and a fresh 1 KiB output
    buffer per record (a chunk's thousands of buffers, freed together, made the heap
    shrink and grow back at each chunk: 360,000 page faults at 512 GPUs). A record that
    holds the separator's encoding itself (a NUL string between two values of a list)
    makes one split too many: then each record is encoded on its own."""
    if not records:
        return []
    mixed: List[Any] = [_BETWEEN] * (2 * len(records) - 1)
    mixed[::2] = records
    lines = _orjson_dumps(mixed, default=_refuse, option=_ORJSON_OPTIONS)[1:-1].split(_BETWEEN_ENCODED)
    if len(lines) != len(records):
        return [_orjson_dumps(rec, default=_refuse, option=_ORJSON_OPTIONS) for rec in records]
    return lines


#: the markers of a line json must encode instead (see :func:`encode`), each with the
#: position of its rarest byte in an event log's JSON ("-", ".", "u"): the byte searched for
_REDO_MARKERS = ((b"e-", 1), (b"0.0000", 1))
_NULL_MARKER = (b"null", 1)


def _marked_lines(data: bytes, lines: List[bytes]) -> Tuple[set, set]:
    """The indexes of the lines of ``data`` (``lines`` joined by newlines) holding
    ``e-`` or ``0.0000`` (first set) and those holding ``null`` (second set).

    numpy compares the chunk's bytes with each marker's rarest byte, then keeps the
    places whose other bytes match too, and finds each one's line by a binary search of
    the line ends: about 2.5x faster than ``bytes.find`` (which stops at every ``e`` of
    an ``e-`` search) with a Python step per hit (7 % of the 1024-GPU run's lines hold
    a null)."""
    import numpy as np  # (on first use: importing the log writer stays light)

    buf = np.frombuffer(data, dtype=np.uint8)
    found = [_occurrences(np, buf, marker, anchor) for marker, anchor in _REDO_MARKERS + (_NULL_MARKER,)]
    if not any(len(at) for at in found):
        return set(), set()
    ends = np.cumsum(np.fromiter(map(len, lines), dtype=np.int64, count=len(lines)) + 1)  # past each newline

    def line_of(at: Any) -> set:
        return set(np.searchsorted(ends, at, side="right").tolist())

    return line_of(np.concatenate(found[:-1])), line_of(found[-1])


def holds_json_only_float(data: bytes) -> bool:
    """``b"e-" in data or b"0.0000" in data`` (a float orjson spells unlike json: see
    :func:`encode`), found as :func:`_marked_lines` finds them: about 4x faster than the
    two ``in`` scans on a Perfetto trace's chunks (each ``e`` stops an ``e-`` search)."""
    import numpy as np

    buf = np.frombuffer(data, dtype=np.uint8)
    return any(len(_occurrences(np, buf, marker, anchor)) for marker, anchor in _REDO_MARKERS)


def _occurrences(np: Any, buf: Any, marker: bytes, anchor: int) -> Any:
    """Where ``marker`` starts in ``buf`` (uint8 array): the places of its byte at
    ``anchor``, narrowed to those whose other bytes match as well."""
    n, m = len(buf), len(marker)
    if n < m:
        return np.zeros(0, dtype=np.int64)
    at = np.flatnonzero(buf[anchor : n - m + 1 + anchor] == marker[anchor])
    for k, byte in enumerate(marker):
        if k != anchor and len(at):
            at = at[buf[at + k] == byte]
    return at


def _all_finite(obj: Any) -> bool:
    """Whether no float inside ``obj`` (dicts, lists, tuples and scalars: what orjson
    encoded) is NaN or infinite. A record's own fields are read in a loop of their own
    (most hold no container): the stack walks only what they nest."""
    if type(obj) is dict:
        for v in obj.values():
            kind = type(v)
            if kind is float:
                if v - v != 0.0:
                    return False
            elif (kind is dict or kind is list or kind is tuple) and not _nested_finite(v):
                return False
        return True
    return _nested_finite(obj)


def _nested_finite(obj: Any) -> bool:
    """:func:`_all_finite` of any value, by a walk of everything it holds."""
    stack = [obj]
    while stack:
        o = stack.pop()
        kind = type(o)
        if kind is float:
            if o - o != 0.0:  # NaN for NaN and for +-inf
                return False
        elif kind is dict:
            stack.extend(o.values())
        elif kind is list or kind is tuple:
            stack.extend(o)
    return True


def atomic_write(path: str, data: "str | bytes | Iterable[str] | Iterable[bytes | memoryview]") -> str:
    """Write ``data`` to ``path`` through a temp file beside it and a rename, so a reader
    (or a crash) never sees a half-written file; returns the path. The one place every
    output of rlharness (logs, reports, traces, pictures) is written. ``data`` may be
    an iterable of text chunks, written as they come (a long log is never one string)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    except OSError as e:  # name the user's path, not the temp file's
        raise OSError(e.errno, e.strerror or str(e), path) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            if isinstance(data, (str, bytes)):
                fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            else:
                for chunk in data:  # text, or bytes already encoded (EventLog.chunks)
                    fh.write(chunk.encode("utf-8") if isinstance(chunk, str) else chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and e.filename in (tmp, None):
            raise OSError(e.errno, e.strerror or str(e), path) from None
        raise
    return path


def write_atomic(path: str, lines: Iterable[str]) -> None:
    """Write JSONL lines atomically (see :func:`atomic_write`), a few thousand at a time:
    a million-record log joined into one string, then encoded, held both copies at once
    (about 0.6 GB for the 1024-GPU scenario)."""
    atomic_write(path, _line_chunks(lines))


def _line_chunks(lines: Iterable[str], per_chunk: int = 4096) -> Iterator[str]:
    it = iter(lines)
    while True:
        chunk = list(islice(it, per_chunk))
        if not chunk:
            return
        chunk.append("")  # the last line's newline
        yield "\n".join(chunk)


class EventLogWriter:
    """File-backed log for long-running producers (gates): emit, then close atomically."""

    def __init__(
        self, path: str, *, source: str, cluster: Optional[Dict[str, Any]] = None, meta: Optional[Dict[str, Any]] = None
    ) -> None:
        self.path = path
        self.log = EventLog(header_record(cluster or {"nodes": 1, "gpus_per_node": 1}, source=source, meta=meta))
        self.closed = False

    def emit(self, kind: str, t: float, **fields: Any) -> Dict[str, Any]:
        return self.log.emit(kind, t, **fields)

    def close(self) -> None:
        if not self.closed:
            self.log.write(self.path)
            self.closed = True
