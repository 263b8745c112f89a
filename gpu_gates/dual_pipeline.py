"""Gate 4: two pipelines time-share GPUs under the harness scheduler and control logic.

    torchrun --nproc-per-node 6 gpu_gates/dual_pipeline.py [--steps 3] [--report PATH] [--explore SEED]

Roles (6 processes): ppl1 trainer (logical GPU 0), ppl1 inference dp0 (GPU 0) and dp1
(GPU 1); ppl2 trainer (GPU 1), ppl2 dp0 (GPU 0), dp1 (GPU 1) — the NeMo 2-GPU partial
overlap: ppl1 train [0] infer [0,1]; ppl2 train [1] infer [0,1]. Rank 0 also runs the
driver (gpu_gates/dual/driver.py): the harness ``SchedulerModel`` and the harness control
logic for both pipelines, every effect done for real by the worker that owns it (real
training steps, CPU bucket caches, dynamic sync groups, IPC, bit-exact digest checks).

Verdict, from the event log with the harness's own invariant checks
(``harness.logs.invariants``): GPU single ownership, T1 < T2 < T3 resize order, no rank
removed and re-added in a cycle, activation only after sync + finalize + publish,
versions published once per cache and never before their sync, ``actor_train`` released
only after refresh + publish, step order, no cache build or promote while a sync reads
the cache; plus every pipeline finished ``--steps``
steps and every synced rank matched its owner bit for bit.

Logical GPUs decide the comm plan (same GPU as the cache owner → IPC, else a dynamic
group). On a GPU node with ``--backend nccl`` each process has its own device (NCCL needs
one GPU per rank), so the sharing of two GPUs is logical; on CPU everything runs on gloo.
Outputs next to the report: ``<report>.driver.jsonl`` (the harness log the checks read),
``<report>.trace.json`` (Perfetto) and ``<report>.timeline.png``.

``--explore SEED`` sleeps small seeded delays before the driver's concurrent operations
(``gpu_gates/dual/explore.py``), so an ordering the simulator's exploration found can be
tried on real process groups; the driver log's header records the seed and every delay.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script by torchrun: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import threading  # noqa: E402
from typing import Any, Callable, Dict, List, Optional, Tuple  # noqa: E402

from gpu_gates.runtime import pg_registry  # noqa: E402
from gpu_gates.runtime.gate import AFTER_FAILURE_MARKER, GateContext, GateSpec, positive_float, positive_int, run_gate  # noqa: E402
from gpu_gates.dual.explore import DEFAULT_MAX_DELAY_S, GateExplorer  # noqa: E402
from gpu_gates.dual.script import HandoverScript  # noqa: E402
from gpu_gates.dual.worker import WORLD, Worker  # noqa: E402
from harness.logs.invariants.ordering import resize_walk  # noqa: E402

CHECKS = (
    "gpu_ownership",
    "resize_order",
    "no_readd_in_cycle",
    "activate_after_sync",
    "versions",
    "release_after_publish",
    "step_order",
    "cache_lock",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=positive_int, default=3, help="training steps per pipeline (>= 3 for the gate)")
    parser.add_argument("--bucket-size-bytes", type=positive_int, default=16384)
    parser.add_argument(
        "--shrink-drain-timeout-s",
        type=positive_float,
        default=30.0,
        help="how long a shrink's drain may wait for the aborted requests to leave its ranks "
        "(RLix's rebalance_on_shrink, 30 s); past it the run fails",
    )
    parser.add_argument(
        "--explore",
        type=_seed,
        metavar="SEED",
        help="sleep small seeded delays before concurrent operations (gpu_gates/dual/explore.py)",
    )
    parser.add_argument(
        "--explore-max-delay-s",
        type=positive_float,
        default=DEFAULT_MAX_DELAY_S,
        metavar="S",
        help=f"with --explore: the bound of one delay (default {DEFAULT_MAX_DELAY_S} s)",
    )


def _seed(text: str) -> int:
    value = int(text)
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be in 0..2**63-1, got {value}")
    return value


def check_world(args: argparse.Namespace, world: int) -> Optional[str]:
    if world != WORLD:
        return f"needs exactly {WORLD} ranks (2 pipelines x (trainer + 2 inference ranks)), got world size {world}"
    return None


def _outputs(ctx: GateContext, records: List[Dict[str, Any]], out: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Write the driver log, then the Perfetto trace and the PNG, naming each in ``out``
    as soon as it exists (a report posted meanwhile lists what is already there)."""
    out = {} if out is None else out
    report = ctx.args.report
    if not report:
        return out
    stem = report[:-5] if report.endswith(".json") else report
    from harness.logs.writer import dumps, write_atomic

    write_atomic(stem + ".driver.jsonl", (dumps(r) for r in records))
    out["driver_log"] = stem + ".driver.jsonl"
    try:
        from harness.logs.outputs.perfetto import write_chrome_trace

        write_chrome_trace(records, stem + ".trace.json")
        out["perfetto"] = stem + ".trace.json"
        from harness.logs.outputs.timeline import write_timeline_png

        write_timeline_png(records, stem + ".timeline.png")
        out["png"] = stem + ".timeline.png"
    except ImportError as exc:  # matplotlib is optional on GPU nodes
        out["png_skipped"] = f"{exc}"
    return out


