"""SHA-256 of every output of every bundled scenario: the before/after check of output work.

Each scenario of ``examples/scenarios`` (and the built-in default) is simulated and its
outputs written into a temporary folder exactly as ``rlharness simulate`` writes them
(as the run goes: ``simulate(stream=True)``; ``--in-memory`` hashes the outputs written
from the whole log instead, which must be the same);
one line per scenario and file is printed, ``scenario file sha256``. For a pure refactor
of the event log encoding, the oracle, the summary or the writers (a change meant to alter
no output), run this before and after and diff; outputs are not frozen otherwise (a more
faithful model changes them, and the change is described instead)::

    python benchmarks/output_hashes.py > before.txt      # on the old commit
    python benchmarks/output_hashes.py > after.txt       # on the new one
    diff before.txt after.txt

``--skip-large`` leaves out the 1024-GPU scenario (about a minute); ``--files`` picks
which outputs are hashed (default: every file the run folder holds). Each scenario runs
in its own child process (``-j`` at a time) so one's memory is not counted in the next.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def bundled_scenarios(skip_large: bool):
    paths = sorted(glob.glob(os.path.join(ROOT, "examples", "scenarios", "*.yaml")))
    if skip_large:
        paths = [p for p in paths if "1024" not in os.path.basename(p)]
    return [""] + [os.path.relpath(p, ROOT) for p in paths]  # "" is the built-in default


def hash_one(path: str, files, in_memory: bool = False) -> None:
    """Child mode: simulate ``path`` ("" for the default), print ``name file sha256`` lines."""
    sys.path.insert(0, ROOT)
    from simulators.run import OUTPUT_FILES, simulate
    from simulators.scenario.loader import load_scenario
    from simulators.scenario.spec import default_scenario

    scenario = load_scenario(os.path.join(ROOT, path)) if path else default_scenario()
    name = os.path.basename(path) if path else "(default)"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run")
        simulate(scenario, out, stream=not in_memory)
        for f in OUTPUT_FILES:
            if files and f not in files:
                continue
            full = os.path.join(out, f)
            digest = "absent"
            if os.path.exists(full):
                h = hashlib.sha256()
                with open(full, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        h.update(block)
                digest = h.hexdigest()
            print(f"{name} {f} {digest}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-large", action="store_true", help="leave out the 1024-GPU scenario")
    ap.add_argument("--files", nargs="*", default=None, help="only these outputs (e.g. events.jsonl summary.json)")
    ap.add_argument("-j", type=int, default=1, help="scenarios simulated at once")
    ap.add_argument(
        "--in-memory",
        action="store_true",
        help="write the outputs from the whole log in memory (simulate(stream=False)) instead of as the "
        "run makes it (what `rlharness simulate` does)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        hash_one(args.child, args.files, args.in_memory)
        return 0
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    extra = (["--files", *args.files] if args.files else []) + (["--in-memory"] if args.in_memory else [])
    pending = bundled_scenarios(args.skip_large)
    running = []
    failed = 0
    while pending or running:
        while pending and len(running) < max(1, args.j):
            path = pending.pop(0)
            running.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--child", path, *extra],
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        proc = running.pop(0)
        out, err = proc.communicate()
        sys.stdout.write(out)
        if proc.returncode != 0:
            failed += 1
            print(
                f"FAILED {proc.args[3]!r}: {err.strip().splitlines()[-1] if err.strip() else proc.returncode}",
                file=sys.stderr,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
