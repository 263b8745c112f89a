"""The YAML dialect of scenario files: PyYAML's safe loader, stricter in two ways.

A duplicate key is an error (PyYAML keeps the last one silently, so a scenario with two
``steps:`` would run with whichever came second), and ``25e9`` is a float as in YAML
1.2 (PyYAML's 1.1 resolver reads it as a string without a dot).
"""

from __future__ import annotations

import re
from typing import Any, Dict

import yaml


class _Loader(yaml.SafeLoader):
    """Safe loader that rejects duplicate keys and reads ``25e9`` as a float (YAML 1.2)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


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
