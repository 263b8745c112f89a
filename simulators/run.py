"""Run a scenario and write its outputs: the one function behind ``rlharness simulate``.

Outputs in the run folder, written together: every output path is checked before the
run starts (the CLI calls ``check_output_dir``), and the files are staged beside the
folder and moved in only when all were written, so the folder is complete or untouched
(:class:`harness.logs.outputs.paths.RunFolder`); an output this run does not make
(``timeline.png`` after ``--no-png``) is removed so no stale file is left beside new ones:

    events.jsonl    the event log (harness schema; replays with ``rlharness replay``)
    summary.txt     the summary tables, as printed
    summary.json    the same figures, machine-readable (harness.logs.outputs.summary.summary_json)
    trace.json      Chrome trace-event JSON: open it in the Perfetto UI (ui.perfetto.dev)
    timeline.png    a picture of who used which GPU when
    scenario.yaml   the scenario as resolved (defaults filled in, seed applied)
    violations.txt  the invariant oracle's findings (empty file when there are none)

The run's *findings* (the oracle's violations, and the outcome of a run that failed) are
classified against the scenario's ``expect:`` list plus any baseline (harness.logs.expect):
summary.txt and summary.json show expected and unexpected findings apart.
"""

from __future__ import annotations

import dataclasses
import json
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import yaml

from harness.logs.writer import atomic_write
from harness.logs.expect import Expectation, Finding, Verdict, classify, from_violations, report_lines
from simulators.runtime.gc_pause import gc_paused
from harness.logs.outputs.paths import RunFolder
from harness.logs.invariants import Violation
from harness.logs.outputs.run_view import RunView
from harness.logs.outputs.perfetto import write_chrome_trace
from harness.logs.outputs.summary import Summary, summarize
from harness.logs.outputs.summary_text import format_summary, summary_json
from harness.logs.outputs.timeline import write_timeline_png
from simulators.verdict.check_fork import check_beside
from simulators.runtime.explore import ExploreSpec
from simulators.runtime.simulation import RunResult, Simulation
from simulators.scenario.dump import scenario_to_mapping
from simulators.scenario.spec import Scenario


#: every file a run folder holds, in the order they are written
OUTPUT_FILES = (
    "events.jsonl",
    "summary.txt",
    "summary.json",
    "trace.json",
    "timeline.png",
    "scenario.yaml",
    "violations.txt",
)


@dataclass
class SimulationOutput:
    result: RunResult
    violations: List[Violation]
    summary: str
    files: List[str]
    figures: Optional[Summary] = None  # what ``summary`` and summary.json print
    verdict: Optional[Verdict] = None  # findings against the expectations (expected / unexpected / not found)

    @property
    def unexpected(self) -> List[Finding]:
        return self.verdict.unexpected if self.verdict is not None else []


def run_findings(result: RunResult, violations: List[Violation], view: Optional[RunView] = None) -> List[Finding]:
    """What the run found: each violation, then the record that ended a failed run
    (named as fuzz names it: ``oom:weights``, ``timeout:...``, ``failed:...``). ``view``:
    the run's view, when the caller has one (its by-kind index finds the registrations;
    a streamed run's view holds the records these read: simulators/run_streamed.py)."""
    types = {p.name: p.type for p in result.scenario.pipelines}
    records = result.records if view is None else view.records
    found = from_violations(violations, records, types, of=None if view is None else view.of)
    if result.reason not in ("done", "horizon"):
        from simulators.fuzz.signature import failure_finding

        found.append(failure_finding(records, types))
    return found


def _write_text(path: str, text: str) -> None:
    atomic_write(path, text)


def with_seed(scenario: Scenario, seed: Optional[int]) -> Scenario:
    return scenario if seed is None else dataclasses.replace(scenario, seed=seed)


def simulate(
    scenario: Scenario,
    out_dir: Optional[str],
    *,
    png: bool = True,
    progress: Optional[Callable[[str], None]] = None,
    explore: Optional[ExploreSpec] = None,
    baseline: Sequence[Expectation] = (),
    strict: bool = False,
    stream: bool = False,
) -> SimulationOutput:
    """Run, check and write; ``baseline`` adds expectations to the scenario's own.
    ``stream``: the event log is written, checked and summarized as the run makes it
    (:func:`simulators.run_streamed.simulate_streamed`: the same files, memory bounded
    by what is live; ``result.records`` is then not kept)."""
    if stream:
        from simulators.run_streamed import simulate_streamed

        return simulate_streamed(
            scenario,
            out_dir,
            png=png,
            progress=progress,
            explore=explore,
            expectations=list(scenario.expect) + list(baseline),
            strict=strict,
        )
    result = Simulation(scenario, progress=progress, explore=explore).run()
    return write_outputs(result, out_dir, png=png, progress=progress, baseline=baseline, strict=strict)


