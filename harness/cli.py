"""The ``rlharness`` command line.

Bad input of any kind (arguments, files, records, scenarios) ends with one line
``error: <what>`` on stderr and exit code 2 — no traceback, no partial output file.
A replay whose decisions diverge from ``--expect`` exits 1; so does a replay or a
``check`` whose log breaks an invariant, and a simulation whose simulated system failed
(OOM, fail-fast) or broke an invariant — a finding, not an error.
A simulation cut by its horizon is an outcome of its own: exit 0 unless the oracle found a
stall (``liveness``) or another violation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

from harness.eventlog.records import InputError, read_records
from harness.eventlog.writer import write_atomic
from harness.replay import compare_decisions, format_table, replay_file

EXIT_OK, EXIT_DIVERGED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print usage + exit 2; one line is clearer
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rlharness", description="Simulation-backed test harness for RL post-training on shared GPUs.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    rp = sub.add_parser("replay", help="replay a scheduler trace through the scheduler model")
    rp.add_argument("trace", metavar="INPUTS.jsonl", help="event log whose input records are replayed")
    rp.add_argument("--out", metavar="PATH", help="write the decision log (JSONL) here")
    rp.add_argument("--expect", metavar="RECORDED.jsonl", help="compare decisions with a recorded log; exit 1 at the first divergence")
    rp.add_argument("--quiet", action="store_true", help="print no table, only the summary line")
    sim = sub.add_parser("simulate", help="simulate a scenario (default: two nemo_async pipelines on 2 GPUs)")
    sim.add_argument("scenario", metavar="SCENARIO", nargs="?", help="scenario YAML (see examples/scenarios/)")
    sim.add_argument("--seed", type=int, help="override the scenario's seed")
    sim.add_argument("--out", metavar="DIR", help="output folder (default: runs/<scenario name>)")
    sim.add_argument("--no-png", action="store_true", help="skip the PNG timeline")
    sim.add_argument("--quiet", action="store_true", help="no progress lines, no summary table")
    sim.add_argument("--check-determinism", action="store_true",
                     help="run again in a fresh process under another PYTHONHASHSEED; exit 1 unless the event logs are byte-identical")
    ck = sub.add_parser("check", help="run every invariant check on event logs (exit 1 on a violation)")
    ck.add_argument("logs", metavar="LOG", nargs="+", help="event log(s): simulator, gate, replay output or scheduler trace")
    ck.add_argument("--check", dest="names", metavar="NAME", action="append", help="run only this check (repeatable)")
    ck.add_argument("--context", type=int, default=2, metavar="N", help="records shown either side of a violation (default 2)")
    ck.add_argument("--max-shown", type=int, default=10, metavar="N", help="violations shown per log (default 10)")
    from simulators.fuzz.cli import add_parser as add_fuzz_parser

    add_fuzz_parser(sub, UsageError)
    imp = sub.add_parser("import", help="convert a real system's log into a replayable input trace")
    imp_sub = imp.add_subparsers(dest="source", metavar="SOURCE", parser_class=_Parser)
    rl = imp_sub.add_parser("rlix-log", help="RLix's [RLIX_SCHED_LOG] stdout lines (reference/rlix.md §3)")
    rl.add_argument("log", metavar="LOG", help="RLix stdout (other lines are passed over)")
    rl.add_argument("--topology", required=True, metavar="TOPOLOGY.yaml",
                    help="cluster and pipeline registrations, which RLix's log does not carry (docs/trace-format.md)")
    rl.add_argument("--out", required=True, metavar="TRACE.jsonl", help="the input trace to write")
    rl.add_argument("--poll-s", type=float, default=1.0, metavar="SECONDS", help="RLix's poll period (default 1)")
    sp = sub.add_parser("schema", help="print the event-log JSON Schema")
    sp.set_defaults(command="schema")
    return parser


def _cmd_replay(args: argparse.Namespace) -> int:
    expected = read_records(args.expect) if args.expect else None  # fail on a bad --expect before any output
    result = replay_file(args.trace)
    if not args.quiet:
        table, notes = format_table(result)
        print(table)
        for note in notes:
            print(f"  note: {note}")
    if result.open_cycle is not None:
        print(f"  note: cycle {result.open_cycle} was planned but never committed")
    if args.out:
        write_atomic(args.out, result.log.lines())
    cycles = sum(1 for d in result.decisions if d["kind"] == "commit")
    print(f"replayed {args.trace}: {cycles} cycles committed, {len(result.decisions)} decisions, {result.rejected} inputs rejected"
          + (f"; decision log: {args.out}" if args.out else ""))
    from harness.check import oracle_log, render, run_oracle
    log = oracle_log(read_records(args.trace), args.trace)  # the whole input log, not only the replayed decisions
    rows = run_oracle(log.records)
    violations = [v for r in rows for v in r.violations]
    if args.quiet:
        print("invariants: all hold" if not violations else f"invariants: {len(violations)} violation(s)")
        for v in violations[:10]:
            print(f"  violation: {v}")
    else:
        print(render(args.trace, log, rows))
    if expected is not None:
        div = compare_decisions(result.decisions, expected)
        if div is not None:
            print(f"DIVERGED at decision #{div.index} (expected file line {div.expected_line}):")
            print(f"  model:    {json.dumps(div.produced) if div.produced else '<no more decisions>'}")
            print(f"  recorded: {json.dumps(div.expected) if div.expected else '<no more decisions>'}")
            return EXIT_DIVERGED
        print(f"matches {args.expect}: {len(result.decisions)} decisions identical")
    return EXIT_DIVERGED if violations else EXIT_OK


def _cmd_simulate(args: argparse.Namespace) -> int:
    from simulators.run import simulate, with_seed
    from simulators.runtime import print_progress
    from simulators.scenario import ScenarioError, load_scenario
    from simulators.spec import default_scenario

    try:
        scenario = load_scenario(args.scenario) if args.scenario else default_scenario()
    except ScenarioError as e:
        raise UsageError(str(e)) from None
    if args.seed is not None and args.seed < 0:
        raise UsageError(f"--seed: must be >= 0, got {args.seed}")
    scenario = with_seed(scenario, args.seed)
    out_dir = args.out or os.path.join("runs", scenario.name)
    if not args.quiet:
        print(f"simulating {scenario.name!r}: {len(scenario.pipelines)} pipeline(s) on {scenario.cluster.num_gpus} GPU(s), "
              f"seed {scenario.seed}, horizon {scenario.horizon_s:g} s", file=sys.stderr)
    out = simulate(scenario, out_dir, png=not args.no_png, progress=None if args.quiet else print_progress)
    res = out.result
    if not args.quiet:
        print(out.summary)
    print(f"{scenario.name}: {res.reason} ({res.detail}); simulated {res.sim_time:.1f} s in {res.wall_s:.2f} s wall, "
          f"{res.events} events, {len(res.records)} records; invariants: "
          + ("all hold" if not out.violations else f"{len(out.violations)} violation(s)"))
    for v in out.violations[:10]:
        print(f"  violation: {v}")
    print(f"outputs: {out_dir}/ (events.jsonl, summary.txt, trace.json{'' if args.no_png else ', timeline.png'}, scenario.yaml, violations.txt)")
    deterministic = _check_determinism(res, args) if args.check_determinism else True
    ended_well = res.reason in ("done", "horizon")  # a horizon stall is a liveness violation
    return EXIT_OK if ended_well and not out.violations and deterministic else EXIT_DIVERGED


def _check_determinism(res, args: argparse.Namespace) -> bool:
    from simulators.determinism import check_determinism

    if not args.quiet:
        print("checking determinism: the same run again in a fresh process", file=sys.stderr)
    try:
        check = check_determinism(res, args.scenario)
    except RuntimeError as e:
        print(f"determinism: NOT CHECKED: {e}")
        return False
    where = f"a fresh process (PYTHONHASHSEED={check.hash_seed})"
    div = check.divergence
    if div is None:
        print(f"determinism: {check.records} records byte-identical in {where}")
        return True
    print(f"determinism: DIVERGED in {where} at events.jsonl line {div.line}:")
    print(f"  this run:  {div.ours if div.ours is not None else '<log ended>'}")
    print(f"  fresh run: {div.theirs if div.theirs is not None else '<log ended>'}")
    return False


def _cmd_import(args: argparse.Namespace) -> int:
    from harness.importers.rlix_log import import_rlix_log

    if args.source != "rlix-log":
        raise UsageError("import: a source is required (rlix-log)")
    if not 0 < args.poll_s <= 3600:
        raise UsageError(f"--poll-s: must be in (0, 3600] seconds, got {args.poll_s:g}")
    if os.path.abspath(args.out) in (os.path.abspath(args.log), os.path.abspath(args.topology)):
        raise UsageError(f"--out: {args.out} is an input of this command")
    res = import_rlix_log(args.log, args.topology, poll_s=args.poll_s)
    write_atomic(args.out, res.log.lines())
    for note in res.notes:
        print(f"  note: {note}")
    print(f"imported {args.log}: {res.inputs} inputs from RLix's log, {res.poll_cycles} poll cycle(s) added, "
          f"{len(res.notes)} note(s); trace: {args.out} (rlharness replay {args.out})")
    return EXIT_OK


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            raise UsageError("a command is required (simulate, replay, check, schema); see rlharness --help")
        if args.command == "replay":
            return _cmd_replay(args)
        if args.command == "simulate":
            return _cmd_simulate(args)
        if args.command == "check":
            from harness.check import run_check
            return run_check(args.logs, names=args.names, context=max(args.context, 0), limit=max(args.max_shown, 0))
        if args.command == "import":
            return _cmd_import(args)
        if args.command == "fuzz":
            from simulators.fuzz.cli import cmd_fuzz

            return cmd_fuzz(args, UsageError)
        if args.command == "schema":
            from harness.eventlog.schema import render
            sys.stdout.write(render())
            return EXIT_OK
        raise UsageError(f"unknown command {args.command!r}")
    except (UsageError, InputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
