"""The simulation: scheduler loop, scheduler calls, event log, and the run itself.

One :class:`Simulation` owns the simpy environment, the scheduler model, the simulated
cluster and the event log. Pipelines (``simulators/pipelines/pipeline.py``) interpret the
harness's control logic; whenever they call the scheduler, the call is logged as an
*input* record first, so the log replays through ``rlharness replay``.

The scheduler loop mirrors RLix's ``_central_scheduling_loop``: a cycle runs when an
input woke it, or when the 1 s poll finds a background-rebalance trigger. A cycle plans
(inputs may then arrive in the lock gap), runs every shrink as a coordinator
``resize_infer`` process and waits for all of them, then every expand, then commits and
signals the waiters — the order ``harness.control.cycle.execute_cycle`` defines (the
gate's driver runs the same generator), so T1 < T2 < T3 holds by construction and is
checked anyway.
"""

from __future__ import annotations

import dataclasses

import sys
import time
from dataclasses import dataclass
from typing import IO, Any, Callable, Dict, List, Optional, Sequence

import simpy

from harness.control.cycle import execute_cycle
from harness.control.interpret import interpret
from harness.control.run_effects import CommitCycle, PlanCycle, RunResizes, SchedulerFailed, SignalWaiters
from harness.logs.stream import CHUNK_RECORDS, Consumer, StreamedLog
from harness.logs.writer import EventLog, header_record
from simulators.runtime.gc_pause import gc_paused
from harness.scheduler.commit import Signal
from harness.scheduler.model import SchedulerModel
from harness.scheduler.options import SchedulerOptions
from harness.scheduler.types import Rejected
from harness.scheduler.topology import ClusterTopology
from simulators.runtime.cluster import SimCluster
from simulators.runtime.env import Actor, SimEnv, Timer
from simulators.runtime.explore import Explorer, ExploreSpec, pilot_steps
from simulators.scenario.spec import Scenario
from simulators.runtime.timeouts import idle_bundle_bounds


class SimFailure(RuntimeError):
    """The simulated system failed (OOM, fail-fast, lifecycle violation): the run ends."""


@dataclass
class RunResult:
    scenario: Scenario
    log: EventLog
    reason: str  # done | horizon | failed
    detail: str
    sim_time: float
    events: int
    wall_s: float

    @property
    def records(self) -> List[dict]:
        if isinstance(self.log, StreamedLog):
            raise RuntimeError("a streamed run keeps no records: its consumers read them as they were made")
        return self.log.records


def _pilot(scenario: Scenario, spec: ExploreSpec) -> Explorer:
    """PCT's pilot run (simulators/runtime/explore.py, pilot_steps): its explorer, which counted the rankings."""
    sim = Simulation(scenario, explore=spec)
    sim.run()
    return sim.env.explorer


def _scheduler_model(scenario: Scenario) -> Any:
    """The scheduler that decides: the model (harness/scheduler/) or, with
    ``scheduler.implementation: rlix``, RLix's own (docs/rlix-live.md)."""
    c = scenario.cluster
    if scenario.scheduler.get("implementation", "model") == "rlix":  # RLix's own scheduler (docs/rlix-live.md)
        from simulators.rlix_live.in_loop import scheduler_for

        return scheduler_for(ClusterTopology(c.nodes, c.gpus_per_node), dict(scenario.scheduler))
    return SchedulerModel(ClusterTopology(c.nodes, c.gpus_per_node), SchedulerOptions.from_mapping(scenario.scheduler))