def write_outputs(
    result: RunResult,
    out_dir: Optional[str],
    *,
    png: bool = True,
    progress: Optional[Callable[[str], None]] = None,
    timings: Optional[Dict[str, float]] = None,
    baseline: Sequence[Expectation] = (),
    strict: bool = False,
    fork: Optional[bool] = None,
) -> SimulationOutput:
    """Check the invariants and summarize a finished run; with ``out_dir``, write the
    outputs listed above into it. ``timings``, if given, receives the wall seconds of
    each step (``check``: the oracle and the summary's figures, ``summary``: its
    findings and text, then each file by name): the benchmark's figures. ``fork``:
    whether the oracle's checks run in a forked child while this process summarizes
    (default: for a long run, :func:`simulators.verdict.check_fork.fork_worthwhile`; the outputs
    are the same either way).

    The cyclic garbage collector is paused meanwhile (:func:`simulators.runtime.gc_pause.gc_paused`):
    the outputs allocate millions of small objects (slices, trace events) next to a log of
    millions more, so it kept re-walking the log — 4 of 17 CPU seconds of the 1024-GPU
    run's outputs, with the same peak RSS without it (the outputs make little cyclic
    garbage; it is collected after)."""
    with gc_paused():
        return _write_outputs(
            result,
            out_dir,
            png=png,
            progress=progress,
            timings=timings,
            expectations=list(result.scenario.expect) + list(baseline),
            strict=strict,
            fork=fork,
        )


def _write_outputs(
    result: RunResult,
    out_dir: Optional[str],
    *,
    png: bool,
    progress: Optional[Callable[[str], None]],
    timings: Optional[Dict[str, float]],
    expectations: List[Expectation],
    strict: bool,
    fork: Optional[bool] = None,
) -> SimulationOutput:
    """The outputs, in two shares (simulators/verdict/check_fork.py): the oracle's checks and the
    event log, which read only the records, run in a forked child for a long run, while
    this process makes what reads the intervals (the summary's figures, the trace, the
    picture); the findings' outputs come once both are done."""
    records = result.records
    # writing the outputs of a long run takes a while too: say what is happening
    long_run = progress is not None and (result.wall_s > 2.0 or len(records) > 200_000)
    say = progress if long_run else (lambda _line: None)
    clock = _Stopwatch(timings)
    say(
        f"  run ended ({result.reason}) after {result.wall_s:.1f} s wall; checking invariants on {len(records)} records"
    )
    view = RunView(records)  # the summary, trace and picture share one derivation of the intervals
    with ExitStack() as stack:
        folder = stack.enter_context(RunFolder(out_dir, OUTPUT_FILES)) if out_dir is not None else None

        def out(name: str) -> str:
            assert folder is not None
            clock.lap(None)
            say(f"  writing {folder.final(name)}")
            clock.name = name
            return folder.path(name)

        def intervals_share(found: Dict[str, List[Violation]]) -> Summary:
            clock.lap("check")  # (this process's share of the checks)
            say("  summarizing")
            # the oracle's handover findings are the summary's handover table: not run twice
            figures = summarize(view, handover_findings=sorted(found.get("handover", ()), key=lambda v: v.seq))
            clock.lap("summary")
            if folder is not None:
                write_chrome_trace(view, out("trace.json"))
                if png:
                    write_timeline_png(view, out("timeline.png"))
                clock.lap(None)
            return figures

        def write_events() -> None:  # (in the child, when forked)
            clock.lap("check")
            result.log.write(events)
            clock.lap("events.jsonl")

        events = out("events.jsonl") if folder is not None else None
        violations, figures = check_beside(
            records, intervals_share, fork=fork, child_work=None if events is None else write_events
        )
        clock.lap("check")  # (the wait for the other share)
        verdict = classify(run_findings(result, violations, view), expectations)
        summary = "\n".join([format_summary(figures)] + report_lines(verdict, strict))
        clock.lap("summary")
        if folder is not None:
            write_findings(out, result.scenario, figures, summary, verdict, violations)
            clock.lap(None)
    files = folder.files if folder is not None else []
    return SimulationOutput(result, violations, summary, files, figures, verdict)


def write_findings(
    out: Callable[[str], str],
    scenario: Scenario,
    figures: Summary,
    summary: str,
    verdict: Verdict,
    violations: List[Violation],
) -> None:
    """The files written once the findings are known (and the resolved scenario)."""
    _write_text(out("summary.txt"), summary + "\n")
    _write_text(
        out("summary.json"),
        json.dumps({**summary_json(figures), "findings": verdict.as_json()}, indent=1, allow_nan=False) + "\n",
    )
    _write_text(out("scenario.yaml"), yaml.safe_dump(scenario_to_mapping(scenario), sort_keys=False))
    _write_text(out("violations.txt"), "".join(f"{v}\n" for v in violations))


class _Stopwatch:
    """Wall seconds per step into ``timings`` (nothing when it is None); ``lap(name)``
    ends the current step under ``name`` (or under ``self.name``, set when a file's
    writing starts)."""

    def __init__(self, timings: Optional[Dict[str, float]]) -> None:
        self.timings = timings
        self.name: Optional[str] = None
        self.t = time.perf_counter()

    def lap(self, name: Optional[str]) -> None:
        now = time.perf_counter()
        name = name or self.name
        if self.timings is not None and name is not None:
            self.timings[name] = self.timings.get(name, 0.0) + now - self.t
        self.name = None
        self.t = now
