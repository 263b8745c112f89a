"""Scheduler-model cycle cost at 64 / 256 / ~1000 GPUs (a printed benchmark, not a test).

Two figures per size, each the median of several runs on this machine:

* bootstrap: every pipeline's first GENERATION request arrives at once and one cycle
  grants them all (the gap-ratio planner activates every bundle);
* steady state: pipelines hold their GEN ranks, one pipeline's progress report moves,
  and the cycle that follows rebalances (usually zero to a few bundles).

Topology: 8 GPUs per node, tp=1 inference, pipeline i's actor_infer maps a window of
2·G/P GPUs starting at i·G/P (wrapping), so each GPU is wanted by two pipelines —
donors and receivers overlap as in a shared cluster.

RLix: its own scheduler is timed live on the same bootstrap workload, alternating with
the model, in the same sitting (benchmarks/rlix_live.py: the pinned rlops/rlix f77d913
archive unpacked into a temporary folder, or ``--rlix CHECKOUT``); the speed-up is the
ratio of the two medians. Without an RLix source (or with ``--stored``) its figures from
one quiet run are printed instead, labelled as stored: 1.9 / 10.6 / 179 ms for the
bootstrap cycle at 64 / 256 / 992 GPUs and ~1.3 ms in steady state at 992 GPUs.
Target: >= 10x faster, growth no worse than linear in GPUs x pipelines.

    python benchmarks/scheduler_cycles.py [--reps N] [--rlix CHECKOUT | --stored]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness.scheduler import Priority, SchedulerModel  # noqa: E402
from harness.scheduler.progress import ProgressReport  # noqa: E402
from harness.scheduler.topology import ClusterTopology  # noqa: E402

SIZES = ((64, 8), (256, 16), (512, 32), (992, 64))
#: RLix's bootstrap cycle measured once on a quiet machine (no 512-GPU figure): printed,
#: labelled as stored, only where the live RLix is not to be had (see rlix_live.py)
RLIX_BOOTSTRAP_MS = {64: 1.9, 256: 10.6, 512: None, 992: 179.0}
RLIX_STEADY_MS_992 = 1.3


def build(gpus: int, pipelines: int) -> SchedulerModel:
    m = SchedulerModel(ClusterTopology(gpus // 8, 8))
    stride = gpus // pipelines
    for i in range(pipelines):
        window = sorted({(i * stride + k) % gpus for k in range(2 * stride)})
        pid = f"p{i:03d}"
        m.register(pid, {"actor_infer": 1}, {"actor_infer": window})
        m.admit(pid)
    return m


def bootstrap(gpus: int, pipelines: int):
    m = build(gpus, pipelines)
    for i in range(pipelines):
        m.request(f"p{i:03d}_actor_infer", Priority.GENERATION, step_target_estimate=16)
    t0 = time.perf_counter()
    signals = m.run_cycle()
    dt = time.perf_counter() - t0
    m.drain()
    assert len(signals) == pipelines, "bootstrap must signal every pipeline"
    return dt, m


def steady(m: SchedulerModel, pipelines: int, reps: int, seed: int = 7):
    rng = random.Random(seed)
    for i in range(pipelines):
        m.report_progress(ProgressReport(f"p{i:03d}", step_target=64, completed=rng.randint(0, 63)))
    m.run_cycle()
    m.drain()
    times, moved = [], 0
    for k in range(reps):
        pid = f"p{rng.randrange(pipelines):03d}"
        m.report_progress(ProgressReport(pid, step_target=64, completed=rng.randint(0, 64)))
        t0 = time.perf_counter()
        m.run_cycle()
        times.append(time.perf_counter() - t0)
        moved += sum(len(e["bundles"]) for r in m.drain() if r["kind"] == "plan" for e in r["expands"])
    return times, moved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--reps", type=int, default=7, help="bootstrap repetitions per size and scheduler (median is printed)"
    )
    ap.add_argument("--steady-reps", type=int, default=200, help="steady-state cycles per size")
    ap.add_argument("--rlix", help="an RLix checkout to time live (default: the pinned archive, see rlix_live.py)")
    ap.add_argument("--stored", action="store_true", help="do not time RLix: print its stored figures")
    args = ap.parse_args(argv)
    from rlix_live import RLixBootstrap, rlix_source

    with contextlib.ExitStack() as stack:
        source = None if args.stored else stack.enter_context(rlix_source(args.rlix))
        rlix = RLixBootstrap(source) if source else None
        load = os.getloadavg()
        print(
            f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1/5/15 min) on {os.cpu_count()} CPUs; RLix: "
            + (
                "LIVE, timed in this sitting, alternating with the model (rlops/rlix f77d913 SchedulerImpl)"
                if rlix
                else "STORED figures from a quiet run, not this sitting (no RLix source found, or --stored): on a "
                "loaded machine the speed-up column understates the model"
            )
        )
        print(
            f"{'GPUs':>5} {'pipes':>5} | {'bootstrap ms':>12} {'RLix ms':>8} {'speed-up':>8} {'us/(GPU*pipe)':>13} | "
            f"{'steady med ms':>13} {'p90 ms':>7} {'bundles moved':>13}"
        )
        rows = []
        for gpus, pipes in SIZES:
            boots, theirs, model = [], [], None
            for _ in range(args.reps):  # alternating: both see the same load
                dt, model = bootstrap(gpus, pipes)
                boots.append(dt)
                if rlix is not None:
                    theirs.append(rlix.time_ms(gpus, pipes))
            b = statistics.median(boots) * 1e3
            ref = statistics.median(theirs) if theirs else RLIX_BOOTSTRAP_MS[gpus]
            times, moved = steady(model, pipes, args.steady_reps)
            times.sort()
            med, p90 = statistics.median(times) * 1e3, times[int(0.9 * (len(times) - 1))] * 1e3
            per = b * 1e3 / (gpus * pipes)
            rows.append((gpus, pipes, b, per, med))
            ref_text = f"{ref:>8.1f} {ref / b:>7.1f}x" if ref else f"{'-':>8} {'-':>8}"
            print(f"{gpus:>5} {pipes:>5} | {b:>12.2f} {ref_text} {per:>13.3f} | {med:>13.3f} {p90:>7.3f} {moved:>13}")
    g0, p0, b0, _, _ = rows[0]
    g2, p2, b2, _, s2 = rows[-1]
    growth = (b2 / b0) / ((g2 * p2) / (g0 * p0))
    print(
        f"\nbootstrap cost growth from {g0}x{p0} to {g2}x{p2}: {b2 / b0:.1f}x for {(g2 * p2) / (g0 * p0):.0f}x more GPUs*pipelines "
        f"(ratio {growth:.2f}; <= 1 means no worse than linear)"
    )
    print(
        f"steady state at {g2} GPUs: {s2:.3f} ms vs RLix's stored {RLIX_STEADY_MS_992} ms ({RLIX_STEADY_MS_992 / s2:.1f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
