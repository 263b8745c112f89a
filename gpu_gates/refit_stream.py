"""Refit stream gate: the colocated ZMQ ping-pong refit, sender and receiver processes.

    torchrun --nproc-per-node 2 gpu_gates/refit_stream.py [--cycles 3] [--budget-bytes 16384]

Rank 0 is the trainer (binds REQ on a private ``ipc://`` endpoint), rank 1 the inference
worker on the same device (connects REP) — NeMo RL's colocated refit (
docs/modelled-systems.md#nemo-rl-refit), run by the one protocol in ``harness/refit/stream.py`` over the real transport
``gpu_gates/transports/zmq_stream.py``. On GPU the payload is a CUDA IPC handle of the staging
buffer; on CPU (gloo, CI) the buffers are ``/dev/shm`` files both processes map.

Every cycle: the trainer takes a deterministic "train step" (every tensor changes),
publishes the manifest ``{name: (shape, dtype)}`` with per-tensor SHA-256 digests through
the store, and streams its state — bf16, fp16, fp32, int64 (2-D and 0-dim) tensors and a
non-contiguous transposed view; with the default budget the embedding is oversized (sent
alone in a dedicated buffer) and two tensors are exactly a half buffer. The receiver
loads into its own weights, finalizes only a complete transfer, and compares digests
bit for bit (a failure names the tensors). The report carries, per cycle, the per-group
timings (pack, send, ACK wait on the sender; load on the receiver), bytes/s and the
overlap figure: seconds during which the sender packed group g+1 while the receiver
loaded group g, and that as a share of the receiver's load time. ``refit_wire`` is
checked over both sides' records; ``rlharness check`` on the event log checks it
again. Nothing is left in ``/dev/shm``; the socket lives in the run's private folder, which
the last rank out removes (``gpu_gates/sync/ipc.py`` ``gate_folders``), a killed rank's files with it.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script by torchrun: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import json  # noqa: E402
from typing import Any, Dict, List, Optional, Tuple  # noqa: E402

import torch  # noqa: E402

from gpu_gates.sync import ipc  # noqa: E402
from gpu_gates.runtime.gate import GateContext, GateSpec, positive_float, positive_int, run_gate  # noqa: E402
from gpu_gates.sync.tiny_model import TinyModel  # noqa: E402
from harness.refit import stream as proto  # noqa: E402
from gpu_gates.transports import zmq_stream as zs  # noqa: E402
from gpu_gates.transports.staging import leftover_shm  # noqa: E402
from gpu_gates.sync.bucket_cache import dtype_from_name, dtype_name, state_digests  # noqa: E402

SENDER, RECEIVER = 0, 1
TRAIN_SEED = 4321


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget-bytes", type=positive_int, default=16384, help="staging budget (two ping-pong buffers of half each)"
    )
    parser.add_argument("--width", type=positive_int, default=64, help="model width (64: ~60 KiB of state)")
    parser.add_argument(
        "--stream-timeout-s", type=positive_float, default=30.0, help="socket send/receive timeout of the stream"
    )


def check_world(args: argparse.Namespace, world: int) -> Optional[str]:
    if world != 2:
        return f"needs exactly 2 ranks (trainer, colocated inference worker), got world size {world}"
    if args.budget_bytes < 2 * proto.ALIGNMENT_BYTES:
        return f"--budget-bytes must be at least {2 * proto.ALIGNMENT_BYTES}"
    return None


def named_state(model: TinyModel) -> List[Tuple[str, torch.Tensor]]:
    """The state as an exporter yields it, plus a non-contiguous view (exporters yield such)."""
    return [(n, t.detach().cpu()) for n, t in model.named_state()] + [("embed.T", model.embed.detach().cpu().t())]


def _wire_records(ctx: GateContext) -> List[Dict[str, Any]]:
    return [dict(r) for r in ctx.events.records if r["kind"].startswith("refit_")]


def run_sender(ctx: GateContext, endpoint: str) -> None:
    model = TinyModel(TRAIN_SEED, width=ctx.args.width)
    sender = zs.RefitSender(
        endpoint, peer=f"rank {RECEIVER}", timeout_s=ctx.args.stream_timeout_s, device=ctx.device, emit=ctx.emit
    )
    # No emergency salvage closes the socket: the finish runs on the watchdog or SIGTERM
    # thread while this one may be blocked in the socket, and libzmq aborts the process
    # when a socket is closed under another thread's call ("Assertion failed: pfd.revents
    # & POLLIN"), which skips every exit handler. The process exits right after the
    # report; its staging files go with ipc.remove_own_files, its socket file with the
    # run's folder.
    previous: Optional[Dict[str, str]] = None
    try:
        for cycle in range(ctx.args.cycles):
            ctx.set_phase(f"cycle {cycle}: train step")
            ctx.emit("cycle_begin", cycle=cycle, version=cycle)
            model.train_step(cycle, TRAIN_SEED)
            named = named_state(model)
            digests = state_digests(named)
            if previous is not None:
                same = [n for n, d in digests.items() if previous.get(n) == d]
                ctx.check("weights_changed", not same, f"cycle {cycle}: the train step left {same} unchanged")
            previous = digests
            manifest = {n: [list(t.shape), dtype_name(t.dtype)] for n, t in named}
            ctx.put(f"refit/{cycle}/manifest", json.dumps({"manifest": manifest, "digests": digests}).encode())
            ctx.set_phase(f"cycle {cycle}: stream")
            ctx.hook("stream")
            ctx.hook(f"stream_cycle{cycle}")  # e.g. kill@stream_cycle1:0: the pooled staging buffers exist by then
            res = sender.stream(named, ctx.args.budget_bytes, step=cycle)
            ctx.data["cycles"].append(
                {
                    "cycle": cycle,
                    "groups": res.groups,
                    "bytes": res.bytes,
                    "wall_s": res.wall_s,
                    "staging_s": res.staging_s,
                    "complete_s": res.complete_s,
                    "groups_detail": [
                        {
                            "group": t.group,
                            "buffer": str(t.buffer),
                            "bytes": t.bytes,
                            "tensors": t.tensors,
                            "pack_s": t.pack_s,
                            "send_s": t.send_s,
                            "ack_wait_s": t.ack_wait_s,
                            "pack_interval": list(t.pack_interval),
                        }
                        for t in res.timings
                    ],
                }
            )
            ctx.emit("cycle_end", cycle=cycle)
    finally:
        sender.close()
        ctx.data["wire"] = _wire_records(ctx)
    left = leftover_shm(os.getpid())
    ctx.check("no_shm_leftovers", not left, f"staging files left in /dev/shm: {left}")


def run_receiver(ctx: GateContext, endpoint: str) -> None:
    receiver = zs.RefitReceiver(
        endpoint, peer=f"rank {SENDER}", timeout_s=ctx.args.stream_timeout_s, device=ctx.device, emit=ctx.emit
    )  # no salvage: see run_sender
    weights: Dict[str, torch.Tensor] = {}
    try:
        for cycle in range(ctx.args.cycles):
            ctx.set_phase(f"cycle {cycle}: wait for the manifest")
            body = json.loads(ctx.wait_get(f"refit/{cycle}/manifest", f"the manifest of cycle {cycle}"))
            manifest = {n: (tuple(shape), dt) for n, (shape, dt) in body["manifest"].items()}
            for n, (shape, dt) in manifest.items():
                if n not in weights:  # allocated (and touched) once, like a served model
                    weights[n] = torch.zeros(shape, dtype=dtype_from_name(dt), device=ctx.device)
            finalized: List[int] = []

            def load(slot: proto.Slot, view: torch.Tensor) -> None:
                ctx.hook("receiver_load")
                weights[slot.name].copy_(view)

            ctx.set_phase(f"cycle {cycle}: receive")
            res = receiver.receive(
                manifest,
                load,
                step=cycle,
                half_bytes=proto.half_buffer_bytes(ctx.args.budget_bytes),
                finalize=finalized.append,
            )
            mine = state_digests((n, t.cpu()) for n, t in weights.items() if n in manifest)
            bad = sorted(n for n, d in body["digests"].items() if mine.get(n) != d)
            described = ", ".join(f"{n!r} ({manifest[n][1]}{list(manifest[n][0])})" for n in bad)
            ctx.check(
                "bit_exact", not bad, f"cycle {cycle}: {len(bad)} tensor(s) differ from the trainer's: {described}"
            )
            ctx.check("finalized_once", finalized == [res.groups], f"cycle {cycle}: finalize calls {finalized}")
            ctx.emit("digest_check", version=cycle, ok=not bad, mismatches=len(bad), target=True)
            ctx.data["cycles"].append(
                {
                    "cycle": cycle,
                    "groups": res.groups,
                    "bytes": res.bytes,
                    "load_s": res.load_s,
                    "load_intervals": [list(x) for x in res.load_intervals],
                }
            )
    finally:
        receiver.close()
        ctx.data["wire"] = _wire_records(ctx)


def run(ctx: GateContext) -> None:
    ctx.data.update(
        role="trainer (sender)" if ctx.rank == SENDER else "inference (receiver)",
        cycles=[],
        transport="cuda_ipc" if ctx.device.type == "cuda" else "cpu_shm",
    )
    if ctx.rank == SENDER:
        endpoint = f"ipc://{ipc.ipc_dir()}/refit.sock"  # the run's private folder (see ipc.gate_folders)
        ctx.put("refit/endpoint", endpoint.encode())
        run_sender(ctx, endpoint)
    else:
        run_receiver(ctx, ctx.wait_get("refit/endpoint", "the trainer's endpoint").decode())


def summarize(args: argparse.Namespace, results: List[Dict[str, Any]]) -> Tuple[Dict[str, Any], List[str]]:
    """Per cycle: groups, bytes/s, per-group timings, overlap; ``refit_wire`` over both sides."""
    from harness.logs.invariants import check_log

    by_rank = {r["rank"]: r.get("data") or {} for r in results}
    sent, received = by_rank.get(SENDER, {}).get("cycles", []), by_rank.get(RECEIVER, {}).get("cycles", [])
    cycles: Dict[str, Any] = {}
    for s in sent:
        r = next((x for x in received if x["cycle"] == s["cycle"]), None)
        loads = r["load_s"] if r else []
        overlap = (
            zs.overlap_seconds(
                [tuple(g["pack_interval"]) for g in s["groups_detail"]], [tuple(x) for x in r["load_intervals"]]
            )
            if r
            else 0.0
        )
        groups = [
            {**{k: v for k, v in g.items() if k != "pack_interval"}, "load_s": loads[i] if i < len(loads) else None}
            for i, g in enumerate(s["groups_detail"])
        ]
        cycles[f"cycle {s['cycle']}"] = {
            "groups": s["groups"],
            "bytes": s["bytes"],
            "wall_s": s["wall_s"],
            "bytes_per_s": s["bytes"] / s["wall_s"] if s["wall_s"] > 0 else None,
            "overlap_s": overlap,
            "overlap_share_of_load": overlap / sum(loads) if sum(loads) > 0 else 0.0,
            "per_group": groups,
        }
    wire = [rec for d in by_rank.values() for rec in d.get("wire", [])]
    wire.sort(key=lambda rec: (rec["t"], rec["rank"], rec["_seq"]))
    violations = check_log([{**rec, "seq": i} for i, rec in enumerate(wire)], ["refit_wire"])
    extra = [f"invariant refit_wire: {v}" for v in violations[:5]]
    return {
        "cycles": cycles,
        "wire_records": len(wire),
        "refit_wire_violations": len(violations),
        "transport": sorted({d.get("transport") for d in by_rank.values() if d.get("transport")}),
        "budget_bytes": args.budget_bytes,
    }, extra


SPEC = GateSpec(
    name="refit_stream",
    description=__doc__.splitlines()[0],
    default_world=2,
    default_cycles=3,
    add_arguments=add_arguments,
    check_world=check_world,
    run=run,
    summarize=summarize,
)


if __name__ == "__main__":
    sys.exit(run_gate(SPEC))
