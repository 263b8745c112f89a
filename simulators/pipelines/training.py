"""The training side of a simulated pipeline: what the trainer's effects cost.

Mixed into :class:`simulators.pipelines.pipeline.PipelineSim` (its handlers are found there by
effect name, ``_<EffectName>``). Split out of ``pipeline.py`` so the trainer's memory
story reads in one place: which training-state kinds (parameters, gradients, optimizer
state, process-group buffers) each phase loads and offloads, charged to the VRAM ledger
on every training GPU, and the host-side weight cache built from them for the refit.
What each phase loads, offloads and destroys is ``harness/control/residency.py`` (the
control logic reads the same table); here each kind costs its bytes on every training
GPU, labelled with the phase that loaded it.
"""

from __future__ import annotations

from simulators.runtime.simulation import SimFailure

TRAIN_STATE_KINDS = ("params", "grads", "optimizer")  # in load/offload order
TRAIN_STATE_KINDS_ALL = frozenset(TRAIN_STATE_KINDS)


class TrainingEffects:
    """Training-cluster effects: ``Compute``, ``BuildCache``, ``PromoteCache``,
    ``OffloadTraining``, ``ReloadTrainComm``, ``DestroyTrainComm``."""

    @property
    def train_resident(self) -> bool:
        return "params" in self.train_loaded

    def _train_bytes(self, kind: str) -> int:
        """Per-GPU bytes of one training-state kind (CostSpec multipliers x weight bytes)."""
        c = self.costs
        mult = {
            "params": 1.0,
            "optimizer": c.optimizer_state_multiplier,
            "grads": c.train_state_multiplier - 1.0 - c.optimizer_state_multiplier,
        }[kind]
        return int(self.weight_bytes * mult / len(self.train_gpus))

    def _load_train(self, kinds) -> None:
        vram, owner = self.sim.cluster.vram, f"{self.pid}/train"
        for kind in TRAIN_STATE_KINDS:  # a fixed order: the log does not depend on the table's
            if kind in kinds and kind not in self.train_loaded:
                nbytes = self._train_bytes(kind)
                for g in self.train_gpus:
                    vram.alloc(g, owner, kind, nbytes, self.train_phase)
                self.train_loaded.add(kind)

    def _onload_again(self, kinds) -> None:
        """Fault ``double_onload``: a second onload of training state already resident. MILES'
        torch_memory_saver refuses to resume a region that is not paused, and the run fails
        (rlops/rlix ``rlix/pipeline/miles_pipeline.py`` at f73bfaf: ``_before_training`` does not
        onload because ``train()`` wakes on its own)."""
        resident = [kind for kind in TRAIN_STATE_KINDS if kind in kinds and kind in self.train_loaded]
        self.sim.emit("fault_fired", name="double_onload", pipeline_id=self.pid, step=self.ctx.step)
        if resident:
            raise SimFailure(
                f"{self.pid}/train onload of {', '.join(resident)}: [torch_memory_saver.cpp] "
                "Cannot resume allocation that is not paused"
            )

    def _create_train_comm(self):
        """Create (or reload) the training process groups. A group of one GPU has no peer
        and holds no communicator buffers (ROLL's ReloadableProcessGroup skips it): bytes
        only when the trainer spans several GPUs."""
        yield self.env.timeout(self.costs.nccl_group_create_s)
        if len(self.train_gpus) > 1:
            for g in self.train_gpus:
                self.sim.cluster.vram.alloc(
                    g, f"{self.pid}/train", "nccl", self.costs.nccl_buffer_bytes, self.train_phase
                )
        self.train_comm_live = True
        self.sim.emit(
            "group_create",
            pipeline_id=self.pid,
            name=f"{self.pid}/megatron",
            members=list(self.train_gpus),
            purpose="training",
        )

    def _destroy_train_comm(self):
        yield self.env.timeout(self.costs.nccl_group_destroy_s)
        for g in self.train_gpus:
            self.sim.cluster.vram.free(g, f"{self.pid}/train", "nccl")
        self.train_comm_live = False
        self.sim.emit(
            "group_destroy",
            pipeline_id=self.pid,
            name=f"{self.pid}/megatron",
            members=list(self.train_gpus),
            purpose="training",
        )

    def _ReloadTrainComm(self, e):
        if self.train_comm_live:  # reloading live groups is a no-op
            return None
        yield from self._create_train_comm()
        return None

    def _Compute(self, e):
        """One worker call (ROLL: under ``state_offload_manger``): load what the phase
        loads, compute, then offload and destroy what the phase's row says."""
        self.train_phase = e.what
        row = self.ctx.residency[e.what]
        if "nccl" in row.loads and not self.train_comm_live:
            yield from self._create_train_comm()
        self._load_train(row.loads)
        if e.what == "train" and self.faults.get("double_onload") == self.ctx.step:
            self._onload_again(row.loads)
        c, n = self.costs, self.ctx.step_target
        if e.what == "train":
            dt = c.train_fixed_s + c.train_s_per_trajectory * n / len(self.train_gpus)
        else:
            dt = c.old_log_probs_s_per_trajectory * n / len(self.train_gpus)
        dp = self.dataplane if e.what == "train" else None
        if dp is not None:  # the batch's bulk reaches the workers before they compute
            batch = self.buffer.last_taken
            evicted = dp.evicted(batch, [r for _, r in self.buffer.items])
            yield from dp.before_train(batch)
        yield self.env.timeout(dt)
        if dp is not None:
            yield from dp.after_train(evicted)
        if row.offloaded_at_end:
            yield from self._offload_train_state(row.offloaded_at_end)
        if row.destroys_groups and self.train_comm_live:
            yield from self._destroy_train_comm()
        return None

    def _BuildCache(self, e):
        if self.faults.get("cache_after_offload") == self.ctx.step and self.train_resident:
            # the misordered hook: training offloads first, the cache is built from what is left
            self.sim.emit("fault_fired", name="cache_after_offload", pipeline_id=self.pid, step=self.ctx.step)
            yield from self._offload_train_state()
        if e.version >= 0 and not self.train_resident:
            raise SimFailure(f"cache v{e.version} built after offload: parameters have no storage (debug #34/#35)")
        if e.version < 0:  # the init cache: the INITIALIZATION phase loads the training state
            self._load_train(self.ctx.residency["init"].loads)
        cluster = self.sim.cluster
        yield from self.cache_lock.acquire("build", e.version)  # never while a sync reads the cache
        if self.spec.refit_path == "colocated_ipc":
            # NeMo RL keeps no copy: version v is the trainer's weights on its GPUs, handed
            # over from there at the refit (the sync charges the copies). The effect stays
            # the point where a version exists, so the version and cache checks read it as always.
            yield self.env.timeout(0)
        else:
            with cluster.links.d2h[self.owner_gpu].request() as req:  # parameters leave the GPU
                yield req
                yield self.env.timeout(self.weight_bytes / cluster.spec.pcie_bytes_per_s)
            yield self.env.timeout(self.weight_bytes / self.costs.cache_pack_bytes_per_s)  # pack into buckets
            self.cache_versions = (self.cache_versions + [e.version])[-2:]  # latest + active: <= 2 copies
            self.sim.cluster.host.set(
                self.sim.cluster.node_of(self.owner_gpu),
                f"{self.pid}/cache",
                len(self.cache_versions) * self.weight_bytes,
                guard=self._host_ram_guarded(),
            )
        self.ctx.versions.cache_built(e.version)
        self.cache_lock.release(e.version)
        return None

    def _PromoteCache(self, e):
        yield from self.cache_lock.acquire("promote", e.version)
        self.ctx.versions.promote(e.version)
        self.cache_lock.release(e.version)
        return None

    def _OffloadTraining(self, e):
        if self.faults.get("wake_before_offload") == self.ctx.step and not self.leaked_train_state:
            self.leaked_train_state = True
            self.sim.emit("fault_fired", name="wake_before_offload", pipeline_id=self.pid, step=self.ctx.step)
            yield self.env.timeout(0)
            return None  # training memory stays resident: the next wake on these GPUs must OOM
        yield from self._offload_train_state()
        self._leave_params_on_gpu()
        return None

    def _offload_train_state(self, kinds=TRAIN_STATE_KINDS_ALL):
        """Move the loaded kinds among ``kinds`` to the host: every trainer at once, over
        its device-to-host link."""
        cluster = self.sim.cluster
        owner = f"{self.pid}/train"
        going = [k for k in TRAIN_STATE_KINDS if k in kinds and k in self.train_loaded]
        share = sum(cluster.vram.held(self.train_gpus[0], owner, k) for k in going)
        rate = min(self.costs.offload_bytes_per_s, cluster.spec.pcie_bytes_per_s)
        reqs = [cluster.links.d2h[g].request() for g in self.train_gpus]  # every trainer offloads at once
        yield self.env.all_of(reqs)
        yield self.env.timeout(share / rate)
        for g, req in zip(self.train_gpus, reqs):
            cluster.links.d2h[g].release(req)
        for g in self.train_gpus:
            for k in going:
                self.sim.cluster.vram.free(g, owner, k)
        self.train_loaded.difference_update(going)

    def _DestroyTrainComm(self, e):
        yield from self._destroy_train_comm()
        return None
