"""Streaming split-API training under data parallelism equals the synchronous full-batch step.

    torchrun --nproc-per-node 2 gpu_gates/train_pump_parity.py [--dtype fp32|bf16] [--loss-type both]

Every step draws a global batch of prompt groups (random masks, so some sequences have
no valid token). Each data-parallel rank gets every world-th group and streams its
groups into the split train API (``gpu_gates/streaming/split_trainer.py``) in a long-tailed
arrival order, one group per ``train_microbatch``: un-normalized sums inside DDP's
``no_sync``, counts all-reduced and gradients reduced and rescaled once by 1/N at
``finish_train_step``, one optimizer and scheduler step. Every rank also runs the
reference — one synchronous step on the whole global batch, in the same dtype, with the
loss written from its definition apart from the trainer (``gpu_gates/streaming/parity_reference.py``:
it shares no helper with ``split_trainer.py``, so a wrong loss in the trainer cannot cancel
out) — and after every step checks:

* ``parity``: parameters equal the reference within the dtype's tolerance
  (fp32: rtol 1e-5, atol 1e-6 — only summation order differs; bf16: rtol 2e-2, atol 1e-2,
  see docs/gates.md: bf16 keeps 8 significant bits, so one rounding is up to 2^-8
  relative (0.4 %), and the streamed gradient is accumulated in bf16 across
  microbatches — up to one rounding per microbatch — before the same SGD update);
* ``loss``: the step's normalized loss equals the reference's;
* ``no_sync``: before finish the ranks' local gradients differ (no reduce fired per
  microbatch), after finish they are identical (exactly one reduce);
* ``leader_metrics``: the replica leaders' token and sequence counts add up to the
  global batch's (each rank is its replica's leader here: DP only);
* ``version``: the trainer version ticks once per step, at finish.

The trainer writes ``trainer_step`` records and the gate a ``ClearSamples`` effect as it
drops each trained group, so ``streaming_step`` reads the merged event log.

Faults, installed by the tests through the test-hook variable (``gpu_gates/runtime/hooks.py``), never a
flag: ``wrong_normalizer`` makes the trainer rescale by the other count (tokens for a sequence
loss and back); ``wrong_loss`` makes its loss sum ignore the mask (padding positions count),
counts unchanged — a bug in the trainer's loss helper, which a reference calling that same
helper would share. Both must fail ``parity``. With ``--chunks K`` each rank's groups of a step
go in K chunks with a log-prob pass (``compute_logprobs``) on the next chunk between them;
``chunk_grads_lost`` (NeMo RL #3660) makes that pass zero the gradient storage, losing every
chunk but the last, which must fail ``parity`` too (a split-vs-split comparison would not see it).
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script by torchrun: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import copy  # noqa: E402
from typing import Any, Dict, List, Optional, Tuple  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from gpu_gates.streaming.parity_reference import ReferenceStep  # noqa: E402
from gpu_gates.runtime.gate import GateContext, GateSpec, positive_int, run_gate  # noqa: E402
from gpu_gates.streaming.split_trainer import (  # noqa: E402
    Batch,
    SplitTrainer,
    TinyPolicy,
    combine_leader_metrics,
    loss_sum_and_counts,
    make_batch,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOLERANCE = {"fp32": (1e-5, 1e-6), "bf16": (2e-2, 1e-2)}  # (rtol, atol)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--loss-type", choices=["token", "sequence", "both"], default="both")
    parser.add_argument("--groups-per-step", type=positive_int, default=8)
    parser.add_argument("--generations", type=positive_int, default=2, help="sequences per prompt group")
    parser.add_argument("--seq-len", type=positive_int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--chunks",
        type=positive_int,
        default=1,
        help="chunks per step on each rank, with a log-prob pass on the next chunk between them",
    )


def check_world(args: argparse.Namespace, world: int) -> Optional[str]:
    if args.groups_per_step < world:
        return f"--groups-per-step {args.groups_per_step} leaves some of the {world} ranks without a group"
    return None


class WrongNormalizer(SplitTrainer):
    """Fault (hook ``wrong_normalizer``): 1/N with the other count."""

    def normalizer(self, tokens: float, sequences: float) -> float:
        return sequences if self.loss_type == "token" else tokens


def maskless_loss_sum_and_counts(model, batch: Batch, loss_type: str):
    """Fault: the loss sum of ``split_trainer.loss_sum_and_counts`` with the mask dropped
    (padding positions count as valid tokens), the counts still right."""
    total, _, _ = loss_sum_and_counts(
        model, Batch(batch.tokens, batch.targets, torch.ones_like(batch.mask), batch.advantages), loss_type
    )
    mask = batch.mask.float()
    return total, mask.sum(), (mask.sum(dim=1) > 0).sum().to(mask.dtype)


class WrongLoss(SplitTrainer):
    """Fault (hook ``wrong_loss``): the trainer's loss ignores the mask."""

    def loss_sum_and_counts(self, forward, batch: Batch):
        return maskless_loss_sum_and_counts(forward, batch, self.loss_type)


