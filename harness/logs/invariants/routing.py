"""Routing invariants: requests go only to routable ranks that hold weights, and no
request is lost or completed twice (an aborted request is dispatched again) (``routing``);
every dispatch goes where RLix's router sends it, and the ranks of one resize join routing
together (``routing_policy``); ``liveness``."""

from __future__ import annotations

from bisect import bisect_right
from typing import AbstractSet, Callable, Dict, FrozenSet, List, NamedTuple, Optional, Set, Tuple

from harness.logs.invariants.base import Records, Violation, invariant, known_whole
from harness.logs.invariants.hot_states import hot_bound
from harness.logs.invariants.waitfor import WAIT_KINDS, WAIT_SEES, GraphWalk, WaitGraph, caller_of, describe, wait_graph


class Completed:
    """The (pipeline, request) pairs completed so far, in memory bounded by the gaps: a
    pipeline's integer request ids are kept as sorted runs ``[first, last]`` (requests are
    numbered in order, so the runs are about as many as the requests still in flight),
    any other id in a set. A long run's completed requests are most of its records."""

    def __init__(self) -> None:
        self.runs: Dict[str, List[List[int]]] = {}  # pipeline -> sorted disjoint runs [first, last]
        self.other: Set[Tuple[object, object]] = set()

    def __contains__(self, req: Tuple[object, object]) -> bool:
        pid, n = req
        if type(n) is not int or not isinstance(pid, str):
            return req in self.other
        runs = self.runs.get(pid)
        if not runs or n > runs[-1][1]:  # (past every run: a request not completed yet, the usual case)
            return False
        i = bisect_right(runs, [n, float("inf")]) - 1
        return i >= 0 and runs[i][0] <= n <= runs[i][1]

    def add(self, req: Tuple[object, object]) -> bool:
        """Mark ``req`` completed; whether it was not already (one search answers both:
        ``routing`` asks at each completion whether it is a second one)."""
        pid, n = req
        if type(n) is not int or not isinstance(pid, str):
            if req in self.other:
                return False
            self.other.add(req)
            return True
        runs = self.runs.get(pid)
        if runs is None:
            self.runs[pid] = [[n, n]]
            return True
        top = runs[-1]
        if n > top[1]:  # past every run (the usual case: the highest completed, or about to be)
            if top[1] == n - 1:
                top[1] = n
            else:
                runs.append([n, n])
            return True
        i = bisect_right(runs, [n, float("inf")])  # runs[:i] start at or before n
        if i > 0 and runs[i - 1][1] >= n:
            return False  # inside the run that starts at or before it: completed already
        joins_left = i > 0 and runs[i - 1][1] == n - 1
        joins_right = i < len(runs) and runs[i][0] == n + 1
        if joins_left and joins_right:
            runs[i - 1][1] = runs[i][1]
            del runs[i]
        elif joins_left:
            runs[i - 1][1] = n
        elif joins_right:
            runs[i][0] = n
        else:
            runs.insert(i, [n, n])
        return True


@invariant("routing", reads=("rank_state", "request_dispatch", "request_done", "request_abort"))
def routing(records: Records) -> List[Violation]:
    out: List[Violation] = []
    state: Dict[Tuple[str, int], str] = {}
    inflight: Dict[Tuple[str, int], int] = {}  # (pipeline, request) -> rank
    done = Completed()
    for r in records:
        k = r["kind"]
        if k == "rank_state":
            state[(r["pipeline_id"], r["dp_rank"])] = r["state"]
        elif k == "request_dispatch":
            key, req = (r["pipeline_id"], r["dp_rank"]), (r["pipeline_id"], r["request"])
            if state.get(key) != "routable":
                out.append(
                    Violation(
                        "routing",
                        r["seq"],
                        f"request {req[1]} dispatched to {key[0]} dp{key[1]} in state {state.get(key, 'unknown')}",
                    )
                )
            if r.get("version") is None:
                out.append(
                    Violation(
                        "routing",
                        r["seq"],
                        f"request {req[1]} dispatched to {key[0]} dp{key[1]}, which holds no weights",
                    )
                )
            if req in done:
                out.append(
                    Violation("routing", r["seq"], f"request {req[1]} of {req[0]} dispatched after it completed")
                )
            if req in inflight:
                out.append(Violation("routing", r["seq"], f"request {req[1]} of {req[0]} dispatched twice"))
            inflight[req] = r["dp_rank"]
        elif k == "request_done":
            req = (r["pipeline_id"], r["request"])
            twice = not done.add(req)  # (added before the check below: it reads only inflight)
            if twice:
                out.append(Violation("routing", r["seq"], f"request {req[1]} of {req[0]} completed twice"))
            if inflight.pop(req, None) != r["dp_rank"]:
                out.append(
                    Violation(
                        "routing",
                        r["seq"],
                        f"request {req[1]} of {req[0]} completed on dp{r['dp_rank']} where it was not running",
                    )
                )
        elif k == "request_abort":
            req = (r["pipeline_id"], r["request"])
            if inflight.pop(req, None) is None:
                out.append(Violation("routing", r["seq"], f"request {req[1]} of {req[0]} aborted while not running"))
    return out


