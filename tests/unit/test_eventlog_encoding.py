"""The log encoding is the json module's canonical one, byte for byte, whichever encoder
writes a record: orjson where its output is identical, json everywhere else (floats
below 1e-4, null, NaN refusal, integers over 64 bits, subclasses, non-str keys)."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import random
import struct

import pytest

from harness.logs import writer
from harness.logs.writer import EventLog, dumps, encode, encoded_chunks, header_record

CANONICAL = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def _floats(n: int):
    rng = random.Random(16)
    edge = [
        0.0,
        -0.0,
        1e-4,
        9.999e-5,
        1e-5,
        1.5e-7,
        5e-324,
        2.2250738585072014e-308,
        1e15,
        9999999999999998.0,
        1e16,
        1.2e30,
        1.7976931348623157e308,
        0.1,
        1 / 3,
        12345678.9,
        100.0,
    ]
    out = edge + [-x for x in edge]
    while len(out) < n:
        x = (
            struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
            if rng.random() < 0.5
            else rng.random() * 10.0 ** rng.randint(-30, 30)
        )
        if math.isfinite(x):
            out.append(x)
    return out


def test_floats_of_every_magnitude_encode_as_json_writes_them():
    records = []
    for x in _floats(20_000):  # the edge cases above and ~20,000 random magnitudes and bit patterns
        rec = {"seq": 1, "t": x, "kind": "progress", "v": [x, {"x": x}]}
        assert encode(rec) == CANONICAL(rec).encode(), x
        records.append(rec)
    # a whole file's chunks, searched for json-only lines chunk by chunk, hold the same lines
    assert b"".join(encoded_chunks(records, 4096)) == "".join(CANONICAL(r) + "\n" for r in records).encode()


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        2**63 - 1,
        -(2**63),
        2**64 - 1,
        2**70,
        -(2**90),
        'é ü \u2028 \x00 \x1f \x7f " \\ 😀',
        "",
        [1, (2, 3)],
        {"a": {"b": []}},
        {1: "int key"},
        {"x": None, "y": 1e-5},
    ],
)
def test_values_encode_as_json_writes_them(value):
    rec = {"seq": 3, "t": 0.5, "kind": "progress", "value": value}
    assert encode(rec) == CANONICAL(rec).encode()
    assert dumps(rec) == CANONICAL(rec)
    plain = {"seq": 4, "t": 1.0, "kind": "progress", "value": 1}
    chunk = [plain, rec, plain, rec]
    assert b"".join(encoded_chunks(chunk, 3)) == "".join(CANONICAL(r) + "\n" for r in chunk).encode()


class Colour(enum.IntEnum):
    RED = 1


class Name(str):
    pass


def test_subclasses_encode_as_json_writes_them():
    rec = {"seq": 3, "t": 0.5, "kind": "progress", "c": Colour.RED, "n": Name("x"), Name("k"): 2}
    assert encode(rec) == CANONICAL(rec).encode()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), [1.0, float("nan")]])
def test_nan_and_infinity_are_refused(bad):
    with pytest.raises(ValueError):
        encode({"seq": 1, "t": 0.0, "kind": "progress", "x": bad})
    # in a file: among lines with a null of their own (json's too) and one with "null" in a string
    records = [{"seq": i, "t": 0.0, "kind": "progress", "x": None, "s": "null"} for i in range(5)]
    records.insert(3, {"seq": 9, "t": 0.0, "kind": "progress", "y": None, "z": {"deep": [bad]}})
    with pytest.raises(ValueError):
        b"".join(encoded_chunks(records, 4))
    records[3] = {"seq": 9, "t": 0.0, "kind": "progress", "y": None, "w": bad}  # a field of the record itself
    with pytest.raises(ValueError):
        b"".join(encoded_chunks(records, 4))
    del records[3]
    assert b"".join(encoded_chunks(records, 4)) == "".join(CANONICAL(r) + "\n" for r in records).encode()


def test_objects_json_cannot_encode_are_refused():
    @dataclasses.dataclass
    class Point:
        x: int

    with pytest.raises(TypeError):
        encode({"seq": 1, "t": 0.0, "kind": "progress", "p": Point(1)})


def test_a_plain_record_takes_the_fast_path(monkeypatch):
    """With orjson installed (a runtime dependency), an ordinary record never reaches json."""
    pytest.importorskip("orjson")

    def refuse(_rec):
        raise AssertionError("json encoder used")

    monkeypatch.setattr(writer, "_json_encode", refuse)
    rec = {"seq": 7, "t": 12.345, "kind": "request_done", "pipeline_id": "p0", "dp_rank": 3, "tokens": [1, 2]}
    assert encode(rec) == b'{"seq":7,"t":12.345,"kind":"request_done","pipeline_id":"p0","dp_rank":3,"tokens":[1,2]}'


def test_a_written_log_is_its_lines_each_with_a_newline(tmp_path):
    log = EventLog(header_record({"nodes": 1, "gpus_per_node": 2}))
    for i in range(20_000):  # more than two chunks
        log.emit("progress", i * 1e-6, value=None if i % 7 == 0 else i, name="ü")
    path = tmp_path / "events.jsonl"
    log.write(str(path))
    want = "".join(CANONICAL(r) + "\n" for r in log.records).encode()
    assert path.read_bytes() == want
    assert b"".join(encoded_chunks(log.records, 333)) == want
    assert list(log.lines()) == [CANONICAL(r) for r in log.records]


def test_a_chunk_encoded_in_one_call_splits_into_its_records_even_when_one_holds_the_separator():
    """A chunk is one orjson call with a NUL string between its records, split where that
    string's encoding falls; a record holding it itself (a NUL between two values of a
    list) makes one split too many, and the chunk's records are then encoded one by one:
    either way each line is the record's own encoding."""
    pytest.importorskip("orjson")
    plain = [{"seq": i, "t": i * 0.5, "kind": "progress", "name": "\x00"} for i in range(5)]
    holding = dict(plain[2], tags=[{"a": 1}, "\x00", {"b": 2}], more=[1, "\x00", 2])
    for records in (plain, plain[:2] + [holding] + plain[3:], [holding], []):
        assert writer._orjson_lines(records) == [writer._orjson_dumps(r) for r in records]
        want = "".join(CANONICAL(r) + "\n" for r in records).encode()
        assert b"".join(encoded_chunks(records, 8192)) == want


