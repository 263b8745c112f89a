"""Comm plan: same-device targets take IPC, every other device the broadcast group."""

import pytest

from harness.refit.comm_plan import BROADCAST, IPC, build_comm_plan


def test_same_device_is_ipc_other_devices_broadcast():
    plan = build_comm_plan((0, 0), {0: [(0, 0)], 1: [(0, 1)], 2: [(1, 0)]})
    assert plan.ipc == {0: [0]}
    assert plan.broadcast == {1: [0], 2: [0]}
    assert plan.needs_group
    assert plan.broadcast_devices == [(0, 1), (1, 0)]
    assert plan.ipc_devices == [(0, 0)]
    assert plan.path_of(0, 0) == IPC and plan.path_of(2, 0) == BROADCAST


def test_same_gpu_index_on_another_node_is_broadcast():
    plan = build_comm_plan((0, 3), {5: [(1, 3)]})
    assert plan.ipc == {} and plan.broadcast == {5: [0]}


def test_tp_bundle_splits_across_paths():
    plan = build_comm_plan((0, 0), {1: [(0, 0), (0, 1)]})
    assert plan.ipc == {1: [0]} and plan.broadcast == {1: [1]}


def test_ipc_only_plan_needs_no_group():
    plan = build_comm_plan((0, 2), {0: [(0, 2)]})
    assert not plan.needs_group and plan.broadcast_devices == []


def test_empty_targets():
    plan = build_comm_plan((0, 0), {})
    assert not plan.needs_group and plan.ipc == {} and plan.broadcast == {}


def test_path_of_unknown_target_raises():
    plan = build_comm_plan((0, 0), {0: [(0, 1)]})
    with pytest.raises(KeyError):
        plan.path_of(3, 0)


@pytest.mark.parametrize(
    "sender, targets, message",
    [
        ((0,), {0: [(0, 1)]}, "sender_device"),
        ((0, 0), {0: [(0, -1)]}, "dp rank 0"),
        ((0, 0), {0: []}, "no devices"),
        ((0, 0), {-1: [(0, 1)]}, "non-negative"),
        ((0, 0), {0: [(0, 1)], 1: [(0, 1)]}, "listed for dp rank 0 and dp rank 1"),
    ],
)
def test_bad_input_is_rejected(sender, targets, message):
    with pytest.raises(ValueError, match=message):
        build_comm_plan(sender, targets)
