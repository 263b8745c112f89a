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
yields the records as they arrive — in a greenlet of its own (a coroutine, in the
oracle's thread) that the oracle hands each chunk's records to and waits for (the two
alternate, so a check sees what a batch run sees, in the same order; the hand-off costs
two greenlet switches per check per chunk). What it keeps is what its loop keeps: per GPU, rank, request in flight, open
interval. The records themselves are dropped once every check has read them. Each
chunk is split by kind once (each record's kind read once, then each set of kinds picks
its records by a numpy mask: :func:`~harness.logs.one_pass.pick_kinds`; the split is
shared with another reader of the same chunks, the outputs' view, through a
:class:`~harness.logs.one_pass.SplitOnce`), and checks that read the log only through one
structure made in a pass of it (the wait-for graph, the engines' table replay:
:data:`SHARED`) share that pass, as the checks that replay the scheduler's decisions
share one replay (:data:`DECISIONS`). (``rlharness simulate`` leaves ``handover_headroom`` out
and judges the summary headroom table's windows instead: simulators/run_streamed.py.)

A check that reads its records more than once (a first pass for the registrations, then
the main loop) or reads the log's end before it reaches it is named in
:data:`WHOLE_HISTORY`, with why: for it the oracle keeps the records of the kinds it
sees — scheduler and lifecycle records, a few percent of a long run's log (none keeps
``vram`` or request records) — and runs it at the end. A check that breaks the
one-pass rules anyway fails loudly (:class:`NotOnePass`), never silently.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional


from harness.logs.invariants import CHECKS, SEES, Violation, merge_findings, shared_walks
from harness.logs.invariants.decision_walks import run_walks
from harness.logs.invariants.engine_transition import engine_replay, on_replay
from harness.logs.invariants.routing import liveness, liveness_beside_graph
from harness.logs.invariants.waitfor import on_graph, wait_graph
from harness.logs.one_pass import NotOnePass, OnePassRun, OnePassView, abandon  # noqa: F401 (re-exported)
from harness.logs.one_pass import SplitOnce, pick_kinds

#: checks that need their kinds' whole history in memory, and why (see the module doc)
WHOLE_HISTORY: Dict[str, str] = {}
#: checks that read the log only through one structure made in one pass of it (and the
#: log's first and last record): the structure is made once, in one pass, for all of
#: them, as the batch oracle shares it, then each runs on it at the end. The wait-for
#: graph (harness/logs/invariants/waitfor.py ``wait_graph``) and the engines' table replay
#: (harness/logs/invariants/engine_transition.py ``engine_replay``): name -> (the pass,
#: a check on what it made, the checks)
GRAPH = "(wait-for graph)"
SHARED: Dict[str, tuple] = {
    GRAPH: (wait_graph, on_graph, ("deadlock", "lost_wakeup", "hot_state")),
    "(engine replay)": (engine_replay, on_replay, ("engine_transition", "engine_stood_down")),
}


#: the one walk of the scheduler's decisions the decision-walk checks share
#: (harness/logs/invariants/decision_walks.py): it makes every such check's findings
DECISIONS = "(decision walk)"


class OnlineOracle:
    """``run_checks`` over records fed a chunk at a time (``oracle(chunk)``: a
    :class:`~harness.logs.stream.StreamedLog` consumer); :meth:`finish` returns each
    named check's findings, as ``run_checks`` does on the whole list."""

    def __init__(
        self,
        names: Optional[Iterable[str]] = None,
        split: Optional[SplitOnce] = None,
    ) -> None:
        """``split``: the splitter of chunks by kind, shared with another reader of the
        same chunks (:class:`~harness.logs.one_pass.SplitOnce`)."""
        self.names = list(CHECKS) if names is None else list(names)
        unknown = [n for n in self.names if n not in CHECKS]
        if unknown:
            raise KeyError(f"unknown invariant(s) {unknown}; known: {', '.join(sorted(CHECKS))}")
        self._split = split if split is not None else SplitOnce()
        self._sets = {name: SEES.get(name) for name in self.names}
        self._first: Optional[Dict[str, Any]] = None
        self._last: Optional[Dict[str, Any]] = None
        self._runners: Dict[str, OnePassRun] = {}
        self._kept: Dict[Optional[FrozenSet[str]], List[Dict[str, Any]]] = {}  # WHOLE_HISTORY checks' views
        self._routes: Dict[str, tuple] = {}
        self._made: Dict[str, Any] = {}  # what each shared pass made, once the log has ended
        self.count = 0

    def _pass_of(self, name: str) -> Callable[[Any], List[Violation]]:
        """What check ``name``'s own pass runs: the check, or for ``liveness`` beside the
        shared wait-for graph's pass, the check reading that pass's graph (its own pass
        would build the same graph again)."""
        if name == "liveness" and CHECKS[name] is liveness and GRAPH in self._shared_of.values():
            return partial(liveness_beside_graph, graph=self._shared_graph)
        return CHECKS[name]

    def _shared_graph(self) -> Any:
        """The shared pass's wait-for graph, for ``liveness`` (asked at the log's end)."""
        if GRAPH not in self._made:
            raise RuntimeError("the shared wait-for graph pass failed before liveness asked for its graph")
        return self._made[GRAPH]

    def _start(self, first: Dict[str, Any]) -> None:
        self._first = first
        kept_sets = {self._sets[n] for n in self.names if n in WHOLE_HISTORY}
        self._kept = {kinds: [] for kinds in kept_sets}
        own = [n for n in self.names if n not in WHOLE_HISTORY]
        self._shared_of: Dict[str, str] = {}  # a check -> the shared pass it reads
        for shared, (_make, _on, checks) in SHARED.items():
            for n in own:
                if n in checks and SEES.get(n) == SEES.get(checks[0]):
                    self._shared_of[n] = shared
        walked, walked_kinds = shared_walks(own)
        for n in walked:
            self._shared_of[n] = DECISIONS
        self._runners = {n: OnePassRun(self._pass_of(n), first, n) for n in own if n not in self._shared_of}
        if walked:
            self._runners[DECISIONS] = OnePassRun(partial(run_walks, names=walked), first, DECISIONS)
            self._sets[DECISIONS] = walked_kinds
        for shared in sorted(set(self._shared_of.values()) - {DECISIONS}):
            self._runners[shared] = OnePassRun(SHARED[shared][0], first, shared)
            self._sets[shared] = self._sets[next(n for n, s in self._shared_of.items() if s == shared)]
        self._streamed_sets = {self._sets[n] for n in self._runners}

    def __call__(self, chunk: List[Dict[str, Any]]) -> None:
        if not chunk:
            return
        if self._first is None:
            self._start(chunk[0])
        self.count += len(chunk)
        self._last = chunk[-1]
        split = self._split(chunk)
        # the chunk split by the kinds each check sees (as kind_views does): each record's
        # kind read once, then each set of kinds picks its records by a numpy mask
        batches = {kinds: pick_kinds(split, kinds) for kinds in self._streamed_sets}
        for kinds, view in self._kept.items():
            view.extend(pick_kinds(split, kinds))
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
        made: Dict[str, Any] = self._made
        for shared in sorted(set(self._shared_of.values())):
            try:
                made[shared] = self._runners[shared].finish()
            except BaseException as e:  # noqa: BLE001 - every pass ends first
                errors.append(e)
        for name in self.names:
            if name in self._shared_of:
                shared = self._shared_of[name]
                if shared == DECISIONS:
                    if shared in made:
                        found[name] = made[shared][name]
                elif shared in made:
                    found[name] = SHARED[shared][1](CHECKS[name], made[shared], self._first, last)
            elif name in self._runners:
                try:
                    found[name] = list(self._runners[name].finish())
                except BaseException as e:  # noqa: BLE001 - every pass ends first
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
