"""Shared gate runtime: CLI, process-group setup, checks, watchdog and the report.

A gate module defines a :class:`GateSpec` (its own flags, a world-size check, a ``run``
body and a rank-0 ``summarize``) and calls :func:`run_gate`. Everything that makes a gate
safe to run unattended lives here, once:

* every rank arms a watchdog and a SIGTERM listener; a hang or teardown becomes a failed
  report, never a stuck job;
* results move through the TCP store, not collectives, so rank 0 can still merge what
  every live rank knew when some rank is broken;
* the report is written atomically on every exit path; exit codes (the project's one
  table, :class:`harness.exit_codes.ExitCode`): 0 passed, 1 failed, 2 usage error,
  77 skipped (the node cannot host the requested world).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from gpu_gates.sync import ipc
from gpu_gates.runtime import report as rep
from gpu_gates.runtime.context import KEY_PREFIX, GateAbort, GateContext  # noqa: F401 (re-exported for gates)
from gpu_gates.runtime.dist_setup import (
    LaunchEnv,
    connect_store,
    device_for,
    device_skip_reason,
    init_world,
    select_backend,
)
from gpu_gates.runtime.events import merge_events, write_event_log
from gpu_gates.runtime.hooks import HookSpecError, TestHooks
from gpu_gates.runtime.memory import MemoryMeter
from gpu_gates.runtime.rank0_first import rank0_speaks_first, wait_for_keys
from gpu_gates.runtime.watchdog import Watchdog, start_sigterm_listener, thread_stacks
from gpu_gates.transports import private_dirs
from harness.exit_codes import ExitCode

__all__ = ["GateAbort", "GateContext", "GateSpec", "positive_float", "positive_int", "run_gate"]


@dataclass
class GateSpec:
    name: str
    description: str
    default_world: int
    default_cycles: int
    add_arguments: Callable[[argparse.ArgumentParser], None]
    check_world: Callable[[argparse.Namespace, int], Optional[str]]
    run: Callable[["GateContext"], None]
    summarize: Callable[[argparse.Namespace, List[Dict[str, Any]]], Tuple[Dict[str, Any], List[str]]]


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


class _RankZeroParser(argparse.ArgumentParser):
    """An argument parser that speaks only on rank 0: torchrun starts every rank with the
    same flags, so a bad flag would otherwise print its usage once per rank. Every rank
    still exits with the usage code."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if os.environ.get("RANK", "0") == "0":
            super()._print_message(message, file)

    def error(self, message: str):  # type: ignore[override]
        """argparse's message, raised for :func:`run_gate` to print once rank 0's turn comes
        (argparse itself prints and exits on every rank at once)."""
        raise _UsageError(f"{self.format_usage()}{self.prog}: error: {message}\n")


class _UsageError(Exception):
    """A bad flag or hook variable: its whole message, usage line included."""


def build_parser(spec: GateSpec) -> argparse.ArgumentParser:
    parser = _RankZeroParser(
        prog=f"gpu_gates/{spec.name}.py",
        description=spec.description,
        epilog=f"launch: torchrun --nproc-per-node {spec.default_world} gpu_gates/{spec.name}.py [flags]; "
        f"exit codes: {ExitCode.OK:d} passed, {ExitCode.FINDING:d} failed, {ExitCode.BAD_INPUT:d} usage "
        f"error, {ExitCode.SKIPPED:d} skipped; see docs/cli.md#exit-codes",
    )
    parser.add_argument(
        "--backend",
        choices=["auto", "nccl", "gloo"],
        default="auto",
        help="auto = nccl when CUDA has a GPU per local rank, else gloo on CPU",
    )
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="auto = the GPU under nccl, the CPU under gloo; cuda with gloo puts several "
        "ranks on one GPU (same-GPU IPC and VRAM paths on a one-GPU node)",
    )
    parser.add_argument("--cycles", type=positive_int, default=spec.default_cycles)
    parser.add_argument("--report", metavar="PATH", help="JSON report (rank 0 merged; .rankN on per-rank failure)")
    parser.add_argument("--timeout-s", type=positive_float, default=120.0, help="per-rank deadline")
    parser.add_argument("--event-log", metavar="PATH", help="JSONL event log (default: <report>.events.jsonl)")
    spec.add_arguments(parser)
    return parser


