"""What the outputs derive from the bulk of a log, each in one pass over its kinds.

A long run's log is mostly request, VRAM, rank-state and effect records. The outputs
read them only through the tables here: the effect and rank intervals, the summary's
request counts, pause rows and scheduler waste. Each table is a function of the records
of its kinds, in log order, and of the run's end (``end()``, read only after the pass:
open intervals are cut there), written as one pass, so a log read once — streamed as
the simulation makes it (harness/logs/outputs/streamed_view.py) — derives the same tables as
a list does (:meth:`harness.logs.outputs.run_view.RunView.derived`) without keeping those
records.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Dict, Iterable, Mapping, NamedTuple, Tuple

from harness.logs.outputs.headroom import HEADROOM_KINDS, headroom
from harness.logs.outputs.intervals import effect_intervals, rank_intervals
from harness.logs.outputs.pause_summary import PAUSE_KINDS, pause_rows
from harness.logs.outputs.waste import WASTE_KINDS, scheduler_waste

End = Callable[[], float]


class RequestCounts(NamedTuple):
    """Per pipeline: requests done, aborted, failed, and tokens generated."""

    done: Dict[str, int]
    aborted: Dict[str, int]
    failed: Dict[str, int]
    tokens: Dict[str, int]


def request_counts(records: Iterable[Mapping[str, Any]], end: End = None) -> RequestCounts:
    """The summary's request columns, from the ``request_done``/``_abort``/``_failed`` records."""
    counts = RequestCounts(defaultdict(int), defaultdict(int), defaultdict(int), defaultdict(int))
    done, aborted, failed, tokens = counts
    for r in records:
        k = r["kind"]
        if k == "request_done":
            done[r["pipeline_id"]] += 1
            tokens[r["pipeline_id"]] += int(r.get("tokens", 0))
        elif k == "request_abort":
            aborted[r["pipeline_id"]] += 1
        else:
            failed[r["pipeline_id"]] += 1
    return counts


#: name -> (the function of (records, end), the kinds it reads)
DERIVED: Dict[str, Tuple[Callable[..., Any], Tuple[str, ...]]] = {
    "effects": (lambda records, end: effect_intervals(records, end), ("effect_start", "effect_end")),
    "ranks": (lambda records, end: rank_intervals(records, end), ("rank_state",)),
    "requests": (request_counts, ("request_done", "request_abort", "request_failed")),
    "pauses": (lambda records, end: pause_rows(records), PAUSE_KINDS),
    "waste": (lambda records, end: scheduler_waste(records, end), WASTE_KINDS),
    "headroom": (headroom, HEADROOM_KINDS),  # reads the header first (routed to it like a record)
}
