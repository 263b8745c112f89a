"""A hand-built event log for the output tests (tests/sim/test_outputs.py).

It is small enough to work every number out by hand; the times are binary fractions, so
the expected figures are exact floats. :func:`build_log` appends its records in time
order, one phase of the run per helper.
"""

from __future__ import annotations


def _effect_fields(pid, effect, args, scope, step, cycle, gpus):
    return dict(
        pipeline_id=pid, effect=effect, args=dict(args or {}), scope=scope, step=step, cycle=cycle, gpus=list(gpus)
    )


class Log:
    def __init__(self, nodes=2, gpus_per_node=2, scenario="two_pipelines_demo"):
        self.records = [
            {
                "seq": 0,
                "t": 0.0,
                "kind": "header",
                "schema": "rlharness.eventlog",
                "version": 1,
                "cluster": {"nodes": nodes, "gpus_per_node": gpus_per_node},
                "meta": {"scenario": scenario},
            }
        ]

    def add(self, t, kind, **fields):
        self.records.append({"seq": len(self.records), "t": float(t), "kind": kind, **fields})

    def effect(self, t0, t1, pid, effect, args=None, scope="step", step=None, cycle=None, gpus=()):
        """An ``effect_start`` and, unless ``t1`` is None (still running, or ended by :meth:`end`), its end."""
        common = _effect_fields(pid, effect, args, scope, step, cycle, gpus)
        self.add(t0, "effect_start", **common)
        if t1 is not None:
            self.add(t1, "effect_end", **common)

    def end(self, t, pid, effect, args=None, scope="step", step=None, cycle=None, gpus=(), **extra):
        """An ``effect_end`` alone (its start added earlier, e.g. by :meth:`effect` with no end)."""
        self.add(t, "effect_end", **_effect_fields(pid, effect, args, scope, step, cycle, gpus), **extra)

    def rank(self, t, pid, dp, state, gpus):
        self.add(t, "rank_state", pipeline_id=pid, dp_rank=dp, state=state, gpus=list(gpus))


def build_log():
    """Two pipelines on 2 nodes x 2 GPUs. ppl1: train [0], infer dp0=[0], dp1=[1];
    ppl2: train [2], infer dp0=[2], dp1=[3]. Records are appended in time order."""
    L = Log()
    _cycle1_expands_both(L)
    _ppl1_shrink_for_training(L)
    _ppl1_trains_while_ppl2_waits(L)
    _ppl1_refresh_and_expand(L)
    _ppl1_step2_and_ppl2_oom(L)
    return L.records


def _cycle1_expands_both(L):
    """ppl1 registers; cycle 1 expands both GEN clusters; every rank is routable at 1.0."""
    L.add(
        0.0,
        "register",
        pipeline_id="ppl1",
        cluster_tp_configs={"actor_train": 1, "actor_infer": 1},
        cluster_device_mappings={"actor_train": [0], "actor_infer": [0, 1]},
        topology="partial_overlap",
    )
    # cycle 1: expand both GEN clusters
    L.add(0.5, "cycle_start", cycle=1, reason="request")
    L.add(
        0.5,
        "plan",
        cycle=1,
        shrinks=[],
        signals=[],
        expands=[
            {
                "cluster_id": "ppl1_actor_infer",
                "has_pending_request": True,
                "bundles": [{"dp_rank": 0, "gpus": [0]}, {"dp_rank": 1, "gpus": [1]}],
            },
            {
                "cluster_id": "ppl2_actor_infer",
                "has_pending_request": True,
                "bundles": [{"dp_rank": 0, "gpus": [2]}, {"dp_rank": 1, "gpus": [3]}],
            },
        ],
    )
    L.add(0.5, "commit", cycle=1, idle_gpus=0, skipped_stale=[])
    for pid, gpus in (("ppl1", (0, 1)), ("ppl2", (2, 3))):
        for dp, g in enumerate(gpus):
            L.rank(1.0, pid, dp, "routable", [g])


def _ppl1_shrink_for_training(L):
    """ppl1 step 1 requests training GPUs; cycle 2 shrinks dp0 (2.0-2.75)."""
    # ppl1 step 1: request training GPUs; the scheduler shrinks dp0 (cycle 2)
    L.effect(2.0, None, "ppl1", "RequestGpus", {"cluster": "actor_train", "priority": "ACTOR_TRAINING"}, step=1)
    L.add(2.0, "cycle_start", cycle=2, reason="request")
    L.add(
        2.0,
        "plan",
        cycle=2,
        expands=[],
        signals=[{"cluster_id": "ppl1_actor_train", "priority": "ACTOR_TRAINING", "gpus": [0]}],
        shrinks=[{"cluster_id": "ppl1_actor_infer", "bundles": [{"dp_rank": 0, "gpus": [0]}]}],
    )
    L.add(2.0, "resize_start", cycle=2, pipeline_id="ppl1", phase="shrink", dp_ranks=[0])
    L.rank(2.0, "ppl1", 0, "draining", [0])
    L.effect(2.0, None, "ppl1", "Sleep", {"ranks": [0], "level": 1}, scope="shrink", cycle=2, gpus=[0])
    L.end(2.25, "ppl1", "Sleep", {"ranks": [0], "level": 1}, scope="shrink", cycle=2, gpus=[0])
    L.rank(2.25, "ppl1", 0, "asleep", [0])
    L.add(2.25, "resize_end", cycle=2, pipeline_id="ppl1", phase="shrink", dp_ranks=[0])
    L.add(2.25, "commit", cycle=2, idle_gpus=0, skipped_stale=[])
    L.end(2.5, "ppl1", "RequestGpus", {"cluster": "actor_train", "priority": "ACTOR_TRAINING"}, step=1, result=[0])
    L.add(2.5, "batch_consumed", pipeline_id="ppl1", step=1, trajectories=8, staleness={"0": 6, "1": 2})
    L.effect(2.5, None, "ppl1", "Compute", {"what": "train", "global_step": 1}, step=1, gpus=[0])
    L.add(2.75, "rejected", input_seq=3, input_kind="release", reason="not allocated")


