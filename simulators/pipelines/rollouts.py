"""The rollout side of a simulated pipeline: collecting trajectories into batches.

Mixed into :class:`simulators.pipelines.pipeline.PipelineSim` (its handlers are found there by
effect name, ``_<EffectName>``). Split out of ``pipeline.py`` so the workload loop reads
in one place: the router's completion callbacks (``_on_trajectory``, ``_on_give_up``)
fill the replay buffer and refill the collector, progress is reported to the scheduler
from the usable count, and ``WaitBatch`` takes a batch of young-enough trajectories
(waking once per batch, not once per completion).
"""

from __future__ import annotations

from simpy.events import PENDING

from harness.control.reporting import clear_progress_due, progress_input
from simulators.pipelines.inference import RankSim, Request


class RolloutEffects:
    """Workload effects: ``BeginProgressBatch``, ``EndProgressBatch``, ``WaitBatch``, and
    the router's completion callbacks."""

    def _on_trajectory(self, req: Request, rank: RankSim) -> None:
        self.collector.outstanding -= 1
        version = req.version
        if version is None or version < 0:
            # the base weights: NeMo's collector stamps the version it was told
            # (set_weight_version), which is the *published* one, and RLix publishes the
            # base cache -1 as max(-1, 0) = 0 (debug #31's clamp). Stamping the rank's -1
            # made every base-weight trajectory one step old at step 0, so a pipeline
            # with max_trajectory_age_steps 0 evicted and regenerated them forever.
            version = 0 if self.ctx.versions.clamp_bootstrap and not self._unclamped_stamp() else -1
        buffer = self.buffer
        buffer.add(version, req.rid)
        if self.dataplane is not None:
            self.dataplane.on_trajectory(req.rid, req.tokens)
        # counted once: nothing below (a report, a refill) changes the buffer or the version
        v = self.ctx.versions.published  # self._usable(), inlined: this runs on every completion
        usable = buffer.usable(0 if v is None else v, self._max_age)
        self._report_progress(False, usable)
        if self.collector.mode == "async":  # self._refill(): a sync collector never refills
            self._refill()
        ready = self.batch_ready
        if ready._value is PENDING and self._wait_batch_has_work(usable):
            # ready.succeed(), inlined (its checks: the event is pending, just tested)
            ready._ok = True
            ready._value = None
            self.env.schedule(ready)

    def _on_give_up(self, req: Request) -> None:
        """A rollout gave up on a request preempted on every attempt: the prompt group is
        dropped (NeMo's prompt-group worker logs the error and reopens its slot) and the
        collector generates a replacement."""
        self.collector.outstanding -= 1
        self._refill()

    def _usable(self) -> int:
        """Buffered trajectories young enough for the published version."""
        v = self.ctx.versions.published
        return self.buffer.usable(0 if v is None else v, self._max_age)

    def _wait_batch_has_work(self, usable: int) -> bool:
        """Whether a waiting :meth:`_WaitBatch` would do anything if woken now (``usable``:
        :meth:`_usable`): evict stale trajectories, take a batch, or (sync) gap-fill.
        Otherwise its wake would only re-arm (the refill it does was just done by the
        completion), so it is not woken: one wake per batch instead of one per trajectory."""
        n = self._per_step
        if usable < len(self.buffer.items) or usable >= n:  # stale items to evict, or a batch
            return True
        return self.collector.mode == "sync" and n - usable - self.collector.outstanding > 0

    def _refill(self) -> None:
        n = self.collector.refill(len(self.buffer.items))
        if n > 0 and not self.finished:
            self.router.submit(self._mark_straggler(self.collector.draw(n), self.ctx.step))

    def _report_progress(self, new_batch: bool, usable: int) -> None:
        """Report ``usable`` (:meth:`_usable`) as collected; the coordinator forwards it
        to the scheduler when its 2 % bucket moves (or a new batch forces it)."""
        if self.finished:
            return
        if not self.progress_hooks:
            if new_batch and not self._progress_suppressed:  # a new batch always forces a report
                self._progress_suppressed = True  # the first report the fault withheld: it fired here
                self._fire("noop_progress_hooks", self.batch_step)
            return
        out = progress_input(self.progress, self.pid, self._per_step, usable, new_batch)
        if out is not None:
            sim = self.sim
            sim.call("progress", out[0], sim.model.report_progress, out[1])

    def _BeginProgressBatch(self, e):
        self.batch_step = e.global_step
        self._collector_epoch_end(e.global_step)
        if self.collector.mode == "sync":
            self.router.submit(
                self._mark_straggler(self.collector.draw(self.spec.workload.trajectories_per_step), e.global_step)
            )
        else:
            self._refill()
        self._report_progress(True, self._usable())
        return None

    def _EndProgressBatch(self, e):
        if clear_progress_due(self.progress) and self.progress_hooks:
            sim = self.sim
            sim.call("clear_progress", {"pipeline_id": self.pid}, lambda: sim.model.clear_progress(self.pid))
        return None

    def _WaitBatch(self, e):
        n, max_age = self._per_step, self._batch_age_bound(self._max_age)
        buffer, collector = self.buffer, self.collector  # both for the pipeline's life
        versions, env = self.ctx.versions, self.env
        while True:
            current = versions.published  # the published version, 0 before the first
            if current is None:
                current = 0
            hist = buffer.take(n, current, max_age)
            if hist is not None:
                break
            self.batch_ready = env.event()
            if collector.mode == "sync":
                # gap-fill: trajectories evicted as too stale are generated again. After the
                # take every item left is young enough: usable == len(items). (A sync
                # collector never refills: self._refill() would do nothing.)
                missing = n - len(buffer.items) - collector.outstanding
                if missing > 0:
                    self.router.submit(collector.draw(missing))
            else:
                self._refill()
            yield self.batch_ready
        self.sim.emit(
            "batch_consumed",
            pipeline_id=self.pid,
            step=e.global_step,
            trajectories=n,
            staleness={str(k): v for k, v in hist.items()},
        )
        self._refill()
        return None