_NO_RANKS: FrozenSet[int] = frozenset()  # a pipeline none of whose ranks was ever routable


def _note_dp_size(sizes: Dict[str, int], r: dict) -> None:
    """A ``register`` record's inference DP ranks into ``sizes``: len(actor_infer mapping) / tp."""
    mapping = r["cluster_device_mappings"].get("actor_infer")
    tp = r["cluster_tp_configs"].get("actor_infer") or 1
    if mapping:
        sizes[r["pipeline_id"]] = len(mapping) // tp


@invariant("routing_policy", reads=("register", "rank_state", "effect_start", "effect_end", "request_dispatch"))
def routing_policy(records: Records) -> List[Violation]:
    """Each dispatch goes to the rank RLix's router picks given the routable set at that
    moment — round robin per request, one cursor over the DP indices 0..dp_size-1 that
    skips ranks not routable (NeMo ``_select_next_active_dp_rank``) — and the ranks of
    one ``Activate`` join routing together: no request is routed while some of them are
    routable and others not yet. The cursor is rebuilt from the log alone (it starts at
    0 and moves past every rank a dispatch went to); after a wrong dispatch it follows
    the rank actually used, and the wrong dispatches of one routable set are reported
    once, with their count. A pipeline's size is its registration's at the dispatch (read
    in the same pass: the check runs online, harness/logs/invariants/online.py)."""
    out: List[Violation] = []
    sizes: Dict[str, int] = {}
    routable: Dict[str, Set[int]] = {}
    cursor: Dict[str, int] = {}
    joining: Dict[str, Tuple[int, Set[int]]] = {}  # pipeline -> (seq of Activate start, its ranks)
    wrong: Dict[str, List] = {}  # pipeline -> [first violation seq, message, count] for the current set

    def flush(pid: str) -> None:
        w = wrong.pop(pid, None)
        if w is not None:
            extra = f" ({w[2]} dispatches off the round robin while this set was routable)" if w[2] > 1 else ""
            out.append(Violation("routing_policy", w[0], w[1] + extra))

    for r in records:
        k = r["kind"]
        if k == "register":
            _note_dp_size(sizes, r)
        elif k == "rank_state":
            pid, dp = r["pipeline_id"], r["dp_rank"]
            ranks = routable.setdefault(pid, set())
            was = dp in ranks
            (ranks.add if r["state"] == "routable" else ranks.discard)(dp)
            if was != (dp in ranks):
                flush(pid)
        elif k == "effect_start" and r["effect"] == "Activate":
            joining[r["pipeline_id"]] = (r["seq"], set(r["args"]["ranks"]))
        elif k == "effect_end" and r["effect"] == "Activate":
            joining.pop(r["pipeline_id"], None)
        elif k == "request_dispatch":
            pid, dp = r["pipeline_id"], r["dp_rank"]
            serving: AbstractSet[int] = routable.get(pid, _NO_RANKS)
            join = joining.get(pid)
            if join is not None and join[1] & serving and not join[1] <= serving:
                out.append(
                    Violation(
                        "routing_policy",
                        r["seq"],
                        f"request {r['request']} of {pid} routed while the ranks {sorted(join[1])} of one "
                        f"Activate (seq {join[0]}) join routing one at a time: only {sorted(join[1] & serving)} routable",
                    )
                )
            n = sizes.get(pid)
            if not n or not serving:
                continue  # unknown pipeline size, or nothing routable (the routing check reports that)
            at = cursor.get(pid, 0)  # (always below n)
            # the cursor's own rank when routable (most dispatches), else the next routable one
            expected = at if at in serving else next(((at + i) % n for i in range(n) if (at + i) % n in serving), None)
            if expected is not None and dp != expected:
                w = wrong.get(pid)
                if w is None:
                    wrong[pid] = [
                        r["seq"],
                        f"request {r['request']} of {pid} routed to dp{dp}; round robin from cursor "
                        f"{at} over routable {sorted(serving)} sends it to dp{expected}",
                        1,
                    ]
                else:
                    w[2] += 1
            cursor[pid] = (dp + 1) % n
    for pid in sorted(wrong):
        flush(pid)
    return out


