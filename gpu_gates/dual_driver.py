"""Gate 4 driver: the harness scheduler model and control logic, in real time.

Runs in a thread of rank 0. It owns one :class:`~harness.scheduler.model.SchedulerModel`
(the same object the simulator drives) and interprets the same control generators as
the simulator (``harness.control.nemo_async``, ``resize.expand_order``/``shrink_order``),
turning each effect into a command for the worker process that must do it (the
per-effect handlers are in ``gpu_gates.dual_effects``). Threads:

* one per pipeline, running initialize → train_step × N → finish;
* the scheduler loop (RLix's central loop: wake on input, plan, run every shrink and wait,
  then every expand, commit, signal), each resize call in its own thread;
* a GENERATION watchdog per pipeline (NeMo's re-request while nothing is active).

Everything is logged in the harness event-log schema (scheduler inputs, decisions,
``effect_start``/``effect_end``, ``rank_state``), so the invariant oracle in
``harness.invariants`` checks this run with exactly the code that checks simulations.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

from harness.control import nemo_async
from harness.control.context import PipelineContext
from harness.control.effects import effect_fields, effect_name
from harness.control.rank_state import RankLifecycle
from harness.control.resize import expand_order, shrink_order
from harness.control.versions import VersionBook
from harness.eventlog.writer import EventLog, header_record
from harness.scheduler.commit import Signal
from harness.scheduler.model import SchedulerModel
from harness.scheduler.progress import CoordinatorProgress
from harness.scheduler.types import ACTOR_TRAIN, GENERATION_CLUSTER, Priority, Rejected
from harness.topology import ClusterTopology
from gpu_gates.dist_setup import connect_store
from gpu_gates.dual_effects import INFER_GPUS, PIPELINES, TRAIN_GPU, DriverEffects, DriverError
from gpu_gates.dual_worker import ROLES, rank_of

class Channel:
    """Ordered command/reply exchange with one worker through the store."""

    def __init__(self, ctx, store, rank: int) -> None:
        self.ctx, self.store, self.rank, self.n, self.lock = ctx, store, rank, 0, threading.Lock()

    def call(self, op: str, **args: Any) -> Any:
        with self.lock:
            i, self.n = self.n, self.n + 1
            self.ctx.put(f"dual/cmd/{self.rank}/{i}", json.dumps({"op": op, "args": args}).encode(), store=self.store)
            reply = json.loads(self.ctx.wait_get(f"dual/res/{self.rank}/{i}", f"rank {self.rank} finishing {op}",
                                                 store=self.store))
        if not reply["ok"]:
            raise DriverError(reply["error"])
        return reply["result"]


class Driver(DriverEffects):
    def __init__(self, ctx, *, steps: int, bucket_size: int, swap_resize_order: bool, own_rank_serve: Callable[[], None],
                 late_receivers_s: float = 0.0) -> None:
        self.ctx = ctx
        self.late_receivers_s = late_receivers_s  # test hook: receivers' commands posted after the owner's
        self.steps = steps
        self.bucket_size = bucket_size
        self.swap = swap_resize_order
        self.own_rank_serve = own_rank_serve
        self.t0 = time.monotonic()
        self.model = SchedulerModel(ClusterTopology(1, 2))
        self.lock = threading.RLock()  # model + log
        self.log = EventLog(header_record({"nodes": 1, "gpus_per_node": 2}, source="gate:dual_pipeline",
                                          meta={"backend": ctx.backend, "steps": steps}))
        # The driver's own store connection: rank 0's worker (main thread) blocks on its
        # client in every group rendezvous, and the commands that let the peers join must
        # not queue behind that wait (see GateContext.wait_get).
        self.store = connect_store(ctx.env, ctx.timeout, host=False)
        self.channels = {r: Channel(ctx, self.store, r) for r in ROLES}
        self.waiters: Dict[int, Tuple[threading.Event, List[Signal]]] = {}
        self.wake = threading.Event()
        self.errors: List[str] = []
        self.done = threading.Event()
        self.ctxs = {p: PipelineContext(p, "nemo_async", steps, sleep_level=2, step_target=4, gen_estimate=1,
                                        versions=VersionBook(clamp_bootstrap=True)) for p in PIPELINES}
        self.life = {(p, d): RankLifecycle(p, d) for p in PIPELINES for d in (0, 1)}
        self.routable: Dict[str, set] = {p: set() for p in PIPELINES}
        self.coord_lock = {p: threading.Lock() for p in PIPELINES}
        self.finished = {p: False for p in PIPELINES}
        self.steps_done = {p: 0 for p in PIPELINES}
        self.sync_n = 0
        self.digest_failures: List[str] = []
        self._early: Dict[int, List[Signal]] = {}  # signals that beat their waiter's registration
        self.progress = {p: CoordinatorProgress(p) for p in PIPELINES}
        # Choreography of step 0, so every run contains a donor-shrink + recipient-expand
        # cycle (what T1 < T2 < T3 is about): ppl2 asks for GENERATION only once ppl1 holds
        # both GPUs, and ppl1's first batch completes only after ppl2 has asked.
        self.ppl2_asked = threading.Event()
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
        with self.lock:
            self.log.emit("cycle", self.now(), phase="plan", reason=reason)
            cp = self.model.plan_cycle(reason)
            self.log.extend(self.now(), self.model.drain())
        if cp is None:
            raise DriverError(f"scheduler failed fast: {self.model.failed}")
        phases = [("shrink", cp.shrink_calls), ("expand", cp.expand_calls)]
        if self.swap:  # test hook: the bug the T1 < T2 < T3 check must catch
            phases.reverse()
        for phase, calls in phases:
            threads = []
            for call in calls:
                ranks = call.dp_ranks_to_remove if phase == "shrink" else call.dp_ranks_to_add
                self.emit("resize_start", cycle=cp.cycle, pipeline_id=call.pipeline_id, phase=phase, dp_ranks=list(ranks))
                gen = (shrink_order if phase == "shrink" else expand_order)(self.ctxs[call.pipeline_id], ranks)
                th = threading.Thread(target=self._resize, args=(call.pipeline_id, phase, list(ranks), cp.cycle, gen), daemon=True)
                th.start()
                threads.append(th)
            for th in threads:
                th.join()
            if self.errors:
                return
        with self.lock:
            self.log.emit("cycle", self.now(), phase="commit")
            signals = self.model.commit_cycle(cp)
            self.log.extend(self.now(), self.model.drain())
        if self.model.failed:
            raise DriverError(f"scheduler failed fast: {self.model.failed}")
        self.deliver(signals)

    def _resize(self, pid: str, phase: str, ranks: List[int], cycle: int, gen) -> None:
        try:
            self.drive(pid, gen, phase, None, cycle)
        except Exception as exc:
            self.fail(f"{pid} {phase} {ranks}: {exc}")
        self.emit("resize_end", cycle=cycle, pipeline_id=pid, phase=phase, dp_ranks=ranks)

    # ------------------------------------------------------------------ pipelines
    def pipeline_main(self, pid: str) -> None:
        ctx = self.ctxs[pid]
        try:
            tps = {ACTOR_TRAIN: 1, GENERATION_CLUSTER: 1}
            maps = {ACTOR_TRAIN: [TRAIN_GPU[pid]], GENERATION_CLUSTER: list(INFER_GPUS)}
            self.call_model("register", {"pipeline_id": pid, "cluster_tp_configs": tps, "cluster_device_mappings": maps},
                            lambda: self.model.register(pid, tps, maps))
            self.call_model("admit", {"pipeline_id": pid}, lambda: self.model.admit(pid))
            self.drive(pid, nemo_async.initialize(ctx), "init", None)
            for step in range(self.steps):
                ctx.step = step
                self.drive(pid, nemo_async.train_step(ctx, step), "step", step)
                self.steps_done[pid] += 1
            self.finish(pid)
        except Exception as exc:
            self.fail(f"{pid}: {exc}")

    def finish(self, pid: str) -> None:
        self.finished[pid] = True
        alloc = self.model.state.allocations.get(f"{pid}_{GENERATION_CLUSTER}")
        if alloc is not None and alloc.active_dp_ranks:
            self.wait_ticket(self.call_model("await_release", {"pipeline_id": pid},
                                             lambda: self.model.await_release(pipeline_id=pid)))
        with self.coord_lock[pid]:
            self.call_model("unregister", {"pipeline_id": pid}, lambda: self.model.unregister(pid))

    def watchdog(self, pid: str) -> None:
        cid = f"{pid}_{GENERATION_CLUSTER}"
        while not self.done.is_set() and not self.finished[pid]:
            time.sleep(0.2)
            with self.lock:
                if self.finished[pid] or cid not in self.model.state.allocations:
                    continue
                busy = any(self.life[(pid, d)].state.value != "asleep" for d in (0, 1))
                if busy or self.model.state.pending_for(cid) is not None or self.model.failed:
                    continue
            try:
                self.call_model("request", {"cluster_id": cid, "priority": "GENERATION", "step_target_estimate": 1},
                                lambda: self.model.request(cid, Priority.GENERATION, step_target_estimate=1))
            except DriverError as exc:
                self.fail(f"{pid} watchdog: {exc}")
                return

    def fail(self, message: str) -> None:
        with self.lock:
            self.errors.append(message)
        self.done.set()
        try:  # release every worker waiting on a command or a peer: they report and exit
            from gpu_gates.context import KEY_PREFIX
            self.store.set(KEY_PREFIX + "abort", f"driver: {message}".encode())
        except Exception:
            pass

    # ------------------------------------------------------------------ the interpreter
    def drive(self, pid: str, gen, scope: str, step: Optional[int], cycle: Optional[int] = None) -> None:
        result: Any = None
        while True:
            if self.errors:
                raise DriverError("aborted: " + self.errors[0])
            try:
                effect = gen.send(result)
            except StopIteration:
                self.activity.pop(f"{pid} {scope}" + ("" if cycle is None else f" (cycle {cycle})"), None)
                return
            name, args = effect_name(effect), effect_fields(effect)
            who = f"{pid} {scope}" + ("" if cycle is None else f" (cycle {cycle})")
            self.activity[who] = f"{name} {args}" + ("" if step is None else f" in step {step}")
            extra: Dict[str, Any] = {"scope": scope, "step": step}
            if cycle is not None:
                extra["cycle"] = cycle
            gpus = self._gpus(pid, name, args)
            if gpus:
                extra["gpus"] = gpus
            self.emit("effect_start", pipeline_id=pid, effect=name, args=args, **extra)
            result = getattr(self, "_" + name)(pid, effect)
            end = dict(extra)
            if result is not None:
                end["result"] = result
            self.emit("effect_end", pipeline_id=pid, effect=name, args=args, **end)

    def _gpus(self, pid: str, name: str, args: Dict[str, Any]) -> List[int]:
        if "ranks" in args:
            return sorted(ROLES[rank_of(pid, "infer", d)][3] for d in args["ranks"])
        if name in ("Compute", "ReloadTrainComm", "DestroyTrainComm", "OffloadTraining", "BuildCache"):
            return [TRAIN_GPU[pid]]
        return []

    def _trainer(self, pid: str) -> Channel:
        return self.channels[rank_of(pid, "trainer")]

    def _infer(self, pid: str, dp: int) -> Channel:
        return self.channels[rank_of(pid, "infer", dp)]

    def _rank_state(self, pid: str, dp: int, event: str, **kw: Any) -> None:
        life = self.life[(pid, dp)]
        life.on(event, **kw)
        self.emit("rank_state", pipeline_id=pid, dp_rank=dp, state=life.state.value,
                  gpus=[ROLES[rank_of(pid, "infer", dp)][3]], version=life.weights_version)

    # ------------------------------------------------------------------ run
    def run(self) -> None:
        threads = [threading.Thread(target=self.scheduler_main, daemon=True)]
        threads += [threading.Thread(target=self.pipeline_main, args=(p,), daemon=True) for p in PIPELINES]
        threads += [threading.Thread(target=self.watchdog, args=(p,), daemon=True) for p in PIPELINES]
        for th in threads:
            th.start()
        for th in threads[1:3]:
            while th.is_alive() and not self.errors:
                th.join(0.1)
        self.done.set()
        threads[0].join(5.0)
        for r, ch in self.channels.items():
            if r != self.ctx.rank:
                try:
                    self.ctx.put(f"dual/cmd/{r}/{ch.n}", json.dumps({"op": "stop"}).encode(), store=self.store)
                except Exception:
                    pass
        self.ctx.put(f"dual/cmd/{self.ctx.rank}/{self.channels[self.ctx.rank].n}", json.dumps({"op": "stop"}).encode(),
                     store=self.store)

    def scheduler_main(self) -> None:
        try:
            self.scheduler_loop()
        except Exception as exc:
            traceback.print_exc()
            self.fail(f"scheduler loop: {exc}")
