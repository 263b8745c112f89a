"""Stateful property test of the scheduler model (Hypothesis rule-based state machine).

A fixed pool of pipelines with different topologies (NeMo-style partial overlap, a tp=2
infer cluster, ROLL-style full overlap) is driven through random sequences of every
input the model takes — register+admit, requests at every priority, release,
release_then_request, await_release, progress reports, clear_progress, unregister,
whole cycles and split plan/commit cycles with inputs arriving in the lock gap — and
after every step the ownership invariants of docs/modelled-systems.md#rlix-one-scheduling-cycle and #rlix-plan-validation must hold:

* GPU conservation and single ownership: idle ∪ allocated = all GPUs, pairwise disjoint;
* every plan passed validation (no ``validation_failed`` record, no fail-fast other than
  the by-design ones: an ``await_release_gpus`` whose cluster was released meanwhile, and
  RLix's identical crash when a pipeline is unregistered and registered again inside the
  lock gap — after either the machine starts a fresh model);
* non-GEN grants are whole device mappings; GEN allocations are whole TP bundles of the
  registered mapping below max_dp;
* no dp rank is both removed and added in one cycle;
* a signalled request receives the cluster's allocation as of its commit (a wake-only
  GENERATION signal is answered before the commit's expands, as in RLix Phase 6).
"""

from __future__ import annotations

from typing import Dict, List, Set

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from harness.scheduler import Priority, Rejected, SchedulerModel
from harness.scheduler.progress import ProgressReport
from harness.scheduler.types import GENERATION_CLUSTER, cluster_id_of, parse_cluster_id
from harness.scheduler.topology import ClusterTopology

ALL = list(Priority)
ESTIMATES = st.sampled_from([True, True, True, False]).flatmap(lambda pos: st.integers(1, 16) if pos else st.none())
MOSTLY = st.sampled_from([True, True, True, True, False])  # True 4 times in 5, shrinks to True
GEN = Priority.GENERATION

# Failures RLix documents as by-design fail-fast (docs/modelled-systems.md#rlix-one-scheduling-cycle Phase 0.5, #rlix-release-unregister-and-fail-fast):
# a planned release whose cluster was released (or re-granted at another priority) before
# the cycle ran. After one of these the machine starts a fresh model.
BY_DESIGN_FAILURES = (
    "await_release_gpus for unknown cluster_id",
    "await_release_gpus is only supported for GENERATION clusters",
)
# RLix-identical, though not listed in docs/modelled-systems.md: a pipeline unregistered *and registered
# again* inside the lock gap is "registered" at commit, so the stale-plan skip does not
# apply and the commit finds no waiter for the planned grant/signal (RLix raises the same
# RuntimeError in _apply_plan_and_signal / _signal_pending_request). Accepted only when the
# named cluster's pipeline really was re-registered during the open cycle's gap.
REREGISTER_IN_GAP_FAILURES = (
    "Planned allocation has no pending waiter: cluster_id=",
    "No pending request found for cluster_id=",
)

# Natural priorities per cluster; any priority is also tried now and then.
NATURAL = {
    "actor_infer": [GEN, GEN, GEN, Priority.INITIALIZATION],
    "actor_train": [Priority.ACTOR_TRAINING, Priority.ACTOR_TRAINING, Priority.INITIALIZATION],
    "reference": [Priority.REF_LOG_PROBS, Priority.OLD_LOG_PROBS],
    "critic": [Priority.CRITIC_TRAINING, Priority.VALUE_COMPUTE],
}


def pool_1x4() -> Dict[str, Dict[str, tuple]]:
    """name -> {cluster: (tp, mapping)} on 1 node x 4 GPUs."""
    return {
        # NeMo partial overlap: train ⊂ infer, one infer rank keeps serving
        "pa": {"actor_train": (1, [0]), "actor_infer": (1, [0, 1]), "reference": (1, [0]), "reward": (1, [])},
        # tp=2 infer over all GPUs; training and critic on the second half
        "pb": {"actor_train": (1, [2]), "critic": (1, [3]), "actor_infer": (2, [0, 1, 2, 3])},
        # ROLL full overlap: infer everywhere, train/ref on [2,3]
        "pc": {"actor_train": (1, [2, 3]), "reference": (1, [2, 3]), "actor_infer": (1, [0, 1, 2, 3])},
    }


