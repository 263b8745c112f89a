"""Codec: jagged strip/re-pad, dtypes (bf16), rectangular passthrough, 1-D promotion,
object fields, and every malformed input rejected naming its field."""

import numpy as np
import pytest
import torch

from gpu_gates.dataplane.codec import FieldSpec, Schema, decode, encode
from harness.dataplane.errors import DataPlaneInputError

SCHEMA = Schema.of(
    FieldSpec("input_ids", "per_token", "int64", pad_value=7),
    FieldSpec("logprobs", "per_token", "bfloat16", pad_value=0),
    FieldSpec("mask", "per_token", "bool"),
    FieldSpec("hidden", "rect", "float32", shape=(2, 3)),
    FieldSpec("advantage", "scalar", "float16"),
    FieldSpec("meta", "object"),
)
LENS = [3, 1, 4]


def padded(dtype, fill=0):
    t = torch.full((3, 6), fill, dtype=dtype)
    for i, n in enumerate(LENS):
        t[i, :n] = torch.arange(1, n + 1).to(dtype)
    return t


def test_per_token_rows_are_stripped_and_repadded_with_the_pad_value_and_dtype():
    ids, lp = padded(torch.int64, fill=-1), padded(torch.bfloat16, fill=5)
    batch = encode(SCHEMA, {"input_ids": ids, "logprobs": lp}, 3, LENS)
    assert [r.shape[0] for r in batch.rows["input_ids"]] == LENS
    assert batch.rows["logprobs"][0].dtype == torch.bfloat16
    assert batch.nbytes == sum(LENS) * 8 + sum(LENS) * 2  # padding is not stored
    out = decode(SCHEMA, batch.rows)
    assert out["input_ids"].shape == (3, 4) and out["input_ids"].dtype == torch.int64
    assert out["input_ids"][1].tolist() == [1, 7, 7, 7]  # re-padded with the field's pad value
    assert out["logprobs"].dtype == torch.bfloat16
    assert torch.equal(out["logprobs"][2], lp[2, :4])
    wide = decode(SCHEMA, batch.rows, pad_to=6)
    assert wide["input_ids"].shape == (3, 6)
    with pytest.raises(DataPlaneInputError, match="pad_to"):
        decode(SCHEMA, batch.rows, pad_to=2)


def test_rectangular_fields_pass_through_and_1d_is_promoted_then_restored():
    hidden = torch.randn(3, 2, 3)
    adv = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float16)
    batch = encode(SCHEMA, {"hidden": hidden, "advantage": adv}, 3, None)
    assert batch.rows["advantage"][0].shape == (1,)  # stored as (N, 1)
    out = decode(SCHEMA, batch.rows)
    assert torch.equal(out["hidden"], hidden)
    assert out["advantage"].shape == (3,) and torch.equal(out["advantage"], adv)


def test_object_fields_become_object_arrays_recorded_as_objects():
    values = [{"group": 1}, "text", [1, 2]]
    batch = encode(SCHEMA, {"meta": values}, 3, None)
    assert batch.object_fields == ["meta"]
    out = decode(SCHEMA, batch.rows)
    assert out["meta"].dtype == object and list(out["meta"]) == values


@pytest.mark.parametrize(
    "fields, lens, match",
    [
        (
            {"input_ids": torch.zeros(3, dtype=torch.int64)},
            LENS,
            "field 'input_ids': 1-D tensor but the schema declares 2-D",
        ),
        ({"input_ids": torch.zeros(2, 6, dtype=torch.int64)}, LENS, "field 'input_ids': 2 rows for 3 samples"),
        ({"input_ids": torch.zeros(3, 3, dtype=torch.int64)}, LENS, "field 'input_ids': row 2 has sequence length 4"),
        (
            {"input_ids": torch.zeros(3, 6, dtype=torch.int32)},
            LENS,
            "field 'input_ids': dtype int32 but the schema declares int64",
        ),
        ({"input_ids": [[1]] * 3}, LENS, "field 'input_ids': expected a tensor, got list"),
        ({"hidden": torch.zeros(3, 3, 2)}, None, r"field 'hidden': row shape \(3, 2\)"),
        (
            {"advantage": torch.zeros(3, 1, dtype=torch.float16)},
            None,
            "field 'advantage': 2-D tensor but the schema declares 1-D",
        ),
        ({"meta": ["a", "b"]}, None, "field 'meta': 2 rows for 3 samples"),
        ({"meta": [object(), 1, 2]}, None, "field 'meta': row 0 is not JSON-serializable"),
        ({"undeclared": torch.zeros(3)}, None, "field 'undeclared': not declared"),
        ({"input_ids": torch.zeros(3, 6, dtype=torch.int64)}, None, "sequence_lengths: required"),
        ({"input_ids": torch.zeros(3, 6, dtype=torch.int64)}, [1, 2], "sequence_lengths: has 2 entries for 3 samples"),
        (
            {"input_ids": torch.zeros(3, 6, dtype=torch.int64)},
            [1, -2, 3],
            "sequence_lengths: must be a list of non-negative ints",
        ),
        ({}, None, "fields: must be a non-empty mapping"),
    ],
)
def test_malformed_input_is_rejected_naming_the_field(fields, lens, match):
    with pytest.raises(DataPlaneInputError, match=match):
        encode(SCHEMA, fields, 3, lens)


@pytest.mark.parametrize(
    "spec, match",
    [
        (dict(name="x", kind="ragged", dtype="int64"), "schema field 'x': kind must be one of"),
        (dict(name="x", kind="rect", dtype="complex"), "schema field 'x': dtype must be one of"),
        (dict(name="x", kind="object", dtype="int64"), "schema field 'x': an object field has no dtype"),
        (
            dict(name="x", kind="scalar", dtype="int64", shape=(2,)),
            "schema field 'x': only rect fields declare a shape",
        ),
    ],
)
def test_bad_schema_is_rejected_naming_the_field(spec, match):
    with pytest.raises(DataPlaneInputError, match=match):
        FieldSpec(**spec)
    with pytest.raises(DataPlaneInputError, match="unknown key"):
        Schema.from_json({"x": {"kind": "rect", "dtype": "int64", "bogus": 1}})


def test_schema_round_trips_through_json():
    assert Schema.from_json(SCHEMA.to_json()) == SCHEMA
    assert isinstance(np.empty(0, dtype=object), np.ndarray)
