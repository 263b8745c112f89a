"""The data plane in the simulator: a store with bandwidth and latency, and per-hop bytes.

A pipeline with a ``data_plane`` section moves each trajectory's per-token tensors
through a key-value store, as NeMo RL with TransferQueue does (reference/nemo_rl.md §3):

* **rollout → store**: every finished trajectory is put (``tokens x bytes_per_token``) as
  it completes; generation does not wait for it, but the store is busy meanwhile;
* **driver → workers, metadata only**: at a train step the driver shards the batch's
  :class:`~harness.dataplane.meta.KVBatchMeta` over the training DP ranks (the real
  ``shard_for_dp``) and hands each its shard; the bytes are the shard's JSON;
* **store → replica leaders**, then **leader → TP siblings** (one broadcast per replica
  over the intra-node link);
* **leader → store**: after the train compute each leader writes back its shard's
  per-token results (``writeback_bytes_per_token``); the driver clears the step's
  samples (and any evicted as stale).

``route: via_driver`` is the design the 1-hop rule forbids: the driver fetches the whole
batch from the store and sends each training rank its shard over its own link, and
write-backs come back through it. It exists to show the step-time cost (and invariant 16
fires on its log). The store and the driver's link are FIFO resources modelled as
timelines (each transfer starts when the previous one on that resource ended), so
contention is deterministic without extra processes. Fetch and write-back run inside the
train ``Compute`` effect, so they count as train time in the summary.

Attached to ``nemo_async`` (and any pipeline whose control logic yields ``Compute("train")``
after a ``WaitBatch``). The ``single_controller`` type (#12) landed after this was built;
its effects (``Generate``, ``ComputeLogProbs``, ``TrainMicrobatches``, ``ClearSamples``)
are the natural hooks, not wired yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from harness.dataplane.meta import KVBatchMeta

ROUTES = ("one_hop", "via_driver")
ROLLOUT_FIELDS = ["trajectory"]      # input_ids, generation logprobs, masks: one record per put
WRITEBACK_FIELDS = ["prev_logprobs"]


@dataclass(frozen=True)
class DataPlaneSpec:
    route: str = "one_hop"
    store_bytes_per_s: float = 5e9        # the store's aggregate bandwidth
    store_latency_s: float = 0.002        # per transfer (request round trip)
    driver_bytes_per_s: float = 1.25e9    # the driver process's link (only via_driver uses it for bulk)
    bytes_per_token: int = 24             # per-token fields the rollout puts
    writeback_bytes_per_token: int = 4    # per-token fields each leader writes back
    train_tp: int = 1                     # TP x CP x PP siblings per training DP replica


class Timeline:
    """A FIFO transfer resource: each transfer starts when the previous one ended."""

    def __init__(self, bytes_per_s: float, latency_s: float) -> None:
        self.bytes_per_s, self.latency_s = bytes_per_s, latency_s
        self.free_at = 0.0

    def transfer(self, now: float, nbytes: int) -> float:
        start = max(now, self.free_at)
        self.free_at = start + self.latency_s + nbytes / self.bytes_per_s
        return self.free_at


class DataPlaneSim:
    """One pipeline's data plane: the store's contents (rid -> tokens) and its hops."""

    def __init__(self, pipe: Any, spec: DataPlaneSpec) -> None:
        self.pipe, self.spec = pipe, spec
        self.env = pipe.env
        self.store = Timeline(spec.store_bytes_per_s, spec.store_latency_s)
        self.driver = Timeline(spec.driver_bytes_per_s, spec.store_latency_s)
        self.intra_bytes_per_s = pipe.sim.scenario.cluster.intra_node_bytes_per_s
        self.dp = len(pipe.train_gpus) // spec.train_tp
        self.tokens: Dict[int, int] = {}
        self.shards: List[KVBatchMeta] = []

    def _emit(self, hop: str, actor: str, role: str, samples: List[str], fields: List[str], nbytes: int,
              end: float, dp_rank: Optional[int] = None, to: Optional[str] = None) -> None:
        p = self.pipe
        self.pipe.sim.emit("dp_transfer", actor=f"{p.pid}/{actor}", role=role, partition=p.pid, hop=hop,
                           samples=samples, fields=fields, bytes=int(nbytes), pipeline_id=p.pid, step=p.ctx.step,
                           dp_rank=dp_rank, to=to, duration=round(end - self.env.now, 9))

    def on_trajectory(self, rid: int, tokens: int) -> None:
        now = self.env.now
        nbytes = tokens * self.spec.bytes_per_token
        self.tokens[rid] = tokens
        self._emit("producer_to_store", "rollout", "producer", [f"r{rid}"], ROLLOUT_FIELDS, nbytes,
                   self.store.transfer(now, nbytes))

    def before_train(self, batch_rids: List[int]):
        """Metadata to the workers, bulk from the store to them; yields until it arrived."""
        s, now = self.spec, self.env.now
        ids = [f"r{r}" for r in batch_rids]
        lens = [self.tokens.get(r, 0) for r in batch_rids]
        meta = KVBatchMeta(self.pipe.pid, tuple(ids), tuple(ROLLOUT_FIELDS), tuple(lens), tuple({} for _ in ids))
        self.shards = meta.shard_for_dp(self.dp)
        done = now
        if s.route == "one_hop":
            t_meta = now
            for d, shard in enumerate(self.shards):
                size = len(shard.to_json().encode())
                t_meta = self.driver.transfer(now, size)
                self._emit("driver_meta", "driver", "driver", list(shard.sample_ids), list(shard.fields), size,
                           t_meta, to=f"dp{d}")
            for d, shard in enumerate(self.shards):
                nbytes = sum(shard.sequence_lengths) * s.bytes_per_token
                end = self.store.transfer(t_meta, nbytes)
                self._emit("store_to_worker", f"train/dp{d}/tp0", "worker", list(shard.sample_ids),
                           ROLLOUT_FIELDS, nbytes, end, dp_rank=d)
                if s.train_tp > 1:
                    end += nbytes / self.intra_bytes_per_s
                    self._emit("leader_to_siblings", f"train/dp{d}/tp0", "worker", list(shard.sample_ids),
                               ROLLOUT_FIELDS, nbytes * (s.train_tp - 1), end, dp_rank=d)
                done = max(done, end)
        else:
            total = sum(lens) * s.bytes_per_token
            got = self.store.transfer(now, total)
            self._emit("store_to_driver", "driver", "driver", ids, ROLLOUT_FIELDS, total, got)
            for d, shard in enumerate(self.shards):
                nbytes = sum(shard.sequence_lengths) * s.bytes_per_token
                for t in range(s.train_tp):  # the driver ships every rank its shard
                    end = self.driver.transfer(got, nbytes)
                    self._emit("driver_to_worker", "driver", "driver", list(shard.sample_ids), ROLLOUT_FIELDS,
                               nbytes, end, to=f"dp{d}/tp{t}")
                    done = max(done, end)
        if done > now:
            yield self.env.timeout(done - now)

    def after_train(self, evicted_rids: List[int]):
        """Leaders' write-back (or through the driver), then the step's one clear."""
        s, now = self.spec, self.env.now
        done = now
        for d, shard in enumerate(self.shards):
            nbytes = sum(shard.sequence_lengths) * s.writeback_bytes_per_token
            if s.route == "one_hop":
                end = self.store.transfer(now, nbytes)
                self._emit("worker_to_store", f"train/dp{d}/tp0", "worker", list(shard.sample_ids), WRITEBACK_FIELDS,
                           nbytes, end, dp_rank=d)
            else:
                got = self.driver.transfer(now, nbytes)
                self._emit("worker_to_driver", f"train/dp{d}/tp0", "worker", list(shard.sample_ids), WRITEBACK_FIELDS,
                           nbytes, got, dp_rank=d)
                end = self.store.transfer(got, nbytes)
                self._emit("driver_to_store", "driver", "driver", list(shard.sample_ids), WRITEBACK_FIELDS, nbytes, end)
            done = max(done, end)
        if done > now:
            yield self.env.timeout(done - now)
        cleared = [s_ for shard in self.shards for s_ in shard.sample_ids] + [f"r{r}" for r in evicted_rids]
        for r in [int(c[1:]) for c in cleared]:
            self.tokens.pop(r, None)
        self.pipe.sim.emit("dp_clear", actor=f"{self.pipe.pid}/driver", role="driver", partition=self.pipe.pid,
                           samples=cleared, pipeline_id=self.pipe.pid, step=self.pipe.ctx.step)
        self.shards = []

    def evicted(self, batch_rids: List[int], buffered_rids: List[int]) -> List[int]:
        """Samples in the store that neither this batch nor the buffer holds: evicted as stale."""
        keep = set(batch_rids) | set(buffered_rids)
        return sorted(r for r in self.tokens if r not in keep)


def check_spec(spec: DataPlaneSpec, train_gpus: int) -> Optional[tuple]:
    """(field, problem) of an invalid section, or None."""
    if spec.route not in ROUTES:
        return "route", f"must be one of {', '.join(ROUTES)}, got {spec.route!r}"
    if train_gpus % spec.train_tp:
        return "train_tp", f"{spec.train_tp} does not divide the {train_gpus} train GPUs"
    return None
