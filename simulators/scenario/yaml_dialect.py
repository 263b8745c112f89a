"""The YAML dialect of scenario files: PyYAML's safe loader, stricter in four ways.

A duplicate key is an error (PyYAML keeps the last one silently, so a scenario with two
``steps:`` would run with whichever came second), ``25e9`` is a float as in YAML 1.2
(PyYAML's 1.1 resolver reads it as a string without a dot), nesting deeper than
:data:`~harness.limits.MAX_NESTING` levels is an error (PyYAML's composer recurses once
per level and would overflow the stack on a value nested 20 000 deep), and an integer
longer than 64 bits is an error (Python refuses to convert one of more than 4 300
digits, with a bare ``ValueError``). Files are read up to
:data:`~harness.limits.MAX_SCENARIO_BYTES` (``/dev/zero`` is a file that never ends).
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Union

import yaml

from harness.limits import MAX_INT, MAX_INT_DIGITS, MAX_NESTING, MAX_SCENARIO_BYTES, fmt_limit


class ScenarioTextError(ValueError):
    """The file cannot be read as scenario text; ``str`` is the problem (no file name)."""


class _Loader(yaml.SafeLoader):
    """Safe loader: no duplicate keys, YAML 1.2 floats, bounded nesting and integers."""

    _depth = 0

    def compose_node(self, parent, index):  # type: ignore[override]
        self._depth += 1
        try:
            if self._depth > MAX_NESTING:
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_NESTING} levels (the limit)", event.start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    digits = sum(ch.isdigit() for ch in str(node.value))
    if digits > MAX_INT_DIGITS + 2:  # (decimal digits; hex/octal/binary forms are shorter or caught below)
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"a number with {digits} digits; integers are limited to {MAX_INT_DIGITS} digits (64 bits)",
            node.start_mark,
        )
    value = loader.construct_yaml_int(node)
    if abs(value) > MAX_INT:
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"integer {value} with {len(str(abs(value)))} digits is outside the 64-bit range (the limit)",
            node.start_mark,
        )
    return value


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> Dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: Dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, "found an unhashable key", key_node.start_mark
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
            )
        seen[key] = True
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def strict_safe_load(text: str) -> Any:
    """Parse YAML text; PyYAML's own errors (with their marks) propagate."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader


def read_scenario_text(path: Union[str, "os.PathLike[str]"]) -> str:
    """The file's text, read up to the size limit and decoded as UTF-8; problems raise
    :class:`ScenarioTextError` (``OSError`` for a file that cannot be opened)."""
    with open(path, "rb") as fh:
        data = fh.read(MAX_SCENARIO_BYTES + 1)
    if len(data) > MAX_SCENARIO_BYTES:
        raise ScenarioTextError(f"larger than {fmt_limit(MAX_SCENARIO_BYTES)} bytes (the limit for a scenario file)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ScenarioTextError(f"not UTF-8 text ({e.reason} at line {line}, byte {e.start})") from None
