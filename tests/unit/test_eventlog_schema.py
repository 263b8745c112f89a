"""The shipped JSON Schema, the kinds table, the docs and the example traces agree."""

from __future__ import annotations

import glob
import json
import os

import jsonschema
import pytest

from harness.eventlog import kinds
from harness.logs.schema import SCHEMA_PATH, render
from harness.logs.records import InputError, check_record

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_shipped_schema_is_generated_from_kinds_table():
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        assert fh.read() == render(), "run: python -m harness.logs.schema --write"


def test_every_input_and_decision_kind_is_documented():
    with open(os.path.join(ROOT, "docs", "trace-format.md"), encoding="utf-8") as fh:
        doc = fh.read()
    for kind in [*kinds.HEADER, *kinds.INPUT_KINDS, *kinds.DECISION_KINDS]:
        assert f"| `{kind}` |" in doc, kind


@pytest.mark.parametrize(
    "path", sorted(glob.glob(os.path.join(ROOT, "examples", "traces", "*.jsonl"))), ids=os.path.basename
)
def test_example_traces_validate_against_json_schema(path):
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        validator = jsonschema.Draft202012Validator(json.load(fh))
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            validator.validate(json.loads(line))


def test_schema_and_reader_agree_on_a_bad_record():
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        validator = jsonschema.Draft202012Validator(json.load(fh))
    bad = {"seq": 1, "t": 0, "kind": "request", "cluster_id": "p_actor_infer", "priority": "GEN", "global_step": "x"}
    assert not validator.is_valid(bad)
    with pytest.raises(InputError, match="field 'global_step'"):
        check_record(bad, "f:2")
