"""The weight-sync groups' creation and first broadcast, member by member.

Before its first weight sync, a trainer with PP > 1 creates one process group per PP stage:
the stage's source rank plus every rollout engine, created by a rendezvous in which every
member blocks until all have joined. Each engine is an actor that serves one blocking join
at a time, in the order the join RPCs reach it. Then every stage's source broadcasts its
stage's weights on its group, while each engine receives one stage after the other on its
receiver communicator, and the trainer's PP ranks meet again (a barrier) before the step.

Nothing orders the join RPCs of different stages: each is its own message. The fixed order
delivers stage 0's first everywhere; an exploration seed (``--explore``) may deliver stage
0's first to engine 0 and stage 1's first to engine 1, and then each engine waits in its
join for the other (slime PR #2331). The switches of
:class:`simulators.scenario.spec.WeightSyncGroupsSpec` choose the buggy or the fixed behaviour of
each field report (docs/exploration.md#field-reports):

* ``join_order``: ``concurrent`` (every source sends its joins at once) or ``phased``
  (the global PP-rank phase order: stage s+1's joins go out once stage s's group exists);
* ``receiver_slot``: ``single`` (an engine keeps one active receiver communicator, so the
  last group created overwrites the others: vime PR #329) or ``per_group``;
* ``broadcast_timeout_s`` and ``join_timeout_s``: 0 waits forever (TRL PR #6913, NeMo RL
  PR #4019: a raw broadcast with no timeout after the receiver died), else the wait gives
  up at its limit and the run fails fast;
* ``engine_exits``: engine 0 dies just before it would post its first receive.

Every join, slot change, receive, broadcast and exit is a record (``rendezvous_join`` ...
``member_exit``, harness/eventlog/kinds_sync.py): the wait-for graph check
(harness/logs/invariants/waitfor.py) rebuilds who waits on whom from them alone.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import simpy

from simulators.scenario.spec import WeightSyncGroupsSpec

JOIN_ORDERS = ("concurrent", "phased")
RECEIVER_SLOTS = ("single", "per_group")


def check_spec(spec: WeightSyncGroupsSpec) -> Optional[Tuple[str, str]]:
    """(field, problem) of an invalid section, or None."""
    if spec.join_order not in JOIN_ORDERS:
        return "join_order", f"must be one of {', '.join(JOIN_ORDERS)}, got {spec.join_order!r}"
    if spec.receiver_slot not in RECEIVER_SLOTS:
        return "receiver_slot", f"must be one of {', '.join(RECEIVER_SLOTS)}, got {spec.receiver_slot!r}"
    return None


class _Broadcast:
    """One group's current broadcast round: who posted the receive, and the delivery."""

    def __init__(self, env: simpy.Environment) -> None:
        self.posted: List[str] = []
        self.all_posted = env.event()
        self.delivered = env.event()


