"""What the pumps' effects do to the controller state, written once for every runtime.

A runtime running ``train_pump`` / ``rollout_pump`` handles the effects that take time
itself (generation, training, weight sync, sleeps); :class:`PumpHandlers` handles every
other effect with :func:`apply_instant` (done at once) or :func:`try_blocking` (``None`` =
wait and try again when the state changes), and hands the pumps to the one interpreter
(``harness.control.interpret``). Keeping this table here is what makes the simulator and
the real CPU runtime agree on the bookkeeping: only time differs between them.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Generator, List, Optional, Tuple

from harness.control import streaming_effects as fx
from harness.control.interpret import EffectLog, Halt, interpret
from harness.streaming.controller import ControllerState

_NO_RESULT = object()


def _admit(st: ControllerState, e: fx.AdmitBatch) -> Optional[Tuple[int, Optional[int]]]:
    adm = st.try_admit()
    return None if adm is None else (adm.dispatch_index, adm.target_step)


def _select(st: ControllerState, e: fx.SelectGroups) -> Optional[Tuple[int, ...]]:
    """Empty when the step's target moved since the pump sized the request (a drop
    landed while it waited): the pump re-reads the target and closes the step short.
    ``st.stale_select_target`` (the ``stale_select_target`` fault) restores the old
    behaviour, where the select kept waiting for groups that can never come."""
    if e.max_groups <= 0:
        return ()
    if not st.stale_select_target and st.step_target(e.step) != e.target:
        return ()
    picked = st.try_select(e.min_groups, e.max_groups)
    return None if picked is None else tuple(g.group_id for g in picked)


BLOCKING: Dict[type, Callable[[ControllerState, Any], Any]] = {
    fx.AdmitBatch: _admit,
    fx.AcquireCapacity: lambda st, e: st.try_acquire_capacity(),
    fx.AcquireInflight: lambda st, e: st.try_acquire_inflight(),
    fx.AwaitRolloutPermitted: lambda st, e: st.try_rollout_permitted(),
    fx.SelectGroups: _select,
}


def _pause(st: ControllerState, e: Any) -> None:
    st.rollouts_permitted = False
    st.changed()


def _resume(st: ControllerState, e: fx.ResumeRollouts) -> None:
    st.weight_version = e.version
    st.rollouts_permitted = True
    st.changed()


def _abort_stale(st: ControllerState, e: fx.AbortStaleInflight) -> list:
    stale = st.stale_inflight()
    for gid in stale:
        st.buffer.remove_group(gid)
        st.aborted.append(gid)
    st.changed()
    return stale


INSTANT: Dict[type, Callable[[ControllerState, Any], Any]] = {
    fx.StepTarget: lambda st, e: st.step_target(e.step),
    fx.Evict: lambda st, e: st.evict(),
    fx.ClearSamples: lambda st, e: st.clear(e.groups),
    fx.PauseRollouts: _pause,
    fx.AbortStaleInflight: _abort_stale,
    fx.ResumeRollouts: _resume,
    fx.Reserve: lambda st, e: st.reserve(e.prompt_id, e.target_step),
    fx.Commit: lambda st, e: (st.commit(e.group_id), None)[1],
    fx.RemoveGroup: lambda st, e: st.remove_group(e.group_id),
    fx.SkipPrompt: lambda st, e: st.skip_prompt(e.target_step, e.cause),
    fx.DropReplaced: lambda st, e: st.skip_prompt(None, e.cause),
    fx.DivertToReserve: lambda st, e: st.divert(e.first_prompt, e.count),
    fx.TakeReplacement: lambda st, e: st.take_replacement(e.target_step, e.used),
    fx.CountReplaced: lambda st, e: st.count_replaced(e.target_step),
    fx.BufferedFor: lambda st, e: st.buffered_for(e.target_step),
    fx.ReleaseInflight: lambda st, e: st.release_inflight(),
    fx.ReleaseCapacity: lambda st, e: st.release_capacity(),
}


def apply_instant(st: ControllerState, effect: Any) -> Any:
    """Apply an instant effect; returns its result, or the module's ``NOT_INSTANT``
    sentinel when the effect is not one (the runtime handles it)."""
    fn = INSTANT.get(type(effect))
    return NOT_INSTANT if fn is None else fn(st, effect)


def try_blocking(st: ControllerState, effect: Any) -> Any:
    """One try of a blocking effect: its result, or ``None`` (wait for a change)."""
    return BLOCKING[type(effect)](st, effect)


NOT_INSTANT = _NO_RESULT

#: A parked blocking effect that the controller's stop cut short.
STOPPED = Halt("stopped")


class PumpHandlers:
    """The handlers of the pumps' effects against one :class:`ControllerState`, for the
    interpreter (``harness.control.interpret``), which runs every pump.

    A blocking effect (admission, capacity, in-flight, permit, selection) is parked until
    it succeeds: tried, then retried after each state change (``runtime.change()``, what
    the runtime yields to wait for one); the controller's stop ends it with ``error:
    "stopped"`` and closes the pump. An instant effect is applied to the state here, then
    the runtime's optional ``_after_<EffectName>(effect, result)`` runs (stop the
    generations of the groups ``AbortStaleInflight`` dropped, clear the data plane's
    samples of the groups ``ClearSamples`` names). Every other effect takes time: the
    runtime's ``_<EffectName>(effect)`` answers (a value, a generator, an awaitable).
    ``runtime.notify()`` is called once after an effect that changed the state, to wake
    every parked effect. Once stopped, every pump but the train pump (``scope == "step"``)
    is closed at its next effect (NeMo: the first pump to finish decides, the rest are
    cancelled)."""

    def __init__(
        self,
        runtime: Any,
        state: ControllerState,
        pipeline_id: str,
        add: Callable[[Dict[str, Any]], Any],
        now: Callable[[], float],
        gpus_of: Optional[Callable[[Any], Optional[List[int]]]] = None,
    ) -> None:
        self.runtime, self.state, self.pipeline_id = runtime, state, pipeline_id
        self.add, self.now, self.gpus_of = add, now, gpus_of
        self._seen_changes = 0  # the state's change counter when the runtime last notified

    def run(self, gen: Generator, scope: str, step: Optional[int] = None) -> Generator:
        """The interpreter over one pump, logged; returns its value (``None`` once stopped)."""
        return interpret(gen, self.handle, **self.options(scope, step))

    def options(self, scope: str, step: Optional[int] = None) -> Dict[str, Any]:
        """The interpreter's options for one pump (``run_awaiting`` takes them too)."""
        return {
            "log": EffectLog(self.add, self.now, self.pipeline_id, scope, step, gpus_of=self.gpus_of),
            "guard": None if scope == "step" else self._stopped,
            "after": self._after,
        }

    def handle(self, effect: Any) -> Any:
        st = self.state
        if type(effect) in BLOCKING:
            return self._wait(effect)
        result = apply_instant(st, effect)
        name = type(effect).__name__
        if result is NOT_INSTANT:
            return getattr(self.runtime, "_" + name)(effect)
        hook = getattr(self.runtime, "_after_" + name, None)
        if hook is not None:
            hook(effect, result)
        return result

    def _wait(self, effect: Any) -> Generator[Any, Any, Any]:
        st, change = self.state, self.runtime.change
        while True:
            if st.stopped:
                return STOPPED
            got = try_blocking(st, effect)
            if got is not None:
                return got
            yield change()

    def _stopped(self) -> bool:
        return self.state.stopped

    def _after(self) -> None:
        st = self.state
        if st.changes != self._seen_changes:
            self._seen_changes = st.changes
            self.runtime.notify()
