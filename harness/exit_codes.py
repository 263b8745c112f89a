"""The exit codes of every program of the project: the ``rlharness`` commands, every GPU
gate (``torchrun gpu_gates/NAME.py`` and ``rlharness gate NAME``) and the tools beside them.

One table, so that a script reading an exit code never has to know which program it ran:
each outcome has its own code and no code means two things. docs/cli.md#exit-codes is the
table for users (a test reads it back and compares it with this one).

Why these numbers: 0, 1 and 2 are what a Unix tool means by success, "the answer is no"
(as ``grep`` or ``diff`` use it) and a usage error; 77 is the code the GNU and Meson test
harnesses read as "skipped"; 128 + N is a process ended by signal N (130 = SIGINT, the
shell's reading of Ctrl-C; 141 = SIGPIPE). Under torchrun any non-zero exit of a rank ends
the job, a skip included: the gates' verdict is in their report, and ``rlharness gate``
turns it back into one of these codes.
"""

from __future__ import annotations

from enum import IntEnum, unique


@unique
class ExitCode(IntEnum):
    """An outcome and its exit code."""

    OK = 0
    """Done, and nothing was found: every invariant held, a replay matched, a gate passed."""

    FINDING = 1
    """A finding: the simulated system failed (OOM, fail-fast), an invariant broke, a
    determinism check found a difference, a gate's check failed. A finding that a
    scenario's ``expect:`` list or ``--baseline`` covers does not count."""

    BAD_INPUT = 2
    """Bad input (arguments, files, records, scenarios, output paths, a gate's options):
    one line ``error: <where>: <what>`` on stderr, nothing written, no work started."""

    DIVERGED = 3
    """``replay --expect``: the model decided differently from the recorded log, whatever
    the invariants say (a finding from a replay whose decisions matched is ``FINDING``)."""

    SKIPPED = 77
    """A gate did not run: the node cannot host it (no NCCL, no CUDA, no vLLM); the
    reason is in its report. Not a pass and not a failure."""

    INTERRUPTED = 130
    """Interrupted (Ctrl-C)."""

    BROKEN_PIPE = 141
    """The reader of the output went away (``rlharness replay X | head``): a quiet exit."""
