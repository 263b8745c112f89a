"""Reading JSONL input safely: bounded lines, bounded nesting and numbers, no duplicate keys.

Python's ``json`` would take a line of ``/dev/zero`` until memory runs out, recurse
until the stack overflows on ``[[[[...`` 100 000 deep, raise a bare ``ValueError`` on a
5 000-digit integer and keep the last of two equal keys silently. Here each of those is
an :class:`~harness.logs.records.InputError` naming the file and line, with the
limit from :mod:`harness.limits` in the message.
"""

from __future__ import annotations

import json
import re
from typing import IO, Any, Dict, Iterator, List, Tuple

from harness.limits import MAX_INT_DIGITS, MAX_LINE_BYTES, MAX_NESTING, fmt_limit


class JsonLineError(ValueError):
    """A problem with one line; ``str`` is the problem without the ``file:line`` prefix."""


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")
_LONG_INT = re.compile(r"(?<![\w.\"])-?\d{%d,}" % (MAX_INT_DIGITS + 1))


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def _depth(text: str) -> int:
    """Deepest nesting of ``text``'s objects/arrays (strings skipped)."""
    depth = deepest = 0
    for ch in _BRACKETS.findall(_STRING.sub("", text)):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def loads(text: str) -> Any:
    """Decode one JSON document within the limits; problems raise :class:`JsonLineError`."""
    # A document cannot nest deeper than it has brackets: the exact (slower) scan runs
    # only on the rare line with many of them.
    if text.count("[") + text.count("{") > MAX_NESTING and _depth(text) > MAX_NESTING:
        raise JsonLineError(f"nested deeper than {MAX_NESTING} levels (the limit)")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as e:
        raise JsonLineError(f"duplicate key {e.args[0]!r} in one object") from None
    except json.JSONDecodeError as e:
        raise JsonLineError(f"malformed JSON: {e.msg} (column {e.colno})") from None
    except (ValueError, RecursionError):
        pass  # a number too long for int() (Python refuses > 4300 digits), caught below
    raise JsonLineError(_number_problem(text))


def _number_problem(text: str) -> str:
    m = _LONG_INT.search(_STRING.sub('""', text))
    digits = len(m.group(0).lstrip("-")) if m else "too many"
    return f"a number with {digits} digits; integers are limited to {MAX_INT_DIGITS} digits (64 bits)"


def numbered_lines(fh: IO[bytes], path: str) -> Iterator[Tuple[int, str]]:
    """``(line number, text)`` of a binary file, each line decoded as UTF-8 on its own so
    an error names its line; a line longer than the limit is an error, not a memory sink."""
    lineno = 0
    while True:
        raw = fh.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        lineno += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise JsonLineError(f"{path}:{lineno}: line longer than {fmt_limit(MAX_LINE_BYTES)} bytes (the limit)")
        try:
            yield lineno, raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise JsonLineError(f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start} of the line)") from None
