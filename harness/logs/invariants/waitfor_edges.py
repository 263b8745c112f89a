"""Wait-for edges of the scheduler and of the cache owner's lock, rebuilt from the records.

The scheduler's waits (none of their records names a waiter process, so the waiter is
the call whose effect was open when the record came):

* a request (``enqueued`` .. its ``signalled``): the caller of the pipeline's open
  ``RequestGpus`` / ``ReleaseThenRequest`` effect for that cluster (else
  ``pid/request:<cluster>``, e.g. NeMo's GENERATION watchdog, which calls without an
  effect) waits on ``scheduler``, which must plan a cycle that grants it. A
  non-GENERATION request needs its whole device mapping (RLix's Phase 2), so it also waits
  on the holder of every non-GENERATION allocation on a GPU of that mapping: the call that
  was granted it (GENERATION ranks are the scheduler's to shrink, so they are no one's
  wait). Holdings are the decisions' (:class:`~harness.logs.invariants.allocations.DecisionWalk`).
* an ``await_release`` (``release_pending`` .. its ``signalled``): the caller of the open
  ``AwaitRelease`` effect (else ``pid/await_release``: the shutdown's, which the simulator
  does not log as an effect) waits on ``scheduler`` for the ack.
* the scheduler, while a resize call is in flight (``resize_start`` .. ``resize_end``),
  waits on that call, ``pid/<shrink|expand>@cycleN``: RLix's loop awaits its
  ``resize_infer`` calls before it commits, and the call takes the coordinator lock, so a
  request can wait through the scheduler on a pipeline's lock holder.

Lost wakeups: ``scheduler_failed`` is the scheduler's exit (every wait still on it was
never errored); a request or await-release of a pipeline still open after that
pipeline's ``unregister`` (which errors its waiters); an await-release still open after
its cluster held no GPU at a commit or was ``released`` (the ack was due there).

The cache lock (RLix's ``_cache_lock`` on the cache owner): a ``BuildCache``,
``PromoteCache`` or ``SyncFromCache`` effect takes it as its first act, so one started and
not yet followed by its ``cache_lock`` acquire (holder build|promote|sync) waits on the
call whose effect holds the lock. One left with the lock free, after a release that came
after it queued and before the end of the log, was never handed the lock: a lost wakeup.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from harness.logs.invariants.allocations import DECISION_KINDS, GENERATION, DecisionWalk, pipeline_of
from harness.logs.invariants.waitgraph import Wait, WaitGraph, caller_of

SCHEDULER = "scheduler"
#: records the scheduler's waits open and close by (read), and keep state from (seen)
SCHED_READS = ("enqueued", "release_pending", "signalled", "resize_start", "resize_end", "scheduler_failed")
SCHED_SEES = DECISION_KINDS
REQUEST_EFFECTS = frozenset(("RequestGpus", "ReleaseThenRequest", "AwaitRelease"))
CACHE_EFFECTS = {"BuildCache": "build", "PromoteCache": "promote", "SyncFromCache": "sync"}


def _cluster_name(cid: str) -> str:
    return cid[len(pipeline_of(cid)) + 1 :]


class SchedulerWaits(DecisionWalk):
    """Fed the scheduler's records and the request effects in log order (:meth:`track`),
    then :meth:`into` a graph. Effects are kept here, not walked: they change no holdings."""

    def __init__(self, header: Optional[dict]) -> None:
        super().__init__([header] if header is not None else [])
        self.calls: Dict[Tuple[str, str], str] = {}  # (pipeline, cluster name | "await") -> caller of the open effect
        self.open: Dict[int, dict] = {}  # request id -> {rec, waiter, what, owed, freed}
        self.holder: Dict[str, str] = {}  # cluster -> the call its allocation was granted to
        self.resizes: Dict[Tuple[int, str, str], dict] = {}  # (cycle, pipeline, phase) -> resize_start
        self.failed: Optional[int] = None  # seq of scheduler_failed

    def effect(self, r: dict) -> None:
        args = r.get("args") or {}
        name = "await" if r["effect"] == "AwaitRelease" else args.get("cluster") or args.get("request_cluster")
        key = (r["pipeline_id"], name)
        if r["kind"] == "effect_start":
            self.calls[key] = caller_of(r)
        else:
            self.calls.pop(key, None)

    def track(self, r: dict) -> None:
        """One record: the walk's hook, then its effect on the holdings."""
        self.on_record(r)
        self.apply(r)

    def on_record(self, r: dict) -> None:
        k = r["kind"]
        if k == "enqueued":
            cid = r["cluster_id"]
            pid, name = pipeline_of(cid), _cluster_name(cid)
            waiter = self.calls.get((pid, name), f"{pid}/request:{name}")
            self.open[r["request_id"]] = {
                "rec": r,
                "waiter": waiter,
                "owed": None,
                "freed": None,
                "what": f"request {r['request_id']} of {cid} at {r['priority']}",
            }
        elif k == "release_pending":
            pid = pipeline_of(r["cluster_id"])
            self.open[r["request_id"]] = {
                "rec": r,
                "waiter": self.calls.get((pid, "await"), f"{pid}/await_release"),
                "owed": None,
                "freed": None,
                "what": f"await_release of {r['cluster_id']} (request {r['request_id']})",
            }
        elif k == "signalled":
            w = self.open.pop(r["request_id"], None)
            if w is not None and r["waiter"] == "request" and r["gpus"] and not r.get("error"):
                self.holder[r["cluster_id"]] = w["waiter"]
        elif k == "resize_start":
            self.resizes[(r["cycle"], r["pipeline_id"], r["phase"])] = r
        elif k == "resize_end":
            self.resizes.pop((r["cycle"], r["pipeline_id"], r["phase"]), None)
        elif k == "scheduler_failed":
            self.failed = r["seq"]
        elif k == "unregister":
            for w in self.open.values():
                if w["owed"] is None and pipeline_of(w["rec"]["cluster_id"]) == r["pipeline_id"]:
                    w["owed"] = f"{r['pipeline_id']} unregistered at seq {r['seq']} without signalling it"
        elif k == "released":
            self._freed(r["cluster_id"], f"released at seq {r['seq']}")

    def after_commit(self, plan: dict, commit: dict) -> None:
        for w in self.open.values():
            cid = w["rec"]["cluster_id"]
            if w["rec"]["kind"] == "release_pending" and w["freed"] is None and not self.h.held(cid):
                w["freed"] = (
                    f"its cluster {cid} held no GPU after the commit of cycle {commit['cycle']} (seq {commit['seq']}), which did not ack it"
                )

    def _freed(self, cid: str, how: str) -> None:
        for w in self.open.values():
            if w["rec"]["kind"] == "release_pending" and w["freed"] is None and w["rec"]["cluster_id"] == cid:
                w["freed"] = f"its cluster {cid} was {how} and the release never acked"

    def _holders(self, cid: str) -> Dict[str, List[int]]:
        """Who holds a GPU of ``cid``'s mapping in a non-GENERATION allocation: holder -> GPUs."""
        reg = self.h.registration(cid)
        out: Dict[str, List[int]] = {}
        for g in (reg.mapping(cid) if reg is not None else None) or ():
            owner = self.h.owner.get(g)
            if owner is not None and owner != cid and self.h.priority.get(owner, GENERATION) != GENERATION:
                out.setdefault(owner, []).append(g)
        return out

    def into(self, g: WaitGraph) -> None:
        if self.failed is not None:  # exited: it waits on nothing and wakes no one
            g.exited[SCHEDULER] = self.failed
        else:
            for (cycle, pid, phase), r in self.resizes.items():
                g.waits.append(
                    Wait(
                        SCHEDULER,
                        f"{pid}/{phase}@cycle{cycle}",
                        r["seq"],
                        r["t"],
                        f"{phase} resize of cycle {cycle}",
                        hot=False,
                    )
                )
        for w in self.open.values():
            r, me = w["rec"], w["waiter"]
            wait = Wait(me, SCHEDULER, r["seq"], r["t"], w["what"], hot=False)
            g.waits.append(wait)
            if r["kind"] == "enqueued" and r["priority"] != GENERATION:
                for owner, gpus in sorted(self._holders(r["cluster_id"]).items()):
                    held = self.holder.get(owner, f"{pipeline_of(owner)}/{_cluster_name(owner)}")
                    g.waits.append(
                        Wait(me, held, r["seq"], r["t"], f"{w['what']}: GPUs {gpus} held by {owner}", hot=False)
                    )
            for why in (w["owed"], w["freed"]):
                if why is not None:
                    g.unwoken.append((wait, why))


