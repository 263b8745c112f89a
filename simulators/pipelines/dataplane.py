"""The data plane in the simulator: a store with bandwidth and latency, and per-hop bytes.

A pipeline with a ``data_plane`` section moves each trajectory's per-token tensors
through a key-value store, as NeMo RL with TransferQueue does (docs/modelled-systems.md#nemo-rl-data-plane):

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
write-backs come back through it. It exists to show the step-time cost (and ``data_plane``
fires on its log). The store and the driver's link are FIFO resources modelled as
timelines (each transfer starts when the previous one on that resource ended), so
contention is deterministic without extra processes. Fetch and write-back run inside the
trainer's effects, so they count as train time in the summary.

Used by ``nemo_async`` (its ``Compute("train")`` after ``WaitBatch``: one fetch, one
write-back, one clear per step) and by ``single_controller`` (per prompt group: a put when
its generation finishes; at ``ComputeLogProbs`` a fetch and the leaders' write-back of
``prev_logprobs``; at ``TrainMicrobatches`` a fetch of the rollout's plus the written-back
fields; a clear at ``ClearSamples`` and at the sampler's evictions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from harness.dataplane.meta import KVBatchMeta

ROUTES = ("one_hop", "via_driver")
ROLLOUT_FIELDS = ["trajectory"]  # input_ids, generation logprobs, masks: one record per put
WRITEBACK_FIELDS = ["prev_logprobs"]


@dataclass(frozen=True)
class DataPlaneSpec:
    # one_hop: bulk store -> workers; via_driver: through the driver (the design the data plane forbids)
    route: str = "one_hop"
    store_bytes_per_s: float = 5e9  # the store's aggregate bandwidth
    store_latency_s: float = 0.002  # per transfer (request round trip)
    driver_bytes_per_s: float = 1.25e9  # the driver process's link (only via_driver uses it for bulk)
    bytes_per_token: int = 24  # per-token fields the rollout puts
    writeback_bytes_per_token: int = 4  # per-token fields each leader writes back
    train_tp: int = 1  # TP x CP x PP siblings per training DP replica


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
    """One pipeline's data plane: the store's contents (sample id -> tokens) and its hops.

    The core (:meth:`put`, :meth:`fetch`, :meth:`write_back`, :meth:`clear`) works on sample
    ids and is what ``single_controller`` calls from its effects; ``on_trajectory`` /
    ``before_train`` / ``after_train`` / ``evicted`` adapt it to ``nemo_async``'s replay
    buffer of integer request ids (sample ``r{rid}``).
    """

    def __init__(self, pipe: Any, spec: DataPlaneSpec, step_of: Optional[Callable[[], Optional[int]]] = None) -> None:
        self.pipe, self.spec = pipe, spec
        self.env = pipe.env
        self.step_of = step_of or (lambda: pipe.ctx.step)
        self.store = Timeline(spec.store_bytes_per_s, spec.store_latency_s)
        self.driver = Timeline(spec.driver_bytes_per_s, spec.store_latency_s)
        self.intra_bytes_per_s = pipe.sim.scenario.cluster.intra_node_bytes_per_s
        self.dp = len(pipe.train_gpus) // spec.train_tp
        self.tokens: Dict[str, int] = {}
        self.shards: List[KVBatchMeta] = []

    def _emit(
        self,
        hop: str,
        actor: str,
        role: str,
        samples: List[str],
        fields: List[str],
        nbytes: int,
        end: float,
        dp_rank: Optional[int] = None,
        to: Optional[str] = None,
    ) -> None:
        p = self.pipe
        self.pipe.sim.emit(
            "dp_transfer",
            actor=f"{p.pid}/{actor}",
            role=role,
            partition=p.pid,
            hop=hop,
            samples=samples,
            fields=fields,
            bytes=int(nbytes),
            pipeline_id=p.pid,
            step=self.step_of(),
            dp_rank=dp_rank,
            to=to,
            duration=round(end - self.env.now, 9),
        )

    # ------------------------------------------------------------------ the core, by sample id
    def put(self, ids: List[str], tokens: List[int]) -> float:
        """The producer's put of finished trajectories (one ``put_samples`` call); returns
        when it has landed in the store (the caller decides whether to wait for it)."""
        nbytes = sum(tokens) * self.spec.bytes_per_token
        for i, n in zip(ids, tokens):
            self.tokens[i] = n
        end = self.store.transfer(self.env.now, nbytes)
        self._emit("producer_to_store", "rollout", "producer", list(ids), ROLLOUT_FIELDS, nbytes, end)
        return end

    def fetch(self, ids: List[str], fields: List[str], bytes_per_token: int):
        """Metadata to the workers, bulk from the store to them; yields until it arrived and
        returns the DP shards (what each replica leader holds, and will write back for)."""
        s, now = self.spec, self.env.now
        lens = [self.tokens.get(i, 0) for i in ids]
        meta = KVBatchMeta(self.pipe.pid, tuple(ids), tuple(fields), tuple(lens), tuple({} for _ in ids))
        shards = meta.shard_for_dp(self.dp)
        done = now
        if s.route == "one_hop":
            t_meta = now
            for d, shard in enumerate(shards):
                size = len(shard.to_json().encode())
                hook = getattr(self.pipe, "_driver_meta_bytes", None)  # fault bulk_in_driver_meta
                if hook is not None:
                    size = hook(size, sum(shard.sequence_lengths) * bytes_per_token)
                t_meta = self.driver.transfer(now, size)
                self._emit(
                    "driver_meta",
                    "driver",
                    "driver",
                    list(shard.sample_ids),
                    list(shard.fields),
                    size,
                    t_meta,
                    to=f"dp{d}",
                )
            for d, shard in enumerate(shards):
                nbytes = sum(shard.sequence_lengths) * bytes_per_token
                end = self.store.transfer(t_meta, nbytes)
                self._emit(
                    "store_to_worker",
                    f"train/dp{d}/tp0",
                    "worker",
                    list(shard.sample_ids),
                    list(fields),
                    nbytes,
                    end,
                    dp_rank=d,
                )
                if s.train_tp > 1:
                    end += nbytes / self.intra_bytes_per_s
                    self._emit(
                        "leader_to_siblings",
                        f"train/dp{d}/tp0",
                        "worker",
                        list(shard.sample_ids),
                        list(fields),
                        nbytes * (s.train_tp - 1),
                        end,
                        dp_rank=d,
                    )
                done = max(done, end)
        else:
            total = sum(lens) * bytes_per_token
            got = self.store.transfer(now, total)
            self._emit("store_to_driver", "driver", "driver", list(ids), list(fields), total, got)
            for d, shard in enumerate(shards):
                nbytes = sum(shard.sequence_lengths) * bytes_per_token
                for t in range(s.train_tp):  # the driver ships every rank its shard
                    end = self.driver.transfer(got, nbytes)
                    self._emit(
                        "driver_to_worker",
                        "driver",
                        "driver",
                        list(shard.sample_ids),
                        list(fields),
                        nbytes,
                        end,
                        to=f"dp{d}/tp{t}",
                    )
                    done = max(done, end)
        if done > now:
            yield self.env.timeout(done - now)
        return shards

    def write_back(self, shards: List[KVBatchMeta]):
        """Each replica leader writes its shard's per-token results back (or through the
        driver); yields until every write has landed."""
        s, now = self.spec, self.env.now
        done = now
        for d, shard in enumerate(shards):
            nbytes = sum(shard.sequence_lengths) * s.writeback_bytes_per_token
            if s.route == "one_hop":
                end = self.store.transfer(now, nbytes)
                self._emit(
                    "worker_to_store",
                    f"train/dp{d}/tp0",
                    "worker",
                    list(shard.sample_ids),
                    WRITEBACK_FIELDS,
                    nbytes,
                    end,
                    dp_rank=d,
                )
            else:
                got = self.driver.transfer(now, nbytes)
                self._emit(
                    "worker_to_driver",
                    f"train/dp{d}/tp0",
                    "worker",
                    list(shard.sample_ids),
                    WRITEBACK_FIELDS,
                    nbytes,
                    got,
                    dp_rank=d,
                )
                end = self.store.transfer(got, nbytes)
                self._emit("driver_to_store", "driver", "driver", list(shard.sample_ids), WRITEBACK_FIELDS, nbytes, end)
            done = max(done, end)
        if done > now:
            yield self.env.timeout(done - now)

    def clear(self, ids: List[str]) -> None:
        """The driver's ``clear_samples``: metadata only, no bulk moves."""
        for i in ids:
            self.tokens.pop(i, None)
        self.pipe.sim.emit(
            "dp_clear",
            actor=f"{self.pipe.pid}/driver",
            role="driver",
            partition=self.pipe.pid,
            samples=list(ids),
            pipeline_id=self.pipe.pid,
            step=self.step_of(),
        )

    # ------------------------------------------------------------------ nemo_async's adapter
    def on_trajectory(self, rid: int, tokens: int) -> None:
        self.put([f"r{rid}"], [tokens])  # generation does not wait for the put

    def before_train(self, batch_rids: List[int]):
        self.shards = yield from self.fetch([f"r{r}" for r in batch_rids], ROLLOUT_FIELDS, self.spec.bytes_per_token)

    def after_train(self, evicted_rids: List[int]):
        """Leaders' write-back, then the step's one clear (this batch and the evicted)."""
        yield from self.write_back(self.shards)
        self.clear([s_ for shard in self.shards for s_ in shard.sample_ids] + [f"r{r}" for r in evicted_rids])
        self.shards = []

    def evicted(self, batch_rids: List[int], buffered_rids: List[int]) -> List[int]:
        """Samples in the store that neither this batch nor the buffer holds: evicted as stale."""
        keep = {f"r{r}" for r in set(batch_rids) | set(buffered_rids)}
        return sorted(int(k[1:]) for k in self.tokens if k not in keep)


def check_spec(spec: DataPlaneSpec, train_gpus: int) -> Optional[tuple]:
    """(field, problem) of an invalid section, or None."""
    if spec.route not in ROUTES:
        return "route", f"must be one of {', '.join(ROUTES)}, got {spec.route!r}"
    if train_gpus % spec.train_tp:
        return "train_tp", f"{spec.train_tp} does not divide the {train_gpus} train GPUs"
    return None
