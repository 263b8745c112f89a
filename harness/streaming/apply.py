"""What the pumps' effects do to the controller state, written once for every runtime.

A runtime interpreting ``train_pump`` / ``rollout_pump`` handles the effects that take
time itself (generation, training, weight sync, sleeps) and hands every other effect to
:func:`apply_instant` (done at once) or :func:`try_blocking` (``None`` = wait and try
again when the state changes). Keeping this table here is what makes the simulator and
the real CPU runtime agree on the bookkeeping: only time differs between them.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from harness.control import streaming_effects as fx
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


def is_blocking(effect: Any) -> bool:
    return type(effect) in BLOCKING


NOT_INSTANT = _NO_RESULT

#: :func:`next_effect` says the generator is finished (its return value comes with it).
FINISHED = object()


def next_effect(gen, result: Any, st: ControllerState, scope: str) -> Tuple[Any, Any]:
    """Resume a pump with the last effect's result: ``(effect, None)``, or ``(FINISHED,
    return value)`` when it returned — or when the controller stopped, which closes every
    pump but the train pump (NeMo: the first pump to finish decides, the rest are cancelled)."""
    if st.stopped and scope != "step":
        gen.close()
        return FINISHED, None
    try:
        return gen.send(result), None
    except StopIteration as stop:
        return FINISHED, stop.value
