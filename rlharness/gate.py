"""``rlharness gate NAME [--nproc N] [gate options]``: run a GPU gate, print its verdict.

``torchrun gpu_gates/NAME.py`` is the gate's own command and stays as it is, but what it
prints ends in torchrun's ``ChildFailedError`` traceback whenever a rank exits non-zero
(a usage error, a skip, a designed failure), and torchrun's exit code is 1 for all of
them. This command is the user's way in:

* the gate's options are parsed here, by the gate's own parser, before anything is
  launched: a bad option is one ``error:`` line and exit 2, no launch;
* the report path (``--report``, default ``runs/gates/NAME.json``) and the event log are
  checked like every output path of rlharness;
* torchrun runs with ``--standalone`` (a free rendezvous port) and its whole output goes
  to ``<report stem>.log``; what is printed is the gate's verdict read from the report:
  status, headline, the per-rank and per-check tables, and where the report, event log
  and launch log are;
* the exit code is the gate's verdict in the project's one table
  (:class:`harness.exit_codes.ExitCode`): OK passed, FINDING failed, BAD_INPUT a usage
  error, SKIPPED skipped (:func:`exit_code_from_report`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
from typing import List, Optional, Tuple

from harness.exit_codes import ExitCode
from harness.logs.outputs.paths import check_output_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GATES_DIR = os.path.join(ROOT, "gpu_gates")


def gate_names() -> List[str]:
    """The gates: the files of ``gpu_gates/`` that end by running ``run_gate`` as a program."""
    names = []
    for fname in sorted(os.listdir(GATES_DIR)):
        if fname.endswith(".py") and fname != "runtime.py":
            with open(os.path.join(GATES_DIR, fname), encoding="utf-8") as fh:
                text = fh.read()
            if "sys.exit(run_gate(" in text:
                names.append(fname[:-3])
    return names


def add_parser(sub) -> None:
    gp = sub.add_parser(
        "gate",
        help="run a GPU gate under torchrun and print its verdict (exit: the gate's)",
        description="Run gpu_gates/NAME.py under torchrun (gloo on CPU, NCCL on GPUs) and print "
        "its verdict. Options after NAME go to the gate (`rlharness gate NAME --help` "
        "lists them), except --nproc. Exit codes: "
        f"{ExitCode.OK:d} passed, {ExitCode.FINDING:d} failed, "
        f"{ExitCode.BAD_INPUT:d} usage error, {ExitCode.SKIPPED:d} skipped. "
        "See docs/gates.md.",
    )
    gp.add_argument("name", metavar="NAME", help="the gate: " + ", ".join(gate_names()))
    gp.add_argument(
        "gate_args",
        nargs=argparse.REMAINDER,
        metavar="...",
        help="--nproc N (ranks; default: the gate's world) and the gate's own options",
    )


def _split_nproc(argv: List[str], usage_error) -> Tuple[Optional[int], List[str]]:
    """Take ``--nproc N`` / ``--nproc=N`` out of the gate's options."""
    rest: List[str] = []
    nproc: Optional[str] = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--nproc":
            if i + 1 >= len(argv):
                raise usage_error("--nproc: expected a positive integer")
            nproc, i = argv[i + 1], i + 2
            continue
        if a.startswith("--nproc="):
            nproc = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    if nproc is None:
        return None, rest
    if not nproc.isdigit() or not 1 <= int(nproc) <= 64:
        raise usage_error(f"--nproc: expected an integer 1..64, got {nproc!r}")
    return int(nproc), rest


def _load_spec(name: str, usage_error):
    if importlib.util.find_spec("torch") is None:
        raise usage_error("gate: torch is not installed here (pip install -e '.[gates]')")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    module = importlib.import_module(f"gpu_gates.{name}")
    return module.SPEC


def _parse_gate_options(spec, argv: List[str], usage_error) -> Optional[argparse.Namespace]:
    """The gate's own parser on its options; ``None`` after ``--help`` (printed)."""
    from gpu_gates.runtime.gate import build_parser

    parser = build_parser(spec)

    def error(message: str):
        raise usage_error(f"gate {spec.name}: {message}")

    parser.prog = f"rlharness gate {spec.name} [--nproc N]"
    parser.error = error  # one line here, not the gate's usage text
    try:
        return parser.parse_args(argv)
    except SystemExit as e:  # --help printed the gate's options
        if e.code:
            raise usage_error(f"gate {spec.name}: bad options") from None
        return None