def pool_2x2() -> Dict[str, Dict[str, tuple]]:
    """name -> {cluster: (tp, mapping)} on 2 nodes x 2 GPUs (tp groups stay inside a node)."""
    return {
        "pa": {"actor_train": (1, [0]), "actor_infer": (1, [0, 1])},
        "pb": {"actor_train": (1, [2, 3]), "actor_infer": (2, [0, 1, 2, 3]), "critic": (1, [1])},
        "pc": {"actor_train": (1, [2, 3]), "reference": (1, [2, 3]), "actor_infer": (1, [0, 1, 2, 3])},
    }


class SchedulerMachine(RuleBasedStateMachine):
    TOPOLOGY = ClusterTopology(1, 4)
    POOL = staticmethod(pool_1x4)

    def __init__(self) -> None:
        super().__init__()
        self.pool = self.POOL()
        self.pids = sorted(self.pool)
        self.initial: List[str] = []
        self.unexpected: List[str] = []
        self.restarts = 0
        self._fresh_model()

    @initialize(pids=st.lists(st.sampled_from(["pa", "pb", "pc"]), min_size=2, max_size=3, unique=True))
    def start(self, pids):
        self.initial = list(pids)
        for pid in pids:
            self._register_admit(pid)

    # ------------------------------------------------------------------ bookkeeping
    def _fresh_model(self) -> None:
        self.model = SchedulerModel(self.TOPOLOGY)
        self.open_cp = None
        self.unregistered_in_gap: Set[str] = set()
        self.reregistered_in_gap: Set[str] = set()
        self.released_while_awaited: Set[str] = set()  # released with an await_release pending
        self.plans: Dict[int, dict] = {}  # cycle -> plan record
        for pid in self.initial:
            self._register_admit(pid)

    def _register_admit(self, pid: str) -> None:
        tps = {name: tp for name, (tp, _) in self.pool[pid].items()}
        maps = {name: list(mp) for name, (_, mp) in self.pool[pid].items()}
        self.model.register(pid, tps, maps)
        self.model.admit(pid)

    def _absorb(self) -> None:
        """Drain the outbox and check every record against the state right after the call."""
        m = self.model
        st_ = m.state
        for rec in m.drain():
            kind = rec["kind"]
            if kind == "validation_failed":
                self.unexpected.append(f"plan failed validation: {rec}")
            elif kind == "plan":
                self.plans[rec["cycle"]] = rec
                shrunk: Dict[str, Set[int]] = {}
                for op in rec["shrinks"]:
                    shrunk.setdefault(op["cluster_id"], set()).update(b["dp_rank"] for b in op["bundles"])
                for op in rec["expands"]:
                    both = shrunk.get(op["cluster_id"], set()) & {b["dp_rank"] for b in op["bundles"]}
                    if both:
                        self.unexpected.append(
                            f"cycle {rec['cycle']} removes and re-adds {op['cluster_id']} ranks {sorted(both)}"
                        )
            elif kind == "signalled" and rec["waiter"] == "request" and rec["error"] is None:
                cid = rec["cluster_id"]
                alloc = st_.allocations.get(cid)
                now = sorted(alloc.gpu_ids) if alloc is not None else []
                expected = now
                plan = self.plans.get(rec["cycle"]) if rec["cycle"] is not None else None
                if (
                    plan is not None
                    and rec["priority"] == GEN.name
                    and any(
                        s["cluster_id"] == cid and s["priority"] == GEN.name and not s["gpus"] for s in plan["signals"]
                    )
                ):
                    # wake-only signal: answered after the shrinks, before the expands
                    added = {
                        g for op in plan["expands"] if op["cluster_id"] == cid for b in op["bundles"] for g in b["gpus"]
                    }
                    expected = sorted(set(now) - added)
                if sorted(rec["gpus"]) != expected:
                    self.unexpected.append(
                        f"signalled {cid} with {rec['gpus']} but its allocation is {expected} ({rec})"
                    )
                if rec["priority"] != GEN.name and alloc is None:
                    self.unexpected.append(f"non-GEN grant {cid} signalled without an allocation ({rec})")
        if m.failed is not None:
            reregistered = any(
                m.failed.startswith(r) and f"cluster_id='{pid}_" in m.failed
                for r in REREGISTER_IN_GAP_FAILURES
                for pid in self.reregistered_in_gap
            )
            released = any(
                m.failed == f"{BY_DESIGN_FAILURES[0]} {cid!r}" or m.failed == f"{BY_DESIGN_FAILURES[1]}, got {cid!r}"
                for cid in self.released_while_awaited
            )
            if released or reregistered:
                self.restarts += 1
                self._fresh_model()  # documented fail-fast; start over with a new scheduler
                self.model.drain()
            else:
                self.unexpected.append(f"model failed fast: {m.failed}")

    def _try(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Rejected:
            return None
        finally:
            self._absorb()

    def _note_release(self, cid: str) -> None:
        if cid in self.model.state.planned_releases:
            self.released_while_awaited.add(cid)

    def _cid(self, pid: str, name: str) -> str:
        return cluster_id_of(pid, name)

    # ------------------------------------------------------------------ inputs
    @rule(pid=st.sampled_from(["pa", "pb", "pc"]))
    def register_admit(self, pid):
        if self.open_cp is not None and pid in self.unregistered_in_gap:
            self.reregistered_in_gap.add(pid)
        self._try(self._register_admit, pid)

    @rule(pid=st.sampled_from(["pa", "pb", "pc"]), estimate=ESTIMATES)
    def request_generation(self, pid, estimate):
        self._try(
            self.model.request, self._cid(pid, GENERATION_CLUSTER), GEN, global_step=0, step_target_estimate=estimate
        )

    @rule(estimates=st.lists(ESTIMATES, min_size=3, max_size=3))
    def everyone_generates(self, estimates):
        """Every registered pipeline asks for GENERATION at once (gap-ratio contention)."""
        for pid, est in zip(self.pids, estimates):
            self._try(self.model.request, self._cid(pid, GENERATION_CLUSTER), GEN, step_target_estimate=est)

    @rule(pid=st.sampled_from(["pa", "pb", "pc"]), data=st.data())
    def train_step(self, pid, data):
        """A training phase: request a training-side cluster (preempting GENERATION), or,
        when the pipeline holds GENERATION, hand it over atomically (release_then_request)."""
        names = sorted(n for n in self.pool[pid] if n not in (GENERATION_CLUSTER, "reward"))
        name = data.draw(st.sampled_from(names), label="cluster")
        prio = data.draw(st.sampled_from(NATURAL[name][:2]), label="priority")
        gen = self.model.state.allocations.get(self._cid(pid, GENERATION_CLUSTER))
        if gen is not None and data.draw(st.booleans(), label="handover"):
            self._note_release(self._cid(pid, GENERATION_CLUSTER))
            self._try(self.model.release_then_request, self._cid(pid, GENERATION_CLUSTER), self._cid(pid, name), prio)
        else:
            self._try(self.model.request, self._cid(pid, name), prio)

    @rule(pid=st.sampled_from(["pa", "pb", "pc"]), data=st.data())
    def request(self, pid, data):
        name = data.draw(st.sampled_from(sorted(self.pool[pid])), label="cluster")
        natural = NATURAL.get(name, ALL)
        prio = data.draw(st.one_of(st.sampled_from(natural), st.sampled_from(ALL)), label="priority")
        est = data.draw(ESTIMATES, label="estimate") if prio == GEN else None
        self._try(self.model.request, self._cid(pid, name), prio, global_step=0, step_target_estimate=est)

    def _some_cluster(self, data, pid: str, *, allocated: bool, label: str) -> str:
        """Mostly a cluster that is allocated now (so the call does something), else any."""
        live = sorted(self.model.state.allocations)
        if allocated and live and data.draw(MOSTLY, label=f"{label}_allocated"):
            return data.draw(st.sampled_from(live), label=label)
        return self._cid(pid, data.draw(st.sampled_from(sorted(self.pool[pid])), label=label))

    @rule(pid=st.sampled_from(["pa", "pb", "pc"]), data=st.data())
    def release(self, pid, data):
        cid = self._some_cluster(data, pid, allocated=True, label="release")
        self._note_release(cid)
        self._try(self.model.release, cid)

    @rule(pid=st.sampled_from(["pa", "pb", "pc"]), data=st.data())
    def release_then_request(self, pid, data):
        rel = self._some_cluster(data, pid, allocated=True, label="release")
        rpid = rel.split("_")[0]  # pool ids have no '_'
        req = data.draw(st.sampled_from(sorted(self.pool[rpid])), label="request")
        prio = data.draw(st.one_of(st.sampled_from(NATURAL.get(req, ALL)), st.sampled_from(ALL)), label="priority")
        est = data.draw(ESTIMATES, label="estimate") if prio == GEN else None
        self._note_release(rel)
        self._try(self.model.release_then_request, rel, self._cid(rpid, req), prio, request_step_target_estimate=est)

    @rule(pid=st.sampled_from(["pa", "pb", "pc"]), by_cluster=st.booleans(), data=st.data())
    def await_release(self, pid, by_cluster, data):
        gen = sorted(c for c, a in self.model.state.allocations.items() if a.priority == GEN)
        if gen and data.draw(MOSTLY, label="gen_allocated"):
            pid = data.draw(st.sampled_from(gen), label="cluster").split("_")[0]
        if by_cluster:
            self._try(self.model.await_release, cluster_id=self._cid(pid, GENERATION_CLUSTER))
        else:
            self._try(self.model.await_release, pipeline_id=pid)

    @rule(
        pid=st.sampled_from(["pa", "pb", "pc"]),
        step_target=st.integers(1, 16),
        completed=st.integers(0, 20),
        mode=st.sampled_from(["train", "val"]),
    )
    def report_progress(self, pid, step_target, completed, mode):
        self._try(self.model.report_progress, ProgressReport(pid, step_target, float(completed), mode=mode))

    @rule(done=st.lists(st.integers(0, 8), min_size=3, max_size=3))
    def everyone_reports(self, done):
        """Uneven progress for every registered pipeline (creates donors and receivers)."""
        for pid, d in zip(self.pids, done):
            self._try(self.model.report_progress, ProgressReport(pid, 8, float(d)))

    @rule(pid=st.sampled_from(["pa", "pb", "pc"]))
    def clear_progress(self, pid):
        self._try(self.model.clear_progress, pid)

    @rule(pid=st.sampled_from(["pa", "pb", "pc"]), really=st.sampled_from([False, False, True]))
    def unregister(self, pid, really):
        if not really:
            return  # keep unregistration rarer than other inputs
        if self.open_cp is not None and pid in self.model.state.registry:
            self.unregistered_in_gap.add(pid)
        self._try(self.model.unregister, pid)

    # ------------------------------------------------------------------ cycles
    @precondition(lambda self: self.open_cp is None)
    @rule()
    def run_cycle(self):
        self._try(self.model.run_cycle)

    @precondition(lambda self: self.open_cp is None)
    @rule()
    def plan_cycle(self):
        self.unregistered_in_gap.clear()
        self.reregistered_in_gap.clear()
        cp = self._try(self.model.plan_cycle)
        if cp is not None and self.model.failed is None:
            self.open_cp = cp

    @precondition(lambda self: self.open_cp is not None)
    @rule()
    def commit_cycle(self):
        cp, self.open_cp = self.open_cp, None
        self._try(self.model.commit_cycle, cp)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def nothing_unexpected(self):
        assert not self.unexpected, "\n".join(self.unexpected)

    @invariant()
    def gpus_conserved_and_singly_owned(self):
        st_ = self.model.state
        universe = set(range(self.TOPOLOGY.num_gpus))
        seen: Dict[int, str] = {g: "idle" for g in st_.idle_gpus}
        assert len(seen) == len(st_.idle_gpus)
        for cid, alloc in st_.allocations.items():
            assert len(set(alloc.gpu_ids)) == len(alloc.gpu_ids), f"{cid} lists a GPU twice: {alloc.gpu_ids}"
            for g in alloc.gpu_ids:
                assert g not in seen, f"GPU {g} owned by {cid} and {seen[g]}"
                seen[g] = cid
        assert set(seen) == universe, (
            f"GPUs {sorted(universe - set(seen))} lost, {sorted(set(seen) - universe)} invented"
        )

    @invariant()
    def allocations_are_whole_mappings_and_bundles(self):
        st_ = self.model.state
        for cid, alloc in st_.allocations.items():
            pid, name = parse_cluster_id(cid)
            entry = st_.registry.get(pid)
            assert entry is not None and name in entry.clusters, f"allocation {cid} of an unregistered cluster"
            cfg = entry.clusters[name]
            if alloc.priority != GEN:
                assert sorted(alloc.gpu_ids) == list(cfg.device_mapping), (
                    f"non-GEN {cid} holds {sorted(alloc.gpu_ids)}, mapping is {list(cfg.device_mapping)}"
                )
                continue
            assert name == GENERATION_CLUSTER, f"GENERATION allocation on {cid}"
            assert set(alloc.dp_rank_to_gpus) == set(alloc.active_dp_ranks), (cid, alloc)
            union: Set[int] = set()
            for r in alloc.active_dp_ranks:
                assert 0 <= r < cfg.max_dp_workers, f"{cid} rank {r} >= max_dp {cfg.max_dp_workers}"
                assert list(alloc.dp_rank_to_gpus[r]) == cfg.bundle(r), (
                    f"{cid} rank {r} holds {alloc.dp_rank_to_gpus[r]}, registry bundle {cfg.bundle(r)}"
                )
                union.update(cfg.bundle(r))
            assert sorted(alloc.gpu_ids) == sorted(union), (
                f"{cid} gpu_ids {alloc.gpu_ids} != active bundles {sorted(union)}"
            )


class SchedulerMachine2x2(SchedulerMachine):
    TOPOLOGY = ClusterTopology(2, 2)
    POOL = staticmethod(pool_2x2)


# Not derandomized: every run of the suite draws new programs, so the runs together search
# far more than one run's 75 x 40 steps (was 150: 4 CPU s a run for both machines).
SETTINGS = settings(
    max_examples=75,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

TestScheduler1x4 = SchedulerMachine.TestCase
TestScheduler1x4.settings = SETTINGS
TestScheduler2x2 = SchedulerMachine2x2.TestCase
TestScheduler2x2.settings = SETTINGS


# ----------------------------------------------------------------------------- pinned behaviours
# Two behaviours the machine above tolerates on purpose, pinned here so a change is seen.


def _model_pq() -> SchedulerModel:
    m = SchedulerModel(ClusterTopology(1, 3))
    m.register("p", {"actor_infer": 1, "actor_train": 1}, {"actor_infer": [0, 1, 2], "actor_train": [0, 1]})
    m.admit("p")
    m.register("q", {"actor_infer": 1, "actor_train": 1}, {"actor_infer": [2], "actor_train": [2]})
    m.admit("q")
    return m


def test_wake_only_signal_is_answered_before_the_same_commits_expand():
    """RLix Phase 6 answers a wake-only GENERATION signal with the allocation as it is after
    the shrinks and *before* the expansions; when the same plan also expands that cluster,
    the waiter gets the pre-expand GPU list (the later has_pending signal finds no waiter)."""
    m = _model_pq()
    m.request("q_actor_train", Priority.ACTOR_TRAINING)
    m.run_cycle()  # q holds GPU 2
    m.request("p_actor_infer", GEN, step_target_estimate=4)
    m.run_cycle()  # p ranks 0,1
    m.request("p_actor_train", Priority.ACTOR_TRAINING)
    m.run_cycle()  # training preempts both ranks
    m.release("p_actor_train")
    m.report_progress(ProgressReport("p", 8, 0.0))
    cp = m.plan_cycle()  # expands p (no waiter yet)
    m.request("p_actor_infer", GEN, step_target_estimate=4)  # lock gap: enqueued, 0 active
    m.release("q_actor_train")
    m.commit_cycle(cp)
    cp = m.plan_cycle()
    assert [(s.cluster_id, s.gpus) for s in cp.plan.signals] == [("p_actor_infer", [])]  # wake-only
    assert [(e.cluster_id, e.dp_rank_to_gpus) for e in cp.plan.expands] == [("p_actor_infer", {2: [2]})]
    signals = m.commit_cycle(cp)
    assert [(s.cluster_id, s.gpus) for s in signals] == [("p_actor_infer", [0, 1])]
    assert sorted(m.state.allocations["p_actor_infer"].gpu_ids) == [0, 1, 2]


def test_reregistration_inside_the_lock_gap_fails_fast_like_rlix():
    """unregister + register again between plan and commit: the pipeline is registered at
    commit, so the stale-plan skip does not apply and the planned grant has no waiter
    (RLix raises the same 'Planned allocation has no pending waiter')."""
    m = _model_pq()
    m.request("p_actor_train", Priority.ACTOR_TRAINING)
    cp = m.plan_cycle()
    assert [s.cluster_id for s in cp.plan.signals] == ["p_actor_train"]
    m.unregister("p")
    m.register("p", {"actor_infer": 1, "actor_train": 1}, {"actor_infer": [0, 1, 2], "actor_train": [0, 1]})
    m.admit("p")
    assert m.commit_cycle(cp) == []
    assert m.failed is not None and m.failed.startswith("Planned allocation has no pending waiter")
    with pytest.raises(Rejected):
        m.request("p_actor_train", Priority.ACTOR_TRAINING)


# ----------------------------------------------------------------------------- known bug (fixed variant)
# SchedulerOptions(ack_unplanned_releases=False) keeps a planned release that arrived in
# the lock gap until a cycle really shrinks it. But PlannedRelease.dp_ranks_to_remove is
# the active-rank list snapshotted when await_release was called, and the commit of the
# cycle that was open at that moment can change the active ranks before the release is
# planned. Found by this state machine run with that option.


def _fixed_variant(train: List[int]) -> SchedulerModel:
    from harness.scheduler import SchedulerOptions

    m = SchedulerModel(ClusterTopology(1, 2), SchedulerOptions(ack_unplanned_releases=False))
    m.register("p", {"actor_infer": 1, "actor_train": 1}, {"actor_infer": [0, 1], "actor_train": train})
    m.admit("p")
    m.request("p_actor_infer", GEN, step_target_estimate=4)
    m.run_cycle()  # p active ranks {0, 1}
    return m


def test_fixed_variant_planned_release_after_gap_shrink_is_planned_validly():
    m = _fixed_variant(train=[0])
    m.request("p_actor_train", Priority.ACTOR_TRAINING)
    cp = m.plan_cycle()  # preempts rank 0 for training
    m.await_release(pipeline_id="p")  # lock gap: snapshot ranks [0, 1]
    m.commit_cycle(cp)  # rank 0 shrunk; release kept (not executed)
    m.run_cycle()  # Phase 0.5 shrinks [0, 1]; 0 is inactive
    assert m.failed is None, m.failed  # (fixed bug: was condition 5 fail-fast)
    acks = [r for r in m.drain() if r["kind"] == "signalled" and r["waiter"] == "planned_release"]
    assert acks and acks[-1]["error"] is None
    assert not m.state.allocations["p_actor_infer"].active_dp_ranks


def test_fixed_variant_planned_release_after_gap_expand_shrinks_to_zero():
    m = _fixed_variant(train=[1])
    m.request("p_actor_train", Priority.ACTOR_TRAINING)
    m.run_cycle()  # training preempts rank 1
    m.release("p_actor_train")
    m.report_progress(ProgressReport("p", 8, 0.0))
    cp = m.plan_cycle()  # re-expands rank 1
    assert [e.dp_rank_to_gpus for e in cp.plan.expands] == [{1: [1]}]
    m.await_release(pipeline_id="p")  # lock gap: snapshot ranks [0]
    m.commit_cycle(cp)  # rank 1 active again; release kept
    signals = m.run_cycle()  # shrinks [0] only, then acks
    assert [(s.kind, s.shrink_executed) for s in signals] == [("planned_release", True)]
    assert not m.state.allocations["p_actor_infer"].active_dp_ranks  # (fixed bug: rank 1 stayed active)