def _header(scenario: Scenario, model: Any, explore: Optional[ExploreSpec]) -> dict:
    """The event log's header: the cluster, the scheduler's options and what the oracle's
    checks need to know of the scenario (their bounds and margins)."""
    c = scenario.cluster
    options = model.options
    return header_record(
        {
            "nodes": c.nodes,
            "gpus_per_node": c.gpus_per_node,
            "vram_gib": c.vram_bytes / (1 << 30),
            "host_ram_bytes": c.host_ram_bytes,
        },  # the host_ram check's capacity
        scheduler=options.to_mapping(),
        source="simulator",
        meta={
            "scenario": scenario.name,
            "seed": scenario.seed,
            "horizon_s": scenario.horizon_s,
            # each pipeline's type: an expectation's `pipeline` matches a type in every command
            # that reads the log (check, replay), as in simulate (docs/expected-findings.md)
            "pipeline_types": {p.name: p.type for p in scenario.pipelines},
            # the oracle's post-sleep residue threshold (``vram``, harness/logs/invariants/memory.py)
            "post_sleep_threshold_bytes": scenario.costs.post_sleep_threshold_bytes,
            # the handover_headroom check's margin (harness/logs/invariants/handover_headroom.py)
            "handover_margin_bytes": scenario.costs.handover_margin_bytes,
            # the idle_bundle_starvation check's bound per pipeline (simulators/runtime/timeouts.py)
            "idle_bundle_bound_s": idle_bundle_bounds(scenario),
            # the trajectory_age check's bound per pipeline with a trajectory buffer
            "max_trajectory_age_steps": {
                p.name: _age_bound(p) for p in scenario.pipelines if p.type != "single_controller"
            },
            # the version_span check's settings per disaggregated pipeline (version_span.py)
            **_version_span_meta(scenario),
            # the liveness monitors' bound, when the scenario changes RLix's deadlines (hot_states.py)
            **_timeouts_meta(scenario.costs),
            # the schedule exploration that ordered same-time events (simulators/runtime/explore.py)
            **({} if explore is None else {"explore": explore.describe()}),
            # RLix's own scheduler decided (scheduler.implementation: rlix)
            **({"scheduler_implementation": f"rlix {model.mods.version}"} if hasattr(model, "mods") else {}),
        },
    )