class ChunkGradsLost(SplitTrainer):
    """Fault (hook ``chunk_grads_lost``, NeMo RL #3660): the gradients of each chunk are
    finalized into the grad storage and the log-prob pass before the next chunk reuses
    that storage and zeroes it, so every chunk but the last is lost (the counts, kept
    apart, still cover them all)."""

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.zero_()
        return super().compute_logprobs(batch)


FAULTS = {"wrong_normalizer": WrongNormalizer, "wrong_loss": WrongLoss, "chunk_grads_lost": ChunkGradsLost}


def trainer_class(ctx: GateContext) -> type:
    """The trainer under test: the production one unless a test installed a fault hook."""
    chosen = [cls for name, cls in FAULTS.items() if ctx.hooks.get(name) is not None]
    return chosen[0] if chosen else SplitTrainer


def global_batch(args, step: int) -> List[Batch]:
    groups = []
    for g in range(args.groups_per_step):
        b = make_batch(args.seed * 100_003 + step * 1_000 + g, args.generations, args.seq_len)
        b.advantages = b.advantages - b.advantages.mean()  # group-normalized, as GRPO
        groups.append(b)
    return groups


def arrival_order(args, step: int, mine: List[int]) -> List[int]:
    """The rank's groups in the order a long-tailed generator would finish them."""
    rng = np.random.default_rng([args.seed, step, 7])
    latency = rng.lognormal(0.0, 1.0, size=args.groups_per_step)
    return sorted(mine, key=lambda g: (latency[g], g))


def _to(batch: Batch, device) -> Batch:
    return Batch(batch.tokens.to(device), batch.targets.to(device), batch.mask.to(device), batch.advantages.to(device))


def _max_err(a: List[torch.Tensor], b: List[torch.Tensor]) -> Tuple[float, float]:
    a, b = [x.detach() for x in a], [y.detach() for y in b]
    abs_err = max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b))
    rel_err = max(float(((x.float() - y.float()).abs() / y.float().abs().clamp_min(1e-3)).max()) for x, y in zip(a, b))
    return abs_err, rel_err


def _grad_digest(model) -> torch.Tensor:
    return torch.stack([p.grad.detach().float().double().sum() for p in model.parameters()]).sum().reshape(1)


def run_loss_type(ctx: GateContext, loss_type: str) -> Dict[str, Any]:
    """Every step of one loss type: streamed on the split train API, then compared with the
    synchronous reference step on the whole global batch."""
    args, rank, world = ctx.args, ctx.rank, ctx.world_size
    dtype = DTYPES[args.dtype]
    rtol, atol = TOLERANCE[args.dtype]
    pid = f"{loss_type}/rank{rank}"
    model = TinyPolicy(seed=args.seed, dtype=dtype).to(ctx.device)
    reference = ReferenceStep(copy.deepcopy(model))
    trainer = trainer_class(ctx)(model, loss_type)
    steps: List[Dict[str, Any]] = []
    for step in range(args.cycles):
        ctx.set_phase(f"{loss_type} step {step}")
        groups = global_batch(args, step)
        mine = arrival_order(args, step, [g for g in range(len(groups)) if g % world == rank])
        _stream_step(ctx, trainer, pid, step, groups, mine)
        local = _grad_digest(model)
        digests = [torch.zeros_like(local) for _ in range(world)]
        dist.all_gather(digests, local)
        result, metrics = trainer.finish_train_step()
        ctx.emit(
            "trainer_step",
            pipeline_id=pid,
            action="finish",
            step=step,
            version=trainer.version,
            applied=result.applied,
            microbatches=result.microbatches,
        )
        after = [torch.zeros(1, dtype=torch.float64, device=ctx.device) for _ in range(world)]
        # the digest of what was applied: parameters after the step
        p_digest = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1)
        dist.all_gather(after, p_digest)
        gathered: List[Any] = [None] * world
        dist.all_gather_object(gathered, metrics)
        abs_err, rel_err, close, ref_loss = _check_step(
            ctx, loss_type, step, model, reference, metrics, digests, after, gathered
        )
        ctx.check("version", trainer.version == step + 1, f"{loss_type} step {step}: trainer version {trainer.version}")
        steps.append(
            {
                "step": step,
                "max_abs_err": abs_err,
                "max_rel_err": rel_err,
                "close": close,
                "microbatches": len(mine),
                "loss": metrics.global_loss,
                "reference_loss": ref_loss,
            }
        )
    return {"steps": steps, "rtol": rtol, "atol": atol}


