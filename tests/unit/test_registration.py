"""Registration rules (docs/modelled-systems.md#rlix-registration), partial-overlap rules (docs/modelled-systems.md#rlix-partial-overlap-shrink-expand-and-routing, F10), cluster-name constants.

Rules are checked both on ``build_pipeline_entry`` (the ``TopologyError.rule`` tag) and
through ``SchedulerModel.register`` (a :class:`Rejected` whose message names the
pipeline, the cluster and the rule).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# harness.scheduler must be imported before harness.scheduler.topology (see the circular-import test).
from harness.scheduler.model import SchedulerModel
from harness.scheduler.types import (
    ACTOR_TRAIN,
    ALL_CLUSTER_NAMES,
    CRITIC,
    GENERATION_CLUSTER,
    GPU_CLUSTER_NAMES,
    REFERENCE,
    REWARD,
    Priority,
    Rejected,
    build_dp_rank_mapping,
    cluster_id_of,
    is_generation_cluster,
    parse_cluster_id,
)
from harness.scheduler.topology import (
    ClusterTopology,
    TopologyError,
    build_pipeline_entry,
    validate_partial_overlap,
)

TOPO = ClusterTopology(2, 4)  # 8 GPUs, node = gpu // 4


def build(tp, mapping, topo=TOPO, pid="ft_abc"):
    return build_pipeline_entry(pid, f"ns_{pid}", tp, mapping, topo)


# (id, tp_configs, device_mappings, topology, rule, cluster named in the message)
REJECTS = [
    ("key_sets_missing_mapping", {"actor_infer": 1, "critic": 1}, {"actor_infer": [0]}, TOPO, "key_sets", "critic"),
    ("key_sets_missing_tp", {"actor_infer": 1}, {"actor_infer": [0], "reference": [1]}, TOPO, "key_sets", "reference"),
    ("actor_infer_required", {"actor_train": 1}, {"actor_train": [0]}, TOPO, "actor_infer_required", "actor_infer"),
    (
        "unknown_cluster_name",
        {"actor_infer": 1, "critic2": 1},
        {"actor_infer": [0], "critic2": [1]},
        TOPO,
        "cluster_name",
        "critic2",
    ),
    ("tp_zero", {"actor_infer": 0}, {"actor_infer": [0]}, TOPO, "tp_size", "actor_infer"),
    ("tp_negative", {"actor_infer": -2}, {"actor_infer": [0, 1]}, TOPO, "tp_size", "actor_infer"),
    ("tp_float", {"actor_infer": 2.0}, {"actor_infer": [0, 1]}, TOPO, "tp_size", "actor_infer"),
    ("tp_str", {"actor_infer": "2"}, {"actor_infer": [0, 1]}, TOPO, "tp_size", "actor_infer"),
    ("tp_bool", {"actor_infer": True}, {"actor_infer": [0]}, TOPO, "tp_size", "actor_infer"),
    ("tp_none", {"actor_infer": None}, {"actor_infer": [0]}, TOPO, "tp_size", "actor_infer"),
    (
        "empty_mapping",
        {"actor_infer": 1, "actor_train": 1},
        {"actor_infer": [0], "actor_train": []},
        TOPO,
        "device_mapping",
        "actor_train",
    ),
    ("mapping_not_ints", {"actor_infer": 1}, {"actor_infer": [0, "1"]}, TOPO, "device_mapping", "actor_infer"),
    (
        "reward_with_gpus",
        {"actor_infer": 1, "reward": 1},
        {"actor_infer": [0], "reward": [3]},
        TOPO,
        "reward_cpu_only",
        "reward",
    ),
    ("duplicate_gpu", {"actor_infer": 1}, {"actor_infer": [0, 1, 1]}, TOPO, "duplicate_gpu", "actor_infer"),
    ("gpu_id_too_large", {"actor_infer": 1}, {"actor_infer": [0, 8]}, TOPO, "gpu_range", "actor_infer"),
    ("gpu_id_negative", {"actor_infer": 1}, {"actor_infer": [-1, 0]}, TOPO, "gpu_range", "actor_infer"),
    ("len_not_multiple_of_tp", {"actor_infer": 2}, {"actor_infer": [0, 1, 2]}, TOPO, "tp_divides", "actor_infer"),
    ("tp_group_not_contiguous", {"actor_infer": 2}, {"actor_infer": [0, 2]}, TOPO, "tp_contiguous", "actor_infer"),
    (
        "tp4_group_not_contiguous",
        {"actor_infer": 4},
        {"actor_infer": [0, 1, 2, 4]},
        TOPO,
        "tp_contiguous",
        "actor_infer",
    ),
    ("tp2_group_crosses_node", {"actor_infer": 2}, {"actor_infer": [3, 4]}, TOPO, "tp_node", "actor_infer"),
    ("tp4_group_crosses_node", {"actor_infer": 4}, {"actor_infer": [2, 3, 4, 5]}, TOPO, "tp_node", "actor_infer"),
    ("tp3_not_allowed", {"actor_infer": 3}, {"actor_infer": [0, 1, 2]}, TOPO, "tp_size", "actor_infer"),
    ("tp6_not_allowed", {"actor_infer": 6}, {"actor_infer": [0, 1, 2, 3, 4, 5]}, TOPO, "tp_size", "actor_infer"),
    (
        "tp8_over_nodes_not_aligned",
        {"actor_infer": 8},
        {"actor_infer": list(range(2, 10))},
        ClusterTopology(3, 4),
        "tp_node",
        "actor_infer",
    ),
    (
        "tp6_multiple_of_gpn_not_aligned",
        {"actor_infer": 6},
        {"actor_infer": list(range(1, 7))},
        ClusterTopology(3, 3),
        "tp_node",
        "actor_infer",
    ),
]


@pytest.mark.parametrize("tp,mapping,topo,rule,cluster", [r[1:] for r in REJECTS], ids=[r[0] for r in REJECTS])
def test_registration_rule_rejects(tp, mapping, topo, rule, cluster):
    with pytest.raises(TopologyError) as info:
        build(tp, mapping, topo)
    err = info.value
    assert err.rule == rule
    msg = str(err)
    assert "pipeline ft_abc" in msg
    assert f"(rule: {rule})" in msg
    assert cluster in msg


@pytest.mark.parametrize("tp,mapping,topo,rule,cluster", [r[1:] for r in REJECTS], ids=[r[0] for r in REJECTS])
def test_model_register_rejects_with_readable_message(tp, mapping, topo, rule, cluster):
    m = SchedulerModel(topo)
    with pytest.raises(Rejected) as info:
        m.register("ft_abc", tp, mapping)
    assert "pipeline ft_abc" in info.value.reason
    assert f"rule: {rule}" in info.value.reason
    assert cluster in info.value.reason
    assert m.state.registry == {}  # nothing half-registered


def test_per_cluster_errors_name_the_cluster_field():
    with pytest.raises(TopologyError) as info:
        build({"actor_infer": 1, "critic": 2}, {"actor_infer": [0], "critic": [0, 2]})
    assert info.value.cluster == "critic"
    assert str(info.value).startswith("pipeline ft_abc, cluster critic:")


@pytest.mark.parametrize("pid", ["ft:abc", "a:b:c", "", "ft abc", "ft/abc"])
def test_pipeline_id_rules(pid):
    with pytest.raises(TopologyError) as info:
        build({"actor_infer": 1}, {"actor_infer": [0]}, pid=pid)
    assert info.value.rule == "pipeline_id"
    m = SchedulerModel(TOPO)
    with pytest.raises(Rejected) as info2:
        m.register(pid, {"actor_infer": 1}, {"actor_infer": [0]})
    assert "rule: pipeline_id" in info2.value.reason


def test_pipeline_id_with_colon_message_names_pipeline():
    with pytest.raises(TopologyError) as info:
        build({"actor_infer": 1}, {"actor_infer": [0]}, pid="ft:abc")
    assert "pipeline ft:abc" in str(info.value) and "':'" in str(info.value)


# --------------------------------------------------------------------------- accepted shapes


@pytest.mark.parametrize(
    "tp,mapping,topo",
    [
        ({"actor_infer": 1}, {"actor_infer": [7, 0, 3]}, TOPO),  # tp=1 is free: any GPUs, any nodes
        ({"actor_infer": 2}, {"actor_infer": [6, 7, 0, 1]}, TOPO),
        ({"actor_infer": 4}, {"actor_infer": [4, 5, 6, 7]}, TOPO),
        ({"actor_infer": 8}, {"actor_infer": list(range(8))}, TOPO),  # multiple of gpn, node-aligned
        ({"actor_infer": 3}, {"actor_infer": [3, 4, 5]}, ClusterTopology(2, 3)),  # 3 = gpn
        ({"actor_infer": 6}, {"actor_infer": list(range(6))}, ClusterTopology(2, 3)),  # 2 whole nodes
        ({"actor_infer": 12}, {"actor_infer": list(range(4, 16))}, ClusterTopology(4, 4)),
        ({"actor_infer": 4}, {"actor_infer": [0, 1, 2, 3]}, ClusterTopology(2, 2)),  # spans 2 whole nodes
    ],
)
def test_valid_tp_shapes_are_accepted(tp, mapping, topo):
    entry = build(tp, mapping, topo)
    assert entry.infer.device_mapping == tuple(sorted(mapping["actor_infer"]))


def test_reward_cpu_only_is_accepted_and_not_a_gpu_cluster():
    entry = build({"actor_infer": 1, "reward": 1}, {"actor_infer": [0], "reward": []})
    assert REWARD not in entry.clusters
    assert set(entry.clusters) == {GENERATION_CLUSTER}


def test_canonicalization_sorts_the_mapping():
    entry = build({"actor_infer": 2, "actor_train": 1}, {"actor_infer": [7, 6, 1, 0], "actor_train": [5, 2]})
    assert entry.infer.device_mapping == (0, 1, 6, 7)
    assert entry.clusters[ACTOR_TRAIN].device_mapping == (2, 5)
    assert entry.clusters[ACTOR_TRAIN].tp_size == 1


def test_model_register_stores_canonical_entry():
    m = SchedulerModel(TOPO)
    m.register("ft_abc", {"actor_infer": 2}, {"actor_infer": [5, 4, 1, 0]})
    entry = m.state.registry["ft_abc"]
    assert entry.infer.device_mapping == (0, 1, 4, 5)
    assert entry.namespace == "pipeline_ft_abc_NS"
    assert entry.admitted is False
    assert m.state.universe() == {0, 1, 4, 5}


@pytest.mark.parametrize(
    "tp,mapping,max_dp",
    [
        (1, list(range(8)), 8),
        (2, list(range(8)), 4),
        (4, list(range(8)), 2),
        (8, list(range(8)), 1),
        (2, [6, 7, 2, 3], 2),
    ],
)
def test_max_dp_workers_is_len_over_tp(tp, mapping, max_dp):
    assert build({"actor_infer": tp}, {"actor_infer": mapping}).infer.max_dp_workers == max_dp


@pytest.mark.parametrize("tp,mapping", [(1, [5, 0, 3]), (2, [7, 6, 0, 1, 3, 2]), (4, [4, 5, 6, 7, 0, 1, 2, 3])])
def test_dp_rank_is_positional_slice_of_sorted_mapping(tp, mapping):
    cfg = build({"actor_infer": tp}, {"actor_infer": mapping}).infer
    ordered = sorted(mapping)
    for r in range(cfg.max_dp_workers):
        assert cfg.bundle(r) == ordered[r * tp : (r + 1) * tp]
    assert build_dp_rank_mapping(mapping, tp) == {r: cfg.bundle(r) for r in range(cfg.max_dp_workers)}


def test_dp_rank_bundles_example():
    cfg = build({"actor_infer": 2}, {"actor_infer": [6, 7, 0, 1]}).infer
    assert cfg.bundle(0) == [0, 1] and cfg.bundle(1) == [6, 7]


# --------------------------------------------------------------------------- fixed deviations (were bugs)


@pytest.mark.parametrize(
    "topo,tp,mapping",
    [
        (ClusterTopology(2, 3), 4, [0, 1, 2, 3]),
        (ClusterTopology(2, 6), 8, list(range(8))),
    ],
)
def test_tp_in_248_larger_than_node_but_not_multiple_is_rejected(topo, tp, mapping):
    with pytest.raises(TopologyError) as info:
        build({"actor_infer": tp}, {"actor_infer": mapping}, topo)
    assert info.value.rule == "tp_node"


def test_harness_topology_importable_on_its_own():
    proc = subprocess.run(
        [sys.executable, "-c", "import harness.scheduler.topology"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr[-500:]


# --------------------------------------------------------------------------- partial overlap


def overlap_entry(infer_tp, infer, train):
    return build({"actor_infer": infer_tp, "actor_train": 1}, {"actor_infer": infer, "actor_train": train})


def test_partial_overlap_valid_topology_passes():
    validate_partial_overlap(overlap_entry(1, [0, 1], [0]))  # the 2-GPU NeMo smoke shape
    validate_partial_overlap(overlap_entry(2, [0, 1, 2, 3], [0, 1]))  # |infer-train| == tp exactly
    validate_partial_overlap(overlap_entry(1, [0, 1, 2, 3], [0, 1]), train_parallel_size=2)


@pytest.mark.parametrize(
    "infer_tp,infer,train,tps,rule,cluster",
    [
        (1, [0, 1, 2, 3], [3, 4], 1, "overlap_subset", ACTOR_TRAIN),
        (2, [0, 1], [0], 1, "overlap_infer_dp", GENERATION_CLUSTER),
        (1, [0], [0], 1, "overlap_infer_dp", GENERATION_CLUSTER),
        (1, list(range(8)), [0, 1, 2], 2, "overlap_train_divides", ACTOR_TRAIN),
        (2, [0, 1, 2, 3], [0, 1, 2], 1, "overlap_survivor", GENERATION_CLUSTER),
        (1, [0, 1], [0, 1], 1, "overlap_survivor", GENERATION_CLUSTER),
    ],
    ids=[
        "train_not_subset",
        "infer_dp_1_tp2",
        "infer_dp_1_tp1",
        "train_len_vs_parallel",
        "no_surviving_rank_tp2",
        "no_surviving_rank_tp1",
    ],
)
def test_partial_overlap_rules(infer_tp, infer, train, tps, rule, cluster):
    with pytest.raises(TopologyError) as info:
        validate_partial_overlap(overlap_entry(infer_tp, infer, train), train_parallel_size=tps)
    assert info.value.rule == rule
    assert info.value.cluster == cluster
    assert f"pipeline ft_abc, cluster {cluster}" in str(info.value)


def test_partial_overlap_needs_actor_train():
    with pytest.raises(TopologyError) as info:
        validate_partial_overlap(build({"actor_infer": 1}, {"actor_infer": [0, 1]}))
    assert info.value.rule == "overlap_train_required"


# --------------------------------------------------------------------------- cluster-name constants


def test_gpu_cluster_names_subset_of_all_names():
    assert set(GPU_CLUSTER_NAMES) < set(ALL_CLUSTER_NAMES)
    assert set(ALL_CLUSTER_NAMES) == {ACTOR_TRAIN, GENERATION_CLUSTER, CRITIC, REFERENCE, REWARD}


def test_reward_is_not_a_gpu_cluster():
    assert REWARD in ALL_CLUSTER_NAMES
    assert REWARD not in GPU_CLUSTER_NAMES
    with pytest.raises(ValueError):
        parse_cluster_id(cluster_id_of("ft_abc", REWARD))


@pytest.mark.parametrize("pid", ["ft_0123456789ab", "lora_a_b_c", "x_actor_train", "p-1_actor_infer", "a"])
@pytest.mark.parametrize("name", GPU_CLUSTER_NAMES)
def test_parse_cluster_id_round_trip(pid, name):
    assert parse_cluster_id(cluster_id_of(pid, name)) == (pid, name)


@pytest.mark.parametrize("bad", ["actor_infer", "_actor_infer", "ft_abc_actor", "ft_abc", "ft_abc_actor_inferx"])
def test_parse_cluster_id_rejects_unknown_suffix_or_empty_pipeline(bad):
    with pytest.raises(ValueError):
        parse_cluster_id(bad)


def test_is_generation_cluster():
    assert is_generation_cluster("lora_a_b_actor_infer")
    assert not is_generation_cluster("ft_abc_actor_train")
    assert not is_generation_cluster("ft_abc_critic")
    assert not is_generation_cluster("ft_abc_actor_inferx")


# --------------------------------------------------------------------------- model admission rules


def _registered_model():
    m = SchedulerModel(TOPO)
    m.register("ft_abc", {"actor_infer": 1, "actor_train": 1}, {"actor_infer": [0, 1], "actor_train": [2]})
    return m


def test_request_before_admit_is_rejected():
    m = _registered_model()
    with pytest.raises(Rejected) as info:
        m.request("ft_abc_actor_train", Priority.INITIALIZATION)
    assert "not admitted" in info.value.reason
    assert not m.state.has_waiters()
    m.admit("ft_abc")
    ticket = m.request("ft_abc_actor_train", Priority.INITIALIZATION)
    assert not ticket.done and m.state.has_waiters()


def test_request_for_unregistered_pipeline_is_rejected():
    m = _registered_model()
    m.admit("ft_abc")
    with pytest.raises(Rejected) as info:
        m.request("ft_other_actor_infer", Priority.GENERATION)
    assert "not registered" in info.value.reason
    assert not m.state.has_waiters()


def test_request_for_unregistered_cluster_of_admitted_pipeline_is_rejected():
    m = _registered_model()
    m.admit("ft_abc")
    with pytest.raises(Rejected) as info:
        m.request("ft_abc_critic", Priority.CRITIC_TRAINING)
    assert "critic" in info.value.reason


def test_admit_unregistered_pipeline_is_rejected():
    m = SchedulerModel(TOPO)
    with pytest.raises(Rejected) as info:
        m.admit("ft_abc")
    assert "registered before admission" in info.value.reason


def test_unknown_cluster_name_rejected_by_model_register():
    m = SchedulerModel(TOPO)
    with pytest.raises(Rejected) as info:
        m.register("ft_abc", {"actor_infer": 1, "policy": 1}, {"actor_infer": [0], "policy": [1]})
    assert "cluster policy" in info.value.reason and "rule: cluster_name" in info.value.reason


def test_a_request_for_a_cluster_the_pipeline_never_registered_is_refused_where_rlix_would_enqueue():
    """RLix has no such check: its refusals (registry, admission, allocation, duplicate) come
    first, and a release-then-request's release sticks before the enqueue is refused."""
    from harness.scheduler.topology import ClusterTopology

    m = SchedulerModel(ClusterTopology(1, 2))
    m.register("ft_a", {"actor_train": 1, "actor_infer": 1}, {"actor_train": [0], "actor_infer": [0, 1]})
    with pytest.raises(Rejected, match="not admitted"):  # RLix's admission check comes first
        m.request("ft_a_critic", Priority.CRITIC_TRAINING)
    m.admit("ft_a")
    with pytest.raises(Rejected, match="cluster critic is not registered for pipeline ft_a"):
        m.request("ft_a_critic", Priority.CRITIC_TRAINING)
    m.request("ft_a_actor_train", Priority.INITIALIZATION)
    m.run_cycle()
    assert "ft_a_actor_train" in m.state.allocations
    with pytest.raises(Rejected, match="cluster critic is not registered"):
        m.release_then_request("ft_a_actor_train", "ft_a_critic", Priority.CRITIC_TRAINING)
    assert "ft_a_actor_train" not in m.state.allocations  # the release stuck, as in RLix
