"""``rlharness size CONFIG --target-tokens-per-s X``: the cheapest layouts of a NeMo RL
config that reach a throughput (docs/preflight.md#sizing).

The search space is the config's own layout with the node count and the generation
tensor parallelism changed (``cluster.num_nodes`` from 1 to ``--max-nodes``, vLLM's
``tensor_parallel_size`` over the divisors of a node): each candidate is imported as
``rlharness import nemo-rl-config`` would import it with those overrides, refused when
the loader or the static memory plan refuses it (the reason is kept), and otherwise
simulated for ``--steps`` steps (the same short run preflight makes). A layout meets the
target when its generated tokens/s does; the cheapest are the fewest GPUs, then the fewest
GPU-hours per step. The plot shows tokens/s against GPUs for every layout that runs.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Dict, List


def add_parser(sub) -> None:
    sz = sub.add_parser("size", help="the cheapest layouts of a NeMo RL config that reach a tokens/s target")
    sz.add_argument("config", metavar="CONFIG", help="a NeMo RL GRPO config")
    sz.add_argument("--target-tokens-per-s", type=float, required=True, metavar="X", help="generated tokens/s to reach")
    sz.add_argument("--max-nodes", type=int, default=8, metavar="N", help="largest node count tried (default 8)")
    sz.add_argument("--gpu", default="h100_sxm", metavar="PRESET", help="the GPU type (default h100_sxm)")
    sz.add_argument("--steps", type=int, default=2, metavar="N", help="simulated steps per layout (default 2)")
    sz.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a NeMo RL override applied to every layout (repeatable)",
    )
    sz.add_argument("--plot", metavar="PNG", help="write tokens/s against GPUs here")


def _candidate(args: argparse.Namespace, nodes: int, tp: int) -> Dict[str, Any]:
    """One layout: its figures, or why it cannot run."""
    import dataclasses

    from harness.logs.outputs.summary_text import summary_json
    from simulators.config_import import nemo_rl
    from simulators.config_import.common import ConfigRefused, finish
    from simulators.preflight.memory import phase_peaks
    from simulators.run import simulate

    row: Dict[str, Any] = {"nodes": nodes, "infer_tp": tp}
    try:
        over = list(args.overrides) + [
            f"++cluster.num_nodes={nodes}",
            f"policy.generation.vllm_cfg.tensor_parallel_size={tp}",
        ]
        cfg, chain = nemo_rl.load(args.config, over)
        _, s = finish(nemo_rl.translate(cfg, args.config, chain, gpu=args.gpu, steps=args.steps), args.config)
    except ConfigRefused as e:
        problem = e.problem.split(": ", 1)[1] if e.problem.startswith("the scenario it gives") else e.problem
        return {**row, "refused": f"{e.key}: {problem}"}
    row["gpus"] = s.cluster.num_gpus
    worst = max(phase_peaks(s), key=lambda pk: pk.peak_bytes - pk.capacity_bytes)
    if worst.peak_bytes > worst.capacity_bytes:
        return {**row, "refused": f"does not fit: {worst.phase} needs {worst.peak_bytes / (1 << 30):.1f} GiB per GPU"}
    short = dataclasses.replace(s, pipelines=tuple(dataclasses.replace(p, steps=args.steps) for p in s.pipelines))
    out = simulate(short, None, png=False)
    p = summary_json(out.figures)["pipelines"][0]
    if out.result.reason != "done" or not p.get("mean_step_s"):
        return {**row, "refused": f"the simulated run ended {out.result.reason}: {out.result.detail}"}
    step = p["mean_step_s"]
    return {
        **row,
        "step_s": step,
        "tokens_per_s": p["tokens"] / max(1, p["steps_done"]) / step,
        "gpu_hours_per_step": s.cluster.num_gpus * step / 3600.0,
    }


def _tps(gpus_per_node: int) -> List[int]:
    return [t for t in (1, 2, 4, 8, 16) if t <= gpus_per_node and gpus_per_node % t == 0]


def _draw(rows: List[Dict[str, Any]], target: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for tp in sorted({r["infer_tp"] for r in rows if "tokens_per_s" in r}):
        pts = sorted((r["gpus"], r["tokens_per_s"]) for r in rows if r["infer_tp"] == tp and "tokens_per_s" in r)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"generation TP {tp}")
    ax.axhline(target, color="#c44e52", linestyle="--", label=f"target {target:,.0f} tokens/s")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("generated tokens/s (simulated)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace, usage_error) -> int:
    from harness.logs.outputs.paths import check_output_file
    from simulators.config_import.common import ConfigRefused, get, load_yaml
    from simulators.costmodel.hardware import GPU_PRESETS
    from rlharness.preflight import kind_of

    if not os.path.isfile(args.config):
        raise usage_error(f"{args.config}: no such file")
    if not args.target_tokens_per_s > 0:
        raise usage_error(f"--target-tokens-per-s: must be > 0, got {args.target_tokens_per_s:g}")
    if not 1 <= args.max_nodes <= 64:
        raise usage_error(f"--max-nodes: must be in 1..64, got {args.max_nodes}")
    if not 1 <= args.steps <= 20:
        raise usage_error(f"--steps: must be in 1..20, got {args.steps}")
    if args.gpu not in GPU_PRESETS:
        raise usage_error(f"--gpu: unknown GPU preset {args.gpu!r}; known: {', '.join(sorted(GPU_PRESETS))}")
    if args.plot:
        check_output_file(args.plot, "--plot", inputs=[args.config])
    try:
        data = load_yaml(args.config)
        if kind_of(data) != "nemo-rl-config":
            raise usage_error(f"{args.config}: size searches NeMo RL configs (this is a {kind_of(data)})")
        from simulators.config_import import nemo_rl

        gpn = get(nemo_rl.load(args.config, args.overrides)[0], "cluster.gpus_per_node")
    except ConfigRefused as e:
        raise usage_error(f"{args.config}: {e}") from None
    except ValueError as e:
        raise usage_error(f"{args.config}: {e}") from None
    rows = [_candidate(args, n, tp) for n in range(1, args.max_nodes + 1) for tp in _tps(int(gpn))]
    meets = sorted(
        (r for r in rows if r.get("tokens_per_s", 0) >= args.target_tokens_per_s),
        key=lambda r: (r["gpus"], r["gpu_hours_per_step"]),
    )
    print(
        f"size {args.config}: {len(rows)} layouts ({args.max_nodes} node counts x generation TP "
        f"{', '.join(map(str, _tps(int(gpn))))}, {gpn} {args.gpu} per node), target "
        f"{args.target_tokens_per_s:,.0f} generated tokens/s"
    )
    print(f"  {'nodes':>5} {'GPUs':>5} {'gen TP':>6} {'step s':>8} {'tokens/s':>10} {'GPU-h/step':>10}  verdict")
    for r in rows:
        if "tokens_per_s" in r:
            verdict = "meets" if r in meets else "below target"
            print(
                f"  {r['nodes']:>5} {r['gpus']:>5} {r['infer_tp']:>6} {r['step_s']:>8.1f} {r['tokens_per_s']:>10,.0f} "
                f"{r['gpu_hours_per_step']:>10.3f}  {verdict}"
            )
        else:
            print(
                f"  {r['nodes']:>5} {r.get('gpus', '-'):>5} {r['infer_tp']:>6} {'-':>8} {'-':>10} {'-':>10}  "
                f"refused: {r['refused'][:110]}"
            )
    if args.plot:
        _draw(rows, args.target_tokens_per_s, args.plot)
        print(f"plot: {args.plot}")
    if not meets:
        print("cheapest: none of these layouts reaches the target (raise --max-nodes)")
        return 1
    best = meets[0]
    print(
        f"cheapest: {best['nodes']} node(s), {best['gpus']} GPUs, generation TP {best['infer_tp']}: "
        f"{best['tokens_per_s']:,.0f} tokens/s, {best['gpu_hours_per_step']:.3f} GPU-hours per step"
    )
    return 0
