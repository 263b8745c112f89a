"""The ``rlharness`` command line.

Every subcommand exits with a code of the project's one table
(:class:`harness.exit_codes.ExitCode`, listed by ``--help`` and in docs/cli.md#exit-codes),
applied here in :func:`main`: bad input is one line ``error: <file/field/argument>:
<what>`` on stderr, no traceback, nothing written; a reader of the output that went away
(``rlharness replay X | head``) is a quiet exit, nothing on stderr, for every command and
for ``--help``/``--version`` alike. As with any Unix tool, output the pipe took in whole
before its reader left (``rlharness schema | head -1``: the schema fits the pipe's buffer)
was written, and the command exits as usual.

Every input and output path is checked before any work starts. A subcommand is a parser
block in :func:`build_parser` (its logic in a module of its own) and a line in
:data:`COMMANDS`; the error handling above applies to it without more code.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from typing import Callable, Dict, List, Optional, Sequence

from harness.logs.records import InputError, read_records
from harness.logs.writer import write_atomic
from harness.exit_codes import ExitCode
from harness.logs.expect import report_lines
from harness.logs.outputs.paths import OutputPathError, check_output_dir, check_output_file
from harness.logs.replay import compare_decisions, format_table, replay_file

#: violations printed before the list is cut (the count of the rest is printed)
SHOWN_VIOLATIONS = 20

EXIT_CODES_HELP = f"""exit codes (every command; docs/cli.md#exit-codes):
  {ExitCode.OK:<4d} done, nothing found (every invariant held, a replay matched)
  {ExitCode.FINDING:<4d} a finding: the simulated system failed, an invariant broke, a determinism
       check found a difference (a simulation cut by its horizon is an outcome: 0 unless
       the oracle finds a stall); findings a scenario's expect: list or --baseline FILE
       covers are reported, not failures, and --strict also fails on an expected finding
       that did not occur (docs/expected-findings.md)
  {ExitCode.BAD_INPUT:<4d} bad input: one line "error: <where>: <what>" on stderr, nothing written
  {ExitCode.DIVERGED:<4d} replay --expect: a decision diverged from the recorded log (whatever the
       invariants say; a finding from replay is an invariant violation alone)
  {ExitCode.SKIPPED:<4d} gate: the gate skipped (the node cannot host it; the reason is in its report)
  {ExitCode.INTERRUPTED:<4d} interrupted
  {ExitCode.BROKEN_PIPE:<4d} the output pipe was closed before all output was written (e.g. | head);
       nothing more is printed, nothing on stderr (--help and --version too)"""


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print usage + exit 2; one line is clearer
        raise UsageError(message)

    def _print_message(self, message: str, file=None) -> None:
        # argparse swallows write errors here (a closed pipe under --help would exit 0);
        # let BrokenPipeError reach main(), which ends every command the same way (141)
        if message:
            (file or sys.stderr).write(message)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("rlharness")
    except Exception:  # running from a checkout that was never installed
        from harness import __version__

        return __version__


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _add_baseline(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--baseline", metavar="FILE", help="expected findings (docs/expected-findings.md): reported, not failures"
    )
    p.add_argument("--strict", action="store_true", help="exit 1 also when an expected finding did not occur")
    add_upstream_flag(p)


def add_upstream_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--upstream-as-findings",
        action="store_true",
        help="count known upstream behaviour (RLix, NeMo RL, ROLL as they are today; "
        "docs/expected-findings.md) as findings: for people changing those systems",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rlharness",
        description="Simulation-backed test harness for RL post-training on shared GPUs.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rlharness {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    rp = sub.add_parser(
        "replay",
        help="replay a scheduler trace through the scheduler model",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rp.add_argument("trace", metavar="INPUTS.jsonl", help="event log whose input records are replayed")
    rp.add_argument("--out", metavar="PATH", help="write the decision log (JSONL) here")
    rp.add_argument(
        "--expect",
        metavar="RECORDED.jsonl",
        help=f"compare decisions with a recorded log; exit {ExitCode.DIVERGED:d} at the first divergence",
    )
    rp.add_argument("--quiet", action="store_true", help="print no table, only the summary line")
    rp.add_argument(
        "--verdict",
        metavar="FILE",
        help="write the verdict as JSON: decisions (matched / diverged / "
        "not compared), invariants, findings, exit code (docs/trace-format.md)",
    )
    _add_baseline(rp)
    sim = sub.add_parser(
        "simulate",
        help="simulate a scenario (default: two nemo_async pipelines on 2 GPUs)",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sim.add_argument("scenario", metavar="SCENARIO", nargs="?", help="scenario YAML (see examples/scenarios/)")
    sim.add_argument("--seed", type=int, help="override the scenario's seed")
    sim.add_argument(
        "--set",
        dest="overrides",
        metavar="PATH=VALUE",
        action="append",
        default=[],
        help="change one field, written as error messages write it (pipelines[0].infer_tp=2, "
        "costs.wake_s=1.5, pipelines[ppl2].steps=8); repeatable; VALUE is YAML",
    )
    sim.add_argument("--out", metavar="DIR", help="output folder (default: runs/<scenario name>)")
    sim.add_argument(
        "--no-png", action="store_true", help="skip the PNG timeline (an old one in the folder is removed)"
    )
    sim.add_argument(
        "--explore",
        type=int,
        metavar="SEED",
        help="a seeded strategy orders same-time events of different processes and lock hand-offs, "
        "and adds small delays to RPC returns and lock holds (docs/exploration.md)",
    )
    sim.add_argument(
        "--explore-strategy",
        choices=["pct", "random"],
        default="pct",
        help="with --explore: pct (priority change points, default) or random (a random walk)",
    )
    sim.add_argument("--quiet", action="store_true", help="no progress lines, no summary table")
    sim.add_argument(
        "--check-determinism",
        action="store_true",
        help="run again in a fresh process under another PYTHONHASHSEED; exit 1 unless the event logs are byte-identical",
    )
    _add_baseline(sim)
    ck = sub.add_parser(
        "check",
        help="run every invariant check on event logs (exit 1 on a violation)",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ck.add_argument(
        "logs", metavar="LOG", nargs="+", help="event log(s): simulator, gate, replay output or scheduler trace"
    )
    ck.add_argument("--check", dest="names", metavar="NAME", action="append", help="run only this check (repeatable)")
    ck.add_argument(
        "--context", type=int, default=2, metavar="N", help="records shown either side of a violation (default 2)"
    )
    ck.add_argument("--max-shown", type=int, default=10, metavar="N", help="violations shown per log (default 10)")
    _add_baseline(ck)
    ck.add_argument(
        "--write-baseline", metavar="FILE", help="write today's findings as a baseline file to start from (exit 0)"
    )
    from simulators.fuzz.cli import add_parser as add_fuzz_parser

    add_fuzz_parser(sub, UsageError)
    imp = sub.add_parser("import", help="convert a real system's log into a replayable input trace")
    imp_sub = imp.add_subparsers(dest="source", metavar="SOURCE", parser_class=_Parser)
    rl = imp_sub.add_parser("rlix-log", help="RLix's [RLIX_SCHED_LOG] stdout lines (format: docs/rlix-log-format.md)")
    rl.add_argument("log", metavar="LOG", help="RLix stdout (other lines are passed over)")
    rl.add_argument(
        "--topology",
        required=True,
        metavar="TOPOLOGY.yaml",
        help="cluster and pipeline registrations, which RLix's log does not carry (format: docs/rlix-log-format.md)",
    )
    rl.add_argument("--out", required=True, metavar="TRACE.jsonl", help="the input trace to write")
    rl.add_argument("--poll-s", type=float, default=1.0, metavar="SECONDS", help="RLix's poll period (default 1)")
    __import__("rlharness.import_config", fromlist=["add_parsers"]).add_parsers(imp_sub)
    cal = sub.add_parser(
        "calibrate",
        help="fit the simulator's refit costs to the real transport on this machine "
        "(refit), or the cost model's efficiency factors to measured step times (step TIMINGS)",
    )
    cal.add_argument("target", choices=["refit", "step"], help="what to calibrate")
    cal.add_argument(
        "timings",
        nargs="?",
        metavar="TIMINGS",
        help="step only: measured per-stage step times (format: docs/cost-model.md)",
    )
    cal.add_argument(
        "--out",
        metavar="FILE",
        help="calibration file to write (default refit-calibration.json / step-calibration.json)",
    )
    cal.add_argument(
        "--hold-out",
        action="append",
        default=[],
        metavar="RUN",
        help="step only: leave this run of TIMINGS out of the fit (repeatable)",
    )
    cal.add_argument(
        "--repeats",
        type=_positive_int,
        default=5,
        metavar="N",
        help="runs per configuration (minimum of, each after a warm-up run)",
    )
    cal.add_argument("--quick", action="store_true", help="a 4-point grid instead of 9")
    fid = sub.add_parser(
        "fidelity",
        help="compare simulated refit times with fresh measurements on held-out "
        "configurations (refit), or predicted stage times with measured ones (step TIMINGS)",
    )
    fid.add_argument("target", choices=["refit", "step"], help="what to check")
    fid.add_argument("timings", nargs="?", metavar="TIMINGS", help="step only: measured per-stage step times")
    how = fid.add_mutually_exclusive_group(required=True)
    how.add_argument("--calibration", metavar="FILE", help="file written by `rlharness calibrate refit`")
    how.add_argument(
        "--fit-alongside",
        action="store_true",
        help="fit on the calibration grid measured in the same interleaved rounds (not from a file)",
    )
    fid.add_argument(
        "--repeats",
        type=_positive_int,
        default=5,
        metavar="N",
        help="runs per configuration (minimum of, each after a warm-up run)",
    )
    fid.add_argument("--strict", action="store_true", help="exit 1 when the error targets are missed")
    sp = sub.add_parser("schema", help="print the event-log JSON Schema")
    sp.set_defaults(command="schema")
    from rlharness import export, gate, validate

    validate.add_parser(sub)
    export.add_parser(sub)
    gate.add_parser(sub)
    from simulators.whatif.cli import add_parser as add_sweep_parser, add_what_if_parser

    add_sweep_parser(sub, UsageError)
    add_what_if_parser(sub)
    for name in ("diff", "preflight", "differential", "size"):  # each module adds its parser
        __import__(f"rlharness.{name}", fromlist=["add_parser"]).add_parser(sub)
    return parser


def print_violations(violations: Sequence[object], where_all: str) -> None:
    """The first :data:`SHOWN_VIOLATIONS` violations, then how many more and where all are."""
    for v in violations[:SHOWN_VIOLATIONS]:
        print(f"  violation: {v}")
    rest = len(violations) - SHOWN_VIOLATIONS
    if rest > 0:
        print(f"  ... and {rest} more violation(s) ({len(violations)} in all; {where_all})")


def _cmd_replay(args: argparse.Namespace) -> int:
    if args.out:
        check_output_file(args.out, "--out", inputs=[args.trace, args.expect])
    if args.verdict:
        check_output_file(args.verdict, "--verdict", inputs=[args.trace, args.expect, args.baseline, args.out])
    expected = read_records(args.expect) if args.expect else None  # fail on a bad --expect before any output
    baseline = _read_baseline(args.baseline, args.upstream_as_findings)
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
    print(
        f"replayed {args.trace}: {cycles} cycles committed, {len(result.decisions)} decisions, {result.rejected} inputs rejected"
        + (f"; decision log: {args.out}" if args.out else "")
    )
    from harness.logs.check import oracle_log, render, run_oracle

    log = oracle_log(read_records(args.trace), args.trace)  # the whole input log, not only the replayed decisions
    rows = run_oracle(log.records)
    violations = [v for r in rows for v in r.violations]
    if args.quiet:
        print("invariants: all hold" if not violations else f"invariants: {len(violations)} violation(s)")
        print_violations(violations, "rlharness check lists them with their context")
    else:
        print(render(args.trace, log, rows))
    from harness.logs.expect import classify, from_violations

    verdict = classify(from_violations(violations, log.records), baseline)
    if verdict.reported:
        for line in report_lines(verdict, args.strict):
            print(line)
    div = compare_decisions(result.decisions, expected) if expected is not None else None
    if div is not None:
        print(f"DIVERGED at decision #{div.index} (expected file line {div.expected_line}):")
        print(f"  model:    {json.dumps(div.produced) if div.produced else '<no more decisions>'}")
        print(f"  recorded: {json.dumps(div.expected) if div.expected else '<no more decisions>'}")
    elif expected is not None:
        print(f"matches {args.expect}: {len(result.decisions)} decisions identical")
    code = ExitCode.DIVERGED if div is not None else ExitCode.FINDING if verdict.failed(args.strict) else ExitCode.OK
    if args.verdict:
        write_atomic(
            args.verdict,
            [json.dumps(replay_verdict(code, expected is not None, div, verdict, len(violations)), sort_keys=True)],
        )
    return code


def replay_verdict(code: int, compared: bool, div, verdict, violations: int) -> dict:
    """``replay --verdict``: what a script needs to tell a decision divergence (the model
    and the recording disagree: a model or system change) from an invariant violation
    in a replay whose decisions agree (the recorded behaviour itself is wrong)."""
    name = {ExitCode.DIVERGED: "diverged", ExitCode.FINDING: "violation", ExitCode.OK: "ok"}[code]
    return {
        "verdict": name,
        "exit": code,
        "decisions": "diverged" if div is not None else "identical" if compared else "not_compared",
        "divergence": None
        if div is None
        else {"index": div.index, "expected_line": div.expected_line, "model": div.produced, "recorded": div.expected},
        "invariants": {"violations": violations, **verdict.as_json()},
    }


def _cmd_simulate(args: argparse.Namespace) -> int:
    from simulators.run import OUTPUT_FILES, simulate, with_seed
    from simulators.runtime.simulation import print_progress
    from simulators.scenario.loader import ScenarioError
    from simulators.scenario.overrides import OverrideError, load_with_overrides, parse_override

    try:
        overrides = [parse_override(text) for text in args.overrides]
        scenario = load_with_overrides(args.scenario, overrides)
    except (ScenarioError, OverrideError) as e:
        raise UsageError(str(e)) from None
    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise UsageError(f"--seed: must be in 0..2**63-1, got {args.seed}")
    scenario = with_seed(scenario, args.seed)
    explore = None
    if args.explore is not None:
        from simulators.runtime.explore import ExploreSpec

        if not 0 <= args.explore < 2**63:
            raise UsageError(f"--explore: must be in 0..2**63-1, got {args.explore}")
        explore = ExploreSpec(args.explore, args.explore_strategy)
    args.explore_spec = explore
    baseline = _read_baseline(args.baseline, args.upstream_as_findings)
    out_dir = args.out or os.path.join("runs", scenario.name)
    check_output_dir(
        out_dir, OUTPUT_FILES, "--out" if args.out else "run folder", inputs=[args.scenario, args.baseline]
    )
    if not args.quiet:
        print(
            f"simulating {scenario.name!r}: {len(scenario.pipelines)} pipeline(s) on {scenario.cluster.num_gpus} GPU(s), "
            f"seed {scenario.seed}, horizon {scenario.horizon_s:g} simulated s",
            file=sys.stderr,
        )
    # the outputs are made as the run goes (memory bounded by what is live: a run larger
    # than memory fits); --check-determinism compares this run's log kept in memory
    out = simulate(
        scenario,
        out_dir,
        png=not args.no_png,
        progress=None if args.quiet else print_progress,
        explore=explore,
        baseline=baseline,
        strict=args.strict,
        stream=not args.check_determinism,
    )
    res = out.result
    if not args.quiet:
        print(out.summary)
    print(
        f"{scenario.name}: {res.reason} ({res.detail}); simulated {res.sim_time:.1f} s in {res.wall_s:.2f} s wall, "
        f"{res.events} events, {res.log.made} records; invariants: "
        + ("all hold" if not out.violations else f"{len(out.violations)} violation(s)")
        + (
            f"; findings: {len(out.verdict.unexpected)} unexpected, {len(out.verdict.expected)} expected or known"
            if out.verdict.reported
            else ""
        )
    )
    if out.figures is not None and out.figures.headroom is not None:
        from harness.logs.outputs.headroom import headroom_brief

        print(headroom_brief(out.figures.headroom))
    if not out.verdict.reported:
        print_violations(out.violations, f"all in {os.path.join(out_dir, 'violations.txt')}")
    elif args.quiet:  # the summary (not printed) holds these lines otherwise
        for line in report_lines(out.verdict, args.strict):
            print(line)
    print(f"outputs: {out_dir}/ ({', '.join(os.path.basename(f) for f in out.files)})")
    deterministic = _check_determinism(res, args) if args.check_determinism else True
    # a failed run is a finding (oom:..., failed:...) and a horizon stall a liveness
    # violation: both are in the verdict, with the expectations that may cover them
    return ExitCode.OK if not out.verdict.failed(args.strict) and deterministic else ExitCode.FINDING


def _read_baseline(path: Optional[str], upstream_as_findings: bool = False):
    """The baseline's expectations, then the known upstream behaviours (unless counted as findings)."""
    from harness.logs.known_upstream import upstream_expectations
    from simulators.verdict.baseline import BaselineError, read_baseline

    try:
        return read_baseline(path) + upstream_expectations(upstream_as_findings)
    except BaselineError as e:
        raise UsageError(str(e)) from None


def _check_determinism(res, args: argparse.Namespace) -> bool:
    from simulators.selfcheck.determinism import check_determinism

    if not args.quiet:
        print("checking determinism: the same run again in a fresh process", file=sys.stderr)
    try:
        check = check_determinism(res, args.scenario, resolved=bool(args.overrides), explore=args.explore_spec)
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
    from harness.logs.importers.rlix_log import import_rlix_log
    from rlharness import import_config

    if args.source in import_config.SOURCES:
        return import_config.run(args, UsageError)
    if args.source != "rlix-log":
        raise UsageError(f"import: a source is required (rlix-log, {', '.join(import_config.SOURCES)})")
    if not 0 < args.poll_s <= 3600:
        raise UsageError(f"--poll-s: must be in (0, 3600] seconds, got {args.poll_s:g}")
    check_output_file(args.out, "--out", inputs=[args.log, args.topology])
    res = import_rlix_log(args.log, args.topology, poll_s=args.poll_s)
    write_atomic(args.out, res.log.lines())
    for note in res.notes:
        print(f"  note: {note}")
    print(
        f"imported {args.log}: {res.inputs} inputs from RLix's log, {res.poll_cycles} poll cycle(s) added, "
        f"{len(res.notes)} note(s); trace: {args.out} (rlharness replay {args.out})"
    )
    return ExitCode.OK


def _cmd_fuzz(args: argparse.Namespace) -> int:
    from simulators.fuzz.cli import cmd_fuzz

    return cmd_fuzz(args, UsageError)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from rlharness.step_calibrate import step_command

    if step_command(args, UsageError, check_output_file):
        return ExitCode.OK
    from rlharness.refit_calibrate import cmd_calibrate

    out = args.out or "refit-calibration.json"
    check_output_file(out, "--out")  # before minutes of measuring
    return cmd_calibrate(out, args.repeats, args.quick)


def _cmd_fidelity(args: argparse.Namespace) -> int:
    from rlharness.step_calibrate import step_command

    if step_command(args, UsageError, check_output_file):
        return ExitCode.OK
    from rlharness.refit_calibrate import cmd_fidelity

    return cmd_fidelity(args.calibration, args.repeats, args.strict, alongside=args.fit_alongside)


def _cmd_schema(args: argparse.Namespace) -> int:
    from harness.logs.schema import render

    sys.stdout.write(render())
    return ExitCode.OK


def _cmd_check(args: argparse.Namespace) -> int:
    from harness.logs.check import run_check

    if args.write_baseline:
        check_output_file(args.write_baseline, "--write-baseline", inputs=list(args.logs) + [args.baseline])
    return run_check(
        args.logs,
        names=args.names,
        context=max(args.context, 0),
        limit=max(args.max_shown, 0),
        baseline=_read_baseline(args.baseline, args.upstream_as_findings),
        strict=args.strict,
        write_baseline=_baseline_writer(args.write_baseline, args.logs),
    )


def _baseline_writer(path: Optional[str], logs: Sequence[str]):
    if not path:
        return None
    from simulators.verdict.baseline import baseline_text

    def write(findings) -> None:
        write_atomic(path, [baseline_text(findings, ", ".join(logs))])
        print(f"baseline: {len(findings)} finding(s) written to {path}; replace each reason with why it is expected")

    return write


def _cmd_validate(args: argparse.Namespace) -> int:
    from rlharness import validate

    return validate.run(args, UsageError)


def _cmd_export(args: argparse.Namespace) -> int:
    from rlharness import export

    return export.run(args, UsageError)


def _cmd_gate(args: argparse.Namespace) -> int:
    from rlharness import gate

    return gate.run(args, UsageError)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from simulators.whatif.cli import cmd_sweep

    return cmd_sweep(args, UsageError)


def _cmd_what_if(args: argparse.Namespace) -> int:
    from simulators.whatif.cli import cmd_what_if

    return cmd_what_if(args, UsageError)


def _module_command(name: str) -> Callable[[argparse.Namespace], int]:
    """A subcommand whose module has ``run(args, usage_error)``."""
    return lambda args: __import__(f"rlharness.{name}", fromlist=["run"]).run(args, UsageError)


#: subcommand -> its function (argparse namespace -> exit code)
COMMANDS: Dict[str, Callable[[argparse.Namespace], int]] = {
    "replay": _cmd_replay,
    "simulate": _cmd_simulate,
    "check": _cmd_check,
    "import": _cmd_import,
    "fuzz": _cmd_fuzz,
    "calibrate": _cmd_calibrate,
    "fidelity": _cmd_fidelity,
    "schema": _cmd_schema,
    "validate": _cmd_validate,
    "export": _cmd_export,
    "gate": _cmd_gate,
    "sweep": _cmd_sweep,
    "what-if": _cmd_what_if,
    **{name: _module_command(name) for name in ("diff", "preflight", "differential", "size")},
}


def _error(text: str) -> int:
    print(f"error: {' '.join(str(text).split())}", file=sys.stderr)
    return ExitCode.BAD_INPUT


def _quiet_broken_pipe() -> int:
    # Python flushes stdout again at exit and would report the broken pipe there: point
    # stdout at /dev/null first (the pattern the Python docs give for SIGPIPE).
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return ExitCode.BROKEN_PIPE


def main(argv: Optional[List[str]] = None) -> int:
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit:  # --help, --version: argparse printed and exits
            sys.stdout.flush()  # a closed pipe shows here, so it ends as 141 like every command
            raise
        if args.command is None:
            raise UsageError(f"a command is required ({', '.join(COMMANDS)}); see rlharness --help")
        command = COMMANDS.get(args.command)
        if command is None:
            raise UsageError(f"unknown command {args.command!r}")
        code = command(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below
        return code
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except (UsageError, InputError, OutputPathError) as e:
        return _error(str(e))
    except OSError as e:
        where = e.filename or ""
        return _error(f"{where}: {e.strerror or e}" if where else (e.strerror or str(e)))
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


def run() -> int:
    """The program: :func:`main` on ``sys.argv``, then the process ends without taking its
    heap apart. ``gc.freeze()`` puts every object out of the interpreter's final
    collection; a simulation's objects are freed by that collection (the simulator's
    processes hold the run in reference cycles), which walked and freed the 1024-GPU
    run's millions of objects for about a second after the command had finished. The
    operating system takes the memory back at once. (In-process callers use main.)"""
    code = main()
    gc.freeze()
    return code


if __name__ == "__main__":
    raise SystemExit(run())
