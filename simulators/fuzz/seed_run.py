"""One seed of a sweep: generate, simulate, check, name the finding.

:func:`run_seed` is the unit of work every executor runs (a local worker process or a
Ray task). Its result is a plain dict that depends on the seed alone — no wall times, no
host names, no process ids — so a sweep's results are byte-identical whichever executor
ran it and in whatever order the seeds completed.

    python -m simulators.fuzz.seed_run --hashes RUN...      (the determinism pass's fresh process)
    python -m simulators.fuzz.seed_run --log RUN OUT.jsonl  (a divergent run's log, to locate it)

A RUN is a seed (``17``: the fixed same-time order) or a seed under a schedule seed and
strategy (``17/3/pct``: ``--explore 3 --explore-strategy pct``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional

from harness.logs.invariants import check_log
from harness.logs.known_upstream import split_known
from simulators.selfcheck.determinism import first_divergence, other_hash_seed
from simulators.runtime.explore import ExploreSpec
from simulators.fuzz.generate import scenario_for_seed
from simulators.fuzz.signature import CLEAN, signature
from simulators.runtime.simulation import Simulation
from simulators.scenario.spec import Scenario

# Violations kept per result (the rest are counted): enough to read, small enough for
# a results file of thousands of seeds.
_KEPT_VIOLATIONS = 5


def scenario_size(s: Scenario) -> tuple:
    """Smaller is a simpler reproducer: GPUs, pipelines, faults, steps, trajectories."""
    return (
        s.cluster.num_gpus,
        len(s.pipelines),
        len(s.faults),
        sum(p.steps for p in s.pipelines),
        sum(p.workload.trajectories_per_step for p in s.pipelines),
    )


def run_scenario(
    scenario: Scenario, explore: Optional[ExploreSpec] = None, upstream_as_findings: bool = False
) -> Dict[str, Any]:
    """Simulate one scenario (under a schedule seed, if given) and describe what it found
    (the seed-independent part). Known upstream behaviour (harness.logs.known_upstream) is
    counted apart and names no signature, unless ``upstream_as_findings``."""
    result = Simulation(scenario, explore=explore).run()
    records = result.records
    violations = check_log(records)
    types = {p.name: p.type for p in scenario.pipelines}
    known: Dict[str, int] = {}
    if not upstream_as_findings:
        violations, known = split_known(violations, records, types)
    sig = signature(records, violations, types)
    return {
        "known_upstream": known,
        "status": "clean" if sig == CLEAN else "finding",
        "signature": sig,
        "reason": result.reason,
        "detail": result.detail,
        "sim_time": round(result.sim_time, 6),
        "records": len(records),
        "violations": len(violations),
        "first_violations": [str(v) for v in violations[:_KEPT_VIOLATIONS]],
        "log_sha256": lines_sha256(result.log.lines()),
    }


def _describe(s: Scenario) -> Dict[str, Any]:
    return {
        "gpus": s.cluster.num_gpus,
        "pipelines": [p.type for p in s.pipelines],
        "faults": [f.name for f in s.faults],
        "size": list(scenario_size(s)),
    }


def lines_sha256(lines) -> str:
    """The SHA-256 of the events.jsonl bytes these lines make (each followed by a newline)."""
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def run_id(seed: int, explore: Optional[Dict[str, Any]] = None) -> str:
    """A run's name: ``SEED``, or ``SEED/SCHEDULE/STRATEGY`` under a schedule seed."""
    return str(seed) if explore is None else f"{seed}/{explore['seed']}/{explore['strategy']}"


def _simulate_run(rid: str):
    seed, *schedule = rid.split("/")
    explore = ExploreSpec(int(schedule[0]), schedule[1]) if schedule else None
    return Simulation(scenario_for_seed(int(seed)), explore=explore).run()


def fresh_hashes(runs: List[str], timeout_s: Optional[float], index: int = 0) -> Dict[str, Any]:
    """The log hash of each run (:func:`run_id`), computed in one fresh interpreter under
    another ``PYTHONHASHSEED`` (one interpreter start for a chunk of runs, not one per run).

    Returns ``{"seed": index, "hashes": {run: sha}}`` or ``{"seed": index, "error": why}``."""
    env = dict(os.environ, PYTHONHASHSEED=other_hash_seed(os.environ.get("PYTHONHASHSEED")))
    cmd = [sys.executable, "-m", "simulators.fuzz.seed_run", "--hashes", *runs]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"seed": index, "error": f"the fresh process took over {timeout_s:g} s"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return {"seed": index, "error": f"the fresh process failed: {last}"}
    return {"seed": index, "hashes": json.loads(proc.stdout)}


def divergence(seed: int, timeout_s: Optional[float], explore: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Where the logs of ``seed`` (under ``explore``, a result's schedule) first differ:
    this process against a fresh one."""
    rid = run_id(seed, explore)
    lines = list(_simulate_run(rid).log.lines())
    env = dict(os.environ, PYTHONHASHSEED=other_hash_seed(os.environ.get("PYTHONHASHSEED")))
    with tempfile.TemporaryDirectory(prefix="rlharness-fuzz-") as tmp:
        path = os.path.join(tmp, "events.jsonl")
        cmd = [sys.executable, "-m", "simulators.fuzz.seed_run", "--log", rid, path]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"status": "not_checked", "why": f"the fresh process took over {timeout_s:g} s"}
        if proc.returncode != 0:
            return {"status": "not_checked", "why": "the fresh process failed"}
        with open(path, encoding="utf-8") as fh:
            div = first_divergence(lines, (line.rstrip("\n") for line in fh))
    if div is None:  # the hashes differed, the logs do not: the difference came and went
        return {"status": "diverged", "line": None, "ours": None, "theirs": None}
    return {"status": "diverged", "line": div.line, "ours": div.ours, "theirs": div.theirs}


def run_seed(seed: int, explore: Optional[ExploreSpec] = None, upstream_as_findings: bool = False) -> Dict[str, Any]:
    """Everything a sweep records about one seed (under a schedule seed, if given). An
    exception escaping the simulator is the caller's to turn into a ``crashed`` result (see
    :mod:`simulators.fuzz.executors`)."""
    scenario = scenario_for_seed(seed)
    out: Dict[str, Any] = {"seed": seed, "scenario": _describe(scenario)}
    if explore is not None:
        out["explore"] = {"seed": explore.seed, "strategy": explore.strategy}
    out.update(run_scenario(scenario, explore, upstream_as_findings))
    return out


def _hashes_main(runs: List[str]) -> None:
    out = {}
    for rid in runs:
        try:
            out[rid] = lines_sha256(_simulate_run(rid).log.lines())
        except Exception as e:  # the primary run crashed too, or it did not: either way a difference
            out[rid] = f"raised {type(e).__name__}"
    sys.stdout.write(json.dumps(out))


def _log_main(rid: str, path: str) -> None:
    from harness.logs.writer import write_atomic

    write_atomic(path, _simulate_run(rid).log.lines())


if __name__ == "__main__":
    if sys.argv[1] == "--hashes":
        _hashes_main(sys.argv[2:])
    else:
        _log_main(sys.argv[2], sys.argv[3])
