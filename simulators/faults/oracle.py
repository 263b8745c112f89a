"""Fault hooks that make the simulated system break an invariant the oracle checks, where
no user report or RLix hazard already does (``simulators/scenario/fault_catalogue.py`` ``FaultSpec``).

Each is a bug class the modelled systems could have — a sync target list that is not the
expand's, tensors riding inside the driver's metadata, a batch taken past the staleness
window, a host-RAM charge let through without the guard — injected at one hook point so
a test can show the named check (``harness/logs/invariants/``) seeing it *from the log*: the
hook leaves a ``fault_fired`` record and changes what the system does, never what the
oracle reads about it. Mixed into :class:`simulators.pipelines.pipeline.PipelineSim` beside
:class:`simulators.faults.field.FieldFaults` (whose ``_fault_due`` / ``_fire`` it uses).
"""

from __future__ import annotations

from typing import Generator, List

from harness.control.effects import LockCoordinator, RequestGpus, UnlockCoordinator


def request_under_lock(request: RequestGpus) -> Generator:
    """The NeMo GENERATION watchdog's re-request in the order RLix's code warns against
    (rlops/rlix ``rlix/pipeline/nemo_rl_pipeline.py`` ``_generation_watchdog_loop``, nemo
    branch at f77d913): the request made, and waited for, while the pipeline's resize lock
    is held. The grant comes through an expand, whose ``resize_infer`` needs that lock."""
    yield LockCoordinator("watchdog")
    yield request
    yield UnlockCoordinator("watchdog")


