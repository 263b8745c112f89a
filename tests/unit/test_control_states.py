"""Every legal and every illegal transition of RankLifecycle and VersionBook, and the
watchdog / progress decisions both runtimes tick (harness/control alone: no simpy, no torch)."""

from __future__ import annotations

import itertools

import pytest

from harness.control.rank_state import RankLifecycle, RankState, RankStateError
from harness.control.reporting import clear_progress_due, progress_input, request_input
from harness.control.versions import VersionBook, VersionError
from harness.control.watchdog import REREQUEST, watchdog_alive, watchdog_tick
from harness.scheduler.model import SchedulerModel
from harness.scheduler.progress import CoordinatorProgress
from harness.scheduler.types import Priority
from harness.scheduler.topology import ClusterTopology

S = RankState
EVENTS = ("wake", "woken", "synced", "refreshed", "finalized", "activated", "abort", "slept", "shutdown")

# The documented table (rank_state.py), written out here independently: a change to the
# table in the module — a transition added, dropped or redirected — fails this test.
LEGAL = {
    (S.ASLEEP, "wake"): S.WAKING,
    (S.WAKING, "woken"): S.AWAKE_UNROUTED,
    (S.AWAKE_UNROUTED, "synced"): S.SYNCED,
    (S.AWAKE_UNROUTED, "abort"): S.DRAINING,
    (S.SYNCED, "synced"): S.SYNCED,
    (S.SYNCED, "finalized"): S.SYNCED,
    (S.SYNCED, "activated"): S.ROUTABLE,
    (S.SYNCED, "abort"): S.DRAINING,
    (S.ROUTABLE, "refreshed"): S.ROUTABLE,
    (S.ROUTABLE, "finalized"): S.ROUTABLE,
    (S.ROUTABLE, "abort"): S.DRAINING,
    (S.DRAINING, "slept"): S.ASLEEP,
}
# the pipeline unregistered: its engines exit from wherever they are; stopped is terminal
LEGAL.update({(state, "shutdown"): S.STOPPED for state in RankState if state is not S.STOPPED})


def rank_in(state: RankState, *, finalized: bool = True) -> RankLifecycle:
    life = RankLifecycle("p", 0)
    life.state, life.finalized = state, finalized
    return life


@pytest.mark.parametrize("state,event", sorted(itertools.product(RankState, EVENTS), key=lambda x: (x[0].value, x[1])))
def test_every_rank_transition_is_legal_exactly_when_the_table_says(state, event):
    life = rank_in(state)
    if (state, event) in LEGAL:
        assert life.on(event, version=3, level=2) is LEGAL[(state, event)]
        assert life.state is LEGAL[(state, event)]
        if event == "shutdown":
            assert life.weights_version is None and life.host_version is None and not life.finalized
    else:
        with pytest.raises(RankStateError, match=f"'{event}' is not allowed in state {state.value}"):
            life.on(event, version=3, level=2)
        assert life.state is state  # a refused event changes nothing
    assert len(LEGAL) == 12 + len(RankState) - 1


def test_activation_needs_finalize_after_the_last_sync():
    life = rank_in(S.AWAKE_UNROUTED, finalized=False)
    life.on("synced", version=1)
    with pytest.raises(RankStateError, match="activated before finalize"):
        life.on("activated")
    life.on("finalized")
    life.on("synced", version=2)  # a second sync undoes the finalize
    with pytest.raises(RankStateError, match="activated before finalize"):
        life.on("activated")
    life.on("finalized")
    assert life.on("activated") is S.ROUTABLE and life.weights_version == 2


@pytest.mark.parametrize("level,restored", [(1, 5), (2, None)])
def test_sleep_level_decides_what_a_woken_rank_holds(level, restored):
    life = rank_in(S.ROUTABLE)
    life.weights_version = 5
    for event in ("abort", "slept"):
        life.on(event, level=level)
    assert life.weights_version is None and not life.finalized
    life.on("wake")
    life.on("woken")
    assert life.weights_version == restored and not life.finalized and not life.serving


def test_only_routable_serves():
    assert [s for s in RankState if rank_in(s).serving] == [S.ROUTABLE]


# ---------------------------------------------------------------------------- VersionBook
def test_version_book_legal_sequence_nemo_clamps_the_bootstrap():
    book = VersionBook(clamp_bootstrap=True)
    book.cache_built(-1)
    book.promote(-1)
    assert book.publish(-1) is True and book.published == 0
    assert book.publish(-1) is False  # the other path publishes the same value: no bump
    book.cache_built(1)
    assert book.active == -1  # built is not promoted
    book.promote(1)
    assert book.publish(1) is True and book.published == 1
    assert book.publish(1) is False


