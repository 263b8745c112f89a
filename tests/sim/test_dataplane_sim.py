"""The data plane in the simulator: bytes per hop, the driver's zero bulk bytes, the
step-time cost of routing bulk through the driver, and bad data_plane sections."""

import dataclasses
import os
from collections import defaultdict

import pytest

from harness.logs.invariants import check_log
from harness.logs.outputs.summary import summarize
from harness.logs.outputs.summary_text import format_summary
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import ScenarioError, load_scenario, scenario_from_mapping
from simulators.scenario.dump import scenario_to_mapping

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
    consumed = sum(
        r["trajectories"] for r in res.records if r["kind"] == "batch_consumed" and r["pipeline_id"] == "ppl1"
    )
    fetched = [
        s for r in res.records if r["kind"] == "dp_transfer" and r["hop"] == "store_to_worker" for s in r["samples"]
    ]
    assert len(fetched) == len(set(fetched)) == consumed  # every consumed sample fetched once, by one leader
    text = format_summary(summarize(res.records))
    assert "Data plane (bytes per hop)" in text
    assert "ppl1: driver bulk bytes 0 (1-hop: the driver moved metadata only)" in text


def test_routing_bulk_through_the_driver_costs_step_time_and_breaks_data_plane():
    one, via = run("dataplane_one_hop"), run("dataplane_via_driver")
    assert {v.invariant for v in check_log(via.records)} - {"handover"} == {"data_plane"}
    assert any("the driver held bulk tensors: store_to_driver" in v.message for v in check_log(via.records))
    a, b = summarize(one.records).pipelines[0], summarize(via.records).pipelines[0]
    # the driver hop costs training time; the mean step also moves with where RLix's round robin
    # put each request, which here outweighs it by 0.08 s, so only train_s is compared
    assert b.train_s > a.train_s + 0.5
    text = format_summary(summarize(via.records))
    assert "driver bulk bytes 0" not in text and "(bulk tensors went through the driver)" in text


@pytest.mark.parametrize(
    "section, message",
    [
        ({"route": "teleport"}, "pipelines[0].data_plane.route: must be one of one_hop, via_driver, got 'teleport'"),
        ({"train_tp": 3}, "pipelines[0].data_plane.train_tp: 3 does not divide the 4 train GPUs"),
        ({"store_bytes_per_s": 0}, "pipelines[0].data_plane.store_bytes_per_s"),
        ({"bogus": 1}, "pipelines[0].data_plane"),
    ],
)
def test_bad_data_plane_section_names_the_field(section, message):
    data = scenario_to_mapping(load_scenario(os.path.join(ROOT, "examples", "scenarios", "dataplane_one_hop.yaml")))
    data["pipelines"][0]["data_plane"] = {**data["pipelines"][0]["data_plane"], **section}
    with pytest.raises(ScenarioError) as info:
        scenario_from_mapping(data, "x.yaml")
    assert message in str(info.value), str(info.value)


# ---------------------------------------------------------------- the single controller's data plane
SC = "dataplane_single_controller"
SC_TOKENS, SC_BPT, SC_WB = 2000, 1558, 4  # fixed decode length (sigma 0 below), bytes per token put / written back