def run(args: argparse.Namespace, usage_error) -> int:
    names = gate_names()
    if args.name not in names:
        raise usage_error(f"gate: unknown gate {args.name!r}; known: {', '.join(names)}")
    nproc, gate_argv = _split_nproc(list(args.gate_args), usage_error)
    spec = _load_spec(args.name, usage_error)
    opts = _parse_gate_options(spec, gate_argv, usage_error)
    if opts is None:
        return ExitCode.OK
    nproc = nproc or spec.default_world
    if not opts.report:
        opts.report = os.path.join("runs", "gates", f"{spec.name}.json")
        gate_argv = gate_argv + ["--report", opts.report]
    from gpu_gates.runtime.report import default_event_log_path

    event_log = opts.event_log or default_event_log_path(opts.report)
    check_output_file(opts.report, "--report")
    check_output_file(event_log, "--event-log")
    launch_log = os.path.splitext(opts.report)[0] + ".log"
    check_output_file(launch_log, "launch log")
    for path in (opts.report, event_log):  # a stale verdict must not be read as this run's
        if os.path.isfile(path):
            os.unlink(path)
    return _launch(spec, nproc, gate_argv, opts.report, event_log, launch_log)


def _launch(spec, nproc: int, gate_argv: List[str], report_path: str, event_log: str, launch_log: str) -> int:
    torchrun_argv = [
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        os.path.join(GATES_DIR, f"{spec.name}.py"),
        *gate_argv,
    ]
    print(
        f"running gate {spec.name} on {nproc} rank(s) under torchrun; launch output: {launch_log}",
        file=sys.stderr,
        flush=True,
    )
    os.makedirs(os.path.dirname(os.path.abspath(launch_log)), exist_ok=True)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(launch_log, "wb") as log:
        code = run_torchrun(torchrun_argv, log.fileno(), env)
    report = None
    if os.path.isfile(report_path):
        with open(report_path, encoding="utf-8") as fh:
            report = json.load(fh)
    if report is None:
        print(f"gate {spec.name}: FAILED: no report was written (torchrun exit {code}); see {launch_log}")
        return ExitCode.FINDING
    from gpu_gates.runtime.report import summary_text

    print(summary_text(report))
    where = [f"report: {report_path}"]
    if report.get("event_log") and os.path.isfile(report["event_log"]):
        where.append(f"event log: {report['event_log']}")
    where.append(f"launch output: {launch_log}")
    print("; ".join(where))
    return exit_code_from_report(report)


def run_torchrun(torchrun_argv: List[str], output_fd: int, env: dict) -> int:
    """``python -m torch.distributed.run TORCHRUN_ARGV`` with ``env``, its output (the
    agent's and every rank's) on ``output_fd``: its exit code.

    Where the system can fork, torchrun's agent is a fork of this process, which has
    already imported torch and the gate to parse the gate's options: a new program would
    import them again (about 1.4 CPU s before the first rank starts). The agent is torch's
    own (``torch.distributed.run.main``: its parser, rendezvous, monitoring and teardown),
    and the ranks are new ``python -u GATE.py`` processes, exactly as under torchrun.
    Interrupted, this process kills the agent as ``subprocess.call`` would."""
    if not hasattr(os, "fork"):
        cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun_argv]
        return subprocess.call(cmd, stdout=output_fd, stderr=output_fd, stdin=subprocess.DEVNULL, env=env)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the agent: never returns
        _become_torchrun(torchrun_argv, output_fd, env)
    try:
        _, status = os.waitpid(pid, 0)
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    return os.waitstatus_to_exitcode(status)


def _become_torchrun(torchrun_argv: List[str], output_fd: int, env: dict) -> None:
    """In the forked child: what ``python -m torch.distributed.run`` would be with this
    environment and output, then exit with its code (an uncaught exception: its
    traceback, exit 1, as a program's)."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        # the streams too: a caller may have replaced sys.stdout/sys.stderr (pytest's
        # capture, a notebook), and the agent's argparse and tracebacks write to them
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(env)
        from torch.distributed.run import main as torchrun_main

        torchrun_main(torchrun_argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def exit_code_from_report(report: dict) -> ExitCode:
    """The exit code of ``rlharness gate`` for a gate's report: its ``status`` mapped onto
    the one table (torchrun's own exit is 1 for every non-zero rank exit, so the report is
    what tells a skip from a failure). A status this command does not know is a failure."""
    from gpu_gates.runtime.report import FAILED, PASSED, SKIPPED

    return {PASSED: ExitCode.OK, FAILED: ExitCode.FINDING, SKIPPED: ExitCode.SKIPPED}.get(
        report.get("status"), ExitCode.FINDING
    )
