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

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

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


@dataclass
class EngineTags:
    """One DP rank's engine: its tags, whether its scheduler is paused, how it slept."""

    name: str
    tags: Dict[str, str] = field(default_factory=lambda: {"weights": "discarded", "kv_cache": "asleep"})
    paused: bool = True  # created asleep (RLix offloads every engine after init)
    level: int = 2
    loaded: bool = False  # weights hold a whole model (restored from host, or fully reloaded)

    def asleep_tags(self) -> List[str]:
        return [t for t in TAGS if self.tags[t] != "awake"]

    def pause(self) -> None:
        self.paused = True

    def sleep(self, level: int) -> None:
        if not self.paused:
            raise EngineStateError(f"{self.name}: sleep while the scheduler runs (pause first)")
        self.level = level
        self.tags = {"weights": "offloaded" if level == 1 else "discarded", "kv_cache": "asleep"}
        self.loaded = level == 1  # a level-1 copy is whole; level 2 keeps nothing

    def wake(self, tags: Tuple[str, ...]) -> None:
        if "kv_cache" in tags and "weights" not in tags and self.tags["weights"] != "awake":
            raise EngineStateError(f"{self.name}: KV cache woken before the weights")
        for tag in tags:
            self.tags[tag] = "awake"

    def load(self, complete: bool) -> None:
        """Weights written by a refit: ``complete`` when every bucket of the model arrived."""
        if self.tags["weights"] != "awake":
            raise EngineStateError(f"{self.name}: weights loaded while asleep")
        self.loaded = self.loaded or complete

    def resume(self) -> None:
        asleep = self.asleep_tags()
        if asleep:
            raise EngineStateError(f"{self.name}: resume with {', '.join(asleep)} asleep (vllm #44483)")
        if not self.loaded:
            raise EngineStateError(f"{self.name}: resume before the weights were fully reloaded")
        self.paused = False
