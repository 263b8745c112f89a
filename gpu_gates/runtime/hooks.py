"""Test-only fault hooks, read from ``RLHARNESS_GATE_TEST_HOOK``.

A gate test must see each gate fail for the right reason, so the tests break the gates
on purpose through this one environment variable (never through a CLI flag, so nobody
passes one by accident on a real node). The value is a comma-separated list of specs:

``hang@POINT[:RANK]``   the rank (default: the last one) sleeps forever at POINT
``raise@POINT[:RANK]``  the rank raises ``RuntimeError`` at POINT
``kill@POINT[:RANK]``   the rank sends itself SIGKILL at POINT (no handler runs: what it
                        created must be removed by a process that survives it)
``corrupt_byte[:N]``    selective_sync: the owner flips one byte of bucket N (default 1)
``leak_group[:DESC]``   nccl_teardown: teardown skips the group (default the DP group)
``leak_sync_group``     selective_sync, dual_pipeline: the dynamic sync group is not destroyed
                        (dual_pipeline: a stray reference keeps it alive through its close)
``swap_resize_order``   dual_pipeline: a cycle runs its expands before its shrinks
``solo_pipelines``      dual_pipeline: no workload script (gpu_gates/dual/script.py), ppl2
                        starts after ppl1 is done, so no cycle moves a GPU between them
                        (the gate must fail)
``abort_never_wakes``   dual_pipeline: an aborted request never ends (RLix's Bug 7), so the
                        shrink's drain runs into its timeout (the gate must fail)
``fail_report_write``   any gate: writing the report fails (the exit code must say so)
``late_skip_report[:S]`` any gate: on a skip, rank 0 writes its report S seconds (default 1)
                        after the others have decided to skip — the order a loaded machine
                        produces now and then, made certain
``late_usage_error[:S]`` any gate: on a usage error, rank 0 prints it S seconds (default 1)
                        late (the same race, for the usage message)
``world_sync_group``    selective_sync: the sync group is the whole world, not a subset
``late_receivers[:S]``  dual_pipeline: the driver posts a sync's receive commands S seconds
                        (default 1) after the owner's send command — the ordering that a
                        loaded machine produces now and then, made certain
``late_start[:S]``      dual_pipeline: ppl2's pipeline starts S seconds (default 0.2) after
                        ppl1's, so its INITIALIZATION takes its training GPU from a ppl1 that
                        already holds both — the start order a loaded machine produces now
                        and then, made certain
``leader_gate_off``     dataplane_writeback: every TP sibling writes back, not only the
                        replica leader (the -601 duplicate-writer bug)
``wrong_normalizer``    train_pump_parity: the trainer rescales by the other count (tokens
                        for a sequence loss and back)
``wrong_loss``          train_pump_parity: the trainer's loss sum ignores the mask (padding
                        positions count); the counts stay right
``chunk_grads_lost``    train_pump_parity (with ``--chunks`` > 1): the log-prob pass between chunks
                        zeroes the gradient storage, losing every chunk but the last (NeMo RL #3660)
``residue_grows``       cycle_trends: the engine's sleep keeps its KV cache (NeMo RL #2619)
``ipc_staging_leak``    cycle_trends: the refit producer keeps every released staging pair (vLLM #51258)
``leak_cycle_group``    cycle_trends: the cycle's process group is never destroyed
``refit_slows``         cycle_trends: each refit's first load waits 20 ms x the cycle number
``drop_kv_scales``      cycle_trends: the trainer exports parameters and buffers only, not the
                        engine's FP8 KV-cache scales (NeMo RL #3226)
``resume_kv_asleep``    cycle_trends: cycle 1 skips the KV-cache wake and the engine, unguarded, resumes
                        and serves with it asleep (verl-omni #380)

POINT is a name a gate passes to :meth:`GateContext.hook`, e.g. ``cycle_begin``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import List, Optional

ENV_VAR = "RLHARNESS_GATE_TEST_HOOK"

POINT_HOOKS = ("hang", "raise", "kill")
PLAIN_HOOKS = (
    "corrupt_byte",
    "leak_group",
    "leak_sync_group",
    "swap_resize_order",
    "late_receivers",
    "late_start",
    "leader_gate_off",
    "fail_report_write",
    "late_skip_report",
    "late_usage_error",
    "world_sync_group",
    "solo_pipelines",
    "wrong_normalizer",
    "wrong_loss",
    "chunk_grads_lost",
    "abort_never_wakes",
    "residue_grows",
    "ipc_staging_leak",
    "leak_cycle_group",
    "refit_slows",
    "drop_kv_scales",
    "resume_kv_asleep",
)

#: plain hooks whose argument is a delay in seconds (checked positive when parsed)
DELAY_HOOKS = ("late_receivers", "late_start", "late_skip_report", "late_usage_error")


class HookSpecError(ValueError):
    """The hook variable could not be parsed (a usage error, exit code 2)."""


@dataclass(frozen=True)
class Hook:
    name: str
    point: Optional[str] = None
    rank: Optional[int] = None
    arg: Optional[str] = None


def parse_hooks(text: Optional[str]) -> List[Hook]:
    hooks: List[Hook] = []
    for raw in (text or "").split(","):
        spec = raw.strip()
        if not spec:
            continue
        if "@" in spec:
            name, _, rest = spec.partition("@")
            if name not in POINT_HOOKS:
                raise HookSpecError(
                    f"{ENV_VAR}: unknown hook {name!r} in {spec!r} (point hooks: {', '.join(POINT_HOOKS)})"
                )
            point, _, rank_text = rest.partition(":")
            if not point:
                raise HookSpecError(f"{ENV_VAR}: hook {spec!r} names no point")
            rank = None
            if rank_text:
                if not rank_text.isdigit():
                    raise HookSpecError(f"{ENV_VAR}: rank in {spec!r} must be a non-negative integer")
                rank = int(rank_text)
            hooks.append(Hook(name=name, point=point, rank=rank))
        else:
            name, _, arg = spec.partition(":")
            if name not in PLAIN_HOOKS:
                raise HookSpecError(f"{ENV_VAR}: unknown hook {name!r} (known: {', '.join(POINT_HOOKS + PLAIN_HOOKS)})")
            if name in DELAY_HOOKS and arg:
                try:
                    ok = float(arg) > 0
                except ValueError:
                    ok = False
                if not ok:
                    raise HookSpecError(f"{ENV_VAR}: {name} takes a positive number of seconds, got {arg!r}")
            hooks.append(Hook(name=name, arg=arg or None))
    return hooks


class TestHooks:
    """The parsed hooks of this process, with the two actions point hooks can take."""

    __test__ = False  # not a pytest class

    def __init__(self, hooks: List[Hook], rank: int, world_size: int) -> None:
        self.hooks = hooks
        self.rank = rank
        self.world_size = world_size

    @classmethod
    def from_env(cls, rank: int, world_size: int) -> "TestHooks":
        return cls(parse_hooks(os.environ.get(ENV_VAR)), rank, world_size)

    def get(self, name: str) -> Optional[Hook]:
        for hook in self.hooks:
            if hook.name == name:
                return hook
        return None

    def seconds(self, name: str, default: float) -> float:
        """A delay hook's seconds (``default`` when given without any), 0 when it is unset."""
        hook = self.get(name)
        if hook is None:
            return 0.0
        return float(hook.arg) if hook.arg else default

    def describe(self) -> List[str]:
        return [
            h.name
            + (f"@{h.point}" if h.point else "")
            + (f":{h.rank}" if h.rank is not None else "")
            + (f":{h.arg}" if h.arg else "")
            for h in self.hooks
        ]

    def matching_point(self, point: str) -> Optional[Hook]:
        for hook in self.hooks:
            if hook.point == point:
                target = self.world_size - 1 if hook.rank is None else hook.rank
                if target == self.rank:
                    return hook
        return None

    @staticmethod
    def act(hook: Hook) -> None:
        if hook.name == "raise":
            raise RuntimeError(f"test hook raise@{hook.point} fired")
        if hook.name == "kill":
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # hang: only the watchdog (or a signal) ends this
            time.sleep(0.5)
