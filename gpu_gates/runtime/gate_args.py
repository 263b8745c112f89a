"""A gate's command line: the :class:`GateSpec` a gate module defines, the flags every gate
shares, and the usage error that every rank exits with but only rank 0 prints.

torchrun starts every rank with the same flags, so a bad flag is found by every rank at
once; argparse would print its usage once per rank. Here the parser raises instead, and
:func:`usage_error` lets rank 0 print the message in one write while the others wait for
it, then every rank exits with the usage code.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from gpu_gates.runtime.dist_setup import LaunchEnv
from gpu_gates.runtime.failures import write_at_once
from gpu_gates.runtime.hooks import HookSpecError, TestHooks
from gpu_gates.runtime.rank0_first import rank0_speaks_first
from harness.exit_codes import ExitCode

if TYPE_CHECKING:
    from gpu_gates.runtime.context import GateContext


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
        raise GateUsageError(f"{self.format_usage()}{self.prog}: error: {message}\n")


class GateUsageError(Exception):
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


def report_path_problem(path: Optional[str]) -> Optional[str]:
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


#: how long the other ranks wait for rank 0's usage message (no --timeout-s was parsed)
USAGE_WAIT_S = 30.0


def usage_error(env: LaunchEnv, message: str) -> int:
    """Rank 0 prints the message in one write; every rank exits 2 once it has."""
    try:
        late = TestHooks.from_env(env.rank, env.world_size).seconds("late_usage_error", 1.0)
    except HookSpecError:  # the hook variable is the usage error itself
        late = 0.0
    rank0_speaks_first(env, time.monotonic() + USAGE_WAIT_S, lambda: write_at_once(sys.stderr, message), late)
    return ExitCode.BAD_INPUT
