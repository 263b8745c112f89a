"""Memory released late, and RLix's MILES wait for it (docs/engine-lifecycle.md).

SGLang's ``release_memory_occupation`` answers before the CUDA driver has the memory back
(THUDM/slime #579; radixark/miles #86: 29.39 GB still used after the 200). With the cost
``release_to_freed_s`` > 0 a sleeping rank's weights, KV cache and communicator buffers move,
at the sleep's return, to a ``releasing`` entry of the VRAM ledger (the engine no longer has
them; the driver does) that leaves the ledger that many seconds later. A training onload on
those GPUs in between meets them: an OOM.

RLix's MILES line waits for them after the training grant (rlops/rlix PR #11 at f73bfaf,
``MilesPipeline._wait_for_overlap_engines_offloaded``): phase 1 polls the pipeline's engines
on the granted GPUs every 0.1 s until each is offloaded, phase 2 polls ``nvidia-smi`` every
0.5 s until the largest used memory over those GPUs is at most
``MILES_MAX_RESIDUAL_GPU_MEM_GB`` (10), each phase within ``timeout_s`` (60 s). Phase 2's
expiry only warns ("wake_up may OOM") and training goes on. Mixed into
:class:`simulators.pipelines.pipeline.PipelineSim`.
"""

from __future__ import annotations

from harness.control.rank_state import RankState
from simulators.runtime.env import Timer

RELEASING = "releasing"  # the ledger's name for memory an engine gave up and the driver has not freed
STATE_POLL_S = 0.1  # phase 1: get_engine_states
MEMORY_POLL_S = 0.5  # phase 2: nvidia-smi --query-gpu=memory.used
_OFFLOADED = (RankState.ASLEEP, RankState.STOPPED)  # SGLang's "offloaded" / "shell"


class LateRelease:
    def _release(self, rank, mems) -> None:
        """A sleep's frees of ``mems``: at once, or, with ``release_to_freed_s``, moved to the
        rank's ``releasing`` entry and freed that much later."""
        vram, delay = self.sim.cluster.vram, self.costs.release_to_freed_s
        owner = self._owner(rank)
        for g in rank.gpus:
            moved = sum(vram.free(g, owner, mem) for mem in mems)
            if delay > 0 and moved:
                vram.alloc(g, owner, RELEASING, moved, "sleep")
        if delay > 0:
            Timer(self.env, delay, rank.actor, self._freed, rank)

    def _freed(self, rank) -> None:
        for g in rank.gpus:
            self.sim.cluster.vram.free(g, self._owner(rank), RELEASING)

    def _residue(self, g: int, owner: str) -> int:
        """What a sleeping rank still holds as its engine reports it (what it released late is
        the driver's, not the engine's)."""
        vram = self.sim.cluster.vram
        return vram.held(g, owner) - vram.held(g, owner, RELEASING)

    def _WaitEnginesOffloaded(self, e):
        c, vram = self.costs, self.sim.cluster.vram
        gpus = sorted(set(self.train_gpus))
        ranks = [rank for rank in self.ranks.values() if set(rank.gpus) & set(gpus)]
        start = self.env.now
        while (
            any(rank.life.state not in _OFFLOADED for rank in ranks) and self.env.now - start < c.offload_wait_timeout_s
        ):
            yield self.env.timeout(STATE_POLL_S)
        offloaded = self.env.now - start
        start = self.env.now
        while True:
            used = max(vram.used[g] for g in gpus)
            if used <= c.max_residual_gpu_mem_bytes:
                outcome = "ok"
                break
            if self.env.now - start >= c.offload_wait_timeout_s:
                outcome = "timeout"  # RLix logs "wake_up may OOM" and trains anyway
                break
            yield self.env.timeout(MEMORY_POLL_S)
        self.sim.emit(
            "offload_wait",
            pipeline_id=self.pid,
            step=self.ctx.step,
            gpus=gpus,
            outcome=outcome,
            state_wait_s=offloaded,
            memory_wait_s=self.env.now - start,
            max_used=used,
            threshold=c.max_residual_gpu_mem_bytes,
        )
        return None
