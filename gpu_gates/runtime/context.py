"""What a gate body sees: rank identity, device, checks, events, memory and store helpers.

Checks never raise: a failed check is recorded with its detail and the gate goes on, so
one run reports every problem it can see. Waiting on another rank goes through the TCP
store with an abort key and the rank's deadline, so a rank never waits on a peer that has
already failed.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from gpu_gates.runtime import report as rep
from gpu_gates.runtime.dist_setup import LaunchEnv
from gpu_gates.runtime.events import EventRecorder
from gpu_gates.runtime.hooks import TestHooks
from gpu_gates.runtime.memory import MemoryMeter

if TYPE_CHECKING:
    from gpu_gates.runtime.gate_args import GateSpec

KEY_PREFIX = "rlharness_gate/"


class GateAbort(RuntimeError):
    """Another rank reported a failure while this rank was waiting on it."""


class GateContext:
    """What a gate body sees: identity, device, checks, events, memory, store helpers."""

    def __init__(
        self,
        spec: "GateSpec",
        args: argparse.Namespace,
        env: LaunchEnv,
        backend: str,
        device: torch.device,
        hooks: TestHooks,
        deadline: float,
    ) -> None:
        self.spec, self.args, self.env = spec, args, env
        self.rank, self.world_size, self.local_rank = env.rank, env.world_size, env.local_rank
        self.backend, self.device, self.hooks = backend, device, hooks
        self.deadline = deadline
        # Collectives time out well after the watchdog, so a hang is reported by the
        # watchdog with every rank's phase instead of as a knock-on gloo/NCCL error.
        self.timeout = datetime.timedelta(seconds=2 * args.timeout_s + 15)
        self.events = EventRecorder(env.rank)
        self.memory: Optional[MemoryMeter] = None
        self.store: Optional[dist.Store] = None
        self.phase = "starting"
        self.checks: List[Dict[str, Any]] = []
        self.failures: List[str] = []
        self.data: Dict[str, Any] = {}
        self.memory_samples: List[Dict[str, Any]] = []
        self.skip_reason: Optional[str] = None
        # Called (each guarded) when this rank is finished by its watchdog or SIGTERM while
        # the body is still running: a gate saves what it has so far (partial logs, what
        # each of its threads was doing) so a timeout report says where things stood.
        self.salvage: List[Callable[[], None]] = []

    # -- progress and verdicts -------------------------------------------------------
    def set_phase(self, phase: str) -> None:
        self.phase = phase

    def hook(self, point: str) -> None:
        """A named point where a test hook may hang or raise this rank."""
        hook = self.hooks.matching_point(point)
        if hook is not None:
            self.set_phase(f"{self.phase} [test hook {hook.name}@{point}]")
            self.emit("hook_fired", hook=f"{hook.name}@{point}")
            TestHooks.act(hook)

    def check(self, name: str, passed: bool, detail: str = "", **extra: Any) -> bool:
        entry = {"name": name, "passed": bool(passed), "detail": detail, "phase": self.phase}
        entry.update(extra)
        self.checks.append(entry)
        if not passed:
            self.failures.append(f"{name}: {detail}" if detail else name)
        return bool(passed)

    def fail(self, message: str) -> None:
        self.failures.append(message)

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.emit(kind, **fields)

    def sample_memory(self, label: str) -> Dict[str, Any]:
        assert self.memory is not None
        sample = self.memory.sample(label)
        self.memory_samples.append(sample)
        self.emit(
            "memory_sample",
            label=label,
            used=sample.get("used"),
            delta_used=sample.get("delta_used"),
            informational=sample["informational"],
        )
        return sample

    @property
    def status(self) -> str:
        if self.failures:
            return rep.FAILED
        return rep.SKIPPED if self.skip_reason else rep.PASSED

    def remaining_s(self) -> float:
        return self.deadline - time.monotonic()

    # -- store helpers (control traffic that must not depend on collectives) ----------
    def key(self, name: str) -> str:
        return f"{KEY_PREFIX}ctl/{name}"

    def put(self, name: str, value: bytes, store: Optional[dist.Store] = None) -> None:
        (store or self.store).set(self.key(name), value)

    def wait_get(self, name: str, what: str, store: Optional[dist.Store] = None) -> bytes:
        """Poll for a key until it appears, another rank aborts, or the deadline nears.

        ``store`` is another client connection to the same store. One client serializes
        its operations: while one thread of a process blocks in a store wait on it (a
        gloo rendezvous does), every other thread's set/get on that client waits too. A
        thread that must keep talking meanwhile (gate 4's driver) uses its own client.
        """
        store = store or self.store
        key = self.key(name)
        while True:
            if store.check([key]):
                return store.get(key)
            if store.check([KEY_PREFIX + "abort"]):
                raise GateAbort(f"gave up waiting for {what}: {store.get(KEY_PREFIX + 'abort').decode()}")
            if self.remaining_s() < 1.0:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.005)

    def rank_result(self) -> Dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "status": self.status,
            "phase": self.phase,
            "checks": self.checks,
            "failures": self.failures,
            "data": self.data,
            "memory": self.memory_samples,
            "skip_reason": self.skip_reason,
        }
