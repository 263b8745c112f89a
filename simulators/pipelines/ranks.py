"""Inference-rank effects of a simulated pipeline: wake, finalize, publish, activate,
abort, drain, sleep — each moving the rank's lifecycle (harness.control.rank_state) and
its VRAM. Mixed into :class:`simulators.pipelines.pipeline.PipelineSim`. A handler of an effect that
takes simulated time is a generator; one that completes at once is a plain method (see
``PipelineSim.drive``)."""

from __future__ import annotations

from typing import List

from harness.control.rank_state import RankState

# a state's log name; an enum's .value is a descriptor call, a dict lookup is cheaper
_STATE_NAME = {state: state.value for state in RankState}


class RankEffects:
    def _log_rank(self, rank) -> None:
        # sim.emit() without its None filter: no field here can be None but version, which it keeps
        record = {
            "seq": 0,
            "t": self.env._now,
            "kind": "rank_state",
            "pipeline_id": self.pid,
            "dp_rank": rank.dp_rank,
            "state": _STATE_NAME[rank.life.state],
            "gpus": list(rank.gpus),
            "version": rank.life.weights_version,
        }
        record.update(self._engine_state_fields(rank))  # tags still asleep (a staged wake), if any
        self.sim.log.add(record)

    def _owner(self, rank) -> str:
        return f"{self.pid}/dp{rank.dp_rank}"

    def _ActiveRanks(self, e):
        return sorted(r for r, rank in self.ranks.items() if rank.routable)

    def _MarkInactive(self, e):
        # RLix marks ranks about to be woken as inactive+preempted; they are asleep and off
        # routing already, so only a routable rank (a control-logic bug) would change here.
        for r in e.ranks:
            if self.ranks[r].routable:
                raise RuntimeError(f"{self.pid} dp{r}: expand of a rank that is still routable")
        return None

    def _Wake(self, e):
        yield from self._wake_ranks(e.ranks, ("weights", "kv_cache"))

    def _wake_ranks(self, ranks, tags):
        """Wake ``tags`` of the ranks (every tag: RLix's wake; the weights alone: the staged
        wake's first half, harness/control/engine.py)."""
        vram, c = self.sim.cluster.vram, self.costs
        tp = self.spec.infer_tp
        per_gpu_weights = self.weight_bytes // tp
        kv = self._kv_bytes() if "kv_cache" in tags else 0
        for r in ranks:
            rank = self.ranks[r]
            rank.life.on("wake")
            self._log_rank(rank)
            owner = self._owner(rank)
            for g in rank.gpus:
                vram.alloc(g, owner, "weights", per_gpu_weights, "wake")
                if kv and rank.engine.tags["kv_cache"] != "awake":
                    vram.alloc(g, owner, "kv_cache", kv, "wake")
                if tp > 1:
                    vram.alloc(g, owner, "nccl", c.nccl_buffer_bytes, "wake")
        # a level-1 sleeper copies its weights back from host RAM (H2D, all GPUs of all
        # ranks at once); a level-2 sleeper has nothing to copy: its weights come by sync
        kept = [self.ranks[r] for r in ranks if self.ranks[r].life.host_version is not None]
        copy_s = per_gpu_weights / self.sim.cluster.spec.pcie_bytes_per_s if kept else 0.0
        yield self.env.timeout(c.wake_s + copy_s)
        host = self.sim.cluster.host
        for rank in kept:
            host.set(self.sim.cluster.node_of(rank.gpus[0]), self._owner(rank), 0)
        for r in ranks:
            rank = self.ranks[r]
            rank.engine.wake(tuple(t for t in tags if rank.engine.tags[t] != "awake"))
            rank.life.on("woken")
            self._log_rank(rank)
        return None

    def _Finalize(self, e):
        yield self.env.timeout(self.costs.finalize_s)
        unchecked = self.faults.get("unchecked_activation") == self.ctx.step
        for r in e.ranks:
            rank = self.ranks[r]
            if unchecked and rank.life.state not in (RankState.SYNCED, RankState.ROUTABLE):
                continue  # the fault's controller does not ask (oracle_faults.py)
            # refused by the lifecycle unless the rank holds synced weights (SYNCED/ROUTABLE)
            rank.life.on("finalized")
            if rank.engine.state["weights"] == "loaded":  # an update to end (an active refresh may have none)
                rank.engine.finalize()
                self._memo_at_finalize(rank)  # the post-load processing reads its memo (engine_effects.py)
        self._finalize_flush(e.ranks)  # MILES' finalize flushes the prefix cache (engine_effects.py)
        return None

    def _PublishVersion(self, e):
        self.ctx.versions.publish(e.version)
        return self.ctx.versions.published

    def _Activate(self, e):
        """``activate_dp_ranks(ranks)``: the whole set becomes routable before any request
        is routed to it (no rank of the set takes the waiting callers alone)."""
        ranks = [self.ranks[r] for r in e.ranks]
        unchecked = self.faults.get("unchecked_activation") == self.ctx.step
        for rank in ranks:
            if unchecked and rank.life.state is not RankState.SYNCED:
                self._force_state(rank, RankState.ROUTABLE)  # the fault: activated past the lifecycle
            else:
                rank.life.on("activated")
            self._resume(rank, forced=unchecked)
            self._log_rank(rank)
            self.router.resume_kept(rank)  # a keep pause's frozen requests go on once the engine runs
        self.router.activate(ranks)
        self._after_activate(ranks)
        return None

    def _Abort(self, e):
        # sleep_partial: the ranks leave the active set together (one lock), then their
        # requests are aborted and their callers re-dispatch to the ranks still active
        ranks = [self.ranks[r] for r in e.ranks]
        routed = [rank for rank in ranks if rank.routable]
        for rank in ranks:
            rank.life.on("abort")
            rank.engine.pause("abort")
            self._log_rank(rank)
        aborted = len(self.router.deactivate(routed)) if routed else 0
        at = self.faults.get("abort_never_wakes")
        # the next Drain (same shrink, under the coordinator lock) waits on these forever
        self._abort_hung = aborted if at is not None and self.ctx.step >= at else 0
        return None

    def _Drain(self, e):
        """Wait until the aborted requests have left the engine (``num_requests_running == 0``),
        under RLix's ``rebalance_on_shrink`` deadline. The deadline is armed only when the
        drain hangs or lasts at least the limit: a shorter drain can never meet it."""
        c = self.costs
        hung = self._abort_hung
        drained = []
        bounded = c.shrink_drain_timeout_s > 0  # 0: no deadline (NVIDIA-NeMo/RL #3929's refit_timeout_s: null)
        if bounded and (hung or c.drain_s >= c.shrink_drain_timeout_s or self.ctx.engine.pause_mode == "wait"):
            self.deadlines.arm("shrink_drain", c.shrink_drain_timeout_s, lambda: bool(drained))
        if hung:  # RLix Bug 7: abort_requests never wakes generate(), so nothing ever drains
            self.sim.emit("fault_fired", name="abort_never_wakes", pipeline_id=self.pid, step=self.ctx.step)
            yield self.env.event()
        if self.ctx.engine.pause_mode == "wait":  # the paused ranks finish what they hold first
            yield from self._drain_paused(e.ranks)
        yield self.env.timeout(c.drain_s)
        drained.append(True)
        for r in e.ranks:  # the pause acknowledged: nothing of it runs any more
            self.ranks[r].engine.drained()
        return None

    def _Sleep(self, e):
        c = self.costs
        if e.level == 1:
            # level 1 keeps the weights in host RAM: charged before VRAM is freed (a full
            # node fails the sleep), and the D2H copy lengthens the sleep
            cluster = self.sim.cluster
            for r in e.ranks:
                rank = self.ranks[r]
                cluster.host.set(cluster.node_of(rank.gpus[0]), self._owner(rank), self.weight_bytes)
            yield self.env.timeout(c.sleep_s + self.weight_bytes // self.spec.infer_tp / cluster.spec.pcie_bytes_per_s)
        else:
            yield self.env.timeout(c.sleep_s)
        at = self.faults.get("keep_nccl_on_sleep")
        keep_nccl = at is not None and self.ctx.step >= at  # the bug persists once it appears
        residues: List[str] = []
        for r in e.ranks:
            rank = self.ranks[r]
            owner = self._owner(rank)
            # freed at once, or late (costs.release_to_freed_s; simulators/pipelines/late_release.py)
            self._release(rank, ("kv_cache", "weights") if keep_nccl else ("kv_cache", "weights", "nccl"))
            for g in rank.gpus:
                self._sleep_residue(g, owner)  # fault sleep_residue_grows (oracle_faults.py)
                left = self._residue(g, owner)
                if left > c.post_sleep_threshold_bytes:
                    residues.append(f"dp{r} keeps {left} B on GPU {g}")
            rank.life.on("slept", level=e.level)
            rank.engine.sleep(e.level)
            self._log_rank(rank)
        if keep_nccl:
            self.sim.emit("fault_fired", name="keep_nccl_on_sleep", pipeline_id=self.pid, step=self.ctx.step)
        if residues:
            raise RuntimeError(f"post-sleep VRAM above {c.post_sleep_threshold_bytes} B: {'; '.join(residues)}")
        return None