def _marked_by_scan(lines):
    """What ``writer._marked_lines`` finds, line by line with ``in`` (the reference)."""
    redo = {i for i, line in enumerate(lines) if b"e-" in line or b"0.0000" in line}
    return redo, {i for i, line in enumerate(lines) if b"null" in line}


@pytest.mark.parametrize(
    "lines",
    [
        [b""],
        [b"null", b""],  # a marker at the very start of the chunk
        [b"e", b"-", b"null", b"0.000", b"0", b"nul", b"l", b""],  # markers cut by a newline are none
        [b"x", b"ab e-", b"nullnull 0.00000 e-e-", b'{"a":null,"b":1e-7}', b"", b"0.0000", b""],
        [b"e-"],  # the very last bytes (no newline after them)
        [b"n", b""],  # shorter than the longest marker
    ],
)
def test_marked_lines_are_the_lines_holding_a_marker(lines):
    assert writer._marked_lines(b"\n".join(lines), lines) == _marked_by_scan(lines)


def test_marked_lines_of_random_chunks():
    rng = random.Random(6)
    pieces = [b"e", b"-", b"0", b".", b"n", b"u", b"l", b"x", b"null", b"e-", b"0.0000", b'"', b"1"]
    for _ in range(300):
        lines = [b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))) for _ in range(rng.randint(1, 20))]
        data = b"\n".join(lines)
        assert writer._marked_lines(data, lines) == _marked_by_scan(lines)
        assert writer.holds_json_only_float(data) == (b"e-" in data or b"0.0000" in data)