#: How long a waiter must have waited, with its pipeline showing no progress, for a run
#: cut by its horizon to count it as stalled: RLix's longest fail-fast deadline
#: (``RLIX_NOTIFY_READY_TIMEOUT_S``, 300 s) by default; a log whose header carries the
#: scenario's own deadlines (``meta.timeouts``) uses the longest of those
#: (harness/logs/invariants/hot_states.py ``hot_bound``). Anything shorter is a run still going.
STALL_WINDOW_S = DEFAULT_STALL_WINDOW_S = 300.0

# records that show a pipeline is still moving: work finished, a batch taken
_PROGRESS_KINDS = ("request_done", "batch_consumed", "effect_end")


def _chain_of(graph: WaitGraph, start: dict) -> str:
    """ "; chain of waits: ..." for an effect that waits in the wait-for graph, else ""."""
    chain = graph.chain(caller_of(start))
    return f"; chain of waits: {describe(chain, graph.exited)}" if chain else ""


def _ends_at_horizon(records: Records) -> bool:
    """Whether the log's last ``sim_end`` (the one the walk below keeps) says ``horizon``:
    found from the end, so a finished million-record run skips the walk at once."""
    for r in reversed(records):
        if r["kind"] == "sim_end":
            return r["reason"] == "horizon"
    return False


@invariant(
    "liveness",
    reads=(
        "effect_start",
        "effect_end",
        "enqueued",
        "release_pending",
        "signalled",
        "sim_end",
        "register",
        "request_done",
        "batch_consumed",
    ),
    sees=("header",) + WAIT_KINDS + WAIT_SEES,
)
def liveness(records: Records) -> List[Violation]:
    """Every pending request and planned release is eventually signalled (or errored).

    Reaching the horizon is an outcome of its own, not a finding: a run cut while it was
    progressing passes. A waiter left at the horizon is a stall only when it has waited at
    least :data:`STALL_WINDOW_S` and its pipeline logged no progress (a request done, a batch
    consumed, an effect ended) during that last window: then nothing was going to release it.
    An open effect that waits in the wait-for graph (a coordinator-lock acquire) names its
    chain of waits (harness/logs/invariants/waitfor.py)."""
    if known_whole(records) and not _ends_at_horizon(records):
        return []  # the walk below finds a stall only in a run cut by its horizon
    # online (a view read once) the wait-for graph is built in this pass, for the chains
    # of waits a finding names; a whole log builds it only when an effect stalled
    walk = None if known_whole(records) else GraphWalk(records[0])
    return _liveness(records, walk, None)


def liveness_beside_graph(records: Records, graph: Callable[[], WaitGraph]) -> List[Violation]:
    """:func:`liveness` of an online view whose wait-for graph another pass builds from
    the same log (the oracle's shared one, harness/logs/invariants/online.py): ``graph()``
    returns it once the log has ended. The graph :func:`liveness` builds in its own pass
    is the same one: it reads only the kinds ``wait_graph``'s checks see, which this
    check sees too (all of them, in log order), and the log's last record."""
    return _liveness(records, None, graph)


