"""Fuzz the two loaders every command reads through: whatever the bytes, a scenario file
loads or raises one :class:`ScenarioError`, an event log reads or raises one
:class:`InputError` — one line each, never another exception (Hypothesis)."""

from __future__ import annotations

import json

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.logs.records import InputError, read_records
from simulators.scenario.loader import ScenarioError, load_scenario

VALID = {
    "name": "fuzz",
    "horizon_s": 600,
    "cluster": {"nodes": 1, "gpus_per_node": 2},
    "costs": {"wake_s": 0.8},
    "scheduler": {"epsilon": 0.0},
    "defaults": {"workload": {"prompts_per_step": 2}},
    "pipelines": [
        {
            "name": "p1",
            "type": "nemo_async",
            "train_gpus": [0],
            "infer_gpus": [0, 1],
            "steps": 1,
            "model": {"params": 1e8},
            "workload": {"decode_tokens_max": 64},
        }
    ],
    "faults": [{"name": "wake_before_offload", "pipeline": "p1", "at_step": 0}],
}

HEADER = {
    "seq": 0,
    "t": 0.0,
    "kind": "header",
    "schema": "rlharness.eventlog",
    "version": 1,
    "cluster": {"nodes": 1, "gpus_per_node": 2},
}
RECORDS = [
    HEADER,
    {
        "seq": 1,
        "t": 0.0,
        "kind": "register",
        "pipeline_id": "p1",
        "cluster_tp_configs": {"actor_train": 1, "actor_infer": 1},
        "cluster_device_mappings": {"actor_train": [0], "actor_infer": [0, 1]},
    },
    {"seq": 2, "t": 0.5, "kind": "admit", "pipeline_id": "p1"},
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _mutate(data, path, value):
    data = json.loads(json.dumps(data))
    if not path:
        return value
    node = data
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return data


def _one_line(e: Exception) -> None:
    text = str(e)
    assert text and "\n" not in text, repr(text)


FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(data=st.data(), value=values)
def test_scenario_loader_on_mutated_scenarios(tmp_path, data, value):
    paths = list(_paths(VALID))
    path = data.draw(st.sampled_from(paths))
    mutated = _mutate(VALID, path, value)
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(mutated, allow_unicode=True))
    try:
        load_scenario(f)
    except ScenarioError as e:
        _one_line(e)


@FUZZ
@given(raw=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_scenario_loader_on_arbitrary_bytes(tmp_path, raw):
    f = tmp_path / "s.yaml"
    f.write_bytes(raw)
    try:
        load_scenario(f)
    except ScenarioError as e:
        _one_line(e)


@FUZZ
@given(data=st.data(), value=values, raw_line=st.binary(max_size=80))
def test_trace_reader_on_mutated_logs(tmp_path, data, value, raw_line):
    records = json.loads(json.dumps(RECORDS))
    i = data.draw(st.integers(0, len(records) - 1))
    path = data.draw(st.sampled_from(list(_paths(records[i]))))
    records[i] = _mutate(records[i], path, value)
    lines = [json.dumps(r, allow_nan=True).encode() for r in records]
    if data.draw(st.booleans()):
        lines.insert(data.draw(st.integers(0, len(lines))), raw_line.replace(b"\n", b" "))
    f = tmp_path / "t.jsonl"
    f.write_bytes(b"\n".join(lines) + b"\n")
    try:
        read_records(str(f))
    except InputError as e:
        _one_line(e)