def _stream_step(ctx: GateContext, trainer, pid: str, step: int, groups: List[Any], mine: List[int]) -> None:
    """One step's groups through the trainer in arrival order, one microbatch each: the
    log-probs of each chunk computed while the step is open, each group's data cleared once."""
    args = ctx.args
    trainer.begin_train_step(step)
    ctx.emit("trainer_step", pipeline_id=pid, action="begin", step=step, version=trainer.version)
    bounds = np.linspace(0, len(mine), min(args.chunks, max(1, len(mine))) + 1).round().astype(int)
    starts = set(bounds[1:-1].tolist())
    for i, g in enumerate(mine):
        if i in starts:  # a new chunk: its log-probs are computed while the step is open
            trainer.compute_logprobs(_to(Batch.cat([groups[h] for h in mine[i : bounds[bounds > i][0]]]), ctx.device))
        trainer.train_microbatch(_to(groups[g], ctx.device))
        gid = step * args.groups_per_step + g  # a group id is never reused
        ctx.emit("trainer_step", pipeline_id=pid, action="microbatch", step=step, version=trainer.version, groups=[gid])
        # clear_samples: the trained group's data is dropped, once, inside its step
        clear = {
            "pipeline_id": pid,
            "effect": "ClearSamples",
            "args": {"step": step, "groups": [gid]},
            "scope": "step",
            "step": step,
        }
        ctx.emit("effect_start", **clear)
        groups[g] = None
        ctx.emit("effect_end", **clear)


def _check_step(
    ctx: GateContext,
    loss_type: str,
    step: int,
    model,
    reference: ReferenceStep,
    metrics,
    digests: List[torch.Tensor],
    after: List[torch.Tensor],
    gathered: List[Any],
) -> Tuple[float, float, bool, Optional[float]]:
    """The step's checks against the synchronous reference step (parity, loss, no gradient
    sync before finish, leader metrics); returns the largest absolute and relative
    parameter error, whether all parameters are within tolerance, and the reference loss."""
    args, world = ctx.args, ctx.world_size
    rtol, atol = TOLERANCE[args.dtype]
    ref_loss, ref_tokens, ref_seqs = reference.step([_to(g, ctx.device) for g in global_batch(args, step)], loss_type)
    ref_params = list(reference.model.parameters())
    abs_err, rel_err = _max_err(list(model.parameters()), ref_params)
    close = all(
        torch.allclose(p.float(), r.float(), rtol=rtol, atol=atol) for p, r in zip(model.parameters(), ref_params)
    )
    ctx.check(
        "parity",
        close,
        f"{loss_type} step {step}: parameters differ from the synchronous step by up to "
        f"{abs_err:.3g} (rel {rel_err:.3g}; tolerance rtol {rtol:g} atol {atol:g})",
    )
    loss_ok = (metrics.global_loss is None) == (ref_loss is None) and (
        ref_loss is None or abs(metrics.global_loss - ref_loss) <= max(atol, rtol * abs(ref_loss)) * 10
    )
    ctx.check(
        "loss", loss_ok, f"{loss_type} step {step}: streamed loss {metrics.global_loss} vs synchronous {ref_loss}"
    )
    if world > 1:
        ctx.check(
            "no_sync",
            len({float(d) for d in digests}) == world,
            f"{loss_type} step {step}: local gradients before finish already agree across ranks "
            f"(a reduce fired per microbatch): {[float(d) for d in digests]}",
        )
        ctx.check(
            "no_sync",
            len({float(d) for d in after}) == 1,
            f"{loss_type} step {step}: parameters differ across ranks after finish: {[float(d) for d in after]}",
        )
    leaders = combine_leader_metrics(gathered)
    ctx.check(
        "leader_metrics",
        leaders["tokens"] == float(ref_tokens) and leaders["sequences"] == float(ref_seqs),
        f"{loss_type} step {step}: leaders count {leaders['tokens']} tokens / {leaders['sequences']} sequences, "
        f"the global batch has {float(ref_tokens)} / {float(ref_seqs)}",
    )
    return abs_err, rel_err, close, ref_loss


def run(ctx: GateContext) -> None:
    types = ["token", "sequence"] if ctx.args.loss_type == "both" else [ctx.args.loss_type]
    ctx.data["dtype"] = ctx.args.dtype
    ctx.data["loss_types"] = {t: run_loss_type(ctx, t) for t in types}


def summarize(args: argparse.Namespace, results: List[Dict[str, Any]]) -> Tuple[Dict[str, Any], List[str]]:
    out: Dict[str, Any] = {"dtype": args.dtype, "loss_types": {}}
    for result in results:
        for lt, info in (result.get("data") or {}).get("loss_types", {}).items():
            entry = out["loss_types"].setdefault(
                lt,
                {
                    "max_abs_err": 0.0,
                    "max_rel_err": 0.0,
                    "steps": 0,
                    "rtol": info["rtol"],
                    "atol": info["atol"],
                    "close": True,
                },
            )
            for s in info["steps"]:
                entry["max_abs_err"] = max(entry["max_abs_err"], s["max_abs_err"])
                entry["max_rel_err"] = max(entry["max_rel_err"], s["max_rel_err"])
                entry["close"] = entry["close"] and s["close"]
            entry["steps"] = max(entry["steps"], len(info["steps"]))
    return out, []


SPEC = GateSpec(
    name="train_pump_parity",
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