def test_version_book_roll_keeps_the_bootstrap():
    book = VersionBook(clamp_bootstrap=False)
    book.cache_built(-1)
    book.promote(-1)
    assert book.publish(-1) is True and book.published == -1
    book.cache_built(0)
    book.promote(0)
    assert book.publish(0) is True and book.published == 0


@pytest.mark.parametrize("built", [[3, 3], [3, 2]])
def test_a_cache_version_must_increase(built):
    book = VersionBook()
    book.cache_built(built[0])
    with pytest.raises(VersionError, match="must increase"):
        book.cache_built(built[1])
    assert book.cache_ready == built[0]


def test_only_the_latest_built_cache_can_be_promoted():
    book = VersionBook()
    with pytest.raises(VersionError, match="latest built cache is None"):
        book.promote(0)
    book.cache_built(0)
    book.cache_built(1)
    with pytest.raises(VersionError, match="latest built cache is 1"):
        book.promote(0)
    book.promote(1)
    assert book.active == 1


def test_only_the_active_version_can_be_published():
    book = VersionBook()
    with pytest.raises(VersionError, match="active cache is None"):
        book.publish(0)
    book.cache_built(0)
    with pytest.raises(VersionError, match="active cache is None"):  # built, not promoted
        book.publish(0)
    book.promote(0)
    book.cache_built(1)
    with pytest.raises(VersionError, match="active cache is 0"):  # N+1 before its promote
        book.publish(1)
    assert book.published is None


def test_a_published_version_never_goes_back():
    book = VersionBook(clamp_bootstrap=False)
    book.cache_built(4)
    book.promote(4)
    book.publish(4)
    book.published = 5  # a runtime that published past the cache (the book must refuse going back)
    with pytest.raises(VersionError, match="go back from 5 to 4"):
        book.publish(4)


# ---------------------------------------------------------------------------- watchdog, progress
def model_with_pipeline() -> SchedulerModel:
    model = SchedulerModel(ClusterTopology(1, 2))
    model.register("p", {"actor_train": 1, "actor_infer": 1}, {"actor_train": [0], "actor_infer": [0, 1]})
    model.admit("p")
    return model


def test_watchdog_rerequests_only_when_granted_before_idle_and_not_pending():
    model = model_with_pipeline()
    cid = "p_actor_infer"
    asleep = [S.ASLEEP, S.ASLEEP]
    assert watchdog_tick(False, False, model.state, cid, asleep) is None  # GENERATION never granted yet
    model.request(cid, Priority.GENERATION, step_target_estimate=1)
    model.commit_cycle(model.plan_cycle())
    assert cid in model.state.allocations
    assert watchdog_tick(False, False, model.state, cid, asleep) == REREQUEST
    assert REREQUEST.priority is Priority.GENERATION and REREQUEST.step_target_estimate == 1
    assert watchdog_tick(True, False, model.state, cid, asleep) is None  # finished
    assert watchdog_tick(False, True, model.state, cid, asleep) is None  # the run stopped
    assert watchdog_tick(False, False, model.state, "q_actor_infer", asleep) is None  # unknown cluster
    for busy in (S.WAKING, S.AWAKE_UNROUTED, S.SYNCED, S.ROUTABLE, S.DRAINING):
        assert watchdog_tick(False, False, model.state, cid, [S.ASLEEP, busy]) is None
    # q's training preempts every GENERATION rank of p: p keeps an empty allocation
    model.register("q", {"actor_train": 2, "actor_infer": 1}, {"actor_train": [0, 1], "actor_infer": [0, 1]})
    model.admit("q")
    model.request("q_actor_train", Priority.ACTOR_TRAINING, global_step=0)
    model.commit_cycle(model.plan_cycle())
    assert not model.state.allocations[cid].active_dp_ranks
    assert watchdog_tick(False, False, model.state, cid, asleep) == REREQUEST
    fields, call = request_input(model, cid, REREQUEST)
    assert fields == {"cluster_id": cid, "priority": "GENERATION", "step_target_estimate": 1}
    assert not call().done  # no GPU is free: the request waits
    assert watchdog_tick(False, False, model.state, cid, asleep) is None  # a request is pending
    assert watchdog_alive(False, False) and not watchdog_alive(True, False) and not watchdog_alive(False, True)


def test_progress_reports_are_throttled_to_bucket_moves_and_cleared_once():
    progress = CoordinatorProgress("p")
    first = progress_input(progress, "p", 100, 0, True)
    assert first is not None and first[0] == {
        "pipeline_id": "p",
        "step_target": 100,
        "completed": 0,
        "mode": "aggregated",
        "new_batch": True,
    }
    assert progress_input(progress, "p", 100, 1, False) is None  # 1 % does not move the 2 % bucket
    moved = progress_input(progress, "p", 100, 2, False)
    assert moved is not None and moved[1].completed == 2
    assert clear_progress_due(progress) is True
    assert clear_progress_due(progress) is False  # nothing left to clear: nothing is sent
