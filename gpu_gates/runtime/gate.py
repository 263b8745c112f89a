"""Shared gate runtime: CLI, process-group setup, checks, watchdog and the report.

A gate module defines a :class:`GateSpec` (its own flags, a world-size check, a ``run``
body and a rank-0 ``summarize``) and calls :func:`run_gate`. Everything that makes a gate
safe to run unattended lives here (one rank's run, from setup to its one finish) and in
the modules beside it (``gate_args.py`` the command line, ``gate_report.py`` the merged
report, ``failures.py`` the headline), once:

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
import gc
import multiprocessing
import os
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional

import torch.distributed as dist

from gpu_gates.runtime import report as rep
from gpu_gates.runtime.context import KEY_PREFIX, GateAbort, GateContext
from gpu_gates.runtime.dist_setup import (
    LaunchEnv,
    connect_store,
    device_for,
    device_skip_reason,
    init_world,
    select_backend,
)
from gpu_gates.runtime.failures import AFTER_FAILURE_MARKER, SECONDARY_MARKERS, primary_failure, write_at_once
from gpu_gates.runtime.gate_args import (
    GateSpec,
    GateUsageError,
    build_parser,
    positive_float,
    positive_int,
    report_path_problem,
    usage_error,
)
from gpu_gates.runtime.gate_report import GateReporting
from gpu_gates.runtime.hooks import HookSpecError, TestHooks
from gpu_gates.runtime.memory import MemoryMeter
from gpu_gates.runtime.watchdog import Watchdog, start_sigterm_listener, thread_stacks
from gpu_gates.sync import ipc
from gpu_gates.transports import private_dirs
from harness.exit_codes import ExitCode

# the names gates and tests import from here, wherever they are defined
__all__ = [
    "AFTER_FAILURE_MARKER",
    "GateAbort",
    "GateContext",
    "GateSpec",
    "build_parser",
    "positive_float",
    "positive_int",
    "primary_failure",
    "run_gate",
    "write_at_once",
]


class _GateRun(GateReporting):
    """One rank's whole life: setup, body, and exactly one finish (normal or emergency);
    the report is :class:`gpu_gates.runtime.gate_report.GateReporting`'s."""

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
            self._record_emergency(emergency)
        elif self.env.rank != 0:
            self.watchdog.stop()  # the bounded waits below take over
        ctx.emit("gate_end", status=ctx.status)
        result = ctx.rank_result()
        result["events"] = ctx.events.records
        self._post(f"result/{self.env.rank}", result)
        code = rep.exit_code_for(ctx.status)
        if self.env.rank == 0:
            code = self._merge_and_report(result, emergency)
        else:
            self._leave_after_rank0(result, emergency)
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

    def _record_emergency(self, emergency: str) -> None:
        """A watchdog or SIGTERM finish: the failure, the abort record, the gate's salvage
        callbacks (what it can still save), and the abort posted for the peers."""
        ctx = self.ctx
        ctx.fail(f"rank {self.env.rank} {emergency}")
        ctx.emit("gate_abort", reason=emergency)
        for salvage in ctx.salvage:
            try:
                salvage()
            except Exception as exc:  # a salvage must never stop the report
                ctx.data.setdefault("salvage_errors", []).append(f"{type(exc).__name__}: {exc}")
        self._post_abort(f"rank {self.env.rank} {emergency}")

    def _merge_and_report(self, result: Dict[str, Any], emergency: Optional[str]) -> int:
        """Rank 0: collect the ranks' results within a window that fits how the run ended,
        write the merged report, print its summary and tell the others it is done."""
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
        return code

    def _leave_after_rank0(self, result: Dict[str, Any], emergency: Optional[str]) -> None:
        """Another rank: its own report when it failed, then wait for rank 0's."""
        if self.ctx.status == rep.FAILED:
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


def run_gate(spec: GateSpec, argv: Optional[List[str]] = None) -> int:
    """Parse flags, then run this rank; returns only for usage errors, skips and (a rank run
    as a function, see :func:`_ends_by_returning`) a pass."""
    _freeze_imported_objects()
    env = LaunchEnv.from_environ()
    parser = build_parser(spec)
    try:
        args = parser.parse_args(argv)
        problem = report_path_problem(args.report) or report_path_problem(args.event_log)
        if problem:
            parser.error(problem)  # usage error: printed once (rank 0), exit code 2 on every rank
        hooks = TestHooks.from_env(env.rank, env.world_size)
    except GateUsageError as exc:
        return usage_error(env, str(exc))
    except HookSpecError as exc:
        return usage_error(env, f"error: {exc}\n")
    return _GateRun(spec, args, env, hooks).execute()


def _freeze_imported_objects() -> None:
    """Exempt everything that exists before the rank's run (the imported modules: about
    170 k objects with torch, 400 k with megatron-core too) from the cyclic garbage
    collector. The teardown checks call ``gc.collect()`` so that a reference cycle is not
    taken for a leaked group; each call walked every imported object (0.1-0.2 CPU s), and
    the teardown gate makes two per cycle on every rank. What the run creates (its groups, tensors and
    their cycles) is collected as before: only objects older than the run are exempt, and
    none of them is garbage the gate looks for."""
    gc.freeze()