def _liveness(
    records: Records, walk: Optional[GraphWalk], shared: Optional[Callable[[], WaitGraph]]
) -> List[Violation]:
    window = hot_bound(records)
    out: List[Violation] = []
    waits = _walk_waits(records, walk)
    end = waits.end
    if end is None or end["reason"] != "horizon":
        return out
    cutoff = end["t"] - window
    out += _stalled_requests(waits, end, window, cutoff)
    graph: List[WaitGraph] = []  # built once, only when an effect stalled
    for (pid, effect, scope), start in sorted(waits.open_effects.items()):
        if _stalled(waits.last_progress, cutoff, pid, start["t"]):
            if not graph:
                if shared is not None:
                    graph.append(shared())
                else:
                    graph.append(wait_graph(records) if walk is None else walk.graph(records[-1]))
            step = f" of step {start['step']}" if start.get("step") is not None else ""
            out.append(
                Violation(
                    "liveness",
                    end["seq"],
                    f"{pid} stuck in {effect}{step} since t={start['t']:.1f}s "
                    f"with no progress in the last {window:g} s{_chain_of(graph[0], start)}",
                )
            )
    return out


class _Waits(NamedTuple):
    """What :func:`liveness` reads in its one pass over the log."""

    waiting: Dict[int, Tuple[int, float, str, str]]  # request id -> (seq, t, cluster, what)
    open_effects: Dict[Tuple[str, str, str], dict]  # (pipeline, effect, scope) -> its effect_start
    last_progress: Dict[str, float]  # pipeline -> t of its last progress record
    pipelines: List[str]  # the registered pipelines, in log order
    end: Optional[dict]  # the last sim_end


def _walk_waits(records: Records, walk: Optional[GraphWalk]) -> _Waits:
    """The requests and releases still waiting, the effects still open and each
    pipeline's last progress at the end of the log (feeding ``walk`` every record)."""
    waiting: Dict[int, Tuple[int, float, str, str]] = {}
    open_effects: Dict[Tuple[str, str, str], dict] = {}
    last_progress: Dict[str, float] = {}
    pipelines: List[str] = []
    end = None
    for r in records:
        k = r["kind"]
        if walk is not None:
            walk.on(r)
        if k in _PROGRESS_KINDS and "pipeline_id" in r:
            last_progress[r["pipeline_id"]] = r["t"]
        if k in ("effect_start", "effect_end"):
            key = (r["pipeline_id"], r["effect"], r.get("scope", ""))
            if k == "effect_start":
                open_effects[key] = r
            else:
                open_effects.pop(key, None)
        elif k == "register":
            pipelines.append(r["pipeline_id"])
        elif k == "enqueued":
            waiting[r["request_id"]] = (
                r["seq"],
                r["t"],
                r["cluster_id"],
                f"request of {r['cluster_id']} at {r['priority']}",
            )
        elif k == "release_pending":
            waiting[r["request_id"]] = (r["seq"], r["t"], r["cluster_id"], f"await_release of {r['cluster_id']}")
        elif k == "signalled":
            waiting.pop(r["request_id"], None)
        elif k == "sim_end":
            end = r
    return _Waits(waiting, open_effects, last_progress, pipelines, end)


def _stalled(last_progress: Dict[str, float], cutoff: float, pid: str, since: float) -> bool:
    """Whether a wait of ``pid`` since ``since`` spans the last window with no progress of it."""
    return since <= cutoff and last_progress.get(pid, float("-inf")) <= cutoff


def _stalled_requests(waits: _Waits, end: dict, window: float, cutoff: float) -> List[Violation]:
    """The requests and planned releases whose pipeline stalled while they waited."""
    pipelines = waits.pipelines

    def owner(cluster_id: str) -> str:
        # cluster ids are "<pipeline>_<cluster>"; a log without its register records falls
        # back on the cluster names every pipeline has (actor_train, actor_infer)
        return next((p for p in pipelines if cluster_id.startswith(p + "_")), cluster_id.rsplit("_actor_", 1)[0])

    out: List[Violation] = []
    for rid, (seq, t, cid, what) in sorted(waits.waiting.items()):
        if _stalled(waits.last_progress, cutoff, owner(cid), t):
            out.append(
                Violation(
                    "liveness",
                    end["seq"],
                    f"{what} (request {rid}, enqueued at seq {seq}, t={t:.1f}s) "
                    f"never returned; its pipeline made no progress in the last {window:g} s",
                )
            )
    return out
