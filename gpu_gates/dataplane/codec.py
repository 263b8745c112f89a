"""Field schema and codec: what a sample's fields look like in the store and back.

The store holds one row per (sample, field). Per-token fields are stored *jagged*: the
writer strips each row's right padding (to the sample's sequence length) and the reader
re-pads with the field's pad value, keeping the dtype (bf16 included). Rectangular fields
pass through as rows of their declared trailing shape. Declared 1-D fields (one value per
sample) are promoted to ``(N, 1)`` on write, as Mooncake needs, and restored to ``(N,)``
from the schema on read. Non-tensor fields become object arrays: each row travels as
UTF-8 JSON in a uint8 tensor and the batch metadata records which fields are objects, so
the read side decodes them. Every malformed input is rejected before anything is
written, with the field's name in the message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from harness.dataplane.errors import DataPlaneInputError

KINDS = ("per_token", "rect", "scalar", "object")

DTYPES: Dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class FieldSpec:
    """One declared field. ``kind``: per_token (N, T) jagged by sequence length; rect
    (N, *shape); scalar (N,) stored as (N, 1); object (any JSON value per sample)."""

    name: str
    kind: str
    dtype: Optional[str] = None
    shape: Tuple[int, ...] = ()
    pad_value: float = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise DataPlaneInputError(
                f"schema field {self.name!r}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}"
            )
        if self.kind == "object":
            if self.dtype is not None:
                raise DataPlaneInputError(f"schema field {self.name!r}: an object field has no dtype")
        elif self.dtype not in DTYPES:
            raise DataPlaneInputError(
                f"schema field {self.name!r}: dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}"
            )
        if self.kind != "rect" and self.shape:
            raise DataPlaneInputError(f"schema field {self.name!r}: only rect fields declare a shape")
        if any(not isinstance(d, int) or d <= 0 for d in self.shape):
            raise DataPlaneInputError(f"schema field {self.name!r}: shape must be positive ints, got {self.shape!r}")

    @property
    def torch_dtype(self) -> Optional[torch.dtype]:
        return DTYPES.get(self.dtype) if self.dtype else None

    def to_json(self) -> Dict[str, Any]:
        return {"kind": self.kind, "dtype": self.dtype, "shape": list(self.shape), "pad_value": self.pad_value}


@dataclass(frozen=True)
class Schema:
    fields: Dict[str, FieldSpec] = field(default_factory=dict)

    @classmethod
    def of(cls, *specs: FieldSpec) -> "Schema":
        return cls({s.name: s for s in specs})

    @classmethod
    def from_json(cls, data: Mapping[str, Mapping[str, Any]]) -> "Schema":
        if not isinstance(data, Mapping) or not data:
            raise DataPlaneInputError("schema: must be a non-empty mapping of field name to spec")
        specs = []
        for name, spec in data.items():
            if not isinstance(spec, Mapping):
                raise DataPlaneInputError(f"schema field {name!r}: spec must be a mapping")
            unknown = set(spec) - {"kind", "dtype", "shape", "pad_value"}
            if unknown:
                raise DataPlaneInputError(f"schema field {name!r}: unknown key(s) {sorted(unknown)}")
            specs.append(
                FieldSpec(
                    name, spec.get("kind"), spec.get("dtype"), tuple(spec.get("shape") or ()), spec.get("pad_value", 0)
                )
            )
        return cls.of(*specs)

    def to_json(self) -> Dict[str, Any]:
        return {n: s.to_json() for n, s in self.fields.items()}

    def __getitem__(self, name: str) -> FieldSpec:
        return self.fields[name]

    def __contains__(self, name: object) -> bool:
        return name in self.fields


@dataclass
class EncodedBatch:
    """Rows ready for a store: ``rows[field][i]`` is sample i's stored tensor."""

    rows: Dict[str, List[torch.Tensor]]
    object_fields: List[str]

    @property
    def nbytes(self) -> int:
        return sum(rows_nbytes(r) for r in self.rows.values())


def rows_nbytes(rows: Sequence[torch.Tensor]) -> int:
    return sum(int(t.numel()) * t.element_size() for t in rows)


def check_lengths(sequence_lengths: Any, n: int) -> List[int]:
    if isinstance(sequence_lengths, torch.Tensor):
        if sequence_lengths.ndim != 1 or sequence_lengths.dtype.is_floating_point:
            raise DataPlaneInputError("sequence_lengths: must be a 1-D integer tensor or list of ints")
        sequence_lengths = sequence_lengths.tolist()
    if not isinstance(sequence_lengths, (list, tuple)) or any(
        not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in sequence_lengths
    ):
        raise DataPlaneInputError("sequence_lengths: must be a list of non-negative ints")
    if len(sequence_lengths) != n:
        raise DataPlaneInputError(f"sequence_lengths: has {len(sequence_lengths)} entries for {n} samples")
    return list(sequence_lengths)


