"""Determinism self-check: the same scenario and seed, run again in a fresh process under
another string-hash seed, must give a byte-identical event log.

A second run inside the same process would share everything that can leak into a model
by accident — the ``PYTHONHASHSEED`` behind set iteration order over strings, object
addresses behind ``id()``-keyed orders, import-time state — so it could not see those
leaks. A fresh process with a different hash seed changes all of them at once, which is
what ``rlharness simulate --check-determinism`` does (the idea of madsim's
``MADSIM_TEST_CHECK_DETERMINISTIC``: run the same seed twice, stop at the first
divergence).

    python -m simulators.selfcheck.determinism SCENARIO|"" SEED OUT.jsonl   (the fresh process)
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from itertools import zip_longest
from typing import Iterable, Optional

from simulators.runtime.explore import ExploreSpec
from simulators.runtime.simulation import RunResult


@dataclass(frozen=True)
class Divergence:
    line: int  # 1-based line of events.jsonl where the two logs first differ
    ours: Optional[str]  # None: this log ended first
    theirs: Optional[str]


@dataclass(frozen=True)
class DeterminismCheck:
    hash_seed: str  # the fresh process's PYTHONHASHSEED
    records: int
    divergence: Optional[Divergence]


def first_divergence(ours: Iterable[str], theirs: Iterable[str]) -> Optional[Divergence]:
    """The first line (without its newline) where two logs differ, or None."""
    for i, (a, b) in enumerate(zip_longest(ours, theirs), 1):
        if a != b:
            return Divergence(i, a, b)
    return None


def other_hash_seed(current: Optional[str]) -> str:
    """A PYTHONHASHSEED that differs from ``current`` (this process's setting): the next
    integer when that is a fixed seed, else 0 (randomization off), which differs from the
    random key a process without a fixed seed hashes with."""
    if current is not None and current.isdigit():
        return str((int(current) + 1) % 4294967296)
    return "0"


def check_determinism(
    result: RunResult, scenario_path: Optional[str], *, resolved: bool = False, explore: Optional[ExploreSpec] = None
) -> DeterminismCheck:
    """Run ``result``'s scenario (from ``scenario_path``, or the default scenario when
    None; with the run's seed) in a fresh process and compare the event logs. With
    ``resolved`` (a scenario changed by ``--set``), the fresh run reads the scenario as
    the run resolved it (what scenario.yaml holds), not the file.

    Raises RuntimeError when the fresh process fails (its last stderr line says why)."""
    hash_seed = other_hash_seed(os.environ.get("PYTHONHASHSEED"))
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    with tempfile.TemporaryDirectory(prefix="rlharness-determinism-") as tmp:
        path = os.path.join(tmp, "events.jsonl")
        if resolved:
            import yaml
            from simulators.scenario.dump import scenario_to_mapping

            scenario_path = os.path.join(tmp, "scenario.yaml")
            with open(scenario_path, "w", encoding="utf-8") as fh:
                yaml.safe_dump(scenario_to_mapping(result.scenario), fh, sort_keys=False)
        cmd = [
            sys.executable,
            "-m",
            "simulators.selfcheck.determinism",
            scenario_path or "",
            str(result.scenario.seed),
            path,
            json.dumps(None if explore is None else dataclasses.asdict(explore)),
        ]
        # no timeout of its own: the fresh run is the same simulation, bounded by its horizon
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
            raise RuntimeError(f"the fresh run failed: {last}")
        with open(path, encoding="utf-8") as fh:
            div = first_divergence(result.log.lines(), (line.rstrip("\n") for line in fh))
    return DeterminismCheck(hash_seed, len(result.records), div)


def _fresh_run(scenario_path: str, seed: int, out_path: str, explore: Optional[ExploreSpec] = None) -> None:
    from harness.logs.writer import write_atomic
    from simulators.run import with_seed
    from simulators.runtime.simulation import Simulation
    from simulators.scenario.loader import load_scenario
    from simulators.scenario.spec import default_scenario

    scenario = load_scenario(scenario_path) if scenario_path else default_scenario()
    write_atomic(out_path, Simulation(with_seed(scenario, seed), explore=explore).run().log.lines())


if __name__ == "__main__":
    explored = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
    _fresh_run(sys.argv[1], int(sys.argv[2]), sys.argv[3], None if explored is None else ExploreSpec(**explored))
