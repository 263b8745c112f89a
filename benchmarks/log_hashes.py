"""sha256 of every bundled scenario's event log (a check for speed work, not a test).

A tool for a pure refactor (a change meant to alter nothing the model does): run this
before and after and diff the output; equal hashes prove it at once. It is not a rule that
logs are frozen: the event logs change whenever the model becomes more faithful (say which
record kinds and scenarios changed, and why), and performance work is held to semantic
equivalence (the same decisions, findings and figures), which a hash diff shows only when
the bytes happen to be unchanged. One line per scenario: the sha256 of the bytes
``rlharness simulate`` writes to events.jsonl, the record count, and the scenario. The
default scenario is ``default`` (``simulators.scenario.spec.default_scenario``).

    python benchmarks/log_hashes.py [--skip-large] [SCENARIO.yaml ...]
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)


def log_sha256(scenario) -> "tuple[str, int]":
    """The sha256 of the run's events.jsonl bytes (the lines the writer writes, each
    followed by a newline) and the number of records."""
    from simulators.runtime.simulation import Simulation

    result = Simulation(scenario).run()
    digest = hashlib.sha256()
    n = 0
    for line in result.log.lines():
        digest.update(line.encode("utf-8"))
        digest.update(b"\n")
        n += 1
    return digest.hexdigest(), n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-large", action="store_true", help="skip the 1024-GPU scenario")
    ap.add_argument("paths", nargs="*", help="scenarios (default: the default one and examples/scenarios/*.yaml)")
    args = ap.parse_args(argv)
    from simulators.scenario.loader import load_scenario
    from simulators.scenario.spec import default_scenario

    paths = args.paths or [None] + sorted(glob.glob(os.path.join(ROOT, "examples", "scenarios", "*.yaml")))
    for path in paths:
        if args.skip_large and path and "1024" in os.path.basename(path):
            continue
        scenario = load_scenario(path) if path else default_scenario()
        sha, n = log_sha256(scenario)
        name = os.path.relpath(path, ROOT) if path else "default"
        print(f"{sha} {n:>8} {name}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