class CacheLockWaits:
    """Each cache owner's lock, from its ``cache_lock`` records and the effects that take it."""

    def __init__(self) -> None:
        self.open: Dict[Tuple[str, str], List[list]] = {}  # (pipeline, what) -> [[effect_start, caller, acquired]]
        self.holder: Dict[str, Tuple[str, str]] = {}  # pipeline -> (what, caller holding)
        self.released: Dict[str, Tuple[int, float]] = {}  # pipeline -> (seq, t) of its last release

    def effect(self, r: dict) -> None:
        key, me = (r["pipeline_id"], CACHE_EFFECTS[r["effect"]]), caller_of(r)
        entries = self.open.setdefault(key, [])
        if r["kind"] == "effect_start":
            entries.append([r, me, False])
            return
        for i, e in enumerate(entries):
            if e[1] == me:
                del entries[i]
                return

    def lock(self, r: dict) -> None:
        pid = r.get("pipeline_id")
        if pid is None:  # a gate rank's cache: no effects name its callers
            return
        what = r["holder"]
        if r["action"] == "acquire":
            entries = self.open.get((pid, what), [])
            e = next((e for e in entries if not e[2]), None)
            if e is not None:
                e[2] = True
            self.holder[pid] = (what, e[1] if e is not None else f"{pid}/{what}")
        else:
            self.holder.pop(pid, None)
            self.released[pid] = (r["seq"], r["t"])

    def into(self, g: WaitGraph) -> None:
        for (pid, what), entries in self.open.items():
            for r, me, acquired in entries:
                if acquired:
                    continue
                held = self.holder.get(pid)
                text = f"cache lock of {pid} for its {what}"
                if held is not None:
                    g.waits.append(Wait(me, held[1], r["seq"], r["t"], f"{text} (held by its {held[0]})"))
                    continue
                last = self.released.get(pid)
                if last is not None and last[0] > r["seq"] and last[1] < g.end_t:
                    g.unwoken.append(
                        (
                            Wait(me, pid, r["seq"], r["t"], text),
                            f"its last holder released it at seq {last[0]} without handing it on: "
                            f"free, and the waiter never woken",
                        )
                    )