def sc_fixed_length(route="one_hop"):
    """The bundled single-controller scenario with every trajectory exactly SC_TOKENS long,
    so each sample's bytes are known and each hop's bytes can be predicted from its samples."""
    data = scenario_to_mapping(load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{SC}.yaml")))
    data["pipelines"][0]["workload"].update(decode_tokens_sigma=0.0, decode_tokens_median=SC_TOKENS)
    data["pipelines"][0]["data_plane"]["route"] = route
    return Simulation(scenario_from_mapping(data, "x.yaml")).run()


def transfers(records, hop):
    return [r for r in records if r["kind"] == "dp_transfer" and r["hop"] == hop]


def test_single_controller_one_hop_bundled_scenario_is_clean_and_shows_bytes_per_hop():
    res = run(SC)
    assert res.reason == "done" and check_log(res.records) == []
    assert set(hops(res.records)) == {
        "producer_to_store",
        "driver_meta",
        "store_to_worker",
        "leader_to_siblings",
        "worker_to_store",
    }
    text = format_summary(summarize(res.records))
    assert (
        "Data plane (bytes per hop)" in text
        and "sc: driver bulk bytes 0 (1-hop: the driver moved metadata only)" in text
    )


def test_single_controller_bytes_per_hop_are_samples_times_per_sample_bytes():
    recs = sc_fixed_length().records
    assert check_log(recs) == []
    puts = transfers(recs, "producer_to_store")
    assert puts and all(r["bytes"] == len(r["samples"]) * SC_TOKENS * SC_BPT for r in puts)
    assert all(len(r["samples"]) == 8 for r in puts)  # one put_samples per prompt group (8 generations)
    fetch = transfers(recs, "store_to_worker")
    lp = [r for r in fetch if r["fields"] == ["trajectory"]]
    train = [r for r in fetch if r["fields"] == ["trajectory", "prev_logprobs"]]
    assert lp and train and len(lp) + len(train) == len(fetch)
    assert all(r["bytes"] == len(r["samples"]) * SC_TOKENS * SC_BPT for r in lp)
    assert all(r["bytes"] == len(r["samples"]) * SC_TOKENS * (SC_BPT + SC_WB) for r in train)
    # TP 2: each leader broadcasts what it fetched to its one sibling
    assert sum(r["bytes"] for r in transfers(recs, "leader_to_siblings")) == sum(r["bytes"] for r in fetch)
    # every consumed trajectory is fetched once for log-probs and once for training, by one leader
    consumed = sum(r["trajectories"] for r in recs if r["kind"] == "batch_consumed")
    for group in (lp, train):
        ids = [s for r in group for s in r["samples"]]
        assert len(ids) == len(set(ids)) == consumed == 3 * 64
        assert {r["actor"] for r in group} == {"sc/train/dp0/tp0", "sc/train/dp1/tp0"}
    # the driver moved metadata only
    meta = transfers(recs, "driver_meta")
    assert meta and not [
        r for r in recs if r["kind"] == "dp_transfer" and r["role"] == "driver" and r["hop"] != "driver_meta"
    ]
    assert sum(r["bytes"] for r in meta) < 1e-4 * sum(r["bytes"] for r in fetch)


def test_single_controller_write_back_is_leader_only_once_per_sample_and_cleared():
    recs = sc_fixed_length().records
    wb = transfers(recs, "worker_to_store")
    assert wb and {r["actor"] for r in wb} == {"sc/train/dp0/tp0", "sc/train/dp1/tp0"}
    assert all(r["bytes"] == len(r["samples"]) * SC_TOKENS * SC_WB and r["fields"] == ["prev_logprobs"] for r in wb)
    written = [s for r in wb for s in r["samples"]]
    assert len(written) == len(set(written)) == 3 * 64
    cleared = [s for r in recs if r["kind"] == "dp_clear" for s in r["samples"]]
    assert len(cleared) == len(set(cleared)) and set(written) <= set(cleared)
    put = {s for r in transfers(recs, "producer_to_store") for s in r["samples"]}
    assert set(cleared) <= put


def test_single_controller_via_driver_costs_step_time_and_breaks_data_plane():
    one, via = run(SC), run(SC + "_via_driver")
    assert {v.invariant for v in check_log(via.records)} == {"data_plane"}
    assert any("the driver held bulk tensors: store_to_driver" in v.message for v in check_log(via.records))
    a, b = summarize(one.records).pipelines[0], summarize(via.records).pipelines[0]
    assert b.train_s > a.train_s + 1.0 and b.mean_step_s > a.mean_step_s + 0.1
    h = hops(via.records)
    assert "store_to_worker" not in h and h["driver_to_worker"] == 2 * h["store_to_driver"]  # TP 2: every rank
    text = format_summary(summarize(via.records))
    assert "(bulk tensors went through the driver)" in text


def test_single_controller_without_a_data_plane_moves_nothing_through_one():
    recs = run("streaming_vs_batch").records
    assert not [r for r in recs if r["kind"] in ("dp_transfer", "dp_clear")]


def test_bad_data_plane_section_on_a_single_controller_names_the_field():
    data = scenario_to_mapping(load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{SC}.yaml")))
    data["pipelines"][0]["data_plane"]["train_tp"] = 8
    with pytest.raises(
        ScenarioError, match=r"pipelines\[0\]\.data_plane\.train_tp: 8 does not divide the 4 train GPUs"
    ):
        scenario_from_mapping(data, "x.yaml")


def test_data_plane_section_round_trips_and_is_optional():
    s = load_scenario(os.path.join(ROOT, "examples", "scenarios", "dataplane_one_hop.yaml"))
    assert scenario_from_mapping(scenario_to_mapping(s), "x.yaml") == s
    plain = dataclasses.replace(s, pipelines=tuple(dataclasses.replace(p, data_plane=None) for p in s.pipelines))
    assert "data_plane" not in scenario_to_mapping(plain)["pipelines"][0]
