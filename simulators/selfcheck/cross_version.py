"""The same scenarios simulated by two CPython versions must give the same bytes.

The project promises byte-identical outputs for a scenario and seed on Python 3.11-3.13.
A fresh process of the *same* interpreter (``--check-determinism``) cannot see what changes
*between* versions — 3.12's compensated ``sum()`` of floats made summary.json differ, see
:mod:`harness.ordered_sum` — so this module runs a set of runs in another interpreter and
compares the SHA-256 of every output file with this one's:

* every bundled scenario but the 1024-GPU one (``examples/scenarios`` and the built-in
  default): events.jsonl, summary.txt, summary.json, trace.json, violations.txt and
  scenario.yaml, as ``rlharness simulate --no-png`` writes them (the PNG is left out: its
  bytes depend on matplotlib and FreeType, not on the interpreter, and matplotlib is not
  what the other interpreter needs to have);
* the event logs of the first fuzz seeds (generated scenarios reach paths no bundled one
  does: faults, odd sizes, fractional demands);
* the event logs of explored runs (``--explore SEED`` under each strategy: the explorer's
  ranks, hand-offs and seeded delays come from ``random.Random``, whose draws must be the
  same on every version).

About 2 s of CPU per interpreter. The other interpreter needs the simulator's dependencies
(simpy, numpy, PyYAML, orjson) importable and this checkout on its path (set here).

    python -m simulators.selfcheck.cross_version OTHER_PYTHON...   (exit 1 on a difference, 2 on an error)
    python -m simulators.selfcheck.cross_version --hashes [WHICH]  (this interpreter's hashes, as JSON)
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from typing import Dict, List, NamedTuple, Optional

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
COMPARED_FILES = ("events.jsonl", "summary.txt", "summary.json", "trace.json", "violations.txt", "scenario.yaml")
FUZZ_SEEDS = range(60)
DEPENDENCIES = ("simpy", "numpy", "yaml", "orjson")
# explored runs compared: (scenario path, "" = the built-in default; schedule seed; strategy)
EXPLORE_RUNS = [
    (path, seed, strategy)
    for path in ("", "examples/scenarios/gap_ratio_3pipelines.yaml")
    for strategy in ("pct", "random")
    for seed in (0, 1)
]

Hashes = Dict[str, Dict[str, str]]  # run name -> file -> sha256


class Answer(NamedTuple):
    """What one interpreter computed: its version, its dependencies' versions, the hashes."""

    python: str
    dependencies: str  # "numpy 2.4.6, orjson 3.13.0, ...": a difference may come from one of them
    hashes: Hashes


def dependency_versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for dist in ("numpy", "orjson", "PyYAML", "simpy"):
        try:
            out.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            out.append(f"{dist} ?")
    return ", ".join(out)


def bundled_scenarios() -> List[str]:
    """ "" (the built-in default) and every bundled scenario but the 1024-GPU one, as
    paths relative to the checkout."""
    paths = sorted(glob.glob(os.path.join(ROOT, "examples", "scenarios", "*.yaml")))
    return [""] + [os.path.relpath(p, ROOT) for p in paths if "1024" not in os.path.basename(p)]


def _file_sha(path: str) -> str:
    if not os.path.exists(path):
        return "absent"
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def output_hashes(
    scenarios: Optional[List[str]] = None, seeds: Optional[range] = None, explore: Optional[List[list]] = None
) -> Hashes:
    """This interpreter's hashes of every compared run (simulated here, now): the given
    bundled scenarios, fuzz seeds and explored runs; all of them when none is given (explored
    runs only then, or when named)."""
    from simulators.runtime.explore import ExploreSpec
    from simulators.fuzz.generate import scenario_for_seed
    from simulators.fuzz.seed_run import lines_sha256
    from simulators.run import simulate
    from simulators.runtime.simulation import Simulation
    from simulators.scenario.loader import load_scenario
    from simulators.scenario.spec import default_scenario

    out: Hashes = {}
    with tempfile.TemporaryDirectory(prefix="rlharness-cross-version-") as tmp:
        for path in bundled_scenarios() if scenarios is None else scenarios:
            scenario = load_scenario(os.path.join(ROOT, path)) if path else default_scenario()
            run_dir = os.path.join(tmp, str(len(out)))
            simulate(scenario, run_dir, png=False)
            out[path or "(default)"] = {f: _file_sha(os.path.join(run_dir, f)) for f in COMPARED_FILES}
    for seed in FUZZ_SEEDS if seeds is None else seeds:
        out[f"fuzz seed {seed}"] = {"events.jsonl": lines_sha256(Simulation(scenario_for_seed(seed)).run().log.lines())}
    if explore is None and scenarios is None and seeds is None:
        explore = EXPLORE_RUNS
    for path, seed, strategy in explore or []:
        scenario = load_scenario(os.path.join(ROOT, path)) if path else default_scenario()
        log = Simulation(scenario, explore=ExploreSpec(seed, strategy)).run().log
        out[f"{path or '(default)'} --explore {seed} --explore-strategy {strategy}"] = {
            "events.jsonl": lines_sha256(log.lines())
        }
    return out


