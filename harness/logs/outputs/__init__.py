"""Outputs of a simulator run, computed from its event log (a list of record dicts).

- :func:`summarize` / :func:`format_summary`: plain-text tables (steps, time split,
  GPU utilization, refit, staleness, scheduler figures, faults);
- :func:`chrome_trace` / :func:`write_chrome_trace`: Chrome Trace Event Format JSON that
  opens in the Perfetto UI (one track per GPU, lanes for overlapping work);
- :func:`write_timeline_png`: a matplotlib PNG timeline (matplotlib is imported only
  when a PNG is drawn).

All are pure functions of the records (no simulator imports), deterministic for equal
input, so a log read back from a JSONL file gives the same outputs as the live run.
Each also accepts a :class:`RunView` of the records: several outputs of one log given the
same view derive its intervals once instead of once each.
"""

from harness.logs.outputs.run_view import RunView
from harness.logs.outputs.perfetto import chrome_trace, write_chrome_trace
from harness.logs.outputs.summary import Summary, summarize
from harness.logs.outputs.summary_text import format_summary
from harness.logs.outputs.timeline import render_timeline_png, write_timeline_png

__all__ = [
    "RunView",
    "Summary",
    "chrome_trace",
    "format_summary",
    "render_timeline_png",
    "summarize",
    "write_chrome_trace",
    "write_timeline_png",
]
