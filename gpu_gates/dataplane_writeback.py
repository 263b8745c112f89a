"""Data-plane gate: only the replica leader writes back (the -601 duplicate-writer bug).

    torchrun --nproc-per-node 4 gpu_gates/dataplane_writeback.py [--tp 2] [--overwrite refuse|upsert]
    python gpu_gates/tq_host.py -- torchrun --nproc-per-node 4 gpu_gates/dataplane_writeback.py --store transferqueue

World = DP x TP. With ``--store served`` (the default) rank 0 hosts one in-process store
(gpu_gates.transports.served_store) that every rank reaches; with ``--store transferqueue`` the
launcher ``gpu_gates/tq_host.py`` runs Ray + TransferQueue and every rank attaches to it
as a plain TQ client (no Ray in the ranks). Rank 0 plays the rollout producer (puts per-token ``input_ids``) and the driver (shards
the batch's *metadata* across DP ranks and clears the step's samples when the step is
done). Every rank is a trainer worker with coordinates (dp, tp): the replica leader
(tp = 0) fetches its DP shard and broadcasts it to its TP siblings in two phases, every
sibling computes ``logprobs`` (bf16, per token), and only the leader writes them back.

Checks: every sibling received exactly the tensors the producer put; the store's write
ledger holds exactly one write of each (sample, field) per step, by its DP replica's
leader; the stored values are right; no write was refused. ``--overwrite refuse`` (the
default) gives the store Mooncake's no-upsert rule, so a second writer is refused with
the -601 class error; ``upsert`` is plain TransferQueue, which overwrites silently — the
ledger still counts the duplicate. On TransferQueue the ledger is the store's own
``__ledger__`` partition (``TransferQueueStore(ledger=True)``) and only ``upsert`` runs:
TQ has no conditional put, so a refusal cannot be made atomic across rank processes. The test hook ``leader_gate_off`` (a documented
fault) makes every sibling write, and the gate must fail naming the -601 class.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script by torchrun: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import json  # noqa: E402
from collections import Counter  # noqa: E402
from typing import Any, Dict, List, Optional, Tuple  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from gpu_gates.runtime.gate import GateContext, GateSpec, positive_int, run_gate  # noqa: E402
from gpu_gates.transports import served_store as served  # noqa: E402
from gpu_gates.dataplane.client import DataPlaneClient  # noqa: E402
from gpu_gates.dataplane.codec import FieldSpec, Schema  # noqa: E402
from harness.dataplane.errors import DuplicateWriteError  # noqa: E402
from harness.dataplane.meta import KVBatchMeta  # noqa: E402
from gpu_gates.dataplane.store import InProcessStore, RefuseOverwrite  # noqa: E402
from gpu_gates.transports.tq_store import TransferQueueStore  # noqa: E402
from gpu_gates.tq_host import CONF_ENV  # noqa: E402
from gpu_gates.transports.worker_mixin import DataPlaneWorkerMixin  # noqa: E402

PARTITION = "train"
SCHEMA = Schema.of(FieldSpec("input_ids", "per_token", "int64"), FieldSpec("logprobs", "per_token", "bfloat16"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tp", type=positive_int, default=2, help="TP siblings per DP replica (world %% tp == 0)")
    parser.add_argument("--samples", type=positive_int, default=8, help="samples per step")
    parser.add_argument(
        "--overwrite",
        choices=["refuse", "upsert"],
        default=None,
        help="refuse (default with --store served): Mooncake's no-upsert rule (-601 on a rewrite); "
        "upsert (default and only choice with --store transferqueue): plain TransferQueue",
    )
    parser.add_argument(
        "--store",
        choices=["served", "transferqueue"],
        default="served",
        help="served: rank 0 hosts an in-process store; transferqueue: the one gpu_gates/tq_host.py "
        "started (ranks attach as TQ clients)",
    )


def check_world(args: argparse.Namespace, world: int) -> Optional[str]:
    if world % args.tp:
        return f"world size {world} is not a multiple of --tp {args.tp}"
    if args.samples < world // args.tp:
        return f"--samples {args.samples} gives some of the {world // args.tp} DP ranks nothing to do"
    if args.overwrite is None:
        args.overwrite = "refuse" if args.store == "served" else "upsert"
    if args.store == "transferqueue":
        if args.overwrite == "refuse":
            return (
                "--overwrite refuse: needs --store served (TransferQueue has no conditional put, so the "
                "no-upsert refusal cannot be made atomic across rank processes)"
            )
        if not os.environ.get(CONF_ENV):
            return (
                f"--store transferqueue: {CONF_ENV} is not set; run the gate under gpu_gates/tq_host.py, "
                "which starts Ray + TransferQueue and names its client config"
            )
    return None


def rollout(step: int, n: int) -> Tuple[List[str], torch.Tensor, List[int]]:
    """The producer's batch, reproducible by every rank for checking."""
    lengths = [3 + (7 * i + 3 * step) % 9 for i in range(n)]
    ids = torch.zeros(n, max(lengths), dtype=torch.int64)
    for i, length in enumerate(lengths):
        ids[i, :length] = torch.arange(length) + 100 * i + 1000 * step
    return [f"s{step}_{i}" for i in range(n)], ids, lengths


