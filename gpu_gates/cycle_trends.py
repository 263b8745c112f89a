"""Cycle-trends gate: N sleep/wake/refit cycles leave nothing behind that grows.

    torchrun --nproc-per-node 2 gpu_gates/cycle_trends.py [--cycles 20] [--budget-bytes 16384]

Rank 0 is the trainer (the refit's producer), rank 1 a colocated inference engine
(``gpu_gates/engines/tiny_engine.py``: weights and a KV cache on the device, tagged as vLLM tags
them, plus FP8 KV-cache scales the engine needs). Every cycle, after vLLM's RL sequence:

1. the engine wakes its ``weights`` tag, takes a refit over the harness's refit stream
   (``harness/refit/stream.py`` on ``gpu_gates/transports/zmq_stream.py``; oversized
   tensors alone) of the trainer's changed state, KV-cache scales included, finalizes, wakes
   its ``kv_cache`` tag, invalidates its prefix cache, resumes and serves one request; the
   weights must be bit-exact and every tensor the engine requires must have arrived (check
   ``refit_complete``; NeMo RL #3226);
2. it pauses (``abort`` and ``keep`` by turns), is drained, sleeps (level 1 on even cycles,
   level 2 on odd ones) and its residue is measured (CUDA ``memory_allocated``; on CPU the
   live bytes of the tensors it allocated);
3. both ranks build a process group for the cycle and destroy it.

Each engine call is an event of the engine's transition table (``harness/control/engine_table.py``),
refused when illegal, and recorded; the oracle's ``engine_transition`` judges the gate's log
against the same table.

Per cycle the gate writes ``trend_sample`` records: ``residue_bytes`` (engine, after
sleep), ``ipc_bytes`` (trainer: its staging memory after the refit — its ``/dev/shm`` files
on CPU, ``memory_allocated`` growth on CUDA), ``live_groups`` (each rank, c10d's
registry) and ``refit_s`` (trainer, wall time of the stream). At the end each rank fits
a least-squares line through its series and checks the slope against the documented
bound (``harness/logs/invariants/trends.py``, docs/trends.md); rank 0 checks the merged log
with ``cycle_trends``, ``refit_payload`` and ``refit_wire`` again.

Fault hooks (``RLHARNESS_GATE_TEST_HOOK``), one per leak class: ``residue_grows`` (the
engine's sleep keeps its KV cache: NeMo RL #2619), ``ipc_staging_leak`` (the producer keeps
each released staging pair: vLLM #51258), ``leak_cycle_group`` (the cycle's group is never
destroyed), ``refit_slows`` (each refit's load waits ``20 ms x cycle``), and
``drop_kv_scales`` (the trainer exports parameters and buffers only: NeMo RL #3226); and
``resume_kv_asleep`` for the table (cycle 1 resumes with its KV cache asleep on an engine that
does not refuse, verl-omni #380: ``engine_transition``).
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script by torchrun: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from typing import Any, Dict, List, Optional, Tuple  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from gpu_gates.sync import ipc  # noqa: E402
from gpu_gates.runtime import pg_registry  # noqa: E402
from gpu_gates.runtime.gate import GateContext, GateSpec, positive_int, run_gate  # noqa: E402
from gpu_gates.engines.tiny_engine import KV_SCALE_NAMES, TinyEngine  # noqa: E402
from gpu_gates.sync.tiny_model import TinyModel  # noqa: E402
from gpu_gates.transports import zmq_stream as zs  # noqa: E402
from gpu_gates.transports.staging import leftover_shm  # noqa: E402
from harness.logs.invariants import trends  # noqa: E402
from harness.refit import stream as proto  # noqa: E402
from gpu_gates.sync.bucket_cache import dtype_name, state_digests  # noqa: E402

SENDER, ENGINE = 0, 1
#: the records the oracle reads: the trends, the refit's wire, the engine's calls (engine_transition)
ENGINE_KINDS = (
    "trend_sample",
    "engine_required",
    "effect_start",
    "effect_end",
    "rank_state",
    "engine_tag",
    "request_dispatch",
)
TRAIN_SEED = 2619
SLOW_STEP_S = 0.02


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget-bytes",
        type=positive_int,
        default=16384,
        help="refit staging budget (two ping-pong buffers of half each; the embedding is oversized)",
    )
    parser.add_argument("--kv-bytes", type=positive_int, default=1 << 20, help="the engine's KV cache size")
    parser.add_argument("--stream-timeout-s", type=float, default=30.0)


def check_world(args: argparse.Namespace, world: int) -> Optional[str]:
    if world != 2:
        return f"needs exactly 2 ranks (trainer, colocated engine), got world size {world}"
    if args.cycles < trends.MIN_CYCLES:
        return f"--cycles must be at least {trends.MIN_CYCLES} to fit a trend, got {args.cycles}"
    if args.budget_bytes < 2 * proto.ALIGNMENT_BYTES:
        return f"--budget-bytes must be at least {2 * proto.ALIGNMENT_BYTES}"
    return None


def kv_scales(model: TinyModel) -> List[Tuple[str, torch.Tensor]]:
    """The FP8 KV-cache scales the trainer computes from its weights (amax / 448, FP8
    e4m3's largest value): state the engine needs that is not a parameter of the model."""
    amax = model.proj_weight.detach().float().abs().amax().cpu()
    return [(n, (amax * (1 + i) / 448.0).reshape(())) for i, n in enumerate(KV_SCALE_NAMES)]


def export(ctx: GateContext, model: TinyModel) -> List[Tuple[str, torch.Tensor]]:
    named = [(n, t.detach().cpu()) for n, t in model.named_state()]
    if ctx.hooks.get("drop_kv_scales") is not None:
        return named  # parameters and buffers only: NeMo RL #3226
    return named + kv_scales(model)


def sample(ctx: GateContext, series: str, cycle: int, value: float) -> None:
    ctx.emit("trend_sample", series=series, cycle=cycle, value=value)
    ctx.data.setdefault("series", {}).setdefault(series, []).append(value)


def cycle_group(ctx: GateContext, cycle: int) -> None:
    """A group per cycle (as a refit's version agreement would build), destroyed after it."""
    group = dist.new_group([SENDER, ENGINE], timeout=ctx.timeout)
    dist.barrier(group=group)
    if ctx.hooks.get("leak_cycle_group") is None:
        dist.destroy_process_group(group)
    else:
        ctx.data.setdefault("leaked_groups", []).append(group)
    sample(ctx, "live_groups/process", cycle, len(pg_registry.live_groups()))


def _device_allocated(ctx: GateContext) -> int:
    if ctx.device.type != "cuda":
        return 0
    torch.cuda.synchronize(ctx.device)
    return int(torch.cuda.memory_allocated(ctx.device))


def run_sender(ctx: GateContext, endpoint: str) -> None:
    model = TinyModel(TRAIN_SEED).to(ctx.device)
    sender = zs.RefitSender(
        endpoint,
        peer=f"rank {ENGINE}",
        timeout_s=ctx.args.stream_timeout_s,
        device=ctx.device,
        emit=ctx.emit,
        leak_staging=ctx.hooks.get("ipc_staging_leak") is not None,
    )
    base = _device_allocated(ctx)
    try:
        for cycle in range(ctx.args.cycles):
            ctx.set_phase(f"cycle {cycle}: train step")
            model.train_step(cycle, TRAIN_SEED)
            named = export(ctx, model)
            manifest = {n: [list(t.shape), dtype_name(t.dtype)] for n, t in named}
            ctx.put(
                f"trend/{cycle}/manifest", json.dumps({"manifest": manifest, "digests": state_digests(named)}).encode()
            )
            ctx.set_phase(f"cycle {cycle}: refit")
            res = sender.stream(named, ctx.args.budget_bytes, step=cycle)
            sample(ctx, "refit_s/trainer", cycle, res.wall_s)
            staged = (
                sum(os.path.getsize(p) for p in leftover_shm(os.getpid()))
                if ctx.device.type != "cuda"
                else _device_allocated(ctx) - base
            )
            sample(ctx, "ipc_bytes/trainer", cycle, staged)
            ctx.set_phase(f"cycle {cycle}: group")
            cycle_group(ctx, cycle)
    finally:
        sender.close()


def refit_engine(ctx: GateContext, receiver: zs.RefitReceiver, engine: TinyEngine, cycle: int) -> None:
    body = json.loads(ctx.wait_get(f"trend/{cycle}/manifest", f"the manifest of cycle {cycle}"))
    manifest = {n: (tuple(shape), dt) for n, (shape, dt) in body["manifest"].items()}
    ctx.emit("engine_required", step=cycle, names=engine.required())
    slow = ctx.hooks.get("refit_slows") is not None
    received: List[str] = []

    def load(slot: proto.Slot, view: torch.Tensor) -> None:
        if slow and not received:
            time.sleep(SLOW_STEP_S * cycle)
        engine.weights[slot.name].copy_(view)
        received.append(slot.name)

    receiver.receive(manifest, load, step=cycle, half_bytes=proto.half_buffer_bytes(ctx.args.budget_bytes))
    missing = [n for n in engine.required() if n not in received]
    ctx.check(
        "refit_complete",
        not missing,
        f"cycle {cycle}: the refit finalized without {len(missing)} tensor(s) "
        f"the engine needs: {', '.join(map(repr, missing))}",
    )
    mine = state_digests((n, engine.weights[n].cpu()) for n in body["digests"] if n in engine.weights)
    bad = sorted(n for n, d in body["digests"].items() if mine.get(n) != d)
    ctx.check("bit_exact", not bad, f"cycle {cycle}: {len(bad)} tensor(s) differ from the trainer's: {bad}")


def engine_cycle(ctx: GateContext, receiver: zs.RefitReceiver, engine: TinyEngine, cycle: int) -> None:
    """vLLM's RL sequence, one call per event of the engine's table: wake the weights, take
    the refit, finalize, wake the KV cache, invalidate the prefix cache, resume, serve one
    request, pause (``abort`` and ``keep`` by turns) and, acknowledged, sleep (levels 1 and 2
    by turns); the residue is measured after the sleep."""
    ctx.set_phase(f"cycle {cycle}: refit")
    engine.wake(["weights"])
    engine.begin_load(cycle)
    refit_engine(ctx, receiver, engine, cycle)
    engine.end_load(cycle)
    engine.finalize()
    if not (cycle == 1 and ctx.hooks.get("resume_kv_asleep") is not None):
        engine.wake(["kv_cache"])  # the hook: verl-omni #380's default wake tags ['weights'] leave it asleep
    engine.invalidate()
    engine.resume()
    engine.generate(cycle)
    engine.pause("abort" if cycle % 2 == 0 else "keep")
    engine.drained()
    level = 1 if cycle % 2 == 0 else 2
    ctx.set_phase(f"cycle {cycle}: sleep level {level}")
    engine.sleep(level)
    sample(ctx, "residue_bytes/engine", cycle, engine.device_bytes())


def run_engine(ctx: GateContext, endpoint: str) -> None:
    spec_model = TinyModel(TRAIN_SEED)
    spec = {n: (tuple(t.shape), dtype_name(t.dtype)) for n, t in spec_model.named_state()}
    spec.update({n: ((), "float32") for n in KV_SCALE_NAMES})
    # the hook resume_kv_asleep runs an engine from before vLLM's guard (#44483): it does not refuse
    engine = TinyEngine(
        ctx.device,
        spec,
        ctx.args.kv_bytes,
        keep_kv_on_sleep=ctx.hooks.get("residue_grows") is not None,
        emit=ctx.emit,
        unguarded=ctx.hooks.get("resume_kv_asleep") is not None,
    )
    receiver = zs.RefitReceiver(
        endpoint, peer=f"rank {SENDER}", timeout_s=ctx.args.stream_timeout_s, device=ctx.device, emit=ctx.emit
    )
    try:
        for cycle in range(ctx.args.cycles):
            engine_cycle(ctx, receiver, engine, cycle)
            ctx.set_phase(f"cycle {cycle}: group")
            cycle_group(ctx, cycle)
    finally:
        receiver.close()


def judge_own(ctx: GateContext) -> None:
    """Each series of this rank: a fitted slope within its family's bound."""
    figures = {}
    for series, values in sorted(ctx.data.get("series", {}).items()):
        t = trends.judge(series, [(c, v, c) for c, v in enumerate(values)])
        if t is None:
            continue
        figures[series] = {"cycles": t.cycles, "slope": t.slope, "bound": t.limit, "first": t.first, "last": t.last}
        ctx.check(f"flat_{series.split('/')[0]}", t.ok, t.describe())
    ctx.data["trends"] = figures


def run(ctx: GateContext) -> None:
    ctx.data.update(
        role="trainer (refit producer)" if ctx.rank == SENDER else "engine (refit receiver)",
        transport="cuda_ipc" if ctx.device.type == "cuda" else "cpu_shm",
    )
    t0 = time.monotonic()
    if ctx.rank == SENDER:
        endpoint = f"ipc://{ipc.ipc_dir()}/trend.sock"
        ctx.put("trend/endpoint", endpoint.encode())
        run_sender(ctx, endpoint)
    else:
        run_engine(ctx, ctx.wait_get("trend/endpoint", "the trainer's endpoint").decode())
    ctx.data["cycles_wall_s"] = time.monotonic() - t0
    judge_own(ctx)
    ctx.data["records"] = [
        dict(r) for r in ctx.events.records if r["kind"].startswith("refit_") or r["kind"] in ENGINE_KINDS
    ]


def summarize(args: argparse.Namespace, results: List[Dict[str, Any]]) -> Tuple[Dict[str, Any], List[str]]:
    """Slopes and bounds per series, the cycles' wall time, and the oracle over both ranks' records."""
    from harness.logs.invariants import check_log

    by_rank = {r["rank"]: r.get("data") or {} for r in results}
    recs = sorted(
        (rec for d in by_rank.values() for rec in d.get("records", [])),
        key=lambda rec: (rec["t"], rec["rank"], rec["_seq"]),
    )
    violations = check_log(
        [{**rec, "seq": i} for i, rec in enumerate(recs)],
        ["cycle_trends", "refit_payload", "refit_wire", "engine_transition", "engine_stood_down"],
    )
    figures = {s: f for d in by_rank.values() for s, f in d.get("trends", {}).items()}
    wall = max((d.get("cycles_wall_s", 0.0) for d in by_rank.values()), default=0.0)
    return {
        "cycles": args.cycles,
        "trends": figures,
        "cycles_wall_s": wall,
        "violations": [str(v) for v in violations],
    }, [f"oracle: {v}" for v in violations[:5]]


SPEC = GateSpec(
    name="cycle_trends",
    description=__doc__.splitlines()[0],
    default_world=2,
    default_cycles=20,
    add_arguments=add_arguments,
    check_world=check_world,
    run=run,
    summarize=summarize,
)


if __name__ == "__main__":
    sys.exit(run_gate(SPEC))