#: said of a check failure found while tearing down a run that had already failed (a
#: process group a hung peer still holds): a consequence, never the headline
AFTER_FAILURE_MARKER = "found after the run had already failed"
SECONDARY_MARKERS = (
    "terminated by SIGTERM",
    "GateAbort",
    "never reported",
    "closed by peer",
    "reset by peer",
    AFTER_FAILURE_MARKER,
)
TIMEOUT_MARKER = "timed out: deadline passed while"


def primary_failure(failures: List[str]) -> str:
    """The failure to headline: a rank's own problem, not a peer's knock-on abort or teardown."""
    # With only knock-on failures, the ranks that never reported name the likely culprit
    # (a rank that timed out and exited before its result reached rank 0 made the launcher
    # SIGTERM the rest); a rank's own SIGTERM says only that the job was torn down.
    fallback = next((f for f in failures if "never reported" in f), failures[0])
    primary = next((f for f in failures if not any(m in f for m in SECONDARY_MARKERS)), fallback)
    timeouts = [f for f in failures if TIMEOUT_MARKER in f]
    if TIMEOUT_MARKER in primary and len(timeouts) > 1:  # show where every stuck rank was
        where = "; ".join(" ".join(f.split(": ", 1)[-1].replace(TIMEOUT_MARKER, "").split()) for f in timeouts)
        return f"{len(timeouts)} rank(s) timed out ({where})"
    return primary


def write_at_once(stream, text: str) -> None:
    """Write a multi-line message with one write(2) on the stream's file descriptor.

    Every rank shares the launcher's stderr; printed line by line, a rank's traceback gets
    other ranks' lines inside it when they fail at the same moment. A pipe keeps a write of
    up to PIPE_BUF (4 KiB on Linux) whole, which a headline and its traceback fit in. A
    stream without a descriptor (captured by a test runner) gets an ordinary write."""
    stream.flush()
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        stream.write(text)
        stream.flush()
        return
    data = text.encode(getattr(stream, "encoding", None) or "utf-8", "backslashreplace")
    while data:
        data = data[os.write(fd, data) :]


