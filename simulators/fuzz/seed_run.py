"""One seed of a sweep: generate, simulate, check, name the finding.

:func:`run_seed` is the unit of work every executor runs (a local worker process or a
Ray task). Its result is a plain dict that depends on the seed alone — no wall times, no
host names, no process ids — so a sweep's results are byte-identical whichever executor
ran it and in whatever order the seeds completed.

    python -m simulators.fuzz.seed_run SEED OUT.jsonl   (the determinism check's fresh process)
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, Optional

from harness.invariants import check_log
from simulators.determinism import first_divergence, other_hash_seed
from simulators.fuzz.generate import scenario_for_seed
from simulators.fuzz.signature import CLEAN, signature
from simulators.runtime import Simulation
from simulators.spec import Scenario

# Violations kept per result (the rest are counted): enough to read, small enough for
# a results file of thousands of seeds.
_KEPT_VIOLATIONS = 5


def scenario_size(s: Scenario) -> tuple:
    """Smaller is a simpler reproducer: GPUs, pipelines, faults, steps, trajectories."""
    return (s.cluster.num_gpus, len(s.pipelines), len(s.faults), sum(p.steps for p in s.pipelines),
            sum(p.workload.trajectories_per_step for p in s.pipelines))


def run_scenario(scenario: Scenario, lines: Optional[list] = None) -> Dict[str, Any]:
    """Simulate one scenario and describe what it found (the seed-independent part); the
    log's lines are appended to ``lines`` when one is given."""
    result = Simulation(scenario).run()
    records = result.records
    violations = check_log(records)
    types = {p.name: p.type for p in scenario.pipelines}
    sig = signature(records, violations, types)
    digest = hashlib.sha256()
    for line in result.log.lines():
        if lines is not None:
            lines.append(line)
        digest.update(line.encode("utf-8"))
        digest.update(b"\n")
    return {
        "status": "clean" if sig == CLEAN else "finding",
        "signature": sig,
        "reason": result.reason,
        "detail": result.detail,
        "sim_time": round(result.sim_time, 6),
        "records": len(records),
        "violations": len(violations),
        "first_violations": [str(v) for v in violations[:_KEPT_VIOLATIONS]],
        "log_sha256": digest.hexdigest(),
    }


def _describe(s: Scenario) -> Dict[str, Any]:
    return {
        "gpus": s.cluster.num_gpus,
        "pipelines": [p.type for p in s.pipelines],
        "faults": [f.name for f in s.faults],
        "size": list(scenario_size(s)),
    }


def fresh_log(seed: int, hash_seed: str, path: str, timeout_s: Optional[float]) -> None:
    """Run ``seed`` in a fresh interpreter under ``hash_seed``, its log written to ``path``."""
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    cmd = [sys.executable, "-m", "simulators.fuzz.seed_run", str(seed), path]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise RuntimeError(f"the fresh run failed: {last}")


def _determinism(seed: int, lines, timeout_s: Optional[float]) -> Dict[str, Any]:
    hash_seed = other_hash_seed(os.environ.get("PYTHONHASHSEED"))
    with tempfile.TemporaryDirectory(prefix="rlharness-fuzz-") as tmp:
        path = os.path.join(tmp, "events.jsonl")
        try:
            fresh_log(seed, hash_seed, path, timeout_s)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            return {"status": "not_checked", "why": str(e).splitlines()[-1]}
        with open(path, encoding="utf-8") as fh:
            div = first_divergence(lines, (line.rstrip("\n") for line in fh))
    if div is None:
        return {"status": "identical"}
    return {"status": "diverged", "line": div.line, "ours": div.ours, "theirs": div.theirs}


def run_seed(seed: int, *, check_determinism: bool = False, time_budget_s: Optional[float] = None) -> Dict[str, Any]:
    """Everything a sweep records about one seed. An exception escaping the simulator is
    the caller's to turn into a ``crashed`` result (see :mod:`simulators.fuzz.executors`)."""
    scenario = scenario_for_seed(seed)
    out: Dict[str, Any] = {"seed": seed, "scenario": _describe(scenario)}
    lines: Optional[list] = [] if check_determinism else None
    out.update(run_scenario(scenario, lines))
    if check_determinism:
        out["determinism"] = _determinism(seed, lines, time_budget_s)
        if out["determinism"]["status"] == "diverged":
            out["status"] = "finding"
            out["signature"] = "nondeterministic"
    return out


def _fresh_main(seed: int, path: str) -> None:
    from harness.eventlog.writer import write_atomic

    write_atomic(path, Simulation(scenario_for_seed(seed)).run().log.lines())


if __name__ == "__main__":
    _fresh_main(int(sys.argv[1]), sys.argv[2])
