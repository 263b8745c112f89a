"""The inference engine's memory tags and pause modes, after vLLM's RL sequence.

vLLM's sequence around a weight update (vllm-project/vllm: ``pause_generation(mode=...)``
from PR #32351, the tag-wise ``sleep``/``wake_up(tags=...)`` of sleep mode, and PR #44483,
which keeps the scheduler paused until every sleeping tag is awake):

    pause(mode) → sleep(level; tags weights and kv_cache) → wake(weights) → load weights →
    finalize → wake(kv_cache) → resume

What a pause does to the requests the engine holds (``mode``):

* ``abort`` — every running and waiting request is aborted at once; whatever it decoded is
  thrown away (the caller may retry it elsewhere: RLix's turn-level re-dispatch). This is
  lost work.
* ``wait`` — no new request is scheduled; those in the engine run to completion first.
* ``keep`` — the scheduler freezes: requests stay in the engine with what they decoded and
  go on after the resume (their KV cache, discarded by a sleep, is recomputed).

Sleep level 1 copies the weights to host RAM (``offloaded``) and discards the KV cache;
level 2 discards both (``discarded``): a level-2 engine must reload every weight after
its wake before it may serve (vllm #29341: serving without the reload returns garbage).

Which modes a pipeline uses is its framework's (:class:`EngineConfig`); the control logic
(``harness/control/resize.py``) yields the effects of the chosen sequence and
:class:`EngineTags` is the per-rank state machine both it and the runtime obey: it refuses
a resume with a tag asleep or a KV wake before the weights, as vLLM does since #44483.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

from harness.control import engine_table as table
from harness.control.effects import Abort, Pause, Ranks
from harness.control.rank_state import RankStateError

PAUSE_MODES = ("abort", "wait", "keep")
#: ``all``: one wake of every tag before the refit (RLix ``wake_up_partial`` → vLLM
#: ``wake_up()`` with no tags); ``staged``: weights before the refit, KV cache after it
WAKE_MODES = ("all", "staged")
TAGS = ("weights", "kv_cache")


@dataclass(frozen=True)
class EngineConfig:
    """A pipeline's engine modes; the defaults are what RLix runs (its shrink calls
    ``sleep_partial(ranks, level, mode="abort")`` and its expand wakes every tag at once)."""

    pause_mode: str = "abort"
    wake: str = "all"


def pause_effect(ranks: Ranks, mode: str):
    """The effect that pauses ``ranks``: RLix's ``Abort`` for mode ``abort`` (the effect the
    shrink always yielded), a ``Pause`` naming the mode otherwise."""
    return Abort(ranks) if mode == "abort" else Pause(ranks, mode)


class EngineStateError(RankStateError):
    """An engine call vLLM refuses (or that would corrupt it): the order was broken."""


class EngineTags:
    """One DP rank's engine: its state in the engine's transition table
    (``harness/control/engine_table.py``), asked before every call, and whether its weights hold a
    whole model (a level-1 copy, or every bucket reloaded: what the table cannot see)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.state: Dict[str, str] = dict(table.INITIAL)  # created asleep (RLix offloads every engine after init)
        self.whole = False

    @property
    def tags(self) -> Dict[str, str]:
        """vLLM's view of the memory tags: ``awake`` once mapped (the weights also while blank or
        being written), else how they sleep (``offloaded`` / ``discarded``; ``asleep``)."""
        weights = self.state[table.WEIGHTS]
        return {
            "weights": weights if weights in ("offloaded", "discarded") else "awake",
            "kv_cache": self.state[table.KV],
        }

    @property
    def paused(self) -> bool:
        return self.state[table.SCHEDULER] != "running"

    def asleep_tags(self) -> List[str]:
        tags = self.tags
        return [t for t in TAGS if tags[t] != "awake"]

    def _step(self, event: str) -> None:
        why = table.step(self.state, event)
        if why is not None:
            raise EngineStateError(f"{self.name}: {why.name} refused ({why.describe()})")

    def force(self, event: str) -> None:
        """What a fault's controller does past the engine's refusal (recorded as it happened)."""
        table.apply(self.state, event)

    def pause(self, mode: str) -> None:
        self._step(f"pause({mode})")

    def drained(self) -> None:
        """The pause acknowledged: no request of the engine still runs."""
        self._step("drained")

    def sleep(self, level: int) -> None:
        self._step(table.sleep_event(level))
        self.whole = level == 1  # a level-1 copy is whole; level 2 keeps nothing

    def wake(self, tags: Tuple[str, ...]) -> None:
        for event in table.wake_events(tags):
            self._step(event)

    def begin_load(self) -> None:
        self._step("load_start")

    def load(self, complete: bool) -> None:
        """The update's write ended: ``complete`` when every bucket of the model arrived."""
        self._step("load_end")
        self.whole = self.whole or complete

    def finalize(self) -> None:
        self._step("finalize")

    def invalidate(self) -> None:
        """The prefix cache flushed (SGLang's ``flush_cache`` in ``finalize_weight_update``)."""
        self._step("invalidate")

    def memo_invalidate(self) -> None:
        """The memo kept in the weights' region dropped (SGLang's weight-load funnel calls
        ``clear_mxfp8_shuffle_index_cache()`` since sgl-project/sglang PR #28676)."""
        self._step("memo_invalidate")

    def memo_use(self) -> None:
        """The post-load processing reads (or fills) the memo: refused once a release of the
        weights' region left it stale."""
        self._step("memo_use")

    def resume(self) -> None:
        why = table.illegal(self.state, "resume")
        if why is not None:
            raise EngineStateError(f"{self.name}: {why.name} refused ({why.describe()})")
        if not self.whole:
            raise EngineStateError(f"{self.name}: resume before the weights were fully reloaded")
        table.apply(self.state, "resume")