class _GateRun:
    """One rank's whole life: setup, body, and exactly one finish (normal or emergency)."""

    def __init__(self, spec: GateSpec, args: argparse.Namespace, env: LaunchEnv, hooks: TestHooks) -> None:
        self.spec, self.args, self.env, self.hooks = spec, args, env, hooks
        self.started = time.time()
        self.grace = max(2.0, min(5.0, 0.1 * args.timeout_s))
        extra = self.grace if env.rank == 0 else 0.0
        self.deadline = time.monotonic() + args.timeout_s + extra
        self.report_store: Optional[dist.Store] = None
        self.ctx: Optional[GateContext] = None
        self.backend: Optional[str] = None
        self._finish_lock = threading.Lock()
        self.body_raised = False
        self.folders: List[private_dirs.RunFolder] = []
        self.event_log = args.event_log or rep.default_event_log_path(args.report)
        self.ended: Optional[int] = None  # the exit code this rank returned with (see _ends_by_returning)

    def execute(self) -> int:
        backend, skip = select_backend(self.args.backend, self.env)
        if backend and not skip:
            skip = device_skip_reason(backend, self.args.device)
        skip = skip or self.spec.check_world(self.args, self.env.world_size)
        if skip:
            return self._skip(backend or self.args.backend, skip)
        self.backend = backend
        device = device_for(backend, self.env, self.args.device)
        ctx = self.ctx = GateContext(self.spec, self.args, self.env, backend, device, self.hooks, self.deadline)
        if self.env.rank == 0:
            private_dirs.sweep_stale()  # folders and staging files of earlier runs killed whole
        self.folders = ipc.gate_folders(self.env.master_port)  # left on every exit path (finish)
        start_sigterm_listener(lambda reason: self.finish(reason))  # before any backend thread exists
        self.watchdog = Watchdog(self.deadline, self._deadline_passed, lambda: f"in phase {ctx.phase!r}")
        self.watchdog.start()
        try:
            ctx.set_phase("init_process_group")
            ctx.memory = MemoryMeter(device)
            ctx.store = init_world(backend, self.env, device, ctx.timeout)
            self.report_store = connect_store(self.env, datetime.timedelta(seconds=30), host=False)
            self._share_epoch()
            ctx.emit(
                "gate_start",
                gate=self.spec.name,
                backend=backend,
                world_size=self.env.world_size,
                cycles=self.args.cycles,
                device=str(device),
            )
            ctx.sample_memory("start")
            ctx.hook("start")
            self.spec.run(ctx)
        except Exception as exc:  # the body failed: record it, tell the others, still report
            ctx.fail(f"rank {self.env.rank} {type(exc).__name__} in phase {ctx.phase!r}: {exc}")
            # printed before the abort is posted: the peers print their own lines as soon as
            # they see it, and this rank's headline and traceback must not be cut by them
            self._print_failure(exc, ctx.failures[-1])
            self._post_abort(ctx.failures[-1])
            self.body_raised = True
        return self.finish(None)

    def _deadline_passed(self, reason: str) -> None:
        """The watchdog's exit: print where each of this rank's threads is first (the phase
        names the step; the stacks name the call that never returned), then finish."""
        try:
            write_at_once(sys.stderr, f"rank {self.env.rank} {reason}; its threads:\n{thread_stacks()}")
        except Exception:  # never in the way of the report
            pass
        self.finish(reason)

    def _print_failure(self, exc: Exception, message: str) -> None:
        """One headline per failing rank, and one traceback at most: a rank that only gave
        up because a peer failed first (``GateAbort``, a connection the dead peer closed)
        prints its line, not a traceback."""
        text = f"rank {self.env.rank} FAILED: {message}\n"
        if not isinstance(exc, GateAbort) and not any(m in str(exc) for m in SECONDARY_MARKERS):
            text += "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            write_at_once(sys.stderr, text)
        except (OSError, ValueError):  # stderr gone (closed, broken pipe): the report still gets written
            pass

    # -- finishing -----------------------------------------------------------------------
    def _share_epoch(self) -> None:
        key = KEY_PREFIX + "epoch"
        if self.env.rank == 0:
            self.report_store.set(key, repr(self.ctx.events.epoch).encode())
        else:
            self.ctx.events.epoch = float(self.report_store.get(key).decode())

    def _post_abort(self, message: str) -> None:
        try:
            if self.report_store is not None:
                self.report_store.set(KEY_PREFIX + "abort", message.encode())
        except Exception:
            pass

    def finish(self, emergency: Optional[str]) -> int:
        """Post this rank's result, let rank 0 merge and write, then exit the process (a
        passing rank run as a function returns instead, see :func:`_ends_by_returning`)."""
        self._enter_finish(emergency)
        ctx = self.ctx
        removed = ipc.remove_own_files()  # every exit path: a cut-short sync leaves no tmpfs file
        if removed:
            ctx.data["tmpfs_removed_at_exit"] = removed
        if emergency:
            ctx.fail(f"rank {self.env.rank} {emergency}")
            ctx.emit("gate_abort", reason=emergency)
            for salvage in ctx.salvage:
                try:
                    salvage()
                except Exception as exc:  # a salvage must never stop the report
                    ctx.data.setdefault("salvage_errors", []).append(f"{type(exc).__name__}: {exc}")
            self._post_abort(f"rank {self.env.rank} {emergency}")
        elif self.env.rank != 0:
            self.watchdog.stop()  # the bounded waits below take over
        ctx.emit("gate_end", status=ctx.status)
        result = ctx.rank_result()
        result["events"] = ctx.events.records
        self._post(f"result/{self.env.rank}", result)
        code = rep.exit_code_for(ctx.status)
        if self.env.rank == 0:
            if emergency:
                window = 1.5
            elif self.body_raised:
                # Peers may be stuck in a collective with a failed rank; they post once a
                # crashed rank's exit (grace + 3 s after its failure) makes torchrun SIGTERM
                # the job. Wait that long, not until the deadline.
                window = min(self.grace + 6.0, max(0.5, self.deadline - time.monotonic() - 1.0))
            else:
                window = max(0.5, self.deadline - time.monotonic() - 1.0)
            results = self._collect(result, time.monotonic() + window)
            report = self._build_report(results)
            written = self._write(self.args.report, report)
            print(rep.summary_text(report), flush=True)
            self._post("done", {"status": report["status"]})
            code = rep.exit_code_for(report["status"])
            if not written and code in (ExitCode.OK, ExitCode.SKIPPED):
                code = ExitCode.FINDING  # a verdict nobody can read is not a pass
        else:
            if ctx.status == rep.FAILED:
                self._write(
                    self.args.report and rep.rank_report_path(self.args.report, self.env.rank),
                    self._build_report([result]),
                )
            # After a crash, leave soon: peers stuck in a collective with this rank are freed
            # when it exits (torchrun then tears the job down and rank 0 reports). After a
            # normal finish, wait for rank 0's merged report so its write is never cut short.
            abrupt = emergency or self.body_raised
            wait = self.grace + 3.0 if abrupt else self.args.timeout_s + self.grace + 5.0
            self._wait_done(time.monotonic() + wait)
        if not emergency and ctx.status != rep.FAILED:
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        for folder in self.folders:  # the last rank out removes the run's folders (a killed rank's files too)
            folder.leave()
        sys.stdout.flush()
        sys.stderr.flush()
        if code == ExitCode.OK and _ends_by_returning():
            self.watchdog.stop()
            self.ended = code
            return code
        os._exit(code)

    def _enter_finish(self, emergency: Optional[str]) -> None:
        """Let one finisher through. An emergency one (watchdog, SIGTERM) that finds another
        under way waits for it up to 10 s, then ends the process: with the code the other
        finisher ended this rank with, once it has (a rank that returned to torch's agent,
        see :func:`_ends_by_returning`, may still be signalled), else failed (the other
        finisher is stuck; never hang)."""
        if not emergency:
            self._finish_lock.acquire()
            return
        give_up = time.monotonic() + 10.0
        while not self._finish_lock.acquire(timeout=0.05):
            if self.ended is not None:
                os._exit(self.ended)
            if time.monotonic() >= give_up:
                os._exit(ExitCode.FINDING)

    def _post(self, name: str, payload: Dict[str, Any]) -> None:
        try:
            self.report_store.set(KEY_PREFIX + name, json.dumps(payload, default=str).encode())
        except Exception as exc:
            print(f"rank {self.env.rank}: could not post {name}: {exc}", file=sys.stderr, flush=True)

    def _collect(self, own: Dict[str, Any], until: float) -> List[Optional[Dict[str, Any]]]:
        """Rank 0: its own result plus whatever the other ranks post before ``until``."""
        results: List[Optional[Dict[str, Any]]] = [None] * self.env.world_size
        results[self.env.rank] = json.loads(json.dumps(own, default=str))
        while self.report_store is not None:
            for r in range(self.env.world_size):
                key = f"{KEY_PREFIX}result/{r}"
                try:
                    if results[r] is None and self.report_store.check([key]):
                        results[r] = json.loads(self.report_store.get(key).decode())
                except Exception:
                    return results
            if all(results) or time.monotonic() >= until:
                break
            time.sleep(0.02)
        return results

    def _wait_done(self, until: float) -> None:
        wait_for_keys(self.report_store, [KEY_PREFIX + "done"], until)

    def _build_report(self, results: List[Optional[Dict[str, Any]]]) -> Dict[str, Any]:
        present = [r for r in results if r is not None]
        missing = [i for i, r in enumerate(results) if r is None] if len(results) == self.env.world_size else []
        failures = [f"rank {r['rank']}: {f}" for r in present for f in r["failures"]]
        failures += [f"rank {m} never reported (hung, died, or blocked on a failed peer)" for m in missing]
        records = merge_events([r.pop("events", []) for r in present])
        try:
            summary, extra = self.spec.summarize(self.args, present)
        except Exception as exc:
            summary, extra = {}, [f"summary failed: {type(exc).__name__}: {exc}"]
        failures += extra
        skipped = present and all(r["status"] == rep.SKIPPED for r in present)
        status = rep.FAILED if failures else (rep.SKIPPED if skipped else rep.PASSED)
        report = self._base_report(status)
        report.update(
            summary=summary,
            ranks=present,
            missing_ranks=missing,
            failures=failures,
            message=primary_failure(failures)
            if failures
            else (present[0].get("skip_reason") if skipped else "all checks passed"),
            events_recorded=len(records),
        )
        if self.env.rank == 0 and self.event_log and len(results) == self.env.world_size:
            per_node = max(1, self.env.local_world_size)
            cluster = {"nodes": max(1, self.env.world_size // per_node), "gpus_per_node": per_node}
            meta = {"backend": self.backend, "world_size": self.env.world_size, "status": status}
            error = write_event_log(self.event_log, self.spec.name, records, cluster=cluster, meta=meta)
            report["event_log"] = None if error else self.event_log
            if error:
                report["event_log_error"] = error
        return report

    def _base_report(self, status: str) -> Dict[str, Any]:
        try:
            from importlib.metadata import version

            megatron = version("megatron-core")
        except Exception:
            megatron = None
        return {
            "gate": self.spec.name,
            "status": status,
            "exit_code": rep.exit_code_for(status),
            "backend": self.backend,
            "world_size": self.env.world_size,
            "cycles": self.args.cycles,
            "timeout_s": self.args.timeout_s,
            "hooks": self.hooks.describe(),
            "torch_version": torch.__version__,
            "megatron_core_version": megatron,
            "cuda_available": torch.cuda.is_available(),
            "started_at": self.started,
            "elapsed_s": round(time.time() - self.started, 3),
            "config": {k: v for k, v in vars(self.args).items()},
            "reporting_rank": self.env.rank,
        }

    def _write(self, path: Optional[str], report: Dict[str, Any]) -> bool:
        """Write a report; False (with one clear line on stderr) when it could not be written."""
        if not path:
            return True
        try:
            if self.hooks.get("fail_report_write") is not None:
                raise OSError("test hook fail_report_write")
            rep.atomic_write_json(path, report)
            return True
        except Exception as exc:
            print(
                f"error: rank {self.env.rank} could not write the report {path}: {type(exc).__name__}: {exc}",
                file=sys.stderr,
                flush=True,
            )
            return False

    def _skip(self, backend: str, reason: str) -> int:
        """Every rank skips (the node cannot host the world); rank 0 writes the report, and
        the others wait for it (:mod:`gpu_gates.runtime.rank0_first`: a peer's early skip exit would
        make torchrun kill rank 0 before its write)."""
        code = [ExitCode.SKIPPED]

        def report() -> None:
            self.backend = backend
            body = self._base_report(rep.SKIPPED)
            body.update(message=f"skipped: {reason}", skip_reason=reason, ranks=[], failures=[], summary={})
            written = self._write(self.args.report, body)
            print(f"gate {self.spec.name}: SKIPPED: {reason}", flush=True)
            if not written:
                code[0] = ExitCode.FINDING

        rank0_speaks_first(self.env, self.deadline, report, self.hooks.seconds("late_skip_report", 1.0))
        return code[0]


def _ends_by_returning() -> bool:
    """Whether a passing rank must return instead of ``os._exit(0)``.

    torchrun starts each rank as a program, and a rank ends with ``os._exit(code)``: the
    exit code is the verdict, and no stuck backend thread can hold the process open. A
    rank that torch's elastic agent runs as a Python *function* in a multiprocessing child
    (``torchrun --run-path``, ``tests/gates/launch_forked.py``) is counted as done only when
    that function returns; a child that ends by ``os._exit(0)`` leaves the agent polling
    forever. So there, and only for a pass on the main thread, the rank returns 0; a
    failure still ends with its non-zero ``os._exit`` code, which the agent sees either way.
    """
    return multiprocessing.parent_process() is not None and threading.current_thread() is threading.main_thread()


def _report_path_problem(path: Optional[str]) -> Optional[str]:
    """Why a report (or event log) could not be written to ``path``, checked before any
    rank starts work: a run whose verdict cannot be saved is refused up front."""
    if not path:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{path}: is a directory, not a report file"
    if not os.path.isdir(folder):
        return f"{path}: folder {folder} does not exist"
    if not os.access(folder, os.W_OK):
        return f"{path}: folder {folder} is not writable"
    return None


def run_gate(spec: GateSpec, argv: Optional[List[str]] = None) -> int:
    """Parse flags, then run this rank; returns only for usage errors, skips and (a rank run
    as a function, see :func:`_ends_by_returning`) a pass."""
    env = LaunchEnv.from_environ()
    parser = build_parser(spec)
    try:
        args = parser.parse_args(argv)
        problem = _report_path_problem(args.report) or _report_path_problem(args.event_log)
        if problem:
            parser.error(problem)  # usage error: printed once (rank 0), exit code 2 on every rank
        hooks = TestHooks.from_env(env.rank, env.world_size)
    except _UsageError as exc:
        return _usage_error(env, str(exc))
    except HookSpecError as exc:
        return _usage_error(env, f"error: {exc}\n")
    return _GateRun(spec, args, env, hooks).execute()


#: how long the other ranks wait for rank 0's usage message (no --timeout-s was parsed)
USAGE_WAIT_S = 30.0


def _usage_error(env: LaunchEnv, message: str) -> int:
    """Rank 0 prints the message in one write; every rank exits 2 once it has."""
    try:
        late = TestHooks.from_env(env.rank, env.world_size).seconds("late_usage_error", 1.0)
    except HookSpecError:  # the hook variable is the usage error itself
        late = 0.0
    rank0_speaks_first(env, time.monotonic() + USAGE_WAIT_S, lambda: write_at_once(sys.stderr, message), late)
    return ExitCode.BAD_INPUT
