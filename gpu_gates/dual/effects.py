"""Gate 4 driver, part two: what each control-logic effect does on real hardware.

:class:`~gpu_gates.dual.driver.Driver` interprets the harness control generators; for an
effect ``X`` it calls ``self._X(pipeline_id, effect)`` defined here (as the simulator's
``RankEffects``/``RefitEffects`` mixins do for simulated time). Scheduler effects go to the
scheduler model, training and refit effects become commands for the worker processes,
routing and lifecycle effects update the driver's own books.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

from gpu_gates.dual.worker import ROLES, rank_of
from harness.control.cache_lock import CacheLockRecords
from harness.control.reporting import progress_input, request_input
from harness.control.resize import COORDINATOR_GONE
from harness.refit.comm_plan import build_comm_plan

PIPELINES = ("ppl1", "ppl2")
TRAIN_GPU = {"ppl1": 0, "ppl2": 1}
INFER_GPUS = (0, 1)


class DriverError(RuntimeError):
    pass


class DriverEffects:
    """Effect handlers; the state they use (channels, model, books) is the Driver's."""

    # scheduler effects
    def _RequestGpus(self, pid, e):
        cid = f"{pid}_{e.cluster}"
        return self.wait_ticket(self.call_model("request", *request_input(self.model, cid, e)))

    def _ReleaseGpus(self, pid, e):
        cid = f"{pid}_{e.cluster}"
        fields = {"cluster_id": cid} if e.global_step is None else {"cluster_id": cid, "global_step": e.global_step}
        self.call_model("release", fields, lambda: self.model.release(cid, global_step=e.global_step))

    def _AwaitRelease(self, pid, e):
        fields = {"pipeline_id": pid} if e.global_step is None else {"pipeline_id": pid, "global_step": e.global_step}
        self.wait_ticket(
            self.call_model(
                "await_release", fields, lambda: self.model.await_release(pipeline_id=pid, global_step=e.global_step)
            )
        )

    # training effects
    def _ReloadTrainComm(self, pid, e):
        return self._trainer(pid).call("reload_comm", step=self.ctxs[pid].step)

    def _Compute(self, pid, e):
        return self._trainer(pid).call("train", step=e.global_step)

    def _BuildCache(self, pid, e):
        with self._cache_held(pid, "build", e.version):  # never while a sync reads the cache
            self._trainer(pid).call("build_cache", version=e.version, bucket_size=self.bucket_size)
            self.ctxs[pid].versions.cache_built(e.version)

    def _PromoteCache(self, pid, e):
        with self._cache_held(pid, "promote", e.version):
            self._trainer(pid).call("promote", version=e.version)
            self.ctxs[pid].versions.promote(e.version)

    @contextlib.contextmanager
    def _cache_held(self, pid: str, holder: str, version: Optional[int]) -> Iterator[None]:
        """RLix's ``_cache_lock`` on the pipeline's cache owner, held by a build, a promote
        or a whole sync, as the simulator's handlers hold theirs (simulators/pipelines/cache_lock.py),
        each acquire and release a ``cache_lock`` record (``harness.control.cache_lock``). The trainer
        rank's cache also locks a build out while it is read (its data's own guard); this
        lock is the exclusion where the driver orders the effects, and the log's evidence
        of it: without it, a build of v3 and a sync of v2 issued from two driver threads
        overlapped in the log on a loaded machine. Waiting for it is bounded like any
        other wait of the driver's."""
        lock, end = self.cache_locks[pid], time.monotonic() + self.ctx.args.timeout_s
        while not lock.acquire(timeout=0.05):
            if self.errors:
                raise DriverError("aborted: " + self.errors[0])
            if time.monotonic() >= end:
                raise DriverError(f"{pid}: gave up waiting for the cache lock ({holder} of v{version})")
        records = CacheLockRecords(self.emit, pipeline_id=pid)
        records.acquired(holder, version)
        try:
            yield
        finally:
            records.released(holder, version)
            lock.release()

    def _OffloadTraining(self, pid, e):
        self._trainer(pid).call("offload")

    def _DestroyTrainComm(self, pid, e):
        return self._trainer(pid).call("destroy_comm")

    def _LockCoordinator(self, pid, e):
        self.coord_lock[pid].acquire()
        if self.gone[pid]:  # the pipeline unregistered while this call waited: its coordinator is gone
            self.coord_lock[pid].release()
            return COORDINATOR_GONE

    def _UnlockCoordinator(self, pid, e):
        self.coord_lock[pid].release()

    # inference + refit effects
    def _ActiveRanks(self, pid, e):
        return sorted(self.routable[pid])

    def _MarkInactive(self, pid, e):
        if set(e.ranks) & self.routable[pid]:
            raise DriverError(
                f"{pid}: expand of ranks {sorted(set(e.ranks) & self.routable[pid])} that are still routable"
            )

    def _Wake(self, pid, e):
        for d in e.ranks:
            self._rank_state(pid, d, "wake")
            self._infer(pid, d).call("wake", level=self.ctxs[pid].sleep_level)
            self._rank_state(pid, d, "woken")

    def _SyncFromCache(self, pid, e):
        with self._cache_held(pid, "sync", e.version):  # the whole sync, as RLix holds it
            return self._sync_from_cache(pid, e)

    def _sync_from_cache(self, pid, e):
        owner = rank_of(pid, "trainer")
        plan = build_comm_plan((0, ROLES[owner][3]), {d: [(0, ROLES[rank_of(pid, "infer", d)][3])] for d in e.ranks})
        ipc_ranks = [rank_of(pid, "infer", d) for d in sorted(plan.ipc)]
        bcast_ranks = [rank_of(pid, "infer", d) for d in sorted(plan.broadcast)]
        ranks_of = {str(d): rank_of(pid, "infer", d) for d in e.ranks}
        with self.lock:
            self.sync_n += 1
            sync_id = f"{pid}_s{self.sync_n}_v{e.version}"
        results: Dict[int, Any] = {}
        errors: List[str] = []

        def run(rank: int, fn: Callable[[], Any]) -> None:
            try:
                results[rank] = fn()
            except Exception as exc:
                errors.append(str(exc))

        threads = [
            threading.Thread(
                target=run,
                args=(
                    owner,
                    lambda: self.channels[owner].call(
                        "sync_send",
                        sync_id=sync_id,
                        version=e.version,
                        rank_of=ranks_of,
                        ipc_dp=sorted(plan.ipc),
                        bcast_dp=sorted(plan.broadcast),
                    ),
                ),
                daemon=True,
            )
        ]
        for r in ipc_ranks + bcast_ranks:
            threads.append(
                threading.Thread(
                    target=run,
                    args=(
                        r,
                        lambda r=r: self.channels[r].call(
                            "sync_recv", sync_id=sync_id, version=e.version, owner=owner, rank_of=ranks_of
                        ),
                    ),
                    daemon=True,
                )
            )
        for i, th in enumerate(threads):
            if i == 1 and self.late_receivers_s:
                time.sleep(self.late_receivers_s)
            th.start()
        for th in threads:
            th.join()
        if errors:
            raise DriverError("; ".join(errors))
        for d in e.ranks:
            self._rank_state(pid, d, "refreshed" if d in self.routable[pid] else "synced", version=e.version)
        return {"ipc": ipc_ranks, "broadcast": bcast_ranks}

    def _Finalize(self, pid, e):
        for d in e.ranks:
            out = self._infer(pid, d).call("finalize", version=self.ctxs[pid].versions.active)
            if not out["ok"]:
                self.digest_failures.append(
                    f"{pid} dp{d}: tensors {out['mismatched']} differ from the owner's version "
                    f"{self.ctxs[pid].versions.active}"
                )
                raise DriverError(self.digest_failures[-1])
            self._rank_state(pid, d, "finalized")

    def _PublishVersion(self, pid, e):
        self.ctxs[pid].versions.publish(e.version)
        return self.ctxs[pid].versions.published

    def _Activate(self, pid, e):
        for d in e.ranks:
            self._rank_state(pid, d, "activated")
            with self.routing_lock[pid]:
                self.routable[pid].add(d)

    def _Abort(self, pid, e):
        """The ranks leave routing, then their requests in flight are aborted (each ends at
        its next token and is re-dispatched by the rollout); the result is how many each had."""
        aborted = []
        with self.routing_lock[pid]:  # no submission slips in between
            for d in e.ranks:
                self.routable[pid].discard(d)
            for d in e.ranks:
                aborted.append(self._infer(pid, d).call("abort"))
        for d in e.ranks:
            self._rank_state(pid, d, "abort")
        return {"in_flight": aborted}

    def _Drain(self, pid, e):
        """Poll each rank's in-flight count to zero, within the shrink-drain timeout (RLix's
        ``rebalance_on_shrink``). A drain that runs out is a ``timeout`` record and a driver
        error: the run fails fast, as RLix does, instead of sleeping ranks that still serve."""
        since, limit = self.now(), self.shrink_drain_timeout_s
        end = time.monotonic() + limit
        first: List[int] = []
        polls = 0
        while True:
            left = [self._infer(pid, d).call("in_flight") for d in e.ranks]
            first = first or left
            polls += 1
            if not any(left):
                return {"in_flight": first, "polls": polls}
            if self.errors:
                raise DriverError("aborted: " + self.errors[0])
            if time.monotonic() >= end:
                self.emit("timeout", pipeline_id=pid, what="shrink_drain", limit_s=limit, since=since)
                busy = ", ".join(f"dp{d}: {n}" for d, n in zip(e.ranks, left) if n)
                raise DriverError(f"shrink_drain timed out after {limit:g} s with requests still in flight ({busy})")
            time.sleep(0.01)

    def _Sleep(self, pid, e):
        for d in e.ranks:
            self._infer(pid, d).call("sleep", level=e.level)
            self._rank_state(pid, d, "slept", level=e.level)

    # workload effects
    def _report(self, pid: str, collected: int, new_batch: bool) -> None:
        """Progress through the coordinator's 2 % buckets, as the scheduler sees it."""
        out = progress_input(self.progress[pid], pid, self.ctxs[pid].step_target, collected, new_batch)
        if out is not None:
            self.call_model("progress", out[0], lambda: self.model.report_progress(out[1]))

    def _wait_until(self, cond: Callable[[], bool], limit_s: float, what: str) -> None:
        """Wait for the choreography's condition; never give up silently: a wait that
        runs out is a driver error (the gate fails with what it waited for)."""
        end = time.monotonic() + limit_s
        while not cond():
            if self.errors:
                raise DriverError("aborted: " + self.errors[0])
            if time.monotonic() >= end:
                raise DriverError(f"gave up after {limit_s:g} s waiting for {what}")
            time.sleep(0.01)

    def _WaitBatch(self, pid, e):
        """Generate a batch: submit requests to the routable ranks (at most one in flight per
        rank, never more than the batch still needs), collect what ended, re-dispatch what a
        shrink aborted. Routing blocks while no rank is routable."""
        generated, target = 0, self.ctxs[pid].step_target
        try:
            while generated < target:
                if self.errors:
                    raise DriverError("aborted: " + self.errors[0])
                self._submit(pid, target - generated)
                done = self._collect(pid)
                generated += done
                if done:
                    self._report(pid, min(generated, target), False)
                time.sleep(0.01)  # rollout takes time: give the scheduler room to rebalance
        finally:
            self.batches_done[pid] += 1
        return generated

    def _submit(self, pid: str, needed: int) -> None:
        with self.routing_lock[pid]:  # ranks do not leave routing while we submit to them
            for d in sorted(self.routable[pid]):
                if needed - sum(self.outstanding[(pid, r)] for r in (0, 1)) <= 0:
                    return
                if self.outstanding[(pid, d)] == 0:
                    with self.lock:
                        self.request_n += 1
                        rid = self.request_n
                    self._infer(pid, d).call("submit", request_id=rid, tokens=4)
                    self.outstanding[(pid, d)] += 1

    def _collect(self, pid: str) -> int:
        """Requests that ended on any rank with some outstanding; returns how many completed."""
        completed = 0
        for d in (0, 1):
            if self.outstanding[(pid, d)]:
                for _rid, status in self._infer(pid, d).call("collect"):
                    self.outstanding[(pid, d)] -= 1
                    completed += status == "done"
        return completed

    def _BeginProgressBatch(self, pid, e):
        self._report(pid, 0, True)
