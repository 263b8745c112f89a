"""Reading and checking event-log records, with errors that name file, line and field.

Every problem in an input file becomes one :class:`InputError` whose text is
``<file>:<line>: <what>`` — the CLI prints it as ``error: ...`` and exits 2. Lines are
read within the limits of :mod:`harness.limits` (line length, nesting, 64-bit integers,
cluster size) and without duplicate keys (:mod:`harness.logs.jsonline`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional

from harness.logs.jsonline import JsonLineError, loads, numbered_lines
from harness.eventlog.kinds import ALL_KINDS, COMMON_FIELDS, RETIRED_KINDS, SCHEMA_NAME, SCHEMA_VERSION
from harness.limits import MAX_GPUS, MAX_INT, fmt_limit


class InputError(ValueError):
    """Bad input; ``str()`` is the one line the user sees (without the 'error: ' prefix)."""


@dataclass(frozen=True)
class Record:
    line: int
    data: Dict[str, Any]

    @property
    def kind(self) -> str:
        return self.data["kind"]

    @property
    def seq(self) -> int:
        return self.data["seq"]

    @property
    def t(self) -> float:
        return self.data["t"]


def _type_ok(value: Any, spec: str) -> bool:
    nullable = spec.endswith("?")
    base = spec.rstrip("?")
    if value is None:
        return nullable or base == "any"
    if base == "any":
        return True
    if base == "int":
        return isinstance(value, int) and not isinstance(value, bool) and -MAX_INT - 1 <= value <= MAX_INT
    if base == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if base == "str":
        return isinstance(value, str)
    if base == "bool":
        return isinstance(value, bool)
    if base == "object":
        return isinstance(value, dict)
    if base == "list":
        return isinstance(value, list)
    if base == "int_list":
        return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if base == "priority":
        return (isinstance(value, str)) or (isinstance(value, int) and not isinstance(value, bool))
    raise AssertionError(f"unknown field type {spec!r}")


_TYPE_WORDS = {
    "int": "an integer",
    "number": "a finite number",
    "str": "a string",
    "bool": "true or false",
    "object": "an object",
    "list": "a list",
    "int_list": "a list of integers",
    "priority": "a priority name or 0..6",
    "any": "any value",
}


def _describe(spec: str) -> str:
    word = _TYPE_WORDS[spec.rstrip("?")]
    return word + (" or null" if spec.endswith("?") else "")


def check_record(data: Any, where: str) -> Dict[str, Any]:
    """Check one decoded record against its kind's field table."""
    if not isinstance(data, dict):
        raise InputError(f"{where}: a record must be a JSON object")
    kind = data.get("kind")
    if not isinstance(kind, str):
        raise InputError(f"{where}: field 'kind': missing or not a string")
    spec = ALL_KINDS.get(kind)
    if spec is None:
        if kind in RETIRED_KINDS:
            raise InputError(
                f"{where}: field 'kind': record kind {kind!r} was retired (one sync vocabulary for every "
                f"runtime, docs/trace-format.md): this log needs the version that wrote it; now "
                f"{RETIRED_KINDS[kind]}"
            )
        raise InputError(f"{where}: field 'kind': unknown record kind {kind!r}")
    seq = data.get("seq")
    if not (isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0):
        raise InputError(f"{where}: field 'seq': must be a non-negative integer")
    if seq > MAX_INT:
        raise InputError(f"{where}: field 'seq': {len(str(seq))} digits, outside the 64-bit range (the limit)")
    t = data.get("t")
    if not _type_ok(t, "number") or t < 0:
        raise InputError(f"{where}: field 't': must be a non-negative number (seconds)")
    for name, ftype in spec["required"].items():
        if name not in data:
            raise InputError(f"{where}: field {name!r}: missing (required for {kind})")
        if not _type_ok(data[name], ftype):
            raise InputError(f"{where}: field {name!r}: must be {_describe(ftype)}, got {json.dumps(data[name])[:60]}")
    for name, value in data.items():
        if name in COMMON_FIELDS or name in spec["required"]:
            continue
        ftype = spec["optional"].get(name)
        if ftype is None:
            raise InputError(f"{where}: field {name!r}: not a field of {kind} records")
        if not _type_ok(value, ftype):
            raise InputError(f"{where}: field {name!r}: must be {_describe(ftype)}, got {json.dumps(value)[:60]}")
    return data


def check_header(rec: Record, where: str) -> None:
    d = rec.data
    if d["schema"] != SCHEMA_NAME:
        raise InputError(f"{where}: field 'schema': expected {SCHEMA_NAME!r}, got {d['schema']!r}")
    if d["version"] != SCHEMA_VERSION:
        raise InputError(f"{where}: field 'version': this rlharness reads version {SCHEMA_VERSION}, got {d['version']}")
    cluster = d["cluster"]
    for key in ("nodes", "gpus_per_node"):
        v = cluster.get(key)
        if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
            raise InputError(f"{where}: field 'cluster.{key}': must be a positive integer")
    if cluster["nodes"] * cluster["gpus_per_node"] > MAX_GPUS:
        raise InputError(
            f"{where}: field 'cluster': {cluster['nodes']:,} nodes x {cluster['gpus_per_node']:,} GPUs "
            f"exceeds the limit of {fmt_limit(MAX_GPUS)} GPUs"
        )
    extra = set(cluster) - {"nodes", "gpus_per_node", "vram_gib", "host_ram_bytes"}
    if extra:
        raise InputError(
            f"{where}: field 'cluster.{sorted(extra)[0]}': not a cluster field "
            f"(nodes, gpus_per_node, vram_gib, host_ram_bytes)"
        )
    ram = cluster.get("host_ram_bytes")
    if ram is not None and not (isinstance(ram, int) and not isinstance(ram, bool) and ram > 0):
        raise InputError(f"{where}: field 'cluster.host_ram_bytes': must be a positive integer (bytes per node)")


def read_records(path: str) -> List[Record]:
    """Read and check a whole JSONL log. The first record must be the header."""
    return list(iter_records(path))


def iter_records(path: str) -> Iterator[Record]:
    """:func:`read_records` one record at a time, as the file is read (a log larger than
    memory is checked in one pass: ``rlharness check``). Each record is checked before it
    is yielded; a bad one raises :class:`InputError` where it is found."""
    records = False  # (whether a record was read: the header)
    prev_seq: Optional[int] = None
    prev_t: Optional[float] = None
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    with fh:
        for lineno, raw in _numbered(fh, path):
            where = f"{path}:{lineno}"
            if not raw.strip():
                continue
            try:
                data = loads(raw)
            except JsonLineError as e:
                raise InputError(f"{where}: {e}") from None
            check_record(data, where)
            rec = Record(lineno, data)
            if not records and rec.kind != "header":
                raise InputError(f"{where}: the first record must be a header (kind 'header'), got {rec.kind!r}")
            if records and rec.kind == "header":
                raise InputError(f"{where}: a second header record")
            if rec.kind == "header":
                check_header(rec, where)
            if prev_seq is not None and rec.seq <= prev_seq:
                raise InputError(f"{where}: field 'seq': {rec.seq} does not increase (previous {prev_seq})")
            if prev_t is not None and rec.t < prev_t:
                raise InputError(f"{where}: field 't': {rec.t} goes back in time (previous {prev_t})")
            prev_seq, prev_t = rec.seq, rec.t
            records = True
            yield rec
    if not records:
        raise InputError(f"{path}:1: empty log (no header record)")


def _numbered(fh, path: str):
    try:
        yield from numbered_lines(fh, path)
    except JsonLineError as e:
        raise InputError(str(e)) from None