def logprob_fn(input_ids: torch.Tensor) -> torch.Tensor:
    return (-(input_ids % 17).to(torch.float32) / 8).to(torch.bfloat16)


class GateWorker(DataPlaneWorkerMixin):
    def __init__(self, client: DataPlaneClient, dp: int, tp: int, group: Any, leader_rank: int, size: int) -> None:
        self.dp_client, self.dp, self.tp = client, dp, tp
        self._group = (group, leader_rank, size)

    def _local_coords(self) -> Dict[str, int]:
        return {"dp": self.dp, "tp": self.tp, "cp": 0, "pp": 0}

    def _replica_group(self):
        return self._group


def run(ctx: GateContext) -> None:
    args = ctx.args
    tp, dp_size = args.tp, ctx.world_size // args.tp
    dp, tp_rank = divmod(ctx.rank, tp)
    ctx.set_phase("replica groups")
    groups = [dist.new_group(list(range(k * tp, (k + 1) * tp)), timeout=ctx.timeout) for k in range(dp_size)]
    sink = lambda kind, fields: ctx.emit(kind, **fields)  # noqa: E731
    ctx.set_phase("store")
    host_store = tq = None
    if args.store == "transferqueue":  # every rank a TQ client of the launcher's TransferQueue
        tq = TransferQueueStore.attach(os.environ[CONF_ENV], ledger=True)
        ctx.salvage.append(tq.detach)
    if ctx.rank == 0:
        if tq is not None:
            host_store, where = tq, {}
        else:
            authkey = os.urandom(16)
            backing = InProcessStore()
            host_store = RefuseOverwrite(backing) if args.overwrite == "refuse" else backing
            address, stop = served.serve(host_store, authkey)
            ctx.salvage.append(stop)
            where = {"address": list(address), "authkey": authkey.hex()}
        producer = DataPlaneClient(host_store, actor="rollout", role="producer", sink=sink)
        driver = DataPlaneClient(host_store, actor="driver", role="driver", sink=sink)
        producer.register_partition(PARTITION, SCHEMA, tasks=["logprob"])
        ctx.put("store", json.dumps(where).encode())
    where = json.loads(ctx.wait_get("store", "the store address"))
    store = tq if tq is not None else served.connect(tuple(where["address"]), bytes.fromhex(where["authkey"]))
    worker = GateWorker(
        DataPlaneClient(store, actor=f"dp{dp}/tp{tp_rank}", role="worker", dp_rank=dp, sink=sink),
        dp,
        tp_rank,
        groups[dp],
        dp * tp,
        tp,
    )
    worker.dp_device = ctx.device
    if ctx.hooks.get("leader_gate_off"):
        worker.leader_gate = False
        ctx.emit("hook_fired", hook="leader_gate_off")
    refused = 0
    for step in range(args.cycles):
        ctx.set_phase(f"step {step}: dispatch")
        ctx.emit("cycle_begin", cycle=step)
        ids, input_ids, lengths = rollout(step, args.samples)
        if ctx.rank == 0:
            meta = producer.put_samples(ids, PARTITION, {"input_ids": input_ids}, sequence_lengths=lengths)
            for d, shard in enumerate(meta.shard_for_dp(dp_size)):
                driver.record_meta_dispatch(shard, to=f"dp{d}")
                ctx.put(f"meta/{step}/{d}", shard.to_json().encode())
        shard = KVBatchMeta.from_json(ctx.wait_get(f"meta/{step}/{dp}", f"step {step} metadata").decode())
        ctx.set_phase(f"step {step}: fetch + write back")
        data = {k: v.cpu() for k, v in worker.fetch_presharded(shard, ["input_ids"]).items()}
        rows = [ids.index(s) for s in shard.sample_ids]
        expect = input_ids[rows][:, : max(shard.sequence_lengths)]
        ctx.check(
            "broadcast_matches_put",
            torch.equal(data["input_ids"], expect),
            f"step {step}: dp{dp}/tp{tp_rank} received tensors that differ from what the producer put",
        )
        try:
            worker.write_back_presharded(shard, {"logprobs": logprob_fn(data["input_ids"])})
        except DuplicateWriteError as exc:
            refused += 1
            ctx.check("no_duplicate_write", False, f"step {step}: store refused dp{dp}/tp{tp_rank}'s write-back: {exc}")
        dist.barrier()
        if ctx.rank == 0:
            ctx.set_phase(f"step {step}: verify")
            _verify(ctx, host_store, step, ids, input_ids, lengths, dp_size, tp)
            driver.clear_samples(ids, PARTITION)  # one clear per step
        dist.barrier()
        ctx.emit("cycle_end", cycle=step)
    ctx.data.update(refused=refused, leader=tp_rank == 0, leader_gate=worker.leader_gate)
    if ctx.rank == 0:
        ctx.data["ledger"] = _ledger_summary(host_store)


