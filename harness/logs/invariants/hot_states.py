"""Liveness monitors, hot and cold (as in Coyote's liveness mode and TigerBeetle's): a
state that must be left is *hot*, and a run in which one stays hot longer than its bound
is a finding even though no safety check fails.

* ``hot_state``: every open wait of the wait-for graph but the scheduler's (a group's
  rendezvous join, a broadcast, a receive, a coordinator- or cache-lock acquire:
  harness/logs/invariants/waitfor.py, waitfor_edges.py) is hot. One still open at the end
  of the log, older than the bound, is a finding naming the state and the chain of waits
  that holds it (one finding per pipeline: its oldest hot wait, and how many other members
  are hot). ``deadlock`` and ``lost_wakeup`` say *why* a wait can never end; this says that
  it has not, whatever the reason (a member that never came is neither).
* ``livelock``: a pipeline whose rollouts keep finishing while no training step completes
  (a batch consumed, a single controller's trainer step finished): a request finished
  more than the bound after the last step (or the registration): work done, no progress.
  A pipeline that stopped finishing requests is stalled, not livelocked (``liveness``). The general ``liveness`` check cannot see it (requests
  finishing are progress to it), nor can a horizon: the run is cut while busy.

Pending scheduler requests, await-release (the graph's scheduler waits, which it marks
not hot), open pipeline effects (a step, a resize, a sync) stay ``liveness``'s (harness/logs/invariants/routing.py): it already judges them over the
same window, with "no progress" as its second condition.

The bound is derived from the scenario's timeouts: the longest fail-fast deadline any one
wait of the modelled system has (RLix's await-release, resize-lock, selective-sync and
shrink-drain limits), which the simulator writes into the header's ``meta.timeouts`` when a
scenario changes them; without it, RLix's defaults (300 s, the longest). A state hot for
longer than every deadline would have ended it is one no deadline is watching.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from harness.logs.invariants.base import Records, Violation, invariant, known_whole
from harness.logs.invariants.waitfor import WAIT_KINDS, WAIT_SEES, describe, wait_graph

#: RLix's default deadlines (RLIX_NOTIFY_READY_TIMEOUT_S 300, RLIX_RESIZE_LOCK_TIMEOUT_S 180,
#: ROLL_SELECTIVE_MODEL_UPDATE_TIMEOUT_S 150, the shrink drain's 30): the bound is the longest
DEFAULT_TIMEOUTS_S = {
    "await_release_s": 300.0,
    "resize_lock_s": 180.0,
    "selective_sync_s": 150.0,
    "shrink_drain_s": 30.0,
}


def hot_bound(records: Records) -> float:
    """The longest deadline of the run's timeouts (header ``meta.timeouts``, else RLix's defaults)."""
    head = records[0] if records and records[0].get("kind") == "header" else {}
    timeouts = (head.get("meta") or {}).get("timeouts") or DEFAULT_TIMEOUTS_S
    return max(float(v) for v in timeouts.values())


@invariant("hot_state", reads=WAIT_KINDS, sees=WAIT_SEES)
def hot_state(records: Records) -> List[Violation]:
    bound = hot_bound(records)
    g = wait_graph(records)
    hot: Dict[str, List] = {}  # pipeline -> its waits hot for longer than the bound, oldest first
    for w in g.waits:
        if w.hot and g.end_t - w.t > bound:
            hot.setdefault(w.waiter.split("/", 1)[0], []).append(w)
    out: List[Violation] = []
    for pid, waits in sorted(hot.items()):
        w = min(waits, key=lambda x: (x.t, x.seq))
        others = len({x.waiter for x in waits}) - 1
        out.append(
            Violation(
                "hot_state",
                g.end_seq,
                f"{w.waiter} hot in the {w.what} since t={w.t:.1f}s (seq {w.seq}): "
                f"{g.end_t - w.t:.1f} s, over the {bound:g} s bound (the longest timeout)"
                f"{f', with {others} other member(s) of {pid} hot' if others else ''}; "
                f"chain of waits: {describe(g.chain(w.waiter), g.exited)}",
            )
        )
    return out


_STEP_KINDS = ("batch_consumed", "trainer_step")


def _every_pipeline_left(records: Records) -> bool:
    """Whether every pipeline that registered also unregistered (or the log has no
    ``sim_end``): then :func:`livelock` finds nothing, and a finished million-record run
    need not walk its request records to learn it."""
    registered, gone, ended = set(), set(), False
    for r in records:
        k = r.get("kind")
        if k == "register":
            registered.add(r.get("pipeline_id"))
        elif k == "unregister":
            gone.add(r.get("pipeline_id"))
        elif k == "sim_end":
            ended = True
    return not ended or registered <= gone


@invariant(
    "livelock",
    reads=("request_done", "batch_consumed", "trainer_step"),
    sees=("header", "register", "unregister", "sim_end"),
)
def livelock(records: Records) -> List[Violation]:
    bound = hot_bound(records)
    if known_whole(records) and _every_pipeline_left(records):
        return []  # a finding names a pipeline still registered at the end: none is
    since: Dict[str, float] = {}  # pipeline -> when its last step completed (or it registered)
    done: Dict[str, int] = {}  # pipeline -> requests finished since then
    first_done: Dict[str, Optional[float]] = {}
    last_done: Dict[str, float] = {}
    gone = set()
    end = None
    for r in records:
        k = r.get("kind")
        pid = r.get("pipeline_id")
        if k == "register":
            since[pid], done[pid], first_done[pid] = r["t"], 0, None
        elif k == "unregister":
            gone.add(pid)
        elif k == "request_done" and pid in since:
            done[pid] += 1
            last_done[pid] = r["t"]
            if first_done[pid] is None:
                first_done[pid] = r["t"]
        elif k in _STEP_KINDS and pid in since and (k == "batch_consumed" or r.get("action") == "finish"):
            since[pid], done[pid], first_done[pid] = r["t"], 0, None
        elif k == "sim_end":
            end = r
    if end is None:
        return []
    out = []
    for pid in sorted(since):
        busy_since = first_done[pid]
        # still working more than the bound after its last step: a stall (nothing finishing) is liveness's
        if pid in gone or busy_since is None or last_done[pid] - since[pid] <= bound:
            continue
        out.append(
            Violation(
                "livelock",
                end["seq"],
                f"{pid} livelocked: {done[pid]} request(s) finished from t={busy_since:.1f}s to "
                f"t={last_done[pid]:.1f}s and no training step completed since t={since[pid]:.1f}s "
                f"(run end t={end['t']:.1f}s, {end['reason']}): busy with no progress for over the "
                f"{bound:g} s bound",
            )
        )
    return out
