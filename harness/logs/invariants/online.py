"""The invariant oracle, online: records go in a chunk at a time, findings come out at the end.

``check_log(records)`` needs the whole log in memory; :class:`OnlineOracle` reads it as
it is made (a :class:`~harness.logs.stream.StreamedLog` consumer) or as it is read
from a file, and returns exactly what ``run_checks`` returns on the same records — the
same findings in the same order (tests/unit/test_online_oracle.py holds the two to it on
bundled logs, broken ones included).

Each check keeps only its own state. A check is a function over the records of the
kinds it ``sees`` (plus the log's first and last record), and nearly every one reads
them in a single pass: ``for r in records``, with ``records[0]`` (the header) read
first. Such a check runs unchanged over a :class:`OnePassView` — an iterable that
yields the records as they arrive — in a thread of its own that the oracle hands each
chunk's records to and waits for (only one thread runs at a time, so a check sees what a
batch run sees, in the same order; the hand-off costs two thread switches per check per
chunk). What it keeps is what its loop keeps: per GPU, rank, request in flight, open
interval. The records themselves are dropped once every check has read them.

A check that reads its records more than once (a first pass for the registrations, then
the main loop) or reads the log's end before it reaches it is named in
:data:`WHOLE_HISTORY`, with why: for it the oracle keeps the records of the kinds it
sees — scheduler and lifecycle records, a few percent of a long run's log (none keeps
``vram`` or request records) — and runs it at the end. A check that breaks the
one-pass rules anyway fails loudly (:class:`NotOnePass`), never silently.
"""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, Iterable, List, Optional

from harness.logs.invariants import CHECKS, SEES, Violation, merge_findings
from harness.logs.invariants.waitfor import on_graph, wait_graph
from harness.logs.one_pass import NotOnePass, OnePassRun, OnePassView, abandon  # noqa: F401 (re-exported)

#: checks that need their kinds' whole history in memory, and why (see the module doc)
WHOLE_HISTORY: Dict[str, str] = {}
#: checks that read the log only through its wait-for graph (and the header): the graph
#: is built once, in one pass, for all of them, as the batch oracle shares it
#: (harness/logs/invariants/waitfor.py ``wait_graph``), then each runs on the graph at the end
SHARED_GRAPH = ("deadlock", "lost_wakeup", "hot_state")
_GRAPH = "(wait-for graph)"


class OnlineOracle:
    """``run_checks`` over records fed a chunk at a time (``oracle(chunk)``: a
    :class:`~harness.logs.stream.StreamedLog` consumer); :meth:`finish` returns each
    named check's findings, as ``run_checks`` does on the whole list."""

    def __init__(self, names: Optional[Iterable[str]] = None) -> None:
        self.names = list(CHECKS) if names is None else list(names)
        unknown = [n for n in self.names if n not in CHECKS]
        if unknown:
            raise KeyError(f"unknown invariant(s) {unknown}; known: {', '.join(sorted(CHECKS))}")
        self._sets = {name: SEES.get(name) for name in self.names}
        self._first: Optional[Dict[str, Any]] = None
        self._last: Optional[Dict[str, Any]] = None
        self._runners: Dict[str, OnePassRun] = {}
        self._kept: Dict[Optional[FrozenSet[str]], List[Dict[str, Any]]] = {}  # WHOLE_HISTORY checks' views
        self._routes: Dict[str, tuple] = {}
        self.count = 0

    def _start(self, first: Dict[str, Any]) -> None:
        self._first = first
        kept_sets = {self._sets[n] for n in self.names if n in WHOLE_HISTORY}
        self._kept = {kinds: [] for kinds in kept_sets}
        own = [n for n in self.names if n not in WHOLE_HISTORY]
        self._on_graph = [n for n in own if n in SHARED_GRAPH and SEES.get(n) == SEES.get(SHARED_GRAPH[0])]
        self._runners = {n: OnePassRun(CHECKS[n], first, n) for n in own if n not in self._on_graph}
        if self._on_graph:
            self._runners[_GRAPH] = OnePassRun(wait_graph, first, _GRAPH)
            self._sets[_GRAPH] = self._sets[self._on_graph[0]]
        self._streamed_sets = {self._sets[n] for n in self._runners}

    def __call__(self, chunk: List[Dict[str, Any]]) -> None:
        if not chunk:
            return
        if self._first is None:
            self._start(chunk[0])
        self.count += len(chunk)
        self._last = chunk[-1]
        # one walk of the chunk splits it by the kinds each check sees (as kind_views does)
        batches: Dict[Optional[FrozenSet[str]], List[Dict[str, Any]]] = {k: [] for k in self._streamed_sets}
        appenders: Dict[str, list] = {}
        everything = []
        for kinds, view in list(batches.items()) + list(self._kept.items()):
            if kinds is None:
                everything.append(view.append)
                continue
            for kind in kinds:
                appenders.setdefault(kind, []).append(view.append)
        targets = {kind: tuple(fns) + tuple(everything) for kind, fns in appenders.items()}
        rest = tuple(everything)
        for r in chunk:
            for append in targets.get(r.get("kind"), rest):
                append(r)
        if chunk[0] is self._first:  # every view starts with the log's first record
            for view in list(batches.values()) + list(self._kept.values()):
                if not view or view[0] is not self._first:
                    view.insert(0, self._first)
        for name, runner in self._runners.items():
            batch = batches[self._sets[name]]
            if batch:
                runner.push(batch)

    def finish(self) -> Dict[str, List[Violation]]:
        """Each check's findings (by check, in the order each found them)."""
        if self._first is None:  # an empty log: every view is empty
            return {name: CHECKS[name]([]) for name in self.names}
        last = self._last
        tail = [last] if last is not self._first else []
        for name, runner in self._runners.items():
            kinds = self._sets[name]
            if tail and kinds is not None and last.get("kind") not in kinds:
                runner.push(tail)  # every view ends with the log's last record
        for kinds, view in self._kept.items():
            if tail and view[-1] is not last:
                view.append(last)
        found: Dict[str, List[Violation]] = {}
        errors = []
        graph = None
        if _GRAPH in self._runners:
            try:
                graph = self._runners[_GRAPH].finish()
            except BaseException as e:  # noqa: BLE001 - every thread ends first
                errors.append(e)
        for name in self.names:
            if name in self._on_graph:
                if graph is not None:
                    found[name] = on_graph(CHECKS[name], graph, self._first, last)
            elif name in self._runners:
                try:
                    found[name] = list(self._runners[name].finish())
                except BaseException as e:  # noqa: BLE001 - every thread ends first
                    errors.append(e)
            else:
                found[name] = CHECKS[name](self._kept[self._sets[name]])
        if errors:
            raise errors[0]
        return found

    def close(self) -> None:
        """End every check's pass without reading it (the run failed before its end)."""
        abandon(self._runners.values())

    def findings(self) -> List[Violation]:
        """:func:`~harness.logs.invariants.check_log` of the records fed: every finding, merged."""
        return merge_findings(self.finish(), self.names)
