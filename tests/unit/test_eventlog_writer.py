"""Writing logs: a long log is streamed in chunks, byte for byte what one string would
give, and a write that fails midway leaves neither the file nor a temp file behind."""

from __future__ import annotations

import os

import pytest

from harness.logs.writer import write_atomic


def test_streamed_log_is_every_line_once_with_its_newline(tmp_path):
    lines = [f'{{"seq":{i}}}' for i in range(10_000)]  # more than two chunks of 4096
    path = tmp_path / "log.jsonl"
    write_atomic(str(path), iter(lines))
    assert path.read_bytes() == "".join(line + "\n" for line in lines).encode()
    write_atomic(str(path), [])
    assert path.read_bytes() == b""


def test_a_log_whose_lines_fail_midway_leaves_nothing_behind(tmp_path):
    def lines():
        for i in range(9_000):
            yield f'{{"seq":{i}}}'
        raise ValueError("record 9000 cannot be encoded")

    path = tmp_path / "log.jsonl"
    with pytest.raises(ValueError):
        write_atomic(str(path), lines())
    assert os.listdir(tmp_path) == []  # no log, no temp file
