"""Gate 4 driver: the harness scheduler model and control logic, in real time.

Runs in a thread of rank 0. It owns one :class:`~harness.scheduler.model.SchedulerModel`
(the same object the simulator drives) and interprets the same control generators as
the simulator, with the same interpreter (``harness.control.interpret``), turning
each effect into a command for the worker process that must do it (the per-effect
handlers are in ``gpu_gates.dual.effects``). Threads:

* one per pipeline, running ``harness.control.lifecycle.pipeline_run`` (register → …
  → initialize → train_step × N → finish: clear progress, planned release, unregister);
* the scheduler loop (when a cycle runs: on input, or the 1 s background poll), each
  cycle ``harness.control.cycle.execute_cycle``, each resize call in its own thread;
* a GENERATION watchdog per pipeline, ticking ``harness.control.watchdog.watchdog_tick``.

Everything is logged in the harness event-log schema (scheduler inputs, decisions,
``effect_start``/``effect_end``, ``rank_state``), so the invariant oracle in
``harness.logs.invariants`` checks this run with exactly the code that checks simulations.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, Generator, List, Optional, Tuple

from harness.control.context import PipelineContext
from harness.control.cycle import execute_cycle, run_resize
from harness.control.effects import TRAINER_EFFECTS, effect_fields
from harness.control.interpret import EffectLog, run_blocking
from harness.control.lifecycle import pipeline_run
from harness.control.rank_state import RankLifecycle
from harness.control.run_effects import RunResizes
from harness.control.versions import VersionBook
from harness.control.reporting import request_input
from harness.control.watchdog import watchdog_alive, watchdog_tick
from harness.logs.writer import EventLog, header_record
from harness.scheduler.commit import Signal
from harness.scheduler.model import SchedulerModel
from harness.scheduler.progress import CoordinatorProgress
from harness.scheduler.types import GENERATION_CLUSTER, Rejected
from harness.scheduler.topology import ClusterTopology
from gpu_gates.runtime.dist_setup import connect_store
from gpu_gates.runtime.failures import write_at_once
from gpu_gates.dual.effects import PIPELINES, TRAIN_GPU, DriverEffects, DriverError
from gpu_gates.dual.lifecycle import LifecycleEffects
from gpu_gates.dual.worker import ROLES, rank_of


def swapped_resize_phases(gen: Generator) -> Generator:
    """Test hook ``swap_resize_order``: a cycle whose expands run before its shrinks — the
    bug the T1 < T2 < T3 check must catch. It rewrites the cycle generator's effects and
    leaves the generator itself (the order every runtime uses) as it is."""
    held: Optional[RunResizes] = None
    result: Any = None
    while True:
        try:
            effect = gen.send(result)
        except StopIteration:
            return
        if isinstance(effect, RunResizes) and effect.phase == "shrink":
            held, result = effect, True  # postponed until after the expands
            continue
        result = yield effect
        if isinstance(effect, RunResizes) and held is not None and result:
            result = yield held
            held = None


class Channel:
    """Ordered command/reply exchange with one worker through the store."""

    def __init__(self, ctx, store, rank: int) -> None:
        self.ctx, self.store, self.rank, self.n, self.lock = ctx, store, rank, 0, threading.Lock()

    def call(self, op: str, **args: Any) -> Any:
        with self.lock:
            i, self.n = self.n, self.n + 1
            self.ctx.put(f"dual/cmd/{self.rank}/{i}", json.dumps({"op": op, "args": args}).encode(), store=self.store)
            reply = json.loads(
                self.ctx.wait_get(f"dual/res/{self.rank}/{i}", f"rank {self.rank} finishing {op}", store=self.store)
            )
        if not reply["ok"]:
            raise DriverError(reply["error"])
        return reply["result"]


class Driver(DriverEffects, LifecycleEffects):
    def __init__(
        self,
        ctx,
        *,
        steps: int,
        bucket_size: int,
        swap_resize_order: bool,
        own_rank_serve: Callable[[], None],
        late_receivers_s: float = 0.0,
        late_start_s: float = 0.0,
        solo: bool = False,
        script: Any = None,
        shrink_drain_timeout_s: float = 30.0,
        explorer: Any = None,
    ) -> None:
        self.ctx = ctx
        self.explorer = explorer  # --explore: seeded delays before concurrent operations (dual_explore.py)
        self.solo = solo  # test hook: ppl2 runs after ppl1, no choreography: no GPU ever changes hands
        # the workload script (gpu_gates/dual/script.py), consulted before each effect: the
        # handlers themselves never wait on which pipeline they serve
        self.script = script
        self.shrink_drain_timeout_s = shrink_drain_timeout_s  # RLix's rebalance_on_shrink (30 s)
        self.late_receivers_s = late_receivers_s  # test hook: receivers' commands posted after the owner's
        self.late_start_s = late_start_s  # test hook: ppl2's pipeline starts this long after ppl1's
        self.steps = steps
        self.bucket_size = bucket_size
        self.swap = swap_resize_order
        self.own_rank_serve = own_rank_serve
        self.t0 = time.monotonic()
        self.model = SchedulerModel(ClusterTopology(1, 2))
        self.lock = threading.RLock()  # model + log
        self.log = EventLog(
            header_record(
                {"nodes": 1, "gpus_per_node": 2},
                source="gate:dual_pipeline",
                meta={"backend": ctx.backend, "steps": steps},
            )
        )
        # The driver's own store connection: rank 0's worker (main thread) blocks on its
        # client in every group rendezvous, and the commands that let the peers join must
        # not queue behind that wait (see GateContext.wait_get).
        self.store = connect_store(ctx.env, ctx.timeout, host=False)
        self.channels = {r: Channel(ctx, self.store, r) for r in ROLES}
        self.waiters: Dict[int, Tuple[threading.Event, List[Signal]]] = {}
        self.wake = threading.Event()
        self.errors: List[str] = []
        self.done = threading.Event()
        self.ctxs = {
            p: PipelineContext(
                p,
                "nemo_async",
                steps,
                sleep_level=2,
                step_target=4,
                gen_estimate=1,
                versions=VersionBook(clamp_bootstrap=True),
            )
            for p in PIPELINES
        }
        self.life = {(p, d): RankLifecycle(p, d) for p in PIPELINES for d in (0, 1)}
        self.routable: Dict[str, set] = {p: set() for p in PIPELINES}
        self.coord_lock = {p: threading.Lock() for p in PIPELINES}
        self.cache_locks = {p: threading.Lock() for p in PIPELINES}  # RLix's _cache_lock (DriverEffects._cache_held)
        # routing: which ranks take new requests; an abort and a submission never interleave
        self.routing_lock = {p: threading.Lock() for p in PIPELINES}
        self.outstanding = {(p, d): 0 for p in PIPELINES for d in (0, 1)}  # submitted, not yet collected
        self.batches_done = {p: 0 for p in PIPELINES}
        self.request_n = 0
        self.finished = {p: False for p in PIPELINES}
        self.gone = {p: False for p in PIPELINES}  # unregistered: its coordinator is dead
        self.steps_done = {p: 0 for p in PIPELINES}
        self.sync_n = 0
        self.digest_failures: List[str] = []
        self._early: Dict[int, List[Signal]] = {}  # signals that beat their waiter's registration
        self.progress = {p: CoordinatorProgress(p) for p in PIPELINES}
        self.activity: Dict[str, str] = {}  # interpreter -> the effect it is executing (for timeout reports)

    # ------------------------------------------------------------------ log + model
    def now(self) -> float:
        return round(time.monotonic() - self.t0, 6)

    def emit(self, kind: str, **fields: Any) -> None:
        with self.lock:
            self.log.emit(kind, self.now(), **fields)

    def call_model(self, kind: str, fields: Dict[str, Any], fn: Callable[[], Any]) -> Any:
        with self.lock:
            rec = self.log.emit(kind, self.now(), **fields)
            try:
                out = fn()
            except Rejected as e:
                self.model.drain()
                self.log.emit("rejected", self.now(), input_seq=rec["seq"], input_kind=kind, reason=e.reason)
                raise DriverError(f"scheduler refused {kind}: {e.reason}") from None
            self.log.extend(self.now(), self.model.drain())
        self.wake.set()
        return out

    def wait_ticket(self, ticket) -> List[int]:
        if ticket.done:
            return ticket.gpus
        with self.lock:
            ev, slot = threading.Event(), []
            self.waiters[ticket.request_id] = (ev, slot)
            for s in self._early.pop(ticket.request_id, []):
                slot.append(s)
                ev.set()
        while not ev.wait(0.05):
            if self.errors:
                raise DriverError("aborted: " + self.errors[0])
        sig = slot[0]
        if sig.error:
            raise DriverError(f"request {ticket.request_id} failed: {sig.error}")
        return sig.gpus

    def deliver(self, signals: List[Signal]) -> None:
        with self.lock:
            for s in signals:
                w = self.waiters.pop(s.request_id, None)
                if w is None:
                    self._early.setdefault(s.request_id, []).append(s)
                    continue
                w[1].append(s)
                w[0].set()

    # ------------------------------------------------------------------ scheduler loop
    def scheduler_loop(self) -> None:
        last_poll = time.monotonic()
        while not self.done.is_set():
            woke = self.wake.wait(0.05)
            reason = "wakeup"
            if woke:
                self.wake.clear()
            else:
                if time.monotonic() - last_poll < 1.0:
                    continue
                last_poll = time.monotonic()
                with self.lock:
                    bg = self.model.background_rebalance_reason()
                if bg is None:
                    continue
                reason = f"background:{bg}"
            self.cycle(reason)

    def cycle(self, reason: str) -> None:
        """One cycle, in the order ``harness.control.cycle.execute_cycle`` defines."""
        gen = execute_cycle(reason)
        if self.swap:
            gen = swapped_resize_phases(gen)
        run_blocking(gen, self._handle_cycle)

    def _handle_cycle(self, effect: Any) -> Any:
        return getattr(self, "_" + type(effect).__name__)(effect)

    def _PlanCycle(self, e) -> Any:
        with self.lock:
            self.log.emit("cycle", self.now(), phase="plan", reason=e.reason)
            plan = self.model.plan_cycle(e.reason)
            self.log.extend(self.now(), self.model.drain())
        return plan

    def _SchedulerFailed(self, e) -> None:
        raise DriverError(f"scheduler failed fast: {self.model.failed}")

    def _RunResizes(self, e) -> bool:
        """Every call of the phase in its own thread (a coordinator call); joins them all."""
        threads = []
        for pid, ranks in e.calls:  # each call writes its own resize records (cycle.run_resize)
            th = threading.Thread(
                target=self._resize,
                args=(pid, e.phase, list(ranks), e.cycle),
                daemon=True,
                name=f"resize {pid} {e.phase} cycle {e.cycle}",
            )  # the --explore stream
            th.start()
            threads.append(th)
        for th in threads:
            th.join()
        return not self.errors

    def record_explore(self) -> None:
        """--explore: the delays slept so far into the log header's ``meta.explore``."""
        if self.explorer is not None:
            got = self.lock.acquire(timeout=1.0)  # also on the salvage path, where a stuck thread may hold it
            try:
                self.log.records[0].setdefault("meta", {})["explore"] = self.explorer.describe()
            finally:
                if got:
                    self.lock.release()

    def _pause(self) -> None:
        """--explore: this thread's next seeded delay (nothing without a seed)."""
        if self.explorer is not None:
            self.explorer.pause()

    def _CommitCycle(self, e) -> Optional[List[Signal]]:
        with self.lock:
            self.log.emit("cycle", self.now(), phase="commit")
            signals = self.model.commit_cycle(e.plan)
            self.log.extend(self.now(), self.model.drain())
        return None if self.model.failed else signals

    def _SignalWaiters(self, e) -> None:
        self._pause()
        self.deliver(list(e.signals))

    def _resize(self, pid: str, phase: str, ranks: List[int], cycle: int) -> None:
        """One coordinator call, interpreted by ``harness.control.cycle.run_resize``."""
        self._pause()
        run_blocking(
            run_resize(
                self.ctxs[pid],
                phase,
                ranks,
                cycle,
                lambda kind, fields: self.emit(kind, **fields),
                lambda exc: self.fail(f"{pid} {phase} {ranks}: {exc}"),
            ),
            self._handler(pid),
        )

    # ------------------------------------------------------------------ pipelines
    def pipeline_main(self, pid: str) -> None:
        try:
            run_blocking(pipeline_run(self.ctxs[pid]), self._handler(pid))
        except Exception as exc:
            self.fail(f"{pid}: {exc}")

    def _handler(self, pid: str) -> Callable[[Any], Any]:
        """Run-level effects of one pipeline: ``_<Name>(pid, effect)``."""

        def handle(effect: Any) -> Any:
            self._before(pid, effect)
            return getattr(self, "_" + type(effect).__name__)(pid, effect)

        return handle

    def _before(self, pid: str, effect: Any) -> None:
        """The workload script's say before an effect runs (nothing without a script),
        after this thread's seeded delay under --explore."""
        self._pause()
        if self.script is not None:
            self.script.before(self, pid, effect)

    def watchdog(self, pid: str) -> None:
        """NeMo's GENERATION re-request, ticked every 0.2 s (2 s in NeMo)."""
        cid = f"{pid}_{GENERATION_CLUSTER}"
        while True:
            time.sleep(0.2)
            with self.lock:
                stopped = self.done.is_set() or bool(self.model.failed)
                if not watchdog_alive(self.finished[pid], stopped):
                    return
                e = watchdog_tick(
                    self.finished[pid], stopped, self.model.state, cid, [self.life[(pid, d)].state for d in (0, 1)]
                )
            if e is None:
                continue
            try:
                self.call_model("request", *request_input(self.model, cid, e))
            except DriverError as exc:
                self.fail(f"{pid} watchdog: {exc}")
                return

    def fail(self, message: str) -> None:
        with self.lock:
            self.errors.append(message)
        self.done.set()
        try:  # release every worker waiting on a command or a peer: they report and exit
            from gpu_gates.runtime.context import KEY_PREFIX

            self.store.set(KEY_PREFIX + "abort", f"driver: {message}".encode())
        except Exception:
            pass

    # ------------------------------------------------------------------ the interpreter
    def drive(self, pid: str, gen, scope: str, step: Optional[int], cycle: Optional[int] = None) -> None:
        """Interpret a step or resize generator, logged (``harness.control.interpret``);
        ``activity`` says what each is executing."""
        who = f"{pid} {scope}" + ("" if cycle is None else f" (cycle {cycle})")
        handlers: Dict[type, Callable[[Any], Any]] = {}

        def handle(effect: Any) -> Any:
            handler = handlers.get(type(effect))
            if handler is None:
                handler = handlers[type(effect)] = getattr(self, "_" + type(effect).__name__)
            self.activity[who] = f"{type(effect).__name__} {effect_fields(effect)}" + (
                "" if step is None else f" in step {step}"
            )
            self._before(pid, effect)
            return handler(pid, effect)

        run_blocking(
            gen,
            handle,
            log=EffectLog(self._add, self.now, pid, scope, step, cycle, lambda effect: self._gpus(pid, effect)),
            guard=self._guard,
        )
        self.activity.pop(who, None)

    def _add(self, record: Dict[str, Any]) -> None:
        with self.lock:  # stamped under the lock: seq and t rise together across threads
            record["t"] = self.now()
            self.log.add(record)

    def _guard(self) -> None:
        if self.errors:
            raise DriverError("aborted: " + self.errors[0])

    def _gpus(self, pid: str, effect: Any) -> List[int]:
        if hasattr(effect, "ranks"):
            return sorted(ROLES[rank_of(pid, "infer", d)][3] for d in effect.ranks)
        if type(effect).__name__ in TRAINER_EFFECTS:
            return [TRAIN_GPU[pid]]
        return []

    def _trainer(self, pid: str) -> Channel:
        return self.channels[rank_of(pid, "trainer")]

    def _infer(self, pid: str, dp: int) -> Channel:
        return self.channels[rank_of(pid, "infer", dp)]

    def _rank_state(self, pid: str, dp: int, event: str, **kw: Any) -> None:
        life = self.life[(pid, dp)]
        life.on(event, **kw)
        self.emit(
            "rank_state",
            pipeline_id=pid,
            dp_rank=dp,
            state=life.state.value,
            gpus=[ROLES[rank_of(pid, "infer", dp)][3]],
            version=life.weights_version,
        )

    # ------------------------------------------------------------------ run
    def run(self) -> None:
        # thread names are the --explore streams (gpu_gates/dual/explore.py)
        threads = [threading.Thread(target=self.scheduler_main, daemon=True, name="scheduler")]
        threads += [threading.Thread(target=self.pipeline_main, args=(p,), daemon=True, name=p) for p in PIPELINES]
        threads[0].start()
        for th in threads[1:3]:
            if th.name == "ppl2" and self.late_start_s:
                time.sleep(self.late_start_s)
            th.start()
            if self.solo:  # one pipeline at a time
                while th.is_alive() and not self.errors:
                    th.join(0.1)
        for th in threads[1:3]:
            while th.is_alive() and not self.errors:
                th.join(0.1)
        self.done.set()
        threads[0].join(5.0)
        # the stop says whether the run already failed: a rank that then finds a group a
        # failed peer still holds reports the leak as that failure's consequence
        stop = json.dumps({"op": "stop", "failed": bool(self.errors)}).encode()
        for r, ch in self.channels.items():
            if r != self.ctx.rank:
                try:
                    self.ctx.put(f"dual/cmd/{r}/{ch.n}", stop, store=self.store)
                except Exception:
                    pass
        self.ctx.put(f"dual/cmd/{self.ctx.rank}/{self.channels[self.ctx.rank].n}", stop, store=self.store)

    def scheduler_main(self) -> None:
        try:
            self.scheduler_loop()
        except Exception as exc:
            write_at_once(sys.stderr, traceback.format_exc())
            self.fail(f"scheduler loop: {exc}")
