"""The samplers' rules held to NeMo RL's (``staleness_sampler.py`` at NVIDIA-NeMo/RL
7ea279abf; its ``tests/unit/single_controller/test_sampler_interface.py``): which rollouts
a weight sync aborts, the order a capped select reads, the resume cursor; and the
end-to-end effect in the simulator."""

from __future__ import annotations

import pytest

from harness.streaming.buffer import RolloutBuffer
from harness.streaming.controller import ControllerState, StreamingConfig
from harness.streaming.samplers import SamplerError, make_sampler
from simulators.runtime.simulation import Simulation
from tests.streaming.test_single_controller_sim import sc_scenario


@pytest.mark.parametrize("name", ["in_order", "weight_fifo", "ready_first"])
def test_gated_samplers_never_abort_a_rollout_in_flight(name):
    s = make_sampler(name, 1)
    buf = RolloutBuffer(8)
    ancient = buf.get(buf.reserve(0, 0, 0))
    assert not s.should_abort_inflight(ancient, 50)


def test_windowed_aborts_only_what_is_below_its_window():
    s = make_sampler("windowed", 2)
    buf = RolloutBuffer(8)
    at = {v: buf.get(buf.reserve(v, v, None)) for v in (2, 3, 5)}
    assert [v for v, e in at.items() if s.should_abort_inflight(e, 5)] == [2]


def test_a_stale_in_order_rollout_finishes_and_is_evicted_once_committed():
    """The controller's own accounting: the sync aborts nothing; the commit then frees
    the slot through evict."""
    st = ControllerState(StreamingConfig(groups_per_step=1, sampler="in_order", window=1, max_buffered_rollouts=4))
    adm = st.try_admit()
    st.capacity_held += 1
    gid, _ = st.reserve(0, adm.target_step)
    st.trainer_version = 1  # step 0 trained from elsewhere; this group's step has passed
    assert st.stale_inflight() == []
    st.commit(gid)
    assert st.evict() == [gid] and st.capacity_held == 0 and st.buffer.used == 0


def test_windowed_freshest_first_breaks_ties_by_dispatch_order():
    s = make_sampler("windowed", 1, freshest_first=True)
    buf = RolloutBuffer(8)
    ids = [buf.reserve(i, v, None) for i, v in enumerate((4, 5, 4, 5))]
    for gid in reversed(ids):  # finish in reverse dispatch order
        buf.commit(gid, 5)
    assert [e.group_id for e in s.select(buf, 5, 1, 8)] == [ids[1], ids[3], ids[0], ids[2]]


@pytest.mark.parametrize("name", ["in_order", "weight_fifo", "windowed", "ready_first"])
def test_a_negative_resume_step_is_refused(name):
    s = make_sampler(name, 1)
    with pytest.raises(SamplerError, match="resume step must be >= 0"):
        s.set_dispatch_index(-1)
    s.set_dispatch_index(3)  # a resumed run: in_order stamps from the restored step
    if name == "in_order":
        assert s.admit(3).target_step == 3


def test_in_the_simulator_windowed_aborts_at_a_sync():
    """Window 0: a rollout still generating at a sync is stale for windowed (the gated
    samplers' side is the unit tests above: they answer no for any rollout)."""
    hits = []
    for seed in range(3):
        res = Simulation(sc_scenario(steps=4, seed=seed, sampler="windowed", window=0)).run()
        assert res.reason == "done"
        hits += [
            g
            for r in res.records
            if r["kind"] == "effect_end" and r["effect"] == "AbortStaleInflight"
            for g in r.get("result", [])
        ]
    assert hits


def test_a_dropped_prompt_shrinks_only_the_step_it_was_stamped_for():
    st = ControllerState(StreamingConfig(groups_per_step=4, sampler="in_order", max_buffered_rollouts=8))
    st.skip_prompt(None)  # unstamped: owed to no step
    st.skip_prompt(2)
    assert [st.step_target(s) for s in range(4)] == [4, 4, 3, 4]


@pytest.mark.parametrize("name", ["in_order", "weight_fifo", "windowed", "ready_first"])
def test_a_negative_window_is_refused(name):
    with pytest.raises(SamplerError, match="window must be >= 0"):
        make_sampler(name, -1)
