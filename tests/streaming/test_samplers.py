"""Samplers, the rollout buffer and the capacity check (harness/streaming)."""

from __future__ import annotations

import sys
import types

import pytest

from harness.streaming.buffer import BufferError, RolloutBuffer
from harness.streaming.controller import CapacityDeadlock, ControllerState, StreamingConfig, check_capacity
from harness.streaming.samplers import SamplerError, make_sampler


def filled(entries):
    """A buffer with (start_version, target_step, ready) groups reserved in order;
    ready ones committed in the order given by their position in ``commit_order``."""
    buf = RolloutBuffer(64)
    ids = [buf.reserve(i, v, t) for i, (v, t, _) in enumerate(entries)]
    return buf, ids


def test_buffer_reserve_commit_remove_and_capacity():
    buf = RolloutBuffer(2)
    a, b = buf.reserve(0, 0), buf.reserve(1, 0)
    assert (a, b) == (0, 1) and buf.used == 2 and buf.free == 0
    assert buf.reserve(2, 0) is None  # full: reserved groups count
    buf.commit(b, 0)
    assert buf.reserve(2, 0) is None  # committed groups count too
    with pytest.raises(BufferError, match="committed twice"):
        buf.commit(b, 0)
    assert buf.remove_group(a) and not buf.remove_group(a)  # idempotent
    with pytest.raises(BufferError, match="not reserved"):
        buf.commit(a, 0)
    c = buf.reserve(2, 1)
    assert c == 2  # a fresh id per attempt, never reused
    assert [e.group_id for e in buf.inflight()] == [c] and [e.group_id for e in buf.ready()] == [b]


def test_select_reads_reservation_order_not_arrival_order():
    """NeMo RL's buffer lists slots by reservation: a capped select trains the groups
    dispatched first, whichever finished first."""
    for name in ("in_order", "windowed", "ready_first", "weight_fifo"):
        s = make_sampler(name, 1)
        buf = RolloutBuffer(8)
        ids = [buf.reserve(i, 0, 0) for i in range(4)]
        for gid in (ids[2], ids[0], ids[3], ids[1]):  # long tail: arrival differs from dispatch
            buf.commit(gid, 0)
        got = [e.group_id for e in s.select(buf, 0, 1, 4)]
        assert got == ids, name
        assert [e.group_id for e in s.select(buf, 0, 1, 2)] == ids[:2], name  # max honoured, first dispatched
        assert s.select(buf, 0, 5, 8) == [], name  # fewer than min: wait


def test_in_order_gate_stamps_and_filters_on_target_step():
    s = make_sampler("in_order", 1)
    assert [s.admit(0).target_step, s.admit(0).target_step] == [0, 1]
    assert s.admit(0) is None  # window + 1 batches ahead of trainer 0
    assert s.admit(1).target_step == 2
    buf = RolloutBuffer(8)
    g0, g1 = buf.reserve(0, 0, 0), buf.reserve(1, 0, 1)
    buf.commit(g1, 0)
    buf.commit(g0, 0)
    assert [e.group_id for e in s.select(buf, 1, 1, 4)] == [g1]
    assert [e.group_id for e in s.evict(buf, 1)] == [g0]  # target 0 < trainer 1
    late = buf.reserve(2, 0, 0)
    # gated: a rollout whose step has passed is not aborted; once committed, evict drops it
    assert not s.should_abort_inflight(buf.get(late), 1)
    buf.commit(late, 1)
    assert [e.group_id for e in s.evict(buf, 1)] == [g0, late]


def test_weight_fifo_takes_only_the_oldest_in_window_version_and_waits_for_it():
    s = make_sampler("weight_fifo", 1)
    assert s.admit(0).target_step is None  # gated, no stamp
    buf = RolloutBuffer(8)
    old_a, old_b, new = buf.reserve(0, 1, None), buf.reserve(1, 1, None), buf.reserve(2, 2, None)
    buf.commit(new, 2)
    buf.commit(old_a, 2)
    assert [e.group_id for e in s.select(buf, 2, 2, 4)] == []  # version 1 still filling (old_b in flight)
    assert [e.group_id for e in s.select(buf, 2, 1, 4)] == [old_a]  # never the newer version first
    stale = buf.reserve(3, 0, None)
    buf.commit(stale, 2)
    assert [e.group_id for e in s.evict(buf, 2)] == [stale]  # 0 < 2 - 1
    assert old_b is not None