def _verify(ctx, store, step, ids, input_ids, lengths, dp_size, tp) -> None:
    ledger = [w for w in store.write_ledger() if w[1] == PARTITION and w[3] == "logprobs" and w[2] in ids]
    per_key = Counter(w[2] for w in ledger)
    dupes = {s: n for s, n in per_key.items() if n > 1}
    missing = [s for s in ids if s not in per_key]
    writers = sorted({w[0] for w in ledger})
    ctx.check(
        "one_write_per_sample_field",
        not dupes and not missing,
        f"step {step}: "
        + (
            f"-601 class: duplicate writes {dict(sorted(dupes.items()))} by {writers}"
            if dupes
            else f"no write-back for {missing}"
        ),
    )
    ctx.check(
        "only_leaders_wrote",
        all(w.endswith("/tp0") for w in writers),
        f"step {step}: -601 class: non-leader writers among {writers}",
    )
    stored = store.read(PARTITION, ids, ["logprobs"])["logprobs"] if not missing else []
    ok = len(stored) == len(ids) and all(
        torch.equal(row, logprob_fn(input_ids[i, : lengths[i]])) for i, row in enumerate(stored)
    )
    ctx.check("stored_values", ok, f"step {step}: stored logprobs differ from the leaders' results")


def _ledger_summary(store) -> Dict[str, Any]:
    ledger = [w for w in store.write_ledger() if w[3] == "logprobs"]
    per_key = Counter((w[2], w[3]) for w in ledger)
    return {
        "writes": len(ledger),
        "keys": len(per_key),
        "max_writes_per_key": max(per_key.values(), default=0),
        "writers": sorted({w[0] for w in ledger}),
    }


def summarize(args: argparse.Namespace, results: List[Dict[str, Any]]) -> Tuple[Dict[str, Any], List[str]]:
    ledger = next((r["data"].get("ledger") for r in results if r["rank"] == 0), None) or {}
    refused = sum(r["data"].get("refused", 0) for r in results)
    summary = {
        "tp": args.tp,
        "dp": len(results) // args.tp,
        "store": args.store,
        "overwrite": args.overwrite,
        "leader_gate": all(r["data"].get("leader_gate", True) for r in results),
        "refused_writes": refused,
        **{f"ledger_{k}": v for k, v in ledger.items()},
    }
    return summary, []


SPEC = GateSpec(
    name="dataplane_writeback",
    description=__doc__.splitlines()[0],
    default_world=4,
    default_cycles=2,
    add_arguments=add_arguments,
    check_world=check_world,
    run=run,
    summarize=summarize,
)


if __name__ == "__main__":
    sys.exit(run_gate(SPEC))