class WeightSyncGroups:
    """The rendezvous and broadcasts of one pipeline's weight-sync groups (a process per
    source, per engine and per join RPC). ``done`` succeeds when every stage's broadcast
    reached every engine and the trainer's stages met again."""

    def __init__(self, sim, index: int, pid: str, spec: WeightSyncGroupsSpec) -> None:
        self.sim, self.env, self.index, self.pid, self.spec = sim, sim.env, index, pid, spec
        stages = range(spec.pp_stages)
        self.sources = [f"src{s}" for s in stages]
        self.engines = [f"eng{e}" for e in range(spec.engines)]
        self.groups = [f"pp{s}" for s in stages]  # group names: per pipeline (records carry pipeline_id)
        self.barrier = "train"
        self.members: Dict[str, List[str]] = {g: [self.sources[s]] + self.engines for s, g in enumerate(self.groups)}
        self.members[self.barrier] = list(self.sources)
        self.joined: Dict[str, List[str]] = {g: [] for g in self.members}
        self.ready = {g: self.env.event() for g in self.members}
        self.inbox = {e: simpy.Store(self.env) for e in self.engines}
        self.rounds = {g: _Broadcast(self.env) for g in self.groups}
        self.slots: Dict[str, Dict[int, str]] = {e: {} for e in self.engines}
        self.dead: List[str] = []
        self.done = self.env.event()
        self._finished = 0

    def start(self) -> None:
        for s in range(self.spec.pp_stages):
            self.env.spawn(self._source(s), "sync_member", self.index, 0, s)
        for e in range(self.spec.engines):
            self.env.spawn(self._engine(e), "sync_member", self.index, 1, e)

    def _emit(self, kind: str, **fields) -> None:
        self.sim.emit(kind, pipeline_id=self.pid, **fields)

    def _fail(self, what: str) -> None:
        self.sim.fail(f"{self.pid}: {what}")

    # ------------------------------------------------------------ rendezvous
    def _join(self, group: str, member: str, stage: Optional[int] = None):
        """Block until every member of ``group`` joined (or the join timeout): True if it exists."""
        self._emit("rendezvous_join", name=group, member=member, members=self.members[group], stage=stage)
        joined = self.joined[group]
        joined.append(member)
        if len(joined) == len(self.members[group]):
            self._emit("rendezvous_done", name=group, members=self.members[group])
            self.ready[group].succeed()
        limit = self.spec.join_timeout_s
        if not limit:
            yield self.ready[group]
            return True
        yield self.ready[group] | self.env.timeout(limit)
        if self.ready[group].triggered:
            return True
        self._emit("rendezvous_abort", name=group, member=member, error=f"join timed out after {limit:g} s")
        self._emit("timeout", what="weight_sync_join", limit_s=limit, since=self.env.now - limit)
        self._fail(f"{member}'s join of {group} timed out after {limit:g} s")
        return False

    def _rpc(self, group: str, engine: int):
        """One join RPC: its own message, so nothing orders it against another stage's (an
        exploration seed also adds its small RPC delay, simulators/runtime/explore.py)."""
        explorer = self.env.explorer
        yield self.env.timeout(self.spec.rpc_latency_s + (0.0 if explorer is None else explorer.delay()))
        yield self.inbox[self.engines[engine]].put(group)

    # ------------------------------------------------------------ the members
    def _source(self, s: int):
        group, me = self.groups[s], self.sources[s]
        if self.spec.join_order == "phased" and s > 0:
            yield self.ready[self.groups[s - 1]]  # slime #2331's fix: one PP stage's groups at a time
        for e in range(self.spec.engines):
            self.env.spawn(self._rpc(group, e), "sync_member", self.index, 2, s, e)
        if not (yield from self._join(group, me, s)):
            return
        if not (yield from self._broadcast(s)):
            return
        if (yield from self._join(self.barrier, me, s)):
            self._finish()

    def _engine(self, e: int):
        me = self.engines[e]
        slots = self.slots[me]
        for _ in range(self.spec.pp_stages):
            group = yield self.inbox[me].get()
            if not (yield from self._join(group, me)):
                return
            stage = self.groups.index(group)
            if self.spec.receiver_slot == "single":
                previous = slots.get(0)
                slots.clear()
                slots[0] = group  # one active receiver communicator: the last init wins
            else:
                previous = slots.get(stage)
                slots[stage] = group
            self._emit("comm_slot", member=me, name=group, previous=previous)
        if self.spec.engine_exits and e == 0:
            self.dead.append(me)
            self._emit("member_exit", member=me, reason="killed before its first receive (engine_exits)")
            return
        for s in range(self.spec.pp_stages):
            group = slots[0] if self.spec.receiver_slot == "single" else slots[s]
            src = self.sources[self.groups.index(group)]
            rnd = self.rounds[group]
            self._emit("broadcast_recv", name=group, member=me, src=src, stage=s)
            rnd.posted.append(me)
            if len(rnd.posted) == len(self.engines) and not rnd.all_posted.triggered:
                rnd.all_posted.succeed()
            yield rnd.delivered
        self._finish()

    def _broadcast(self, s: int):
        group, me = self.groups[s], self.sources[s]
        limit = self.spec.broadcast_timeout_s
        self._emit("broadcast_start", name=group, src=me, dsts=self.engines, timeout_s=limit or None, stage=s)
        rnd = self.rounds[group]
        start = self.env.now
        yield (rnd.all_posted | self.env.timeout(limit)) if limit else rnd.all_posted
        if rnd.all_posted.triggered:
            # the transfer itself: a receiver that died meanwhile never completes it
            yield self.env.timeout(self.spec.broadcast_s)
        if rnd.all_posted.triggered and not self.dead:
            self.rounds[group] = _Broadcast(self.env)
            self._emit("broadcast_end", name=group, src=me, ok=True)
            rnd.delivered.succeed()
            return True
        if not limit:
            yield self.env.event()  # a raw broadcast with no timeout: waits forever
        yield self.env.timeout(max(0.0, start + limit - self.env.now))
        self._emit("broadcast_end", name=group, src=me, ok=False, error=f"timed out after {limit:g} s")
        self._emit("timeout", what="weight_sync_broadcast", limit_s=limit, since=start)
        self._fail(f"{me}'s broadcast on {group} timed out after {limit:g} s")
        return False

    def _finish(self) -> None:
        self._finished += 1
        if self._finished == self.spec.pp_stages + self.spec.engines and not self.done.triggered:
            self.done.succeed()
