"""``rlharness simulate`` for runs larger than memory: the outputs made as the run goes.

:func:`simulators.run.write_outputs` reads a finished run's records, all in memory (a
4,096-GPU run makes about five million, 2 GB as dicts). Here the event log is streamed
(:class:`~harness.logs.stream.StreamedLog`): each chunk of records is written to
``events.jsonl`` in the staged run folder, then read by the online oracle
(:class:`~harness.logs.invariants.online.OnlineOracle`) and by the outputs' view
(:class:`~harness.logs.outputs.streamed_view.StreamedRunView`), then dropped; the two
share the split of each chunk by kind, and the oracle's ``handover_headroom`` check is
judged on the windows the view's headroom table makes (one walk of the VRAM records, not
two). When the run ends, the oracle's findings and the view's tables are complete; the summary, trace,
picture and findings are written from them exactly as :func:`simulators.run.write_outputs`
writes them from the whole log (benchmarks/output_hashes.py compares every output of
every bundled scenario, ``--in-memory`` for the other path). The folder is complete or
untouched, as before (:class:`harness.logs.outputs.paths.RunFolder`).
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from typing import Callable, List, Optional

from harness.logs.expect import Expectation, classify, report_lines
from simulators.runtime.gc_pause import gc_paused
from harness.logs.invariants import CHECKS, merge_findings
from harness.logs.invariants.online import OnlineOracle
from harness.logs.one_pass import SplitOnce
from harness.logs.outputs.headroom import headroom_findings_of
from harness.logs.outputs.paths import RunFolder
from harness.logs.outputs.perfetto import write_chrome_trace
from harness.logs.outputs.streamed_view import StreamedRunView
from harness.logs.outputs.summary import summarize
from harness.logs.outputs.summary_text import format_summary
from harness.logs.outputs.timeline import write_timeline_png
from simulators.runtime.explore import ExploreSpec
from simulators.run import OUTPUT_FILES, SimulationOutput, run_findings, write_findings
from simulators.runtime.simulation import Simulation
from simulators.scenario.spec import Scenario


def simulate_streamed(
    scenario: Scenario,
    out_dir: Optional[str],
    *,
    png: bool = True,
    progress: Optional[Callable[[str], None]] = None,
    explore: Optional[ExploreSpec] = None,
    expectations: List[Expectation] = (),
    strict: bool = False,
) -> SimulationOutput:
    """Run ``scenario`` with its outputs made as it goes; the files of ``simulate``."""
    say = progress if progress is not None else (lambda _line: None)
    split = SplitOnce(readers=2)  # each chunk split by kind once, for the view and the oracle
    view = StreamedRunView(streaming=any(p.type == "single_controller" for p in scenario.pipelines), split=split)
    # the handover_headroom check judges the windows the summary's headroom table makes
    # (the same records: the check's kinds, the header first), not a second walk of them
    oracle = OnlineOracle([n for n in CHECKS if n != "handover_headroom"], split=split)
    with ExitStack() as stack:
        folder = stack.enter_context(RunFolder(out_dir, OUTPUT_FILES)) if out_dir is not None else None
        sink = stack.enter_context(open(folder.path("events.jsonl"), "wb")) if folder is not None else None
        try:
            result = Simulation(scenario, progress=progress, explore=explore, sink=sink, consumers=[oracle, view]).run()
            say(
                f"  run ended ({result.reason}) after {result.wall_s:.1f} s wall; {result.log.made} records "
                "written and checked as they were made"
            )
            with gc_paused():
                found = oracle.finish()  # (first: its checks' state is let go before the tables are made)
                view.finish()
                found["handover_headroom"] = headroom_findings_of(view.derived("headroom"))
        except BaseException:
            oracle.close()
            view.close()
            raise
        if sink is not None:  # (as atomic_write leaves a file: on disk before the folder moves in)
            sink.flush()
            os.fsync(sink.fileno())
            sink.close()
        with gc_paused():
            violations = merge_findings(found, list(CHECKS))
            figures = summarize(view, handover_findings=sorted(found.get("handover", ()), key=lambda v: v.seq))
            if folder is not None:
                say(f"  writing {folder.final('trace.json')}")
                write_chrome_trace(view, folder.path("trace.json"))
                if png:
                    say(f"  writing {folder.final('timeline.png')}")
                    write_timeline_png(view, folder.path("timeline.png"))
            verdict = classify(run_findings(result, violations, view), expectations)
            summary = "\n".join([format_summary(figures)] + report_lines(verdict, strict))
            if folder is not None:
                write_findings(folder.path, scenario, figures, summary, verdict, violations)
    files = folder.files if folder is not None else []
    return SimulationOutput(result, violations, summary, files, figures, verdict)
