"""The engine's pause modes and tag-wise wake in the simulator (harness/control/engine.py):
``Pause`` (modes ``wait`` and ``keep``; ``abort`` stays RLix's ``Abort``), ``WakeTags``,
the resume at activation, and the fault hooks of the engine-lifecycle classes. Mixed into
:class:`simulators.pipelines.pipeline.PipelineSim` beside :class:`simulators.pipelines.ranks.RankEffects`,
whose ``_Wake`` / ``_Sleep`` / ``_Activate`` call the helpers here.
"""

from __future__ import annotations

from harness.control.rank_state import RankState
from simulators.runtime.env import Timer
from simulators.runtime.simulation import SimFailure

DRAIN_POLL_S = 0.05  # how often a drain looks at num_requests_running (RLix polls it)
_NONE: dict = {}  # no extra rank_state fields (read only)


class EngineEffects:
    # ------------------------------------------------------------------ pause
    def _Pause(self, e):
        """``pause_generation(mode)`` with ``wait`` or ``keep``: the ranks leave routing
        together; ``wait`` leaves their requests running to completion (the drain waits for
        them), ``keep`` freezes them in the engine until the rank resumes."""
        ranks = [self.ranks[r] for r in e.ranks]
        routed = [rank for rank in ranks if rank.routable]
        self._abort_hung = 0
        for rank in ranks:
            rank.life.on("abort")  # off routing, on the way to sleep: the lifecycle's draining
            rank.engine.pause(e.mode)
            self._log_rank(rank)
        if self._fault_due("abort_on_pause") and routed:
            # miles #2372: the weight update aborts every request whatever the pause mode
            self._fire("abort_on_pause")
            self.router.deactivate(routed)
            return None
        self.router.pause_ranks(routed, e.mode)
        return None

    def _drain_paused(self, ranks):
        """A ``wait`` pause's drain: until no request runs or waits on the ranks."""
        while any(self.ranks[r].inflight or self.ranks[r].queued for r in ranks):
            yield self.env.timeout(DRAIN_POLL_S)

    # ------------------------------------------------------------------ wake by tag
    def _WakeTags(self, e):
        """``wake_up(tags=...)``: weights (with the rank's lifecycle wake; level 1 copies
        them back from host RAM), or the KV cache once the weights are in."""
        if e.tags == ("kv_cache",):
            if self._fault_due("resume_before_kv_wake") and not self.__dict__.get("_kv_late_fired"):
                self._kv_late_fired = True
                self._fire("resume_before_kv_wake")
                self._kv_late = tuple(e.ranks)  # woken only after the activation (the fault)
                return None
            self._wake_kv(e.ranks)
            return None
        if self._fault_due("kv_wake_before_weights") and not self.__dict__.get("_kv_first_fired"):
            self._kv_first_fired = True
            self._fire("kv_wake_before_weights")
            self._wake_kv(e.ranks, forced=True)
        yield from self._wake_ranks(e.ranks, ("weights",))

    def _wake_kv(self, ranks, forced: bool = False) -> None:
        vram = self.sim.cluster.vram
        for r in ranks:
            rank = self.ranks[r]
            if rank.engine.tags["kv_cache"] == "awake":
                continue
            if forced:
                rank.engine.force("wake(kv_cache)")  # the fault: past the engine's refusal
            else:
                rank.engine.wake(("kv_cache",))
            for g in rank.gpus:
                vram.alloc(g, self._owner(rank), "kv_cache", self._kv_bytes(), "wake")
            self.sim.emit("engine_tag", pipeline_id=self.pid, dp_rank=r, tag="kv_cache", state="awake")

    def _kv_bytes(self) -> int:
        per_gpu_weights = self.weight_bytes // self.spec.infer_tp
        return max(0, int(self.costs.kv_cache_fraction * self.sim.cluster.vram.capacity) - per_gpu_weights)

    # ------------------------------------------------------------------ MILES' pause around finalize
    def _PauseGeneration(self, e):
        """``pause_generation(mode="retract")`` on serving ranks: their schedulers stop, what
        they run is kept (a ``keep`` pause) and no new request is routed to them."""
        ranks = [self.ranks[r] for r in e.ranks if self.ranks[r].routable]
        for rank in ranks:
            rank.engine.pause("keep")
        self.router.pause_ranks(ranks, "keep")
        return None

    def _ContinueGeneration(self, e):
        """``continue_generation``: the schedulers run again, the kept requests go on."""
        ranks = [self.ranks[r] for r in e.ranks if self.ranks[r].routable and self.ranks[r].engine.paused]
        for rank in ranks:
            rank.engine.resume()
        self.router.activate(ranks)
        for rank in ranks:
            self.router.resume_kept(rank)
        return None

    def _finalize_flush(self, ranks) -> None:
        """MILES' ``finalize_weight_update`` flushes the prefix cache (SGLang ``/flush_cache``);
        fault ``finalize_fails``: it raises on the serving ranks instead."""
        if self.ctx.finalize_pause == "none":
            return
        serving = [r for r in ranks if self.ranks[r].routable]
        if serving and self.faults.get("finalize_fails") == self.ctx.step:
            self._fire("finalize_fails")
            raise SimFailure(f"{self.pid} finalize_weight_update failed on dp {serving}")
        for r in serving:
            self.ranks[r].engine.invalidate()
            self.sim.emit("engine_tag", pipeline_id=self.pid, dp_rank=r, tag="prefix_cache", state="invalidated")

    # ------------------------------------------------------------------ the weights' memo
    def _memo_at_load(self, ranks) -> None:
        """Pipeline option ``weights_memo``: SGLang's weight-load funnel drops the memo kept in
        the weights' region (``clear_mxfp8_shuffle_index_cache()``, sgl-project/sglang PR #28676);
        fault ``memo_not_invalidated``: the load leaves it, as before that PR."""
        if not self.spec.weights_memo:
            return
        if self._fault_due("memo_not_invalidated"):
            if not self.__dict__.get("_memo_fired"):
                self._memo_fired = True
                self._fire("memo_not_invalidated")
            return
        for r in ranks:
            self.ranks[r].engine.memo_invalidate()
            self.sim.emit("engine_tag", pipeline_id=self.pid, dp_rank=r, tag="memo_cache", state="invalidated")

    def _memo_at_finalize(self, rank) -> None:
        """The finalize's post-load processing (the MoE weights' align) reads the memo, or fills
        it when empty. A stale memo is read as the engine did, silently: its indices hold
        whatever the resumed pages hold and the layout of the new weights is wrong."""
        if not self.spec.weights_memo:
            return
        if rank.engine.state["memo_cache"] == "stale" and self._fault_due("memo_not_invalidated"):
            rank.engine.force("memo_use")  # SGLang does not refuse: the fault's corruption is silent
        else:
            rank.engine.memo_use()
        self.sim.emit("engine_tag", pipeline_id=self.pid, dp_rank=rank.dp_rank, tag="memo_cache", state="used")

    # ------------------------------------------------------------------ resume
    def _resume(self, rank, forced: bool) -> None:
        """Activation resumes the engine: refused with a tag asleep or weights not whole,
        unless a fault's controller does not ask."""
        late = rank.dp_rank in self.__dict__.get("_kv_late", ())
        partial = self.__dict__.get("_partially_loaded")
        if partial and rank.dp_rank in partial:  # fault partial_reload: the controller takes the sync's word
            partial.discard(rank.dp_rank)
            forced = True
        if forced or late:
            rank.engine.force("resume")
        else:
            rank.engine.resume()

    def _after_activate(self, ranks) -> None:
        """Fault ``resume_before_kv_wake``: the KV cache of the ranks the controller resumed
        early is woken one wake later, while they already take requests."""
        late = [rank.dp_rank for rank in ranks if rank.dp_rank in self.__dict__.get("_kv_late", ())]
        if late:
            self._kv_late = ()
            Timer(self.env, self.costs.wake_s, ranks[0].actor, self._wake_kv, tuple(late))

    def _engine_loaded(self, e, complete: bool) -> None:
        for r in e.ranks:
            rank = self.ranks[r]
            if rank.engine.state["weights"] == "loading":
                rank.engine.load(complete)
            if not complete:
                self.__dict__.setdefault("_partially_loaded", set()).add(r)

    def _partial_reload(self, e) -> bool:
        """Fault ``partial_reload``: an expand's sync carries only the first bucket of the
        model (a payload of the changed tensors only: verl #3461's LoRA case)."""
        return e.path == "expand" and self._armed_once("partial_reload")

    def _engine_state_fields(self, rank) -> dict:
        """``asleep_tags`` for a rank_state record: only when some tags are awake and some
        not (a staged wake's window), past waking; every other record stays as it was."""
        tags = rank.engine.tags
        if (tags["weights"] == "awake") == (tags["kv_cache"] == "awake") or rank.life.state in (
            RankState.ASLEEP,
            RankState.WAKING,
            RankState.STOPPED,
        ):
            return _NONE
        return {"asleep_tags": rank.engine.asleep_tags()}