def _check_tensor(spec: FieldSpec, value: Any, n: int) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise DataPlaneInputError(f"field {spec.name!r}: expected a tensor, got {type(value).__name__}")
    if value.is_nested:
        raise DataPlaneInputError(f"field {spec.name!r}: pass a padded tensor, not a nested one")
    if value.dtype != spec.torch_dtype:
        raise DataPlaneInputError(
            f"field {spec.name!r}: dtype {DTYPE_NAMES.get(value.dtype, value.dtype)} "
            f"but the schema declares {spec.dtype}"
        )
    want_ndim = {"per_token": 2, "scalar": 1, "rect": 1 + len(spec.shape)}[spec.kind]
    if value.ndim != want_ndim:
        raise DataPlaneInputError(
            f"field {spec.name!r}: {value.ndim}-D tensor but the schema declares "
            f"{want_ndim}-D ({spec.kind}{'' if spec.kind != 'rect' else ' ' + str(tuple(spec.shape))})"
        )
    if value.shape[0] != n:
        raise DataPlaneInputError(f"field {spec.name!r}: {value.shape[0]} rows for {n} samples")
    if spec.kind == "rect" and tuple(value.shape[1:]) != tuple(spec.shape):
        raise DataPlaneInputError(
            f"field {spec.name!r}: row shape {tuple(value.shape[1:])} but the schema declares {tuple(spec.shape)}"
        )
    return value.detach().cpu()


def encode(
    schema: Schema, fields: Mapping[str, Any], n: int, sequence_lengths: Optional[Sequence[int]]
) -> EncodedBatch:
    """Validate every field, then cut rows; raises before producing anything on bad input."""
    if not isinstance(fields, Mapping) or not fields:
        raise DataPlaneInputError("fields: must be a non-empty mapping of field name to values")
    for name in fields:
        if name not in schema:
            raise DataPlaneInputError(
                f"field {name!r}: not declared in the partition's schema (declared: {', '.join(sorted(schema.fields))})"
            )
    lengths: Optional[List[int]] = None
    if any(schema[name].kind == "per_token" for name in fields):
        if sequence_lengths is None:
            per_token = sorted(n_ for n_ in fields if schema[n_].kind == "per_token")
            raise DataPlaneInputError(f"sequence_lengths: required to strip padding of per-token field(s) {per_token}")
        lengths = check_lengths(sequence_lengths, n)
    rows: Dict[str, List[torch.Tensor]] = {}
    objects: List[str] = []
    for name, value in fields.items():
        spec = schema[name]
        if spec.kind == "object":
            rows[name] = _encode_objects(spec, value, n)
            objects.append(name)
            continue
        t = _check_tensor(spec, value, n)
        if spec.kind == "per_token":
            assert lengths is not None
            longest = max(lengths, default=0)
            if longest > t.shape[1]:
                i = lengths.index(longest)
                raise DataPlaneInputError(
                    f"field {name!r}: row {i} has sequence length {longest} but the tensor is only {t.shape[1]} wide"
                )
            rows[name] = [t[i, : lengths[i]].clone() for i in range(n)]
        elif spec.kind == "scalar":
            rows[name] = list(t.reshape(n, 1).clone().unbind(0))
        else:
            rows[name] = list(t.clone().unbind(0))
    return EncodedBatch(rows, objects)


def _encode_objects(spec: FieldSpec, value: Any, n: int) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor) or isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise DataPlaneInputError(
            f"field {spec.name!r}: an object field takes a list or object array, got {type(value).__name__}"
        )
    if len(value) != n:
        raise DataPlaneInputError(f"field {spec.name!r}: {len(value)} rows for {n} samples")
    out = []
    for i, item in enumerate(value):
        try:
            text = json.dumps(item.tolist() if isinstance(item, np.generic) else item, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise DataPlaneInputError(f"field {spec.name!r}: row {i} is not JSON-serializable ({exc})") from None
        out.append(torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8).clone())
    return out


def decode(schema: Schema, rows: Mapping[str, Sequence[torch.Tensor]], pad_to: Optional[int] = None) -> Dict[str, Any]:
    """Rows back to batch values: per-token re-padded, 1-D restored, objects decoded."""
    out: Dict[str, Any] = {}
    for name, field_rows in rows.items():
        spec = schema[name]
        if spec.kind == "object":
            arr = np.empty(len(field_rows), dtype=object)
            for i, r in enumerate(field_rows):
                arr[i] = json.loads(bytes(r.to(torch.uint8).tolist()).decode())
            out[name] = arr
        elif spec.kind == "per_token":
            width = max((int(r.shape[0]) for r in field_rows), default=0)
            if pad_to is not None:
                if pad_to < width:
                    raise DataPlaneInputError(
                        f"pad_to: {pad_to} is shorter than field {name!r}'s longest row ({width})"
                    )
                width = pad_to
            t = torch.full((len(field_rows), width), spec.pad_value, dtype=spec.torch_dtype)
            for i, r in enumerate(field_rows):
                t[i, : r.shape[0]] = r.to(spec.torch_dtype)
            out[name] = t
        else:
            shape = (1,) if spec.kind == "scalar" else tuple(spec.shape)
            t = (
                torch.stack([r.to(spec.torch_dtype).reshape(shape) for r in field_rows])
                if field_rows
                else torch.empty((0, *shape), dtype=spec.torch_dtype)
            )
            out[name] = t.reshape(-1) if spec.kind == "scalar" else t
    return out