class Simulation:
    def __init__(
        self,
        scenario: Scenario,
        *,
        progress: Optional[Callable[[str], None]] = None,
        explore: Optional[ExploreSpec] = None,
        sink: Optional[IO[bytes]] = None,
        consumers: Sequence[Consumer] = (),
        per_chunk: int = CHUNK_RECORDS,
    ) -> None:
        """With a ``sink`` or ``consumers`` the event log is streamed
        (:class:`~harness.logs.stream.StreamedLog`): its bytes go to ``sink`` and its
        records to each consumer, ``per_chunk`` at a time, as the run makes them, and the
        result keeps none (``result.log.last`` is the final record)."""
        self.scenario = scenario
        if explore is not None and explore.strategy == "pct" and explore.steps == 0:
            explore = dataclasses.replace(explore, steps=pilot_steps(scenario, lambda spec: _pilot(scenario, spec)))
        self.explore = explore
        self.env = SimEnv(explorer=None if explore is None else Explorer(explore))
        c = scenario.cluster
        self.model = _scheduler_model(scenario)
        header = _header(scenario, self.model, explore)
        self.log = (
            EventLog(header) if sink is None and not consumers else StreamedLog(header, sink, consumers, per_chunk)
        )
        self.cluster = SimCluster(self.env, c, listener=self._on_vram, host_listener=self._on_host_ram)
        self.waiters: Dict[int, simpy.Event] = {}
        self._run_handlers: Dict[type, Callable[[Any], Any]] = {}  # effect class -> bound handler (_handle)
        self.wake = self.env.event()
        self._poll_actor = Actor("scheduler", 1)  # the key the 1 s poll runs under (see poll)
        self._rpc_actor = Actor("scheduler", 3)  # explored: the key of a delayed RPC return (deliver)
        self.background: Optional[str] = None
        self.stop = self.env.event()
        self.failure: Optional[str] = None
        self.progress = progress
        self.pipelines = self._make_pipelines()
        self.by_id = {p.pid: p for p in self.pipelines}
        self._ack_droppers = [p for p in self.pipelines if "lost_release_ack" in p.faults]

    def _make_pipelines(self) -> List[Any]:
        """One simulated pipeline per scenario entry, in file order (its index keys its actors)."""
        from simulators.pipelines.pipeline import PipelineSim  # local: pipeline imports this module's types
        from simulators.pipelines.disaggregated import DisaggregatedSim
        from simulators.pipelines.single_controller import SingleControllerSim

        runtimes = {"single_controller": SingleControllerSim, "disaggregated": DisaggregatedSim}
        return [runtimes.get(spec.type, PipelineSim)(self, spec, i) for i, spec in enumerate(self.scenario.pipelines)]

    # ------------------------------------------------------------------ logging
    def emit(self, kind: str, **fields: Any) -> None:
        self.log.append(kind, self.env.now, {k: v for k, v in fields.items() if v is not None or k in _KEEP_NULL})

    def drain(self) -> None:
        self.log.extend(self.env._now, self.model.drain())

    def _on_vram(self, gpu: int, owner: str, mem: str, delta: int, used: int, phase: Optional[str]) -> None:
        rec = {
            "seq": 0,
            "t": self.env._now,
            "kind": "vram",
            "gpu": gpu,
            "owner": owner,
            "mem": mem,
            "delta": delta,
            "used": used,
        }
        if phase is not None:
            rec["phase"] = phase
        self.log.add(rec)

    def _on_host_ram(self, node: int, owner: str, delta: int, used: int) -> None:
        self.log.add(
            {
                "seq": 0,
                "t": self.env._now,
                "kind": "host_ram",
                "node": node,
                "owner": owner,
                "delta": delta,
                "used": used,
            }
        )

    # ------------------------------------------------------------------ scheduler calls
    def call(self, input_kind: str, fields: Dict[str, Any], fn: Callable[..., Any], *args: Any) -> Any:
        """Log an input record, apply it to the model (``fn(*args)``), log its decisions. A
        refusal is a bug in the simulated system (or a fault): the run fails."""
        log, model, now = self.log, self.model, self.env._now
        rec = log.append(input_kind, now, fields)
        try:
            result = fn(*args)
        except Rejected as e:
            log.extend(now, model.drain())  # what happened before the refusal (a release) stays logged
            log.emit("rejected", now, input_seq=rec["seq"], input_kind=input_kind, reason=e.reason)
            raise SimFailure(f"scheduler refused {input_kind}: {e.reason}") from None
        log.extend(now, model.drain())  # self.drain() and self.wakeup(), inlined (hot path)
        if not self.wake.triggered:
            self.wake.succeed()
        if model.failed:
            raise SimFailure(f"scheduler failed fast: {model.failed}")
        return result

    def waiter(self, request_id: int) -> simpy.Event:
        ev = self.env.event()
        self.waiters[request_id] = ev
        return ev

    def wakeup(self) -> None:
        if not self.wake.triggered:
            self.wake.succeed()

    def deliver(self, signals: List[Signal]) -> None:
        explorer = self.env.explorer
        for s in signals:
            ev = self.waiters.pop(s.request_id, None)
            if ev is None:
                continue
            delay = 0.0 if explorer is None else explorer.delay()
            if delay:  # explored: the RPC's return reaches its caller a little later
                Timer(self.env, delay, self._rpc_actor, _succeed_with, (ev, s))
            else:
                ev.succeed(s)

    # ------------------------------------------------------------------ scheduler loop
    def scheduler_loop(self):
        env = self.env
        while True:
            yield self.wake
            self.wake = env.event()
            reason = "wakeup"
            if self.background is not None:
                reason, self.background = f"background:{self.background}", None
            yield from self.cycle(reason)

    def poll(self, _arg: Any = None) -> None:
        """RLix's 1 s poll: a background cycle when no one waits and a trigger holds.

        A :class:`~simulators.runtime.env.Timer` chain run for the ``("scheduler", 1)`` actor: each
        tick is the one event a polling process's timeout would be, with the same key, so
        the same order, without resuming a process per tick. The trigger (a pure read of
        the model) is only computed when a wake-up is not already under way."""
        if not self.wake.triggered:
            reason = self.model.background_rebalance_reason()
            if reason is not None:
                self.background = reason
                self.wakeup()
        Timer(self.env, self.scenario.costs.scheduler_poll_s, self._poll_actor, self.poll, None)

    def cycle(self, reason: str):
        """One cycle, in the order ``harness.control.cycle.execute_cycle`` defines."""
        yield from interpret(execute_cycle(reason), self._handle)

    def _handle(self, effect: Any) -> Any:
        """A cycle's effect (``harness.control.run_effects``): its ``_<Name>`` handler,
        looked up once per effect class (a cycle runs on every scheduler wake-up)."""
        cls = type(effect)
        handler = self._run_handlers.get(cls)
        if handler is None:
            handler = self._run_handlers[cls] = getattr(self, "_" + cls.__name__)
        return handler(effect)

    def _PlanCycle(self, e: PlanCycle) -> Any:
        self.log.add({"seq": 0, "t": self.env._now, "kind": "cycle", "phase": "plan", "reason": e.reason})
        plan = self.model.plan_cycle(e.reason)
        self.drain()
        return plan

    def _SchedulerFailed(self, e: SchedulerFailed) -> None:
        self.fail(f"scheduler failed fast: {self.model.failed}")

    def _RunResizes(self, e: RunResizes):
        """Every call of the phase as its own coordinator process; returns when all have."""
        env = self.env
        procs = []
        for pid, ranks in e.calls:  # each call writes its own resize records (cycle.run_resize)
            pipe = self.by_id[pid]
            call = pipe.resize(e.phase, list(ranks), e.cycle)
            if env.explorer is not None:  # explored: the call reaches the coordinator a little later
                call = _after(env, env.explorer.delay(), call)
            procs.append(env.spawn(call, "resize", pipe.index))
        if procs:
            yield env.all_of(procs)
        return not self.failure

    def _CommitCycle(self, e: CommitCycle) -> Optional[List[Signal]]:
        self.log.add({"seq": 0, "t": self.env._now, "kind": "cycle", "phase": "commit"})
        for pipe in self._ack_droppers:  # fault lost_release_ack (oracle_faults.py)
            pipe._drop_release_ack(e.plan)
        signals = self.model.commit_cycle(e.plan)
        self.drain()
        return None if self.model.failed else signals

    def _SignalWaiters(self, e: SignalWaiters) -> None:
        self.deliver(e.signals)

    # ------------------------------------------------------------------ run
    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
            if not self.stop.triggered:
                self.stop.succeed()

    def run(self) -> RunResult:
        env = self.env
        t0 = time.perf_counter()
        env.spawn(self.scheduler_loop(), "scheduler", 0)
        Timer(env, self.scenario.costs.scheduler_poll_s, self._poll_actor, self.poll, None)
        mains = [env.spawn(p.main(), "pipeline", p.index) for p in self.pipelines]
        all_done = env.all_of(mains)
        horizon = env.timeout(self.scenario.horizon_s)
        self._progress_events = 0  # the progress printer's own events are not the run's
        if self.progress is not None:
            self._progress_events += 1  # its Initialize event
            env.spawn(self._progress_reporter(t0), "scheduler", 2)
        # The run allocates heavily (events, records) and keeps most of it (the log), so
        # automatic collection finds little and costs much: with the gen-0 threshold at
        # 50,000 the 1024-GPU run spent ~9 % of its time in 86 collections, and still found
        # only ~25,000 cyclic garbage objects (spent generators and their frames; peak RSS
        # the same with collection off). So none runs during the run; it is switched back on
        # after (left off if it was off), with the run's survivors in the oldest generation
        # (simulators.runtime.gc_pause), and a later full collection finds that garbage. When a
        # collection runs has no part in the log: a process still running is referenced by
        # the event queue, so nothing of the run is collected while it runs.
        try:
            with gc_paused():
                env.run(until=env.any_of([all_done, self.stop, horizon]))
        finally:
            if hasattr(self.model, "close"):  # RLix's own scheduler: its event loop and parked callers
                self.model.close()
        if self.failure:
            reason, detail = "failed", self.failure
        elif all_done.triggered:
            reason, detail = "done", f"{len(self.pipelines)} pipeline(s) finished"
        else:
            reason, detail = "horizon", f"horizon {self.scenario.horizon_s} s reached"
        events = env.scheduled_events() - self._progress_events
        self.log.emit("sim_end", env.now, reason=reason, sim_time=env.now, events=events, detail=detail)
        if isinstance(self.log, StreamedLog):
            self.log.close()
        return RunResult(self.scenario, self.log, reason, detail, env.now, events, time.perf_counter() - t0)

    def _progress_reporter(self, t0: float):
        """Prints a progress line at most once per wall-second (stderr; not in the log)."""
        env = self.env
        last = t0
        # at most a simulated minute between looks at the clock: a long horizon must not
        # leave a slow run without a progress line
        step = min(60.0, max(1.0, self.scenario.horizon_s / 1000.0))
        while True:
            self._progress_events += 1
            yield env.timeout(step)
            now = time.perf_counter()
            if now - last >= 1.0:
                last = now
                done = sum(p.steps_done for p in self.pipelines)
                total = sum(p.spec.steps for p in self.pipelines)
                self.progress(
                    f"  t={env.now:9.1f}s  steps {done}/{total}  events {self.log.made}  wall {now - t0:5.1f}s"
                )


