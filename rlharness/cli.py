"""The ``rlharness`` command line.

Every subcommand exits with a code of the project's one table
(:class:`harness.exit_codes.ExitCode`, listed by ``--help`` and in docs/cli.md#exit-codes),
applied here in :func:`main`: bad input is one line ``error: <file/field/argument>:
<what>`` on stderr, no traceback, nothing written; a reader of the output that went away
(``rlharness replay X | head``) is a quiet exit, nothing on stderr, for every command and
for ``--help``/``--version`` alike. As with any Unix tool, output the pipe took in whole
before its reader left (``rlharness schema | head -1``: the schema fits the pipe's buffer)
was written, and the command exits as usual.

Every input and output path is checked before any work starts. A subcommand is a module
with ``add_parser(sub)`` and ``run(args, usage_error)`` (``rlharness/replay.py``,
``rlharness/simulate.py``, ...), a line in :func:`build_parser` and one in
:data:`COMMANDS`; the error handling above applies to it without more code. What several
subcommands share (the parser class, the exit-code epilog, the baseline flags) is in
:mod:`rlharness.options`.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import Callable, Dict, List, Optional

from harness.exit_codes import ExitCode
from harness.logs.outputs.paths import OutputPathError
from harness.logs.records import InputError
from rlharness import (
    calibrate,
    check,
    diff,
    differential,
    export,
    gate,
    import_log,
    preflight,
    replay,
    schema,
    simulate,
    size,
    validate,
)
from rlharness.options import EXIT_CODES_HELP, OneLineErrorParser, UsageError

__all__ = ["COMMANDS", "UsageError", "build_parser", "main", "run"]


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("rlharness")
    except Exception:  # running from a checkout that was never installed
        from harness import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    """The program's parser: each subcommand's module adds its own, in the order --help lists them."""
    parser = OneLineErrorParser(
        prog="rlharness",
        description="Simulation-backed test harness for RL post-training on shared GPUs.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rlharness {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)
    for module in (replay, simulate, check):
        module.add_parser(sub)
    from simulators.fuzz.cli import add_parser as add_fuzz_parser

    add_fuzz_parser(sub, UsageError)
    for module in (import_log, calibrate, schema, validate, export, gate):  # calibrate adds fidelity too
        module.add_parser(sub)
    from simulators.whatif.cli import add_parser as add_sweep_parser, add_what_if_parser

    add_sweep_parser(sub, UsageError)
    add_what_if_parser(sub)
    for module in (diff, preflight, differential, size):
        module.add_parser(sub)
    return parser


def _cmd_fuzz(args: argparse.Namespace, usage_error) -> int:
    from simulators.fuzz.cli import cmd_fuzz

    return cmd_fuzz(args, usage_error)


def _cmd_sweep(args: argparse.Namespace, usage_error) -> int:
    from simulators.whatif.cli import cmd_sweep

    return cmd_sweep(args, usage_error)


def _cmd_what_if(args: argparse.Namespace, usage_error) -> int:
    from simulators.whatif.cli import cmd_what_if

    return cmd_what_if(args, usage_error)


#: subcommand -> its function (argparse namespace, the usage-error class -> exit code)
COMMANDS: Dict[str, Callable[[argparse.Namespace, type], int]] = {
    "replay": replay.run,
    "simulate": simulate.run,
    "check": check.run,
    "import": import_log.run,
    "fuzz": _cmd_fuzz,
    "calibrate": calibrate.run_calibrate,
    "fidelity": calibrate.run_fidelity,
    "schema": schema.run,
    "validate": validate.run,
    "export": export.run,
    "gate": gate.run,
    "sweep": _cmd_sweep,
    "what-if": _cmd_what_if,
    "diff": diff.run,
    "preflight": preflight.run,
    "differential": differential.run,
    "size": size.run,
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
        code = command(args, UsageError)
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
