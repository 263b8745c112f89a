"""Where the CPU of ``rlharness simulate`` goes: each part of the streamed run, in one process.

The command (``rlharness simulate SCENARIO --out DIR --quiet --no-png``, ``--png`` to draw
the picture too) runs in a fresh process (``rlharness.cli.run``: the command's own code
path, simulators/run_streamed.py) with its functions wrapped from here, not timed in the
project's code: each wrapper reads ``time.process_time`` around the call and keeps the
call's own time (its time less that of the wrapped calls inside it), so every CPU second
of the process is counted once. The parts:

- imports, reading the scenario: from the process's start to ``simulate_streamed``;
- the simulation's own work: ``Simulation`` (made and run), less the chunk hand-offs;
- the one-pass readers as pushed: each ``OnePassRun.push`` of a chunk (its reader's
  work, in its greenlet) and each reader's start, per reader (the oracle's check passes,
  the outputs' view's tables);
- encoding the log (``_encode_lines``), writing ``events.jsonl`` (the sink's writes,
  flush, fsync, close);
- the split by kind, the picks, the view's index, the hand-offs: what the two consumers
  (``OnlineOracle``, ``StreamedRunView``) and ``StreamedLog.flush`` do themselves;
- the trace, the picture, the summary (``summarize``, ``format_summary``);
- the findings, the tables' and checks' ends: the oracle's and the view's ``finish``
  (the readers' ends), the verdict, ``findings.json``/``summary.txt``, the run folder;
- the command's end: from ``simulate_streamed``'s return to the process's end.

Printed: each part's CPU s, its share of the whole process, the whole (user + system, of
it in the kernel), and each reader's CPU as pushed (``--top`` of them, and their sum).
``--rounds K`` runs K processes and keeps each part's least; ``--other PATH`` alternates
with another checkout (this script, that tree on PYTHONPATH; a function that tree lacks is
not wrapped, and its time falls to its caller's part). The machine is shared: print
``uptime`` beside the figures (the load at each process's start is printed).

    git archive 8ce5aa6 | tar -x -C /tmp/old      # (a checkout to compare with, if any)
    nice python benchmarks/streamed_parts.py [--scenario PATH | --gpus N [--steps S]] [--png]
        [--rounds K] [--other /tmp/old] [--top 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
LARGE = "examples/scenarios/large_1024gpu.yaml"

#: the parts, in the order printed, with their labels
PARTS = {
    "imports": "imports, reading the scenario",
    "simulation": "the simulation's own work (outside the chunk hand-offs)",
    "readers": "the one-pass readers, as pushed",
    "encoding": "encoding the log (orjson, a chunk at a time)",
    "split": "the split by kind, the picks, the view's index, the hand-offs (caller's side)",
    "writing": "writing `events.jsonl`",
    "trace": "the trace (after the run)",
    "picture": "the picture",
    "summary": "the summary",
    "ends": "the findings, the tables' and checks' ends, the run folder",
    "command": "the command's end (its outcome printed)",
}


# ---- the measured process


class Parts:
    """CPU seconds by part, each wrapped call's own (its nested wrapped calls' taken out).
    The readers run in greenlets of the caller's thread, strictly alternating with it,
    so the wrapped calls nest as on one stack."""

    def __init__(self) -> None:
        self.cpu: Dict[str, float] = {name: 0.0 for name in PARTS}
        self.readers: Dict[str, float] = {}
        self.stack: List[list] = []  # [part, start, nested time, reader or None]
        self.in_flush = 0
        self.owner = ""  # the consumer pushing: "oracle" or "view"
        self.records = 0
        self.returned = 0.0  # the CPU time when simulate_streamed returned
        self.missing: List[str] = []

    def timed(self, fn: Callable[..., Any], part: Any) -> Callable[..., Any]:
        """``fn`` with its own CPU time added to ``part`` (a name, or a function of the
        call's arguments giving (part, reader or None))."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            name, reader = part(*args) if callable(part) else (part, None)
            frame = [name, time.process_time(), 0.0, reader]
            self.stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.process_time() - frame[1]
                popped = self.stack.pop()
                if popped is not frame:  # a switch left a call open: the account is wrong
                    raise RuntimeError(f"streamed_parts: unbalanced timing stack at {name}")
                own = spent - frame[2]
                self.cpu[name] += own
                if reader is not None:
                    self.readers[reader] = self.readers.get(reader, 0.0) + own
                if self.stack:
                    self.stack[-1][2] += spent

        return wrapper

    def patch(self, owner: Any, attr: str, part: Any, where: str) -> Optional[Callable[..., Any]]:
        """Replace ``owner.attr`` by its timed wrapper (noted as missing where absent)."""
        fn = getattr(owner, attr, None)
        if fn is None:
            self.missing.append(f"{where}.{attr}")
            return None
        setattr(owner, attr, self.timed(fn, part))
        return fn


class _TimedSink:
    """The event log's file, its writes and closing counted as the writing part."""

    def __init__(self, fh: Any, parts: Parts) -> None:
        self._fh = fh
        self.write = parts.timed(fh.write, "writing")
        self.flush = parts.timed(fh.flush, "writing")
        self.close = parts.timed(fh.close, "writing")

    def fileno(self) -> int:
        return self._fh.fileno()

    def __enter__(self) -> "_TimedSink":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _consumer(parts: Parts, owner: str, call: Callable[..., Any]) -> Callable[..., Any]:
    def consume(self: Any, chunk: Any) -> Any:
        before, parts.owner = parts.owner, owner
        try:
            return call(self, chunk)
        finally:
            parts.owner = before

    return parts.timed(consume, "split")


def _instrument(parts: Parts) -> None:
    """Wrap the streamed run's functions (in the modules that call them)."""
    import harness.logs.one_pass as one_pass
    import harness.logs.stream as stream
    import simulators.run_streamed as streamed
    from simulators.runtime.simulation import Simulation

    parts.patch(Simulation, "__init__", "simulation", "Simulation")
    parts.patch(Simulation, "run", "simulation", "Simulation")
    flush = stream.StreamedLog.flush

    def counted_flush(self: Any) -> None:
        parts.records += len(self.records)
        parts.in_flush += 1
        try:
            flush(self)
        finally:
            parts.in_flush -= 1

    stream.StreamedLog.flush = parts.timed(counted_flush, "split")
    parts.patch(stream, "_encode_lines", "encoding", "harness.logs.stream")

    def reader_part(run: Any, *_args: Any) -> tuple:
        if not parts.in_flush:  # the end pushed by finish(): the reader's end
            return "ends", None
        return "readers", f"{parts.owner or '?'}: {getattr(run, 'name', '') or '?'}"

    def started_part(_run: Any, _fn: Any = None, _first: Any = None, name: str = "", *_rest: Any) -> tuple:
        return "readers", f"{parts.owner or '?'}: {name or '?'}"  # (made at a consumer's first chunk)

    parts.patch(one_pass.OnePassRun, "push", reader_part, "OnePassRun")
    parts.patch(one_pass.OnePassRun, "__init__", started_part, "OnePassRun")
    for cls, owner in (
        (getattr(streamed, "OnlineOracle", None), "oracle"),
        (getattr(streamed, "StreamedRunView", None), "view"),
    ):
        if cls is None:
            parts.missing.append(f"simulators.run_streamed.{owner}")
            continue
        cls.__call__ = _consumer(parts, owner, cls.__call__)
        parts.patch(cls, "finish", "ends", cls.__name__)
    parts.patch(streamed, "write_chrome_trace", "trace", "simulators.run_streamed")
    parts.patch(streamed, "write_timeline_png", "picture", "simulators.run_streamed")
    parts.patch(streamed, "summarize", "summary", "simulators.run_streamed")
    parts.patch(streamed, "format_summary", "summary", "simulators.run_streamed")
    parts.patch(os, "fsync", "writing", "os")
    opened = open
    streamed.open = lambda path, mode="r", *a, **k: _TimedSink(opened(path, mode, *a, **k), parts)  # type: ignore[attr-defined]
    simulate = streamed.simulate_streamed

    def entered(*args: Any, **kwargs: Any) -> Any:
        parts.cpu["imports"] = time.process_time()  # (nothing wrapped has run yet)
        return simulate(*args, **kwargs)

    timed = parts.timed(entered, "ends")

    def returned(*args: Any, **kwargs: Any) -> Any:
        try:
            return timed(*args, **kwargs)
        finally:
            parts.returned = time.process_time()

    streamed.simulate_streamed = returned


def child(scenario: str, png: bool, report: str) -> int:
    """Run the command here, its parts timed; their CPU written to ``report`` (JSON)."""
    load = os.getloadavg()[0]
    parts = Parts()
    _instrument(parts)
    import rlharness.cli as cli

    with tempfile.TemporaryDirectory(prefix="streamed-parts-") as tmp:
        sys.argv = ["rlharness", "simulate", scenario, "--out", os.path.join(tmp, "run"), "--quiet"]
        sys.argv += [] if png else ["--no-png"]
        code = cli.run()
        parts.cpu["command"] = time.process_time() - parts.returned
        ended, ended_cpu = os.times(), time.process_time()  # (os.times: clock ticks; only its kernel share)
    if code not in (0, 1):  # 1: the run's findings, every output written (2: its error printed)
        return code
    if parts.stack or not parts.returned:
        raise RuntimeError("streamed_parts: simulate_streamed not run, or a timed call left open")
    whole = {"cpu": ended_cpu, "system": ended.system}
    out = {"parts": parts.cpu, "readers": parts.readers, "whole": whole, "records": parts.records}
    out.update(load=load, missing=parts.missing)
    with open(report, "w", encoding="utf-8") as fh:
        json.dump(out, fh)
    return 0


# ---- the driver


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _measure(tree: str, scenario: str, png: bool) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="streamed-parts-") as tmp:
        report = os.path.join(tmp, "parts.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", scenario, report] + (["--png"] if png else [])
        proc = subprocess.run(cmd, cwd=tree, env=dict(os.environ, PYTHONPATH=tree), capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(report):
            last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1].removeprefix("error: ")
            raise _Failed(proc.returncode if proc.returncode == 2 else 1, f"{tree}: {last}")
        with open(report, encoding="utf-8") as fh:
            return json.load(fh)