def _ppl1_trains_while_ppl2_waits(L):
    """ppl2 waits for a batch from 3.0; ppl1 trains, builds its cache and offloads (to 5.0)."""
    # ppl2 waits for a batch from 3.0 to 9.0 (waiting occupies no GPU)
    L.effect(3.0, None, "ppl2", "WaitBatch", {"global_step": 1}, step=1)
    L.end(4.5, "ppl1", "Compute", {"what": "train", "global_step": 1}, step=1, gpus=[0])
    L.effect(4.5, 4.75, "ppl1", "BuildCache", {"version": 1}, step=1, gpus=[0])
    L.effect(4.75, 5.0, "ppl1", "OffloadTraining", {}, step=1, gpus=[0])


def _ppl1_refresh_and_expand(L):
    """An active refresh of dp1 (5.0-5.5), then cycle 3 expands dp0 back (to 6.5)."""
    # active refresh of dp1 while it keeps serving on GPU 1 (overlap -> second lane)
    sync = dict(
        pipeline_id="ppl1",
        effect="SyncFromCache",
        args={"ranks": [1], "version": 1, "path": "active"},
        scope="step",
        step=1,
        cycle=None,
        gpus=[1],
    )
    L.add(5.0, "effect_start", **sync)
    L.add(5.25, "sync_bucket", pipeline_id="ppl1", version=1, bucket=0, path="ipc", dp_ranks=[1], bytes=1000)
    L.add(5.5, "sync_bucket", pipeline_id="ppl1", version=1, bucket=1, path="ipc", dp_ranks=[1], bytes=24)
    L.add(5.5, "effect_end", **sync, result=[1])
    # cycle 3: expand dp0 back
    L.add(5.5, "cycle_start", cycle=3, reason="release")
    L.add(
        5.5,
        "plan",
        cycle=3,
        shrinks=[],
        signals=[],
        expands=[
            {"cluster_id": "ppl1_actor_infer", "has_pending_request": False, "bundles": [{"dp_rank": 0, "gpus": [0]}]}
        ],
    )
    L.add(5.5, "resize_start", cycle=3, pipeline_id="ppl1", phase="expand", dp_ranks=[0])
    L.effect(5.5, 6.0, "ppl1", "Wake", {"ranks": [0]}, scope="expand", cycle=3, gpus=[0])
    L.effect(
        6.0,
        None,
        "ppl1",
        "SyncFromCache",
        {"ranks": [0], "version": 1, "path": "expand"},
        scope="expand",
        cycle=3,
        gpus=[0],
    )
    L.add(6.25, "sync_bucket", pipeline_id="ppl1", version=1, bucket=0, path="broadcast", dp_ranks=[0], bytes=2048)
    L.end(
        6.5, "ppl1", "SyncFromCache", {"ranks": [0], "version": 1, "path": "expand"}, scope="expand", cycle=3, gpus=[0]
    )
    L.effect(6.5, 6.5, "ppl1", "Activate", {"ranks": [0]}, scope="expand", cycle=3, gpus=[0])
    L.rank(6.5, "ppl1", 0, "routable", [0])
    L.add(6.5, "resize_end", cycle=3, pipeline_id="ppl1", phase="expand", dp_ranks=[0])
    L.add(6.5, "commit", cycle=3, idle_gpus=0, skipped_stale=[])


def _ppl1_step2_and_ppl2_oom(L):
    """ppl1's last step (7.0-8.0); ppl2's batch at 9.0 and its trainer's OOM; the end at 10.0."""
    # ppl1 step 2: dp0 goes to sleep without a Sleep effect, train 7 -> 8 (the last step)
    L.rank(7.0, "ppl1", 0, "asleep", [0])
    L.add(7.0, "batch_consumed", pipeline_id="ppl1", step=2, trajectories=8, staleness={"1": 4, "2": 4})
    L.effect(7.0, 8.0, "ppl1", "Compute", {"what": "train", "global_step": 2}, step=2, gpus=[0])
    # ppl2 step 1: batch at 9.0, training starts and the trainer hits an OOM
    L.end(9.0, "ppl2", "WaitBatch", {"global_step": 1}, step=1)
    L.add(9.0, "batch_consumed", pipeline_id="ppl2", step=1, trajectories=4, staleness={"0": 4})
    L.rank(9.0, "ppl2", 0, "draining", [2])
    L.effect(9.0, None, "ppl2", "Compute", {"what": "train", "global_step": 1}, step=1, gpus=[2])
    L.add(9.5, "oom", gpu=2, owner="ppl2/train", mem="train_state", requested=100, used=80, capacity=160)
    L.add(9.5, "fault_fired", name="oom_kill", pipeline_id="ppl2", step=1)
    L.add(10.0, "sim_end", reason="failed", sim_time=10.0, events=len(L.records) + 1)
