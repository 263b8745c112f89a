"""The data plane in the simulator: bytes per hop, the driver's zero bulk bytes, the
step-time cost of routing bulk through the driver, and bad data_plane sections."""

import dataclasses
import os
from collections import defaultdict

import pytest

from harness.invariants import check_log
from harness.outputs.summary import format_summary, summarize
from simulators.runtime import Simulation
from simulators.scenario import ScenarioError, load_scenario, scenario_from_mapping, scenario_to_mapping

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_RUNS = {}


def run(name):
    if name not in _RUNS:
        _RUNS[name] = Simulation(load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))).run()
    return _RUNS[name]


def hops(records):
    out = defaultdict(int)
    for r in records:
        if r["kind"] == "dp_transfer":
            out[r["hop"]] += r["bytes"]
    return dict(out)


def test_one_hop_moves_bulk_store_to_leaders_and_the_driver_only_metadata():
    res = run("dataplane_one_hop")
    # handover: NeMo's init keeps its multi-GPU trainer's groups (docs/residency.md), not a data-plane matter
    assert res.reason == "done" and [v for v in check_log(res.records) if v.invariant != "handover"] == []
    h = hops(res.records)
    assert set(h) == {"producer_to_store", "driver_meta", "store_to_worker", "leader_to_siblings", "worker_to_store"}
    assert h["leader_to_siblings"] == h["store_to_worker"]  # TP 2: each leader sends its shard to one sibling
    assert h["store_to_worker"] * 4 == h["worker_to_store"] * 1558  # fetched and written back: the same tokens
    consumed = sum(r["trajectories"] for r in res.records if r["kind"] == "batch_consumed" and r["pipeline_id"] == "ppl1")
    fetched = [s for r in res.records if r["kind"] == "dp_transfer" and r["hop"] == "store_to_worker" for s in r["samples"]]
    assert len(fetched) == len(set(fetched)) == consumed  # every consumed sample fetched once, by one leader
    text = format_summary(summarize(res.records))
    assert "Data plane (bytes per hop)" in text
    assert "ppl1: driver bulk bytes 0 (1-hop: the driver moved metadata only)" in text


def test_routing_bulk_through_the_driver_costs_step_time_and_breaks_invariant_16():
    one, via = run("dataplane_one_hop"), run("dataplane_via_driver")
    assert {v.invariant for v in check_log(via.records)} - {"handover"} == {"data_plane"}
    assert any("the driver held bulk tensors: store_to_driver" in v.message for v in check_log(via.records))
    a, b = summarize(one.records).pipelines[0], summarize(via.records).pipelines[0]
    # the driver hop costs training time; the mean step also moves with where RLix's round robin
    # put each request (issue 18), which here outweighs it by 0.08 s, so only train_s is compared
    assert b.train_s > a.train_s + 0.5
    text = format_summary(summarize(via.records))
    assert "driver bulk bytes 0" not in text and "(bulk tensors went through the driver)" in text


@pytest.mark.parametrize("section, message", [
    ({"route": "teleport"}, "pipelines[0].data_plane.route: must be one of one_hop, via_driver, got 'teleport'"),
    ({"train_tp": 3}, "pipelines[0].data_plane.train_tp: 3 does not divide the 4 train GPUs"),
    ({"store_bytes_per_s": 0}, "pipelines[0].data_plane.store_bytes_per_s"),
    ({"bogus": 1}, "pipelines[0].data_plane"),
])
def test_bad_data_plane_section_names_the_field(section, message):
    data = scenario_to_mapping(load_scenario(os.path.join(ROOT, "examples", "scenarios", "dataplane_one_hop.yaml")))
    data["pipelines"][0]["data_plane"] = {**data["pipelines"][0]["data_plane"], **section}
    with pytest.raises(ScenarioError) as info:
        scenario_from_mapping(data, "x.yaml")
    assert message in str(info.value), str(info.value)


def test_data_plane_on_a_single_controller_is_refused_until_it_is_wired():
    data = scenario_to_mapping(load_scenario(os.path.join(ROOT, "examples", "scenarios", "dataplane_one_hop.yaml")))
    data["pipelines"][0].update(type="single_controller", train_gpus=[0, 1, 2, 3], infer_gpus=[4, 5, 6, 7])
    with pytest.raises(ScenarioError, match="pipelines\\[0\\].data_plane: not modelled for single_controller"):
        scenario_from_mapping(data, "x.yaml")


def test_data_plane_section_round_trips_and_is_optional():
    s = load_scenario(os.path.join(ROOT, "examples", "scenarios", "dataplane_one_hop.yaml"))
    assert scenario_from_mapping(scenario_to_mapping(s), "x.yaml") == s
    plain = dataclasses.replace(s, pipelines=tuple(dataclasses.replace(p, data_plane=None) for p in s.pipelines))
    assert "data_plane" not in scenario_to_mapping(plain)["pipelines"][0]