class _Failed(Exception):
    def __init__(self, code: int, line: str) -> None:
        super().__init__(line)
        self.code = code


def _least(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Each part's, reader's and the whole's least over ``runs``."""
    least: Dict[str, Any] = {"parts": {}, "readers": {}, "whole": {}}
    for key in ("parts", "readers"):
        for name in {n for r in runs for n in r[key]}:
            least[key][name] = min(r[key].get(name, float("inf")) for r in runs)
    best = min(runs, key=lambda r: r["whole"]["cpu"])
    least["whole"] = best["whole"]
    least["records"] = runs[0]["records"]
    return least


def _print(results: Dict[str, List[Dict[str, Any]]], top: int, scenario: str, png: bool) -> None:
    labels = list(results)
    least = {label: _least(runs) for label, runs in results.items()}
    rounds = len(results[labels[0]])
    loads = [r["load"] for runs in results.values() for r in runs]
    print(
        f"{scenario}: {least[labels[0]]['records']:,} records, picture {'on' if png else 'off'}; CPU s per part, "
        f"least of {rounds} process(es) each; load at their starts {min(loads):.1f}-{max(loads):.1f}"
    )
    head = f"  {'part':<80}" + "".join(f"{label:>10}{'share':>7}" for label in labels)
    print(head)
    for name, text in PARTS.items():
        cells = ""
        for label in labels:
            s, whole = least[label]["parts"].get(name, 0.0), least[label]["whole"]["cpu"]
            cells += f"{s:>10.2f}{100 * s / whole:>6.0f}%"
        print(f"  {text:<80}{cells}")
    print(f"  {'sum of the parts':<80}" + "".join(f"{sum(least[lb]['parts'].values()):>10.2f}{'':>7}" for lb in labels))
    print(
        f"  {'the whole process (of it in the kernel)':<80}"
        + "".join(f"{least[lb]['whole']['cpu']:>10.2f} ({least[lb]['whole']['system']:.2f})" for lb in labels)
    )
    for label in labels:
        print(f"  {label}: whole process per run " + ", ".join(f"{r['whole']['cpu']:.2f}" for r in results[label]))
        got = least[label]["readers"]
        owners: Dict[str, int] = {}
        for reader in got:
            owners[reader.split(":")[0]] = owners.get(reader.split(":")[0], 0) + 1
        print(f"  {label}: {len(got)} one-pass readers ({', '.join(f'{o}: {n}' for o, n in sorted(owners.items()))})")
        if results[label][0]["missing"]:
            print(f"  {label}: not wrapped (absent there): {', '.join(results[label][0]['missing'])}")
    readers = least[labels[0]]["readers"]
    print(f"the one-pass readers as pushed ({labels[0]}; {len(readers)} readers, CPU s, least of {rounds}):")
    for name in sorted(readers, key=lambda n: -readers[n])[:top]:
        print(f"  {name:<60}" + "".join(f"{least[lb]['readers'].get(name, float('nan')):>10.3f}" for lb in labels))
    print(f"  {'all readers':<60}" + "".join(f"{sum(least[lb]['readers'].values()):>10.2f}" for lb in labels))


def _scenario_path(args: argparse.Namespace, tmp: str) -> str:
    if args.gpus is not None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import yaml
        from scale_scenarios import scale_scenario

        try:
            mapping = scale_scenario(args.gpus, args.steps)
        except ValueError as e:
            raise _Failed(2, f"--gpus: {e}") from None
        path = os.path.join(tmp, f"scale_{args.gpus}gpu.yaml")
        with open(path, "w", encoding="utf-8") as fh:
            yaml.safe_dump(mapping, fh, sort_keys=False)
        return path
    path = args.scenario if os.path.isabs(args.scenario) else os.path.join(ROOT, args.scenario)
    if not os.path.isfile(path):
        raise _Failed(2, f"--scenario: no such file {args.scenario}")
    return path


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1], "--png" in argv[3:], argv[2])
    ap = _Parser(description=__doc__.splitlines()[0])
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--scenario", default=LARGE, help=f"a scenario file (default {LARGE})")
    where.add_argument("--gpus", type=int, help="benchmarks/scale_scenarios.py's scenario of this many GPUs")
    ap.add_argument("--steps", type=int, default=100, help="with --gpus: steps per pipeline")
    ap.add_argument("--png", action="store_true", help="draw timeline.png too")
    ap.add_argument("--rounds", type=int, default=1, help="processes per checkout (each part's least is kept)")
    ap.add_argument("--other", help="another checkout to alternate with (a directory holding simulators/)")
    ap.add_argument("--top", type=int, default=15, help="how many readers to list")
    ap.add_argument("--json", help="also write every run's parts to this file")
    args = ap.parse_args(argv)
    try:
        if args.rounds < 1:
            raise _Failed(2, f"--rounds: at least 1, got {args.rounds}")
        if args.other and not os.path.isdir(os.path.join(args.other, "simulators")):
            raise _Failed(2, f"--other: {args.other} holds no simulators/")
        trees = [("this", ROOT)] + ([("other", os.path.abspath(args.other))] if args.other else [])
        with tempfile.TemporaryDirectory(prefix="streamed-parts-") as tmp:
            scenario = _scenario_path(args, tmp)
            results: Dict[str, List[Dict[str, Any]]] = {label: [] for label, _ in trees}
            for _ in range(args.rounds):
                for label, tree in reversed(trees):  # the other checkout first in each round
                    results[label].append(_measure(tree, scenario, args.png))
    except _Failed as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    name = f"{args.gpus} GPUs (benchmarks/scale_scenarios.py)" if args.gpus else os.path.relpath(scenario, ROOT)
    _print(results, args.top, name, args.png)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