def _succeed_with(arg: Any) -> None:
    ev, value = arg
    ev.succeed(value)


def _after(env: SimEnv, delay: float, gen: Any):
    """``gen`` run ``delay`` later (none: at once)."""
    if delay:
        yield env.timeout(delay)
    return (yield from gen)


_KEEP_NULL = {"version", "result", "error", "cycle", "step"}


def _age_bound(p) -> int:
    """A pipeline's staleness bound (the trajectory_age check): its workload's window, or what a
    disaggregated order allows by construction (``harness.control.disaggregated``)."""
    if p.disaggregated is None:
        return p.workload.max_trajectory_age_steps
    from harness.control.disaggregated import trajectory_age_bound

    return trajectory_age_bound(p.disaggregated.shape, p.workload.max_trajectory_age_steps)


def _version_span_meta(scenario: Scenario) -> Dict[str, Any]:
    """``version_span``: per disaggregated pipeline whether a trajectory may span weight
    versions (a partial rollout or an in-flight update) and, fully asynchronous, the
    rollouter's admission window (its staleness bound and batch). Absent without such a
    pipeline, so that other logs keep their bytes."""
    spans = {}
    for p in scenario.pipelines:
        if p.type != "disaggregated":
            continue
        d = p.disaggregated
        entry: Dict[str, Any] = {"partial_rollout": d.shape == "fully_async" and d.weight_sync != "drain"}
        if d.shape == "fully_async":
            w = p.workload
            entry.update(max_age=_age_bound(p), batch=w.prompts_per_step * w.generations_per_prompt)
        spans[p.name] = entry
    return {"version_span": spans} if spans else {}


def _timeouts_meta(costs) -> Dict[str, Any]:
    """``{"timeouts": {...}}`` when any of RLix's deadlines differs from its default, else
    nothing (the header of every scenario with the defaults stays as it was)."""
    from harness.logs.invariants.hot_states import DEFAULT_TIMEOUTS_S

    timeouts = {
        "await_release_s": costs.await_release_timeout_s,
        "resize_lock_s": costs.resize_lock_timeout_s,
        "selective_sync_s": costs.selective_sync_timeout_s,
        "shrink_drain_s": costs.shrink_drain_timeout_s,
    }
    return {} if timeouts == DEFAULT_TIMEOUTS_S else {"timeouts": timeouts}


def print_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
