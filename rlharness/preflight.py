"""``rlharness preflight CONFIG_OR_SCENARIO [--cluster NODESxGPUSxTYPE]``: the verdicts of
:mod:`simulators.preflight.questions` for a scenario or for a NeMo RL, ROLL or RLix pipeline config
(imported as ``rlharness import`` imports it; docs/preflight.md).

Exit codes as everywhere: 0 every verdict holds, 1 a verdict refuses the config (it cannot
fit, it can deadlock, the bound is broken, the short run found something), 2 bad input —
including a config the importers refuse, named by its key.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any, Callable, Dict, Optional, Tuple

_CLUSTER = re.compile(r"^(\d+)x(\d+)x([a-z0-9_]+)$")


def add_parser(sub) -> None:
    pf = sub.add_parser(
        "preflight",
        help="verdicts before a run: fits, cannot deadlock, staleness, step time, "
        "known upstream behaviours (exit 1 when one refuses)",
    )
    pf.add_argument(
        "input",
        metavar="CONFIG_OR_SCENARIO",
        help="a scenario, or a NeMo RL / ROLL / RLix pipeline config (read as `rlharness import` reads it)",
    )
    pf.add_argument("--cluster", metavar="NODESxGPUSxTYPE", help="the cluster to check against, e.g. 8x8xh100_sxm")
    pf.add_argument("--gpu", default="h100_sxm", metavar="PRESET", help="a config's GPU type (default h100_sxm)")
    pf.add_argument("--steps", type=int, default=2, metavar="N", help="steps of the short simulation (default 2)")
    pf.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a NeMo RL config: a command-line override as NeMo RL takes it (repeatable)",
    )
    pf.add_argument("--nemo-configs", metavar="DIR", help="for an RLix NeMo RL pipeline: NeMo RL's examples/configs")


def _cluster(text: Optional[str], usage_error) -> Optional[Tuple[int, int, str]]:
    if text is None:
        return None
    from simulators.costmodel.hardware import GPU_PRESETS

    m = _CLUSTER.match(text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise usage_error(f"--cluster: expected NODESxGPUSxTYPE (e.g. 8x8xh100_sxm), got {text!r}")
    if m.group(3) not in GPU_PRESETS:
        raise usage_error(f"--cluster: unknown GPU type {m.group(3)!r}; known: {', '.join(sorted(GPU_PRESETS))}")
    return int(m.group(1)), int(m.group(2)), m.group(3)


def kind_of(data: Dict[str, Any]) -> str:
    """scenario | rlix-pipelines | roll-config | nemo-rl-config, from the top-level keys."""
    if "pipelines" in data and "cluster" in data:
        return "scenario"
    if "pipeline_cls" in data:
        return "rlix-pipelines"
    defaults = data.get("defaults")
    if (
        "actor_train" in data
        or "actor_infer" in data
        or (isinstance(defaults, list) and any("@" in str(d) for d in defaults))
    ):
        return "roll-config"
    if {"grpo", "policy", "loss_fn", "defaults"} & set(data):
        return "nemo-rl-config"
    raise ValueError("neither a scenario (cluster, pipelines) nor a NeMo RL, ROLL or RLix pipeline config")


def _scenario(data: Dict[str, Any], path: str, cluster, usage_error):
    from simulators.scenario.loader import ScenarioError, scenario_from_mapping

    if cluster:
        kept = {
            k: v
            for k, v in (data.get("cluster") or {}).items()
            if k not in ("vram_bytes", "pcie_bytes_per_s", "intra_node_bytes_per_s", "inter_node_bytes_per_s")
        }
        data = dict(data, cluster=dict(kept, nodes=cluster[0], gpus_per_node=cluster[1], gpu=cluster[2]))
    try:
        return scenario_from_mapping(data, path)
    except ScenarioError as e:
        raise usage_error(str(e)) from None


def _config(kind: str, args: argparse.Namespace, cluster, usage_error):
    from simulators.config_import import nemo_rl, rlix_pipelines, roll
    from simulators.config_import.common import ConfigRefused, finish

    gpu = cluster[2] if cluster else args.gpu
    try:
        if kind == "nemo-rl-config":
            over = [f"++cluster.num_nodes={cluster[0]}", f"++cluster.gpus_per_node={cluster[1]}"] if cluster else []
            cfg, chain = nemo_rl.load(args.input, list(args.overrides) + over)
            draft = nemo_rl.translate(cfg, args.input, chain, gpu=gpu, steps=args.steps)
        elif kind == "roll-config":
            cfg, chain = roll.load(args.input)
            draft = roll.translate(cfg, args.input, chain, gpu=gpu, steps=args.steps)
        else:
            draft = rlix_pipelines.translate([args.input], gpu=gpu, steps=args.steps, nemo_configs=args.nemo_configs)
        if cluster and kind != "nemo-rl-config":
            draft.set(("cluster", "nodes"), cluster[0], "--cluster")
            draft.set(("cluster", "gpus_per_node"), cluster[1], "--cluster")
        _, scenario = finish(draft, args.input)
    except ConfigRefused as e:
        raise usage_error(f"{args.input}: {e}") from None

    def key_of(field: str) -> str:
        src = draft.source_of(field)
        return f"{src.split(' ')[0]} (scenario {field})" if src else field

    return scenario, key_of


def run(args: argparse.Namespace, usage_error) -> int:
    from simulators.config_import.common import ConfigRefused, load_yaml
    from simulators.preflight.questions import preflight

    cluster = _cluster(args.cluster, usage_error)
    if not 1 <= args.steps <= 100:
        raise usage_error(f"--steps: must be in 1..100, got {args.steps}")
    if not os.path.isfile(args.input):
        raise usage_error(f"{args.input}: no such file")
    try:
        data = load_yaml(args.input)
        kind = kind_of(data)
    except ConfigRefused as e:
        raise usage_error(f"{args.input}: {e.problem}") from None
    except ValueError as e:
        raise usage_error(f"{args.input}: {e}") from None
    if args.overrides and kind != "nemo-rl-config":
        raise usage_error(f"--set: overrides apply to a NeMo RL config; {args.input} is a {kind}")
    if kind == "scenario":
        scenario = _scenario(data, args.input, cluster, usage_error)
        key_of: Callable[[str], str] = lambda field: field
    else:
        scenario, key_of = _config(kind, args, cluster, usage_error)
    print(
        f"preflight {args.input} ({kind}): {len(scenario.pipelines)} pipeline(s) on {scenario.cluster.nodes} x "
        f"{scenario.cluster.gpus_per_node} {scenario.cluster.gpu or 'GPUs'} ({scenario.cluster.vram_bytes / (1 << 30):.0f} GiB each)"
    )
    verdicts = preflight(scenario, key_of, steps=args.steps)
    for v in verdicts:
        mark = {True: "ok     ", False: "REFUSED", None: "note   "}[v.ok]
        print(
            f"  {mark} {v.question}: {v.figure}"
            + (f"; change {v.key}" if v.key and v.ok is False else f" (key: {v.key})" if v.key else "")
        )
    refused = [v for v in verdicts if v.ok is False]
    print(f"verdict: {'refused: ' + '; '.join(v.question for v in refused) if refused else 'every check holds'}")
    return 1 if refused else 0