class OracleFaults:
    def _armed_once(self, name: str) -> bool:
        """Whether fault ``name`` is due now; the first time, a ``fault_fired`` record."""
        if not self._fault_due(name):
            return False
        fired = self.__dict__.setdefault("_oracle_fired", set())
        if name not in fired:
            fired.add(name)
            self._fire(name)
        return True

    # sync_targets
    def _sync_written_ranks(self, path: str, ranks) -> List[int]:
        """The ranks an expand's bucket lands on. Armed (``sync_outside_expand``): every
        rank of the pipeline, as if the target list were the whole DP range rather than
        the ranks the scheduler expanded; the others are asleep or serving."""
        if path == "expand" and self._armed_once("sync_outside_expand"):
            return sorted(self.ranks)
        return list(ranks)

    # versions: a publish before the receivers applied the version
    def _publish_on_ack_now(self) -> bool:
        """Armed at exactly this step (``publish_on_ack``, RLinf #1456): the active refresh
        counts its sync as done on the receivers' acknowledgement and publishes the version
        before their finalize applies it (``harness/control/nemo_async.py``)."""
        return self.faults.get("publish_on_ack") == self.ctx.step and self._armed_once("publish_on_ack")

    # livelock (harness/logs/invariants/hot_states.py)
    def _unclamped_stamp(self) -> bool:
        """Armed (``unclamped_base_stamp``, whole run): a base-weight trajectory is stamped
        the rank's -1, not the published 0 -- the model's age-0 bug before its fix: with
        ``max_trajectory_age_steps: 0`` every such trajectory is stale at step 0, evicted
        and regenerated forever (examples/fuzz/nemo_age0_never_trains.yaml)."""
        return "unclamped_base_stamp" in self.faults and self._armed_once("unclamped_base_stamp")

    # lost_wakeup (harness/logs/invariants/waitfor.py)
    def _drop_lock_waiter(self) -> None:
        """Armed (``lost_lock_handoff``, from ``at_step`` on): a release of the coordinator
        lock forgets the call queued for it (a release that notifies no one): the lock is
        free and its waiter is never woken (RLix's acquire then ends at its deadline)."""
        if self.lock.queue and self._armed_once("lost_lock_handoff"):
            self.lock.queue.pop(0)

    def _request_under_lock_due(self) -> bool:
        """Armed (``watchdog_request_under_lock``, from ``at_step`` on): the GENERATION
        watchdog keeps the pipeline's resize lock across its re-request, instead of taking
        its snapshot under the lock and dropping it before the request, as RLix's watchdog
        does (its docstring: the re-request "triggers an ``_expand_workers`` callback that
        re-acquires the lock"). The expand that would grant the request waits on the lock,
        the scheduler on the expand, the watchdog on the scheduler: a ``deadlock``."""
        return "watchdog_request_under_lock" in self.faults and self._armed_once("watchdog_request_under_lock")

    def _drop_cache_waiter(self) -> bool:
        """Armed (``lost_cache_handoff``, from ``at_step`` on): a release of the cache lock
        with a call queued for it forgets that call: the lock is free and the waiter is
        never woken. True when it dropped one (``CacheLock.release``)."""
        return bool(self.cache_lock.waiting) and self._armed_once("lost_cache_handoff")

    def _drop_release_ack(self, cp) -> None:
        """Armed (``lost_release_ack``, from ``at_step`` on): the commit of a cycle that
        shrinks this pipeline's GENERATION cluster for its planned release forgets that
        release: the cluster goes to zero and the ``await_release`` is never acked (it ends
        at RLix's await-release deadline). Called by the simulation just before a commit."""
        cid, state = f"{self.pid}_actor_infer", self.sim.model.state
        if (
            cid in state.planned_releases
            and any(op.cluster_id == cid for op in cp.plan.shrinks)
            and self._armed_once("lost_release_ack")
        ):
            del state.planned_releases[cid]

    # rank_lifecycle
    def _unchecked_activation_now(self) -> bool:
        """Armed at exactly this step (``unchecked_activation``): the expand skips its sync
        and the controller finalizes and activates without the lifecycle's consent."""
        return self.faults.get("unchecked_activation") == self.ctx.step and self._armed_once("unchecked_activation")

    def _force_state(self, rank, state) -> None:
        """The controller sets the engine's state itself, past the lifecycle's refusal."""
        rank.life.state = state
        rank.life.finalized = True

    # data_plane: the metadata hop judged by its bytes
    def _driver_meta_bytes(self, meta_bytes: int, bulk_bytes: int) -> int:
        """Bytes of one ``driver_meta`` hop. Armed (``bulk_in_driver_meta``): the driver
        packs the shard's tensors into the metadata it hands a worker."""
        if self._armed_once("bulk_in_driver_meta"):
            return meta_bytes + bulk_bytes
        return meta_bytes

    # trajectory_age
    def _batch_age_bound(self, max_age: int) -> int:
        """The age window ``WaitBatch`` takes trajectories in. Armed (``stale_batch``): two
        steps wider than ``max_trajectory_age_steps`` (and, for the whole run, an async
        collector generates that much further ahead, so old trajectories exist to take)."""
        if self._armed_once("stale_batch"):
            return max_age + 2
        return max_age

    # host_ram
    def _host_ram_guarded(self) -> bool:
        """Whether the cache build's host-RAM charge is guarded. Armed
        (``no_host_ram_guard``): the charge goes through whatever the node holds (the
        node overcommits instead of the process being killed with a ``host_oom``)."""
        return not self._armed_once("no_host_ram_guard")

    # cycle_trends: the leak classes a single cycle cannot show (harness/logs/invariants/trends.py)
    def _sleep_residue(self, gpu: int, owner: str) -> None:
        """Called after a rank's sleep freed its memory on ``gpu``. Armed
        (``sleep_residue_grows``, NeMo RL #2619: memory after sleep grew from 4.11 GiB to
        ~25 GiB in three steps): the sleep leaves :data:`RESIDUE_STEP_BYTES` more behind
        every time, so the residue grows by that much per cycle until the post-sleep
        threshold or a wake runs out of memory."""
        if self._armed_once("sleep_residue_grows"):
            self.sim.cluster.vram.alloc(gpu, owner, "sleep_residue", RESIDUE_STEP_BYTES)

    def _staging_kept(self) -> bool:
        """Whether a sync's staging buffer stays allocated when the sync frees it. Armed
        (``staging_leak``, vLLM #51258: the IPC staging buffer leaked once per step until a
        wake ran out of memory): it does, and the next sync allocates a new one beside it."""
        return self._armed_once("staging_leak")

    def _refit_slowdown_s(self) -> float:
        """Extra seconds at the end of a sync. Armed (``refit_slows``): each sync since the
        fault armed takes :data:`REFIT_SLOWDOWN_S` longer than the one before (a cost that
        grows with what earlier cycles left behind)."""
        if not self._armed_once("refit_slows"):
            return 0.0
        self._slow_syncs = getattr(self, "_slow_syncs", 0) + 1
        return self._slow_syncs * REFIT_SLOWDOWN_S


RESIDUE_STEP_BYTES = 32 << 20
REFIT_SLOWDOWN_S = 0.25