def test_windowed_is_ungated_filters_by_window_and_can_go_freshest_first():
    s = make_sampler("windowed", 1)
    assert all(s.admit(0) is not None for _ in range(10))  # capacity bounds it, not the gate
    assert s.required_buffer_capacity(8) == 1
    buf = RolloutBuffer(8)
    g = {v: buf.reserve(v, v, None) for v in (3, 5, 4)}
    for v in (3, 5, 4):
        buf.commit(g[v], 5)
    assert [e.start_version for e in s.select(buf, 5, 1, 8)] == [5, 4]  # 3 is outside [4, 5]
    fresh = make_sampler("windowed", 2, freshest_first=True)
    assert [e.start_version for e in fresh.select(buf, 5, 1, 8)] == [5, 4, 3]
    assert [e.start_version for e in s.evict(buf, 5)] == [3]
    inflight = buf.get(buf.reserve(9, 2, None))
    assert s.should_abort_inflight(inflight, 5)


def test_strict_on_policy_filter_window_zero():
    s = make_sampler("windowed", 0)
    buf = RolloutBuffer(8)
    on, off = buf.reserve(0, 3, None), buf.reserve(1, 2, None)
    buf.commit(off, 3)
    buf.commit(on, 3)
    picked = s.select(buf, 3, 1, 8)
    assert [e.group_id for e in picked] == [on]
    assert s.is_on_policy(buf.get(on), 3) and not s.is_on_policy(buf.get(off), 3)
    assert [e.group_id for e in s.evict(buf, 3)] == [off]


def test_ready_first_takes_anything_not_from_the_future_and_never_evicts():
    s = make_sampler("ready_first", 1)
    buf = RolloutBuffer(8)
    g = [buf.reserve(i, v, None) for i, v in enumerate((0, 7, 2))]
    for gid in g:
        buf.commit(gid, 2)
    assert [e.start_version for e in s.select(buf, 2, 1, 8)] == [0, 2]
    assert s.evict(buf, 100) == [] and not s.should_abort_inflight(buf.get(g[0]), 100)


def test_set_dispatch_index_resumes_the_gate():
    s = make_sampler("in_order", 0)
    s.set_dispatch_index(5)
    assert s.admit(4) is None and s.admit(5).target_step == 5


def test_custom_sampler_is_loaded_from_module_colon_class(monkeypatch):
    mod = types.ModuleType("rlh_custom_sampler")

    class Mine(type(make_sampler("windowed"))):
        name = "mine"

    class Broken:
        def __init__(self, window):
            self.window, self.gated = window, True

    mod.Mine, mod.Broken = Mine, Broken
    monkeypatch.setitem(sys.modules, "rlh_custom_sampler", mod)
    s = make_sampler("custom", 2, target="rlh_custom_sampler:Mine")
    assert isinstance(s, Mine) and s.window == 2
    with pytest.raises(SamplerError, match="lacks admit, select"):
        make_sampler("custom", 1, target="rlh_custom_sampler:Broken")
    with pytest.raises(SamplerError, match="must be 'module:Class'"):
        make_sampler("custom", 1, target="nocolon")
    with pytest.raises(SamplerError, match="cannot be loaded"):
        make_sampler("custom", 1, target="rlh_custom_sampler:Nope")
    with pytest.raises(SamplerError, match="unknown sampler 'fifo'"):
        make_sampler("fifo")


@pytest.mark.parametrize("name", ["in_order", "weight_fifo", "ready_first"])
def test_gated_capacity_below_groups_times_window_plus_one_is_rejected_with_the_reason(name):
    s = make_sampler(name, 2)
    check_capacity(s, 4, 12)  # exactly 4 x (2 + 1)
    with pytest.raises(CapacityDeadlock, match=r"max_buffered_rollouts 11 is below the 12 groups .*deadlock"):
        check_capacity(s, 4, 11)
    with pytest.raises(CapacityDeadlock):
        ControllerState(StreamingConfig(groups_per_step=4, sampler=name, window=2, max_buffered_rollouts=11))
    check_capacity(make_sampler("windowed", 2), 4, 1)  # ungated: capacity only throttles