def _order_evidence(records: List[Dict[str, Any]]) -> List[str]:
    """Per cycle that shrank ranks: T1 (last shrink returned) < T2 (first expand started)
    < T3 (first waiter signalled), read by the ``resize_order`` check's own walk."""
    lines = []
    for c, m in sorted(resize_walk(records)[1].items()):
        if m.t1 is not None:
            parts = [f"T1 {m.t1:.3f}s"] + [
                f"{k.upper()} {t:.3f}s" for k, t in (("t2", m.t2), ("t3", m.t3)) if t is not None
            ]
            lines.append(f"cycle {c}: " + " < ".join(parts))
    return lines


def _exercised_cycles(records: List[Dict[str, Any]]) -> List[int]:
    """Cycles that both shrank and expanded ranks: where T1 < T2 < T3 has something to check."""
    return sorted(c for c, m in resize_walk(records)[1].items() if m.t1 is not None and m.t2 is not None)


def _check_no_group_survives(ctx: GateContext, baseline: Dict[str, Any], after_failure: bool = False) -> None:
    """Every process group the run made is gone. Checked on every exit path: a failed run
    must not hide a leaked group. After a failure (a peer hung or died) a group that rank
    still belongs to cannot be torn down, so the leak is reported as a consequence and the
    report's headline stays with the failure that caused it."""
    survivors = [i.label() for n, i in sorted(pg_registry.live_groups().items()) if n not in baseline]
    detail = f"process group(s) alive at the end of the run: {', '.join(survivors)}"
    if after_failure:
        detail += f" ({AFTER_FAILURE_MARKER})"
    ctx.check("no_group_survives", not survivors, detail)


def _record_verdicts(ctx: GateContext, records: List[Dict[str, Any]], driver_errors: List[str]) -> list:
    """The harness's invariant checks over the driver log, then the driver's own errors:
    an order bug is the cause and the errors it led to follow it. On a run cut short the
    log is a prefix of a run, on which each of these checks (all safety properties) holds
    or fails as it would on the whole run."""
    from harness.logs.invariants import check_log

    violations = check_log(records, CHECKS)
    for name in CHECKS:
        found = [v for v in violations if v.invariant == name]
        ctx.check(f"invariant:{name}", not found, "; ".join(str(v) for v in found[:3]))
    for err in driver_errors:
        ctx.fail(f"driver: {err}")
    return violations


def run(ctx: GateContext) -> None:
    """Rank 0 runs the driver beside its own trainer role; every other rank serves its role."""
    worker = Worker(ctx)
    baseline = pg_registry.live_groups()
    ctx.data.update(role=f"{worker.pipeline} {worker.role}" + ("" if worker.dp is None else f" dp{worker.dp}"))
    if ctx.rank != 0:
        try:
            worker.serve()
        except BaseException:
            worker.drop_training_group()
            _check_no_group_survives(ctx, baseline, after_failure=True)
            raise
        _check_no_group_survives(ctx, baseline, after_failure=worker.run_failed)
        return
    driver = _driver(ctx, worker)
    salvage = _salvage(ctx, driver)
    ctx.salvage.append(salvage)
    thread = threading.Thread(target=driver.run, daemon=True)
    thread.start()
    try:
        worker.serve()  # rank 0 is also ppl1's trainer: serve until the driver says stop
    except BaseException:
        ctx.salvage.remove(salvage)  # once, here, not again on an emergency finish
        salvage()
        worker.drop_training_group()
        _check_no_group_survives(ctx, baseline, after_failure=True)
        # The driver's own error (a resize or drain that timed out) stopped this rank's
        # serve loop with the abort it posted: record the checks and that error here, so
        # the cause heads the report rather than this rank's knock-on abort, whichever
        # peers still manage to report before rank 0's collection window closes.
        records, errors = _driver_snapshot(driver)
        _record_verdicts(ctx, records, errors)
        raise
    ctx.salvage.remove(salvage)
    thread.join(10.0)
    _verify(ctx, driver, baseline)


