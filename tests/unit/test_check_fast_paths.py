"""The checks' fast paths find what their general paths find (issue #42's per-record cost).

Each fast path skips work the general one would do for nothing: ``step_order`` scans its
pipeline's steps only when one still open is earlier, ``routing`` answers "completed
before?" and records the completion in one search, ``grant_order`` reads the obtainable
GPUs by cluster, ``idle_bundle_starvation`` settles a moved rank of a pipeline that is
not starved at once. Each is held here to a reference written out the general way, on
random sequences that include broken ones (a step reopened, a request completed twice),
and a count shows the work the fast path skips.
"""

from __future__ import annotations

import random
from typing import Dict, List

from harness.logs.invariants import CHECKS, check_log
from harness.logs.invariants.allocations import GENERATION, Holdings
from harness.logs.invariants.base import Violation


def _step_order_reference(records: List[dict]) -> List[Violation]:
    """step_order as a scan of every step the pipeline opened, at every start."""
    out: List[Violation] = []
    opened: Dict[str, Dict[int, int]] = {}
    current: Dict[str, int] = {}
    for r in records:
        if r["kind"] not in ("effect_start", "effect_end") or r.get("scope") != "step" or r.get("step") is None:
            continue
        pid, step = r["pipeline_id"], r["step"]
        steps = opened.setdefault(pid, {})
        if r["kind"] == "effect_start":
            earlier = [s for s, n in steps.items() if s < step and n > 0]
            if earlier:
                msg = f"{pid}: step {step} starts {r['effect']} while step {earlier[0]} is unfinished"
                out.append(Violation("step_order", r["seq"], msg))
            if step < current.get(pid, step):
                out.append(Violation("step_order", r["seq"], f"{pid}: step {step} after step {current[pid]}"))
            current[pid] = max(step, current.get(pid, step))
            steps[step] = steps.get(step, 0) + 1
        else:
            steps[step] = steps.get(step, 0) - 1
    return out


def _random_effects(rng: random.Random, n: int) -> List[dict]:
    out = [{"seq": 0, "t": 0.0, "kind": "header"}]
    for seq in range(1, n):
        out.append(
            {
                "seq": seq,
                "t": float(seq),
                "kind": rng.choice(("effect_start", "effect_start", "effect_end")),
                "pipeline_id": rng.choice("pq"),
                "effect": rng.choice(("Compute", "BuildCache")),
                "args": {},
                "scope": rng.choice(("step", "step", "step", "expand")),
                "step": rng.choice((0, 1, 2, 3, 4, None)),
            }
        )
    return out


def test_step_order_finds_what_a_scan_of_every_step_finds():
    rng = random.Random(42)
    fired = 0
    for _ in range(300):
        records = _random_effects(rng, rng.randint(1, 60))
        want = _step_order_reference(records)
        assert CHECKS["step_order"](records) == want
        fired += bool(want)
    assert fired > 100  # broken sequences (steps reopened, ends without starts) among them


def test_routing_completion_answers_and_records_in_one_search():
    from harness.logs.invariants.routing import Completed

    rng = random.Random(7)
    for _ in range(200):
        completed, reference = Completed(), set()
        for _ in range(rng.randint(0, 80)):
            req = (rng.choice("ab"), rng.choice((rng.randint(0, 40), "x")))
            assert completed.add(req) == (req not in reference)  # new exactly when not completed before
            reference.add(req)
            assert all(((p, q) in completed) == ((p, q) in reference) for p in "ab" for q in range(-1, 42))


def test_routing_finds_a_second_completion_once_per_completion():
    rec = {"t": 0.0, "pipeline_id": "p", "dp_rank": 0, "request": 3}
    records = [
        {"seq": 0, "t": 0.0, "kind": "header"},
        {"seq": 1, "t": 0.0, "kind": "rank_state", "pipeline_id": "p", "dp_rank": 0, "state": "routable"},
        {**rec, "seq": 2, "kind": "request_dispatch", "version": 1},
        {**rec, "seq": 3, "kind": "request_done"},
        {**rec, "seq": 4, "kind": "request_done"},
        {**rec, "seq": 5, "kind": "request_done"},
    ]
    found = [(v.seq, v.message) for v in check_log(records, ["routing"])]
    assert found == [
        (4, "request 3 of p completed twice"),
        (4, "request 3 of p completed on dp0 where it was not running"),
        (5, "request 3 of p completed twice"),
        (5, "request 3 of p completed on dp0 where it was not running"),
    ]


def test_obtainable_read_by_cluster_is_every_gpu_minus_non_generation_holdings():
    from harness.logs.invariants.scheduling import _Pending

    rng = random.Random(3)
    walk = _Pending([{"seq": 0, "t": 0.0, "kind": "header", "cluster": {"nodes": 2, "gpus_per_node": 8}}])
    assert walk.h.num_gpus == 16
    for _ in range(200):
        h = walk.h = Holdings(num_gpus=16)
        for cid in ("p_actor_train", "p_actor_infer", "q_actor_train", "q_actor_infer"):
            gpus = rng.sample(range(18), rng.randint(0, 6))  # 16, 17: outside the cluster
            h.grant(0, cid, gpus, lambda seq, msg: None)
            if rng.random() < 0.8:
                h.priority[cid] = GENERATION if cid.endswith("infer") else rng.choice(("ACTOR_TRAINING", GENERATION))
        want = {g for g in range(16) if h.priority.get(h.owner.get(g, ""), GENERATION) == GENERATION}
        assert walk.obtainable() == want


