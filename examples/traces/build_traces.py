"""Rebuild the example scheduler traces in this folder (python examples/traces/build_traces.py).

Each trace is an event log of scheduler *inputs* only (schema: docs/trace-format.md);
``rlharness replay`` feeds them to the scheduler model and prints its decisions.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from harness.logs.writer import EventLog, header_record, write_atomic  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


class Trace:
    def __init__(self, nodes: int, gpus_per_node: int, **scheduler):
        self.log = EventLog(
            header_record(
                {"nodes": nodes, "gpus_per_node": gpus_per_node}, scheduler=scheduler or None, source="example"
            )
        )
        self.t = 0.0

    def at(self, dt: float) -> "Trace":
        self.t = round(self.t + dt, 6)
        return self

    def __call__(self, kind: str, **fields) -> "Trace":
        self.log.emit(kind, self.t, **fields)
        return self

    def cycle(self, **fields) -> "Trace":
        return self("cycle", **fields)

    def save(self, name: str) -> None:
        write_atomic(os.path.join(HERE, name), self.log.lines())


def partial_overlap_2gpu() -> Trace:
    """NeMo-style: ppl1 train [0] infer [0,1]; ppl2 train [1] infer [0,1] (the default scenario)."""
    tr = Trace(1, 2)
    for pid, train in (("ppl1", [0]), ("ppl2", [1])):
        tr(
            "register",
            pipeline_id=pid,
            topology="partial_overlap",
            cluster_tp_configs={"actor_train": 1, "actor_infer": 1},
            cluster_device_mappings={"actor_train": train, "actor_infer": [0, 1]},
        )
        tr("admit", pipeline_id=pid)
        # initialize_pipeline: INIT actor_train, build cache, offload, release; INIT actor_infer, sleep, release
        tr.at(0.1)("request", cluster_id=f"{pid}_actor_train", priority="INITIALIZATION").cycle()
        tr.at(2.0)("release", cluster_id=f"{pid}_actor_train")
        tr("request", cluster_id=f"{pid}_actor_infer", priority="INITIALIZATION").cycle()
        tr.at(3.0)("release", cluster_id=f"{pid}_actor_infer")
    # first GENERATION requests (NeMo: estimate 1)
    tr.at(0.5)("request", cluster_id="ppl1_actor_infer", priority="GENERATION", step_target_estimate=1)
    tr("request", cluster_id="ppl2_actor_infer", priority="GENERATION", step_target_estimate=1).cycle()
    for step in range(2):
        for pid, other in (("ppl1", "ppl2"), ("ppl2", "ppl1")):
            tr.at(4.0)("progress", pipeline_id=pid, step_target=8, completed=6, mode="train")
            tr("progress", pipeline_id=other, step_target=8, completed=2, mode="train").cycle()
            # before_training: ACTOR_TRAINING preempts the overlapping infer rank
            tr.at(1.0)("request", cluster_id=f"{pid}_actor_train", priority="ACTOR_TRAINING", global_step=step).cycle()
            # watchdog: no active rank left -> re-request GENERATION
            tr.at(2.0)(
                "request", cluster_id=f"{pid}_actor_infer", priority="GENERATION", step_target_estimate=1
            ).cycle()
            # after_training: active refresh + publish, then release actor_train; next cycle expands back
            tr.at(6.0)("release", cluster_id=f"{pid}_actor_train", global_step=step).cycle()
            tr("clear_progress", pipeline_id=pid)
    # a refused input: releasing a cluster that holds nothing (replay records 'rejected' and goes on)
    tr.at(0.5)("release", cluster_id="ppl1_actor_train")
    for pid in ("ppl1", "ppl2"):
        tr.at(0.5)("await_release", pipeline_id=pid).cycle()
        tr("unregister", pipeline_id=pid)
    return tr


def roll_dual_4gpu() -> Trace:
    """ROLL-style dual pipeline (ppl1 train/ref [0,1], ppl2 train/ref [2,3], both infer [0..3]):
    the whole GEN cluster shrinks to zero at each step via await_release, then
    REF_LOG_PROBS -> OLD_LOG_PROBS -> ACTOR_TRAINING on the training GPUs, then release."""
    tr = Trace(1, 4)
    pipes = (("ft_000000000001", [0, 1]), ("ft_000000000002", [2, 3]))
    for pid, train in pipes:
        tr(
            "register",
            pipeline_id=pid,
            cluster_tp_configs={"actor_train": 1, "actor_infer": 1, "reference": 1},
            cluster_device_mappings={"actor_train": train, "actor_infer": [0, 1, 2, 3], "reference": train},
        )
        tr("admit", pipeline_id=pid)
    for step in range(3):
        for pid, _ in pipes:
            tr.at(0.2)(
                "request",
                cluster_id=f"{pid}_actor_infer",
                priority="GENERATION",
                global_step=step,
                step_target_estimate=16,
            )
        tr.cycle()
        for done in (4, 8, 12, 16):
            for n, (pid, _) in enumerate(pipes):
                tr.at(1.5)("progress", pipeline_id=pid, step_target=16, completed=max(0, done - 4 * n), mode="train")
            tr.cycle(reason="progress")
        for pid, _ in pipes:
            g = f"{pid}_"
            tr.at(0.5)("await_release", pipeline_id=pid, global_step=step).cycle()
            tr("clear_progress", pipeline_id=pid)
            tr.at(0.3)("request", cluster_id=g + "reference", priority="REF_LOG_PROBS", global_step=step).cycle()
            tr.at(2.0)(
                "release_then_request",
                release_cluster_id=g + "reference",
                release_global_step=step,
                request_cluster_id=g + "actor_train",
                request_priority="OLD_LOG_PROBS",
                request_global_step=step,
            ).cycle()
            tr.at(2.0)(
                "release_then_request",
                release_cluster_id=g + "actor_train",
                release_global_step=step,
                request_cluster_id=g + "actor_train",
                request_priority="ACTOR_TRAINING",
                request_global_step=step,
            ).cycle()
            tr.at(5.0)("release", cluster_id=g + "actor_train", global_step=step)
    return tr


def gap_ratio_3pipelines() -> Trace:
    """Three pipelines share 8 GPUs by remaining demand; background rebalance moves bundles."""
    tr = Trace(1, 8)
    specs = (
        ("pa", 1, [0, 1, 2, 3, 4, 5, 6, 7]),
        ("pb", 1, [0, 1, 2, 3, 4, 5, 6, 7]),
        ("pc", 1, [0, 1, 2, 3, 4, 5, 6, 7]),
    )
    for pid, tp, infer in specs:
        tr(
            "register",
            pipeline_id=pid,
            cluster_tp_configs={"actor_infer": tp},
            cluster_device_mappings={"actor_infer": infer},
        )
        tr("admit", pipeline_id=pid)
    for pid, _, _ in specs:
        tr.at(0.1)("request", cluster_id=f"{pid}_actor_infer", priority="GENERATION", step_target_estimate=32)
    tr.cycle()
    # demand diverges: pa nearly done, pb half, pc barely started
    for completed in ((8, 8, 0), (24, 12, 2), (31, 16, 4), (32, 20, 8)):
        tr.at(2.0)
        for (pid, _, _), c in zip(specs, completed):
            tr("progress", pipeline_id=pid, step_target=32, completed=c, mode="train")
        tr.cycle(reason="background:2.1")
    # pa finishes its step and clears its progress; its GEN allocation stays (B-13 wedge shape)
    tr.at(2.0)("clear_progress", pipeline_id="pa").cycle(reason="background:2.1")
    # lock gap: a planned release lands between plan and commit and is acked prematurely
    tr.at(1.0).cycle(phase="plan", reason="background:2.1")
    tr("await_release", pipeline_id="pb")
    tr.cycle(phase="commit")
    tr.at(1.0).cycle()
    return tr


if __name__ == "__main__":
    partial_overlap_2gpu().save("partial_overlap_2gpu.jsonl")
    roll_dual_4gpu().save("roll_dual_4gpu.jsonl")
    gap_ratio_3pipelines().save("gap_ratio_3pipelines.jsonl")
    print("wrote 3 traces to", HERE)
