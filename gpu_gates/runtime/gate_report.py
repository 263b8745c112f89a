"""How one gate run's ranks become one report.

Results move through the TCP store, not collectives, so rank 0 can still merge what every
live rank knew when some rank is broken: each rank posts its result, rank 0 collects what
arrives before its window closes, names the ranks that never reported, asks the gate to
summarize, writes the merged report atomically and the merged event log. A skip (the node
cannot host the world) is reported by rank 0 alone while the others wait for its write.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from gpu_gates.runtime import report as rep
from gpu_gates.runtime.context import KEY_PREFIX
from gpu_gates.runtime.dist_setup import LaunchEnv
from gpu_gates.runtime.events import merge_events, write_event_log
from gpu_gates.runtime.failures import primary_failure
from gpu_gates.runtime.gate_args import GateSpec
from gpu_gates.runtime.hooks import TestHooks
from gpu_gates.runtime.rank0_first import rank0_speaks_first, wait_for_keys
from harness.exit_codes import ExitCode


class GateReporting:
    """The reporting half of one rank's run (:class:`gpu_gates.runtime.gate._GateRun`)."""

    spec: GateSpec
    args: argparse.Namespace
    env: LaunchEnv
    hooks: TestHooks
    started: float
    deadline: float
    backend: Optional[str]
    report_store: Optional[dist.Store]
    event_log: Optional[str]

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