def _driver(ctx: GateContext, worker: Worker):
    """The driver of both pipelines, with the gate's flags and test hooks."""
    from gpu_gates.dual.driver import Driver

    solo = ctx.hooks.get("solo_pipelines") is not None
    return Driver(
        ctx,
        steps=ctx.args.steps,
        bucket_size=ctx.args.bucket_size_bytes,
        swap_resize_order=ctx.hooks.get("swap_resize_order") is not None,
        own_rank_serve=worker.serve,
        late_receivers_s=ctx.hooks.seconds("late_receivers", 1.0),
        late_start_s=ctx.hooks.seconds("late_start", 0.2),
        solo=solo,
        script=None if solo else HandoverScript(),
        shrink_drain_timeout_s=ctx.args.shrink_drain_timeout_s,
        explorer=None if ctx.args.explore is None else GateExplorer(ctx.args.explore, ctx.args.explore_max_delay_s),
    )


def _driver_snapshot(driver) -> Tuple[List[Dict[str, Any]], List[str]]:
    """The driver's records and errors so far, under its lock if it can be had within 1 s
    (a driver thread stuck while holding it must not stop the report)."""
    got = driver.lock.acquire(timeout=1.0)
    try:
        return list(driver.log.records), list(driver.errors)
    finally:
        if got:
            driver.lock.release()


def _salvage(ctx: GateContext, driver) -> Callable[[], None]:
    def salvage() -> None:
        """The run ended early (timeout, a failed peer): keep the partial driver log and
        what each interpreter was executing, so the report shows where things stood."""
        driver.record_explore()
        records, _ = _driver_snapshot(driver)
        # what the run reached first (cheap), then the output files (slow: a PNG): a
        # deadline that finishes this rank meanwhile still reports where things stood
        out: Dict[str, Any] = {}
        ctx.data.update(
            driver_activity=dict(driver.activity), records=len(records), steps_done=dict(driver.steps_done), outputs=out
        )
        _outputs(ctx, records, out)

    return salvage


def _verify(ctx: GateContext, driver, baseline: Dict[str, Any]) -> None:
    """After a finished driver: the invariant checks on its log, the steps done, the digests,
    and the figures of the report."""
    ctx.set_phase("verify")
    driver.record_explore()
    # after a driver error (a resize that timed out on a hung peer) a leaked group is its consequence
    _check_no_group_survives(ctx, baseline, after_failure=bool(driver.errors))
    records = driver.log.records
    violations = _record_verdicts(ctx, records, driver.errors)
    if not driver.errors:  # after a driver error the missing steps are its consequence, not news
        for pid, n in driver.steps_done.items():
            ctx.check("steps_done", n >= ctx.args.steps, f"{pid} finished {n} of {ctx.args.steps} steps")
        exercised = _exercised_cycles(records)
        ctx.check(
            "shrink_expand_cycle",
            bool(exercised),
            "no scheduler cycle both shrank and expanded ranks: the resize-order check had nothing to check",
        )
        ctx.data["exercised_cycles"] = exercised
    published = {pid: driver.ctxs[pid].versions.published for pid in driver.ctxs}
    ctx.check("no_digest_mismatch", not driver.digest_failures, "; ".join(driver.digest_failures))
    ctx.data.update(
        steps_done=driver.steps_done,
        published=published,
        cycles=driver.model.state.cycle_counter,
        order=_order_evidence(records),
        records=len(records),
        outputs=_outputs(ctx, records),
        violations=[str(v) for v in violations[:20]],
        driver_activity=dict(driver.activity),
    )
    if driver.explorer is not None:
        ctx.data["explore"] = {
            "seed": driver.explorer.seed,
            "delays_slept": sum(map(len, driver.explorer.slept.values())),
        }


def summarize(args: argparse.Namespace, results: List[Dict[str, Any]]) -> Tuple[Dict[str, Any], List[str]]:
    d = next((r.get("data") or {} for r in results if r["rank"] == 0), {})
    return {
        "steps_done": d.get("steps_done"),
        "published_versions": d.get("published"),
        "cycles": d.get("cycles"),
        "resize_order": d.get("order", [])[:20],
        "driver_records": d.get("records"),
        "outputs": d.get("outputs", {}),
        "violations": d.get("violations", []),
        "driver_activity": d.get("driver_activity", {}),
        **({"explore": d["explore"]} if "explore" in d else {}),
    }, []


SPEC = GateSpec(
    name="dual_pipeline",
    description=__doc__.splitlines()[0],
    default_world=WORLD,
    default_cycles=1,
    add_arguments=add_arguments,
    check_world=check_world,
    run=run,
    summarize=summarize,
)


if __name__ == "__main__":
    sys.exit(run_gate(SPEC))
