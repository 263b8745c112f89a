"""Generate the JSON Schema of the event log from the kinds table.

``python -m harness.logs.schema --write`` refreshes ``eventlog.schema.json``; the test
suite fails if the shipped file and this generator disagree.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict

from harness.eventlog.kinds import ALL_KINDS, SCHEMA_NAME, SCHEMA_VERSION

SCHEMA_PATH = os.path.join(os.path.dirname(__file__), "eventlog.schema.json")

_JSON_TYPES: Dict[str, Dict[str, Any]] = {
    "int": {"type": "integer"},
    "number": {"type": "number"},
    "str": {"type": "string"},
    "bool": {"type": "boolean"},
    "object": {"type": "object"},
    "list": {"type": "array"},
    "int_list": {"type": "array", "items": {"type": "integer"}},
    "priority": {"oneOf": [{"type": "string"}, {"type": "integer", "minimum": 0, "maximum": 6}]},
    "any": {},
}


def _field_schema(spec: str) -> Dict[str, Any]:
    base = dict(_JSON_TYPES[spec.rstrip("?")])
    if spec.endswith("?") and base:
        return {"anyOf": [base, {"type": "null"}]}
    return base


def build_schema() -> Dict[str, Any]:
    branches = []
    for kind, spec in ALL_KINDS.items():
        props: Dict[str, Any] = {
            "seq": {"type": "integer", "minimum": 0},
            "t": {"type": "number", "minimum": 0},
            "kind": {"const": kind},
        }
        for name, ftype in {**spec["required"], **spec["optional"]}.items():
            props[name] = _field_schema(ftype)
        branches.append(
            {
                "if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
                "then": {
                    "description": spec["doc"],
                    "properties": props,
                    "required": ["seq", "t", "kind", *spec["required"]],
                    "additionalProperties": False,
                },
            }
        )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"{SCHEMA_NAME}/{SCHEMA_VERSION}",
        "title": f"rlharness event log record, version {SCHEMA_VERSION}",
        "description": "One JSON object per line; the first line is the header. See docs/trace-format.md.",
        "type": "object",
        "required": ["seq", "t", "kind"],
        "properties": {"kind": {"enum": sorted(ALL_KINDS)}},
        "allOf": branches,
    }


def render() -> str:
    return json.dumps(build_schema(), indent=2, sort_keys=False) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--write"]:
        with open(SCHEMA_PATH, "w", encoding="utf-8") as fh:
            fh.write(render())
        print(f"wrote {SCHEMA_PATH}")
        return 0
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