def hashes_under(
    python: str,
    scenarios: Optional[List[str]] = None,
    seeds: Optional[range] = None,
    timeout_s: Optional[float] = 300,
    explore: Optional[List[list]] = None,
) -> Answer:
    """The :class:`Answer` computed by the interpreter ``python`` on this checkout, of the
    same runs :func:`output_hashes` takes.

    Raises RuntimeError (one line: what failed) when it cannot run or lacks a dependency."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    try:
        proc = subprocess.run(
            [
                python,
                "-m",
                "simulators.selfcheck.cross_version",
                "--hashes",
                json.dumps(
                    {
                        "scenarios": scenarios,
                        "seeds": None if seeds is None else [seeds.start, seeds.stop],
                        "explore": explore,
                    }
                ),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except OSError as e:
        raise RuntimeError(f"{python}: cannot run it ({e.strerror or e})") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{python}: no answer within {timeout_s:g} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise RuntimeError(f"{python}: {last}")
    answer = json.loads(proc.stdout)
    return Answer(answer["python"], answer["dependencies"], answer["hashes"])


def differences(ours: Hashes, theirs: Hashes, our_version: str, their_version: str) -> List[str]:
    """One line per run and file whose bytes differ (or that only one side has)."""
    lines = []
    for run in sorted(set(ours) | set(theirs)):
        a, b = ours.get(run, {}), theirs.get(run, {})
        for f in sorted(set(a) | set(b)):
            if a.get(f) != b.get(f):
                lines.append(
                    f"{run} {f}: Python {our_version} {str(a.get(f))[:12]} != "
                    f"Python {their_version} {str(b.get(f))[:12]}"
                )
    return lines


def _count(hashes: Hashes) -> int:
    return sum(len(files) for files in hashes.values())


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--hashes"]:
        missing = [m for m in DEPENDENCIES if _missing(m)]
        if missing:
            print(f"Python {platform.python_version()} lacks the simulator's {', '.join(missing)}", file=sys.stderr)
            return 2
        which = json.loads(argv[1]) if len(argv) > 1 else {}
        seeds = range(*which["seeds"]) if which.get("seeds") is not None else None
        json.dump(
            {
                "python": platform.python_version(),
                "dependencies": dependency_versions(),
                "hashes": output_hashes(which.get("scenarios"), seeds, which.get("explore")),
            },
            sys.stdout,
        )
        return 0
    if not argv or any(a.startswith("-") for a in argv):
        print("usage: python -m simulators.selfcheck.cross_version OTHER_PYTHON... | --hashes", file=sys.stderr)
        return 2
    ours, version = output_hashes(), platform.python_version()
    status = 0
    for python in argv:
        try:
            their_version, their_deps, theirs = hashes_under(python)
        except RuntimeError as e:
            print(f"cross-version: error: {e}", file=sys.stderr)
            return 2
        diff = differences(ours, theirs, version, their_version)
        if diff:
            status = 1
            print(
                f"cross-version: Python {version} ({dependency_versions()}) and {their_version} ({their_deps}) "
                f"differ in {len(diff)} of {_count(ours)} files:"
            )
            print("\n".join(f"  {line}" for line in diff))
        else:
            print(
                f"cross-version: Python {version} and {their_version}: {_count(ours)} files of {len(ours)} runs "
                f"byte-identical"
            )
    return status


def _missing(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return True
    return False


if __name__ == "__main__":
    raise SystemExit(main())