def _refresh_general(self) -> None:
    """idle_bundle_starvation's refresh without its shortcut (every dirty pipeline judged)."""
    if not self.dirty and not self.holdings_changed:
        return
    pids = set(self.dirty)
    if self.holdings_changed:
        pids |= {p for p, w in self.waiting.items() if w}
    starved = {pid for pid in pids if self.waiting.get(pid) and not self.routable.get(pid)}
    idle = self.h.idle() if starved else set()
    for pid in pids:
        bundle = self._idle_bundle(pid, idle) if pid in starved else None
        if bundle is None:
            self.since.pop(pid, None)
            self.reported.discard(pid)
        elif pid not in self.since:
            self.since[pid] = (self.last_t, bundle)
    self.dirty.clear()
    self.holdings_changed = False


def _random_starvation_log(rng: random.Random) -> List[dict]:
    head = {"seq": 0, "t": 0.0, "kind": "header", "cluster": {"nodes": 1, "gpus_per_node": 4}}
    out = [head]
    for pid, train, infer in (("p", [0], [1, 2]), ("q", [3], [2, 3])):
        out.append(
            {
                "t": 0.0,
                "kind": "register",
                "pipeline_id": pid,
                "cluster_tp_configs": {"actor_train": 1, "actor_infer": 1},
                "cluster_device_mappings": {"actor_train": train, "actor_infer": infer},
            }
        )
    t = 0.0
    for _ in range(rng.randint(0, 40)):
        t += rng.choice((1.0, 30.0, 70.0))
        pid = rng.choice("pq")
        roll = rng.random()
        if roll < 0.15:  # the holdings move: a grant of a GPU, or its release
            cid, gpu = f"{pid}_actor_infer", rng.randint(1, 3)
            if rng.random() < 0.5:
                signal = {"cluster_id": cid, "gpus": [gpu], "priority": GENERATION}
                out.append(
                    {"t": t, "kind": "plan", "cycle": len(out), "shrinks": [], "signals": [signal], "expands": []}
                )
                out.append({"t": t, "kind": "commit", "cycle": out[-1]["cycle"]})
            else:
                out.append({"t": t, "kind": "released", "cluster_id": cid, "gpus": [gpu]})
        elif roll < 0.55:
            kind = rng.choice(("effect_start", "effect_end"))
            out.append({"t": t, "kind": kind, "pipeline_id": pid, "effect": "WaitBatch", "args": {}, "scope": "step"})
        else:
            state = rng.choice(("routable", "asleep"))
            out.append({"t": t, "kind": "rank_state", "pipeline_id": pid, "dp_rank": rng.randint(0, 1), "state": state})
    out.append({"t": t + 100.0, "kind": "sim_end", "reason": "done", "sim_time": t + 100.0, "events": 1})
    for seq, r in enumerate(out):
        r["seq"] = seq
    return out


def test_idle_bundle_starvation_settles_moved_ranks_as_the_general_refresh(monkeypatch):
    from harness.logs.invariants.scheduling import _IdleBundle

    rng = random.Random(11)
    logs = [_random_starvation_log(rng) for _ in range(150)]
    fast = [CHECKS["idle_bundle_starvation"](log) for log in logs]
    monkeypatch.setattr(_IdleBundle, "_refresh", _refresh_general)
    assert [CHECKS["idle_bundle_starvation"](log) for log in logs] == fast
    assert sum(bool(found) for found in fast) > 10  # starvation among them, found both ways


def test_routing_searches_the_completed_runs_once_per_completion(monkeypatch):
    import harness.logs.invariants.routing as routing_module

    calls = [0]
    search = routing_module.bisect_right

    def counted(*args):
        calls[0] += 1
        return search(*args)

    monkeypatch.setattr(routing_module, "bisect_right", counted)
    order = list(range(1, 201))
    random.Random(1).shuffle(order)  # completions out of order: most land below the highest completed
    records = [{"seq": 0, "t": 0.0, "kind": "header"}]
    records.append({"seq": 1, "t": 0.0, "kind": "rank_state", "pipeline_id": "p", "dp_rank": 0, "state": "routable"})
    for n in range(1, 201):
        records.append(
            {"t": 0.0, "kind": "request_dispatch", "pipeline_id": "p", "dp_rank": 0, "request": n, "version": 1}
        )
    for n in order:
        records.append({"t": 0.0, "kind": "request_done", "pipeline_id": "p", "dp_rank": 0, "request": n})
    for seq, r in enumerate(records):
        r["seq"] = seq
    assert CHECKS["routing"](records) == []
    assert calls[0] <= len(order)  # one search a completion at most (it was two: asked, then added)
