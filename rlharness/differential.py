"""``rlharness differential SCENARIO_OR_TRACE --rlix PATH``: the scheduler model and RLix's
own scheduler (imported from the checkout at PATH) see the same inputs, cycle by cycle
(docs/rlix-live.md).

A scenario is simulated first (the model decides; its event log's input records are the
trace); a trace (any event log with input records) is used as it is. The model runs
with the scenario's ``scheduler`` options, or with ``--option KEY=VALUE``. Exit 0 when
every cycle agrees; 1 at the first divergence, which is printed (the cycle, both
decisions, the inputs since the previous cycle) and written as a replayable trace
(``--out``, default ``divergence.jsonl``); 2 for bad input, including an RLix whose
interfaces changed (one line naming what is missing).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Dict, List


def add_parser(sub) -> None:
    df = sub.add_parser(
        "differential",
        help="the scheduler model against RLix's own scheduler on the same inputs "
        "(exit 1 at the first diverging cycle)",
    )
    df.add_argument("input", metavar="SCENARIO_OR_TRACE", help="a scenario YAML (simulated first) or an event log")
    df.add_argument(
        "--rlix",
        metavar="PATH",
        default=os.environ.get("RLHARNESS_RLIX"),
        help="an RLix checkout (the folder holding rlix/); default $RLHARNESS_RLIX",
    )
    df.add_argument(
        "--option",
        dest="options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a scheduler option of the model (demand_floor=true, ...); repeatable",
    )
    df.add_argument(
        "--out",
        default="divergence.jsonl",
        metavar="TRACE.jsonl",
        help="where a divergence's replayable trace goes (default divergence.jsonl)",
    )


def _options(args: argparse.Namespace, base: Dict[str, Any], usage_error):
    import yaml

    from harness.scheduler.options import SchedulerOptions

    values = dict(base)
    for text in args.options:
        key, sep, raw = text.partition("=")
        if not sep or key not in SchedulerOptions.__dataclass_fields__:
            raise usage_error(
                f"--option: expected KEY=VALUE with KEY a scheduler option "
                f"({', '.join(SchedulerOptions.__dataclass_fields__)}), got {text!r}"
            )
        values[key] = yaml.safe_load(raw)
    try:
        return SchedulerOptions(**values)
    except (TypeError, ValueError) as e:
        raise usage_error(f"--option: {e}") from None


def _records(args: argparse.Namespace, usage_error):
    """(records, the scenario's scheduler options or {})."""
    from harness.logs.records import Record, read_records
    from simulators.scenario.loader import ScenarioError, load_scenario

    if args.input.endswith((".jsonl", ".json")):
        return read_records(args.input), {}
    try:
        scenario = load_scenario(args.input)
    except ScenarioError as e:
        raise usage_error(str(e)) from None
    from simulators.runtime.simulation import Simulation

    records = Simulation(scenario).run().records
    opts = {
        k: v
        for k, v in scenario.scheduler.items()
        if k not in ("policy", "partition", "groups", "release_after_offload")
    }
    return [Record(i + 1, r) for i, r in enumerate(records)], opts


def run(args: argparse.Namespace, usage_error) -> int:
    from harness.logs.writer import write_atomic
    from harness.logs.outputs.paths import check_output_file
    from simulators.rlix_live.differential import differential, trace_lines
    from simulators.rlix_live.loader import RlixLoadError, load_rlix

    if not args.rlix:
        raise usage_error("--rlix: an RLix checkout is required (or set RLHARNESS_RLIX)")
    if not os.path.isfile(args.input):
        raise usage_error(f"{args.input}: no such file")
    check_output_file(args.out, "--out", inputs=[args.input])
    try:
        mods = load_rlix(args.rlix)
    except RlixLoadError as e:
        raise usage_error(str(e)) from None
    records, scenario_opts = _records(args, usage_error)
    options = _options(args, scenario_opts, usage_error)
    try:
        res = differential(records, mods, options, args.input)
    except ValueError as e:
        raise usage_error(f"{args.input}: {e}") from None
    where = f"RLix {mods.version} at {mods.source}"
    if res.divergence is None:
        print(f"agree: {res.cycles} cycles and {res.inputs} inputs decided identically by the model and {where}")
        return 0
    dv = res.divergence
    print(f"DIVERGED at cycle {dv.cycle} (trace line {dv.at_line}) against {where}:")
    print(f"  model: {json.dumps(dv.model)}")
    print(f"  rlix:  {json.dumps(dv.rlix)}")
    shown: List[Dict[str, Any]] = dv.inputs[-20:]
    print(f"  inputs since the previous cycle ({len(dv.inputs)}, last {len(shown)} shown):")
    for rec in shown:
        print(f"    {json.dumps({k: v for k, v in rec.items() if k not in ('seq', 't')})}")
    write_atomic(args.out, trace_lines(res.prefix))
    print(
        f"replayable trace: {args.out} (rlharness differential {args.out} --rlix {args.rlix}; rlharness replay {args.out})"
    )
    return 1
