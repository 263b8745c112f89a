"""The simulated router routes as RLix's NeMo port does (simulators/pipelines/inference.py): a
resize's ranks join routing together, round robin per request with one cursor over the DP
indices, the engine's own queue beyond max_num_seqs, 50 ms polling while no rank is
active — and the ``routing_policy`` check catches a log where a fresh set's queue went to
one rank."""

from __future__ import annotations

import copy
import os
from collections import Counter

from harness.control.rank_state import RankLifecycle, RankState
from harness.logs.invariants import check_log
from simulators.runtime.env import SimEnv
from simulators.pipelines.inference import POLL_S, RankSim, Request, Router
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _router(env, n, max_concurrent=64):
    log, done = [], []
    router = Router(
        env,
        "p",
        0,
        max_concurrent=max_concurrent,
        tokens_per_s=100.0,
        half_point=0.0,
        log=log.append,
        on_done=lambda req, rank: done.append((env.now, req.rid, rank.dp_rank)),
    )
    ranks = {r: RankSim("p", r, (r,), RankLifecycle("p", r)) for r in range(n)}
    for rank in ranks.values():
        rank.life.state = RankState.ROUTABLE  # the router only reads the lifecycle's state and version
    router.ranks = ranks
    return router, ranks, log, done


def _dispatched(log):
    return [(r["request"], r["dp_rank"]) for r in log if r["kind"] == "request_dispatch"]


def test_round_robin_cursor_walks_dp_indices_and_skips_inactive_ranks():
    env = SimEnv()
    router, ranks, log, _ = _router(env, 4)
    router.activate([ranks[1], ranks[3]])
    router.submit([Request(i, tokens=10) for i in range(3)])
    assert [dp for _, dp in _dispatched(log)] == [1, 3, 1]  # NeMo's own unit test


def test_a_set_activated_together_shares_the_waiting_callers():
    env = SimEnv()
    router, ranks, log, _ = _router(env, 4)
    router.submit([Request(i, tokens=10) for i in range(8)])  # nothing active: all poll
    assert _dispatched(log) == []
    router.activate(list(ranks.values()))
    env.run(until=1.0)
    assert Counter(dp for _, dp in _dispatched(log)) == {0: 2, 1: 2, 2: 2, 3: 2}


def test_waiting_callers_are_routed_at_their_next_50ms_poll_tick():
    env = SimEnv()
    router, ranks, log, _ = _router(env, 1)
    router.submit([Request(1, tokens=10)])  # starts polling at t=0

    def later():
        yield env.timeout(0.12)
        router.activate([ranks[0]])

    env.spawn(later(), "pipeline", 0)
    env.run(until=1.0)
    first = next(r for r in log if r["kind"] == "request_dispatch")
    assert abs(first["t"] - 3 * POLL_S) < 1e-9  # ticks at 0.05, 0.10, 0.15: the first after 0.12


def test_beyond_max_num_seqs_requests_wait_in_their_ranks_engine_queue():
    env = SimEnv()
    router, ranks, log, done = _router(env, 2, max_concurrent=1)
    router.activate(list(ranks.values()))
    router.submit([Request(1, tokens=100), Request(2, tokens=100), Request(3, tokens=50)])
    env.run()
    # 1 -> dp0, 2 -> dp1, 3 -> dp0 (round robin, no admission limit in the router), where
    # it waits for request 1 although dp1 frees first: a queued request is never moved
    assert _dispatched(log) == [(1, 0), (2, 1), (3, 0)]
    assert done == [(1.0, 1, 0), (1.0, 2, 1), (1.5, 3, 0)]


def test_a_shrink_aborts_queued_requests_too_and_their_callers_go_round_robin():
    env = SimEnv()
    router, ranks, log, _ = _router(env, 3, max_concurrent=1)
    router.activate(list(ranks.values()))
    router.submit([Request(i, tokens=100) for i in range(4)])  # 0->dp0, 1->dp1, 2->dp2, 3->dp0 (queued)
    aborted = router.deactivate([ranks[0]])
    assert sorted(r.rid for r in aborted) == [0, 3] and all(r.attempt == 1 for r in aborted)
    assert _dispatched(log)[4:] == [(0, 1), (3, 2)]  # cursor at 1 after request 3 went to dp0


def test_routing_policy_fires_on_a_sim_log_whose_fresh_set_queue_went_to_one_rank():
    res = Simulation(load_scenario(os.path.join(ROOT, "examples", "scenarios", "roll_dual_4gpu.yaml"))).run()
    records = res.records
    assert check_log(records, ["routing", "routing_policy"]) == []
    # the mutation: every dispatch right after the first multi-rank Activate goes to its first rank
    mutated = copy.deepcopy(records)
    start = next(
        i
        for i, r in enumerate(mutated)
        if r["kind"] == "effect_end" and r["effect"] == "Activate" and len(r["args"]["ranks"]) > 1
    )
    pid, first = mutated[start]["pipeline_id"], mutated[start]["args"]["ranks"][0]
    moved = 0
    for r in mutated[start + 1 :]:
        if r["kind"] == "rank_state" and r["pipeline_id"] == pid:
            break
        if r["kind"] == "request_dispatch" and r["pipeline_id"] == pid:
            r["dp_rank"], moved = first, moved + 1
    assert moved > 1
    found = check_log(mutated, ["routing_policy"])
    assert found and f"routed to dp{first}" in found[0].message
