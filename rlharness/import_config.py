"""``rlharness import nemo-rl-config | roll-config | rlix-pipelines``: a user's own config
in, a scenario out (docs/importers.md).

Each writes one scenario YAML whose every field is commented with the config key it came
from. What a scenario cannot represent is refused like any bad input: one line
``error: <file>: <config key>: <why>``, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import os
from typing import List

SOURCES = ("nemo-rl-config", "roll-config", "rlix-pipelines")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, metavar="SCENARIO.yaml", help="the scenario to write")
    p.add_argument(
        "--gpu",
        default="h100_sxm",
        metavar="PRESET",
        help="the GPU type (configs name none): a preset of simulators/costmodel/hardware.py (default h100_sxm)",
    )
    p.add_argument("--steps", type=int, default=4, metavar="N", help="training steps to simulate (default 4)")
    p.add_argument("--name", metavar="NAME", help="the scenario's name (default: from the file name)")


def add_parsers(imp_sub) -> None:
    nr = imp_sub.add_parser(
        "nemo-rl-config", help="a NeMo RL GRPO config (defaults: inheritance, overrides) -> a scenario"
    )
    nr.add_argument("config", metavar="CONFIG.yaml", help="NeMo RL config (examples/configs/... or your own)")
    nr.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a NeMo RL command-line override (KEY=V, +KEY=V, ++KEY=V, ~KEY); repeatable",
    )
    _common(nr)
    ro = imp_sub.add_parser("roll-config", help="a ROLL RLVR or agentic pipeline config -> a scenario")
    ro.add_argument("config", metavar="CONFIG.yaml", help="ROLL config (examples/**/*.yaml or your own)")
    _common(ro)
    rx = imp_sub.add_parser("rlix-pipelines", help="RLix pipeline configs (one per pipeline) -> one scenario")
    rx.add_argument("configs", metavar="PIPELINE.yaml", nargs="+", help="RLix pipeline YAMLs (NeMo RL or ROLL)")
    rx.add_argument(
        "--nemo-configs",
        metavar="DIR",
        help="a NeMo RL checkout's examples/configs, for nemo_config_path (a path on the machine that ran it)",
    )
    _common(rx)


def import_scenario(args: argparse.Namespace):
    """(scenario text, Scenario) for the parsed arguments; raises ConfigRefused."""
    from simulators.config_import import nemo_rl, rlix_pipelines, roll
    from simulators.config_import.common import finish

    if args.source == "nemo-rl-config":
        cfg, chain = nemo_rl.load(args.config, args.overrides)
        draft = nemo_rl.translate(cfg, args.config, chain, gpu=args.gpu, steps=args.steps, name=args.name)
    elif args.source == "roll-config":
        cfg, chain = roll.load(args.config)
        draft = roll.translate(cfg, args.config, chain, gpu=args.gpu, steps=args.steps, name=args.name)
    else:
        draft = rlix_pipelines.translate(
            args.configs, gpu=args.gpu, steps=args.steps, name=args.name, nemo_configs=args.nemo_configs
        )
    return finish(draft, args.out)


def check_args(args: argparse.Namespace, usage_error) -> List[str]:
    """The inputs, after the checks every import makes before reading them."""
    from simulators.costmodel.hardware import GPU_PRESETS

    if args.gpu not in GPU_PRESETS:
        raise usage_error(f"--gpu: unknown GPU preset {args.gpu!r}; known: {', '.join(sorted(GPU_PRESETS))}")
    if not 1 <= args.steps <= 100_000:
        raise usage_error(f"--steps: must be in 1..100000, got {args.steps}")
    inputs = list(args.configs) if args.source == "rlix-pipelines" else [args.config]
    for path in inputs:
        if not os.path.isfile(path):
            raise usage_error(f"{path}: no such file")
    if getattr(args, "nemo_configs", None) and not os.path.isdir(args.nemo_configs):
        raise usage_error(f"--nemo-configs: {args.nemo_configs}: not a folder")
    return inputs


def run(args: argparse.Namespace, usage_error) -> int:
    from harness.logs.writer import write_atomic
    from harness.logs.outputs.paths import check_output_file
    from simulators.config_import.common import ConfigRefused

    inputs = check_args(args, usage_error)
    check_output_file(args.out, "--out", inputs=inputs)
    try:
        text, scenario = import_scenario(args)
    except ConfigRefused as e:
        where = getattr(e, "file", None) or inputs[0]
        raise usage_error(f"{where}: {e}") from None
    write_atomic(args.out, [text.rstrip("\n")])
    pipes = ", ".join(
        f"{p.name} ({p.type}, {len(p.train_gpus)} train / {len(p.infer_gpus)} infer GPUs)" for p in scenario.pipelines
    )
    print(
        f"imported {', '.join(inputs)}: scenario {scenario.name!r} on {scenario.cluster.num_gpus} GPU(s): {pipes}; "
        f"written to {args.out} (rlharness preflight {args.out}; rlharness simulate {args.out})"
    )
    return 0
