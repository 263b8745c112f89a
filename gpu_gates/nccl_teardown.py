"""Gate 2.5 Part 1: model-parallel process groups are really gone after teardown.

    torchrun --nproc-per-node 2 gpu_gates/nccl_teardown.py [--mode megatron|full|both]

Each cycle builds TP/DP groups, checks an all-reduce on both, allocates fake weights,
tears everything down and then verifies what survived:

* every group the build registered is unregistered again (c10d registry back to the
  pre-cycle set); survivors are named in the failure;
* the stale TP handle is unusable: unregistered everywhere, and on NCCL a collective on
  it raises (gloo keeps a destroyed group's sockets usable while a Python handle exists,
  so on gloo only the registry is checked, and the report says so);
* on GPU, >= 90 % of what the cycle added to device memory is released, and the residue
  grows by <= 1 MiB per cycle after the first (on CPU memory is informational);
* the next cycle re-initializes and its all-reduces are correct.

``megatron`` mode fails, truthfully, where ``destroy_model_parallel`` only drops
references; ``full`` mode is the teardown a time-sharing trainer must use.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script by torchrun: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import gc  # noqa: E402
from typing import Any, Dict, List, Optional, Tuple  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from gpu_gates.teardown import mp_groups  # noqa: E402
from gpu_gates.runtime import pg_registry  # noqa: E402
from gpu_gates.runtime.memory import MIB  # noqa: E402
from gpu_gates.runtime.gate import GateContext, GateSpec, positive_int, run_gate  # noqa: E402

MODES = ("megatron", "full")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=["megatron", "full", "both"], default="both")
    parser.add_argument("--tp", type=positive_int, default=2, help="tensor-parallel size (world %% tp == 0)")
    parser.add_argument(
        "--builder",
        choices=["auto", "megatron", "torch"],
        default="auto",
        help="group builder for full mode (auto: megatron-core when importable)",
    )
    parser.add_argument(
        "--fake-weights-mib",
        type=positive_int,
        default=None,
        help="fake weights per rank (default 256 on GPU, 8 on CPU)",
    )
    parser.add_argument("--min-release-fraction", type=float, default=0.9)
    parser.add_argument("--max-residue-growth-mib", type=float, default=1.0)


def check_world(args: argparse.Namespace, world: int) -> Optional[str]:
    if world < 2:
        return f"needs at least 2 ranks for a TP group, got world size {world}"
    if world % args.tp:
        return f"world size {world} is not a multiple of --tp {args.tp}"
    return None


def _all_reduce_check(ctx: GateContext, group: Any, ranks: List[int], label: str, cycle_tag: str) -> bool:
    value = torch.tensor([float(ctx.rank + 1)], device=ctx.device)
    dist.all_reduce(value, group=group)
    expected = float(sum(r + 1 for r in ranks))
    ok = ctx.check(
        f"allreduce_{label}",
        value.item() == expected,
        f"{cycle_tag}: {label} all-reduce over {ranks} gave {value.item()}, expected {expected}",
    )
    ctx.emit("allreduce_check", group=label, members=ranks, ok=ok)
    return ok


def _stale_probe(ctx: GateContext, built: mp_groups.BuiltGroups, cycle_tag: str) -> Dict[str, Any]:
    """Is the old TP handle still usable after teardown?"""
    label = f"TP group {built.tp_ranks}"
    registered = pg_registry.is_registered(built.tp)
    ctx.check(
        "stale_handle_unregistered",
        not registered,
        f"{cycle_tag}: {label} is still registered after teardown (its communicator is alive)",
    )
    probe: Dict[str, Any] = {"registered": registered}
    if ctx.backend == "nccl":
        try:
            dist.all_reduce(torch.ones(1, device=ctx.device), group=built.tp)
            raised = False
        except Exception as exc:  # the expected outcome: comms were shut down
            raised, probe["error"] = True, f"{type(exc).__name__}: {str(exc)[:200]}"
        probe["collective_raised"] = raised
        ctx.check("stale_collective_raises", raised, f"{cycle_tag}: all-reduce on the stale {label} still ran")
    else:
        probe["collective_raised"] = None
        probe["note"] = "gloo: collective on a stale handle not run; registry checked instead"
    ctx.emit("stale_probe", group="tp", registered=registered, collective_raised=probe["collective_raised"])
    return probe


def _teardown(ctx: GateContext, mode: str, built: mp_groups.BuiltGroups, megatron: Any) -> List[pg_registry.GroupInfo]:
    if built.builder == "megatron":
        megatron.destroy_model_parallel()
    if mode == "megatron":
        return []
    keep = None
    hook = ctx.hooks.get("leak_group")
    if hook is not None:  # test hook: "forget" one group so the gate must name it
        want = hook.arg or mp_groups.DP_DESC
        keep = (
            pg_registry.info_of(built.dp)
            if want == mp_groups.DP_DESC
            else next((i for i in built.created.values() if i.desc == want), None)
        )
    return mp_groups.destroy_created(built, keep=keep)


def _memory_checks(ctx: GateContext, cycle: int, pre, peak, post, mode_start, prev_residue, tag) -> Tuple[dict, int]:
    if ctx.memory.informational:
        return {"informational": True, "rss_pre": pre["used"], "rss_peak": peak["used"], "rss_post": post["used"]}, 0
    added = peak["used"] - pre["used"]
    released = peak["used"] - post["used"]
    fraction = released / added if added > 0 else 1.0
    residue = post["used"] - mode_start["used"]
    ctx.check(
        "memory_released",
        fraction >= ctx.args.min_release_fraction,
        f"{tag}: released {released / MIB:.1f} of {added / MIB:.1f} MiB ({fraction:.1%})",
    )
    if prev_residue is not None:
        growth = residue - prev_residue
        ctx.check(
            "residue_stable",
            growth <= ctx.args.max_residue_growth_mib * MIB,
            f"{tag}: residue grew {growth / MIB:.2f} MiB since the previous cycle",
        )
    return {
        "added_bytes": added,
        "released_bytes": released,
        "released_fraction": round(fraction, 4),
        "residue_bytes": residue,
        "allocated": post.get("allocated"),
        "reserved": post.get("reserved"),
    }, residue


def run_cycle(ctx: GateContext, mode: str, cycle: int, builder: str, megatron: Any, mode_start, prev_residue):
    tag = f"mode {mode} cycle {cycle}"
    ctx.set_phase(f"{tag}: build")
    ctx.emit("cycle_begin", cycle=cycle, mode=mode)
    ctx.hook("cycle_begin")
    ctx.memory.release_caches()
    pre = ctx.sample_memory(f"{tag} pre")
    baseline = pg_registry.live_groups()
    built = mp_groups.build_groups(builder, ctx.args.tp, ctx.timeout, megatron)
    for info in built.created.values():
        ctx.emit("group_create", name=info.name, desc=info.desc or "", members=info.ranks)
    created = len(built.created)
    allreduce_ok = _all_reduce_check(ctx, built.tp, built.tp_ranks, "tp", tag)
    allreduce_ok = _all_reduce_check(ctx, built.dp, built.dp_ranks, "dp", tag) and allreduce_ok
    mib = ctx.args.fake_weights_mib or (256 if ctx.device.type == "cuda" else 8)
    weights = torch.full((mib * MIB // 4,), float(ctx.rank), dtype=torch.float32, device=ctx.device)
    grad_slice = weights[: MIB // 4].clone()
    dist.all_reduce(grad_slice, group=built.tp)  # materialise comm buffers on the TP group
    peak = ctx.sample_memory(f"{tag} peak")
    ctx.set_phase(f"{tag}: teardown")
    ctx.hook("teardown")
    del weights, grad_slice
    destroyed = _teardown(ctx, mode, built, megatron)
    for info in destroyed:
        ctx.emit("group_destroy", name=info.name, desc=info.desc or "", members=info.ranks, mode=mode)
    gc.collect()
    ctx.memory.release_caches()
    ctx.set_phase(f"{tag}: verify")
    after = pg_registry.live_groups()
    survived = [info.label() for name, info in sorted(after.items()) if name not in baseline]
    ctx.check(
        "groups_released",
        not survived,
        f"{tag}: {len(survived)} process group(s) survived teardown: {', '.join(survived)}",
    )
    probe = _stale_probe(ctx, built, tag)
    del built
    gc.collect()
    ctx.memory.release_caches()
    post = ctx.sample_memory(f"{tag} post")
    memory, residue = _memory_checks(ctx, cycle, pre, peak, post, mode_start, prev_residue, tag)
    dist.barrier()
    ctx.emit("cycle_end", cycle=cycle, mode=mode, survived=len(survived))
    return {
        "cycle": cycle,
        "created": created,
        "destroyed": len(destroyed),
        "allreduce_ok": allreduce_ok,
        "survived": survived,
        "stale_probe": probe,
        "memory": memory,
    }, residue


def run_mode(ctx: GateContext, mode: str, entry: Dict[str, Any]) -> None:
    """Run all cycles of one mode, filling ``entry`` as it goes (a hang still shows progress)."""
    use_megatron = mode == "megatron" or ctx.args.builder != "torch"
    megatron, megatron_info = mp_groups.load_megatron() if use_megatron else (None, "")
    if mode == "megatron" and megatron is None:
        entry.update(status="skipped", reason=f"skipped: {megatron_info}")
        return
    if ctx.args.builder == "megatron" and megatron is None:
        raise RuntimeError(f"--builder megatron but {megatron_info}")
    builder = "megatron" if megatron is not None and use_megatron else "torch"
    entry.update(builder=builder, megatron_core=megatron_info if megatron is not None else None)
    failures_before = len(ctx.failures)
    mode_baseline = pg_registry.live_groups()
    ctx.memory.release_caches()
    mode_start = ctx.sample_memory(f"mode {mode} start")
    cycles, prev_residue = entry["cycles"], None
    for cycle in range(ctx.args.cycles):
        result, residue = run_cycle(ctx, mode, cycle, builder, megatron, mode_start, prev_residue)
        prev_residue = residue if not ctx.memory.informational else None
        cycles.append(result)
        entry["survived"] = sorted({label for c in cycles for label in c["survived"]})
    ctx.set_phase(f"mode {mode}: clean-up")
    leftovers = mp_groups.destroy_leftovers(mode_baseline)
    dist.barrier()
    entry.update(
        status="failed" if len(ctx.failures) > failures_before else "passed",
        cleanup_destroyed=len(leftovers),
        reinit_ok=all(c["allreduce_ok"] for c in cycles[1:]) if len(cycles) > 1 else None,
    )


def run(ctx: GateContext) -> None:
    modes = MODES if ctx.args.mode == "both" else (ctx.args.mode,)
    ctx.data["modes"] = {}
    for mode in modes:
        entry = ctx.data["modes"][mode] = {"status": "incomplete", "cycles": [], "survived": []}
        run_mode(ctx, mode, entry)
    if all(m["status"] == "skipped" for m in ctx.data["modes"].values()):
        ctx.skip_reason = "; ".join(m["reason"] for m in ctx.data["modes"].values())


def summarize(args: argparse.Namespace, results: List[Dict[str, Any]]) -> Tuple[Dict[str, Any], List[str]]:
    """Per mode: verdict, which kinds of group survived (by desc) and how many per rank."""
    modes: Dict[str, Any] = {}
    for result in results:
        rank = str(result["rank"])
        for mode, info in (result.get("data") or {}).get("modes", {}).items():
            entry = modes.setdefault(
                mode,
                {
                    "status": info["status"],
                    "reason": info.get("reason"),
                    "survived": set(),
                    "survived_count_by_rank": {},
                },
            )
            if info["status"] == "failed" or (info["status"] == "incomplete" and entry["status"] != "failed"):
                entry["status"] = info["status"]
            for key in ("builder", "megatron_core"):
                if info.get(key) is not None:
                    entry[key] = info[key]
            if info.get("survived"):
                entry["survived"].update(label.split(" (pg ")[0] for label in info["survived"])
                entry["survived_count_by_rank"][rank] = len(info["survived"])
            if info.get("reinit_ok") is not None:
                entry["reinit_ok"] = entry.get("reinit_ok", True) and info["reinit_ok"]
            fractions = [c["memory"].get("released_fraction") for c in info.get("cycles", [])]
            if any(f is not None for f in fractions):
                entry.setdefault("released_fraction_by_rank", {})[rank] = fractions
    for entry in modes.values():
        entry["survived"] = sorted(entry["survived"])
        if entry["status"] == "failed" and entry["survived"]:
            total = sum(entry["survived_count_by_rank"].values())
            entry["verdict"] = (
                f"teardown left {total} group registration(s) alive across ranks "
                f"({len(entry['survived'])} kinds: {', '.join(entry['survived'])})"
            )
        elif entry["status"] == "passed":
            entry["verdict"] = "all groups destroyed, stale handle unusable, re-init works"
        elif entry["status"] == "incomplete":
            entry["verdict"] = "did not finish on every rank (see failures)"
        else:
            entry["verdict"] = entry.get("reason") or entry["status"]
    return {"modes": modes}, []


SPEC = GateSpec(
    name="nccl_teardown",
    description=__doc__.splitlines()[0],
    default_world=2,
    default_cycles=5,
    add_arguments=add_arguments,
    check_world=check_world,
    run=run,
    summarize=summarize,
)


if __name__ == "__main__":
    sys.exit(run_gate(SPEC))
