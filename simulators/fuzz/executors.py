"""Where the seeds of a sweep run: local worker processes, or tasks on a Ray cluster.

Both executors run :func:`isolated_seed`: the seed in a child process of its own with a
wall-clock budget, so that a seed which hangs or kills its process becomes a result
(``timeout``, ``crashed``) carrying its seed, and the sweep goes on. Results are yielded
as seeds complete; the sweep sorts them by seed, so completion order never shows.

Local: one forked child per seed, at most ``workers`` at a time, all waited on from one
thread (no fork from a multi-threaded parent). Ray: the same function as a Ray task (it
forks inside the Ray worker), so a Ray cluster adds machines without changing a result.
"""

from __future__ import annotations

import multiprocessing
import traceback
from multiprocessing.connection import wait
from typing import Any, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional

from simulators.fuzz.seed_run import run_seed

_GRACE_S = 5.0  # beyond the budget, for a child to hand over a finished result

Result = Dict[str, Any]


def _context():
    # fork is cheap (the parent has imported the simulator already) and available on the
    # platforms the harness runs on; elsewhere fall back to spawn
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def crashed(seed: int, e: BaseException) -> Result:
    """The result of a seed whose run raised: the exception's type is the signature."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f" at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
    return {
        "seed": seed,
        "status": "crashed",
        "signature": f"crashed:{type(e).__name__}",
        "detail": f"{type(e).__name__}: {e}{where}",
    }


def _child(conn, job: "Job") -> None:
    try:
        res = job.fn(*job.args)
    except BaseException as e:  # an exception escaping the simulator is a finding, not a sweep error
        res = dict(crashed(job.seed, e), **(job.extra or {}))
    conn.send(res)
    conn.close()


def _lost(job: "Job", status: str, detail: str) -> Result:
    return {"seed": job.seed, "status": status, "signature": status, "detail": detail, **(job.extra or {})}


class Job(NamedTuple):
    """``fn(*args)`` for ``seed``, run in a child process; returns a result dict. ``extra``
    goes into the result of a job that crashed or ran out of time (what else names the run:
    its schedule seed)."""

    seed: int
    fn: Callable[..., Result]
    args: tuple
    extra: Optional[Dict[str, Any]] = None


def seed_job(seed: int, explore: Optional[Any] = None, upstream_as_findings: bool = False) -> Job:
    """One seed's run; ``explore`` (an ExploreSpec): under that schedule seed."""
    if explore is None:
        return Job(seed, run_seed, (seed, None, upstream_as_findings))
    return Job(seed, run_seed, (seed, explore, upstream_as_findings), {"explore": explore_fields(explore)})


def explore_fields(explore: Any) -> Dict[str, Any]:
    """What a result records of its schedule: the seed and strategy (the reproducer's flags)."""
    return {"seed": explore.seed, "strategy": explore.strategy}


class _Running:
    def __init__(self, ctx, job: Job, budget: Optional[float], now: float) -> None:
        self.job = job
        self.recv, send = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_child, args=(send, job), daemon=True)
        self.proc.start()
        send.close()
        self.deadline = None if budget is None else now + budget + _GRACE_S

    def finish(self) -> Result:
        try:
            res = self.recv.recv()
        except (EOFError, OSError):
            self.proc.join(1.0)
            code = self.proc.exitcode
            res = _lost(self.job, "crashed", f"the seed's process died (exit code {code}) without a result")
        self.proc.join(5.0)
        self.recv.close()
        return res

    def kill(self, budget: float) -> Result:
        self.proc.kill()
        self.proc.join(5.0)
        self.recv.close()
        return _lost(self.job, "timeout", f"over its time budget of {budget:g} s")


def run_isolated(
    jobs: Iterable[Job], *, workers: int, budget: Optional[float], clock: Callable[[], float]
) -> Iterator[Result]:
    """Run each job in a forked child, ``workers`` at a time; yield results as they end."""
    ctx = _context()
    pending = list(jobs)
    pending.reverse()
    running: List[_Running] = []
    try:
        while pending or running:
            while pending and len(running) < workers:
                running.append(_Running(ctx, pending.pop(), budget, clock()))
            deadlines = [r.deadline for r in running if r.deadline is not None]
            timeout = max(0.0, min(deadlines) - clock()) if deadlines else None
            ready = wait([r.recv for r in running], timeout=timeout)
            now = clock()
            for r in list(running):
                if r.recv in ready:
                    running.remove(r)
                    yield r.finish()
                elif r.deadline is not None and now >= r.deadline:
                    running.remove(r)
                    yield r.kill(budget)
    finally:
        for r in running:  # interrupted: no orphans
            r.proc.kill()
            r.proc.join(5.0)


def isolated_job(job: Job, budget: Optional[float]) -> Result:
    """One job in a child process of its own (the unit of work of a Ray task)."""
    import time

    return next(run_isolated([job], workers=1, budget=budget, clock=time.monotonic))


def run_on_ray(jobs: Iterable[Job], *, address: str, workers: int, budget: Optional[float]) -> Iterator[Result]:
    """Run each job as a Ray task (``address``: a cluster, or ``local`` to start a local
    Ray with ``workers`` CPUs); yield results as they end.

    The nodes must have rlharness importable (installed, or the same checkout on the same
    path, as a local cluster has)."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("--ray needs Ray: pip install 'rlharness[fuzz]' (or pip install ray)") from None
    started_here = not ray.is_initialized()  # a caller's Ray (tests, benchmarks) is left running
    if started_here:
        if address == "local":
            # worker_niceness 0: the tasks are the work asked for, at the priority the local
            # executor's processes get (Ray's default nice 15 would yield to any busy process)
            ray.init(
                num_cpus=workers,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                _system_config={"worker_niceness": 0},
            )
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    task = ray.remote(num_cpus=1, max_retries=0)(isolated_job)
    refs = {task.remote(job, budget): job for job in jobs}
    try:
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                job = refs.pop(ref)
                try:
                    yield ray.get(ref)
                except Exception as e:  # the Ray worker died (OOM killer, node lost)
                    yield _lost(job, "crashed", f"the Ray task died: {type(e).__name__}")
    finally:
        for ref in refs:
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()
