"""The scripted interpreter the control-order tests drive ``harness/control`` with (no simpy,
no torch): it records every effect in order, answers queries, injects a failure at a named
effect and moves real rank and version state; and the pipeline contexts they start from."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from harness.control.context import PipelineContext
from harness.control.effects import effect_fields
from harness.control.interpret import run_blocking
from harness.control.rank_state import RankLifecycle
from harness.control.versions import VersionBook


class Injected(RuntimeError):
    """The failure a test injects into one effect."""


class Script:
    """A scripted runtime: records every effect (name and fields) in order, answers
    queries from ``answers`` and raises :class:`Injected` at the effect named ``fail_at``
    (its ``nth`` occurrence). Rank and version effects move real ``RankLifecycle`` /
    ``VersionBook`` objects, as both runtimes do, so a test can read the state a failure
    leaves behind."""

    def __init__(
        self,
        ctx: PipelineContext,
        *,
        ranks: int = 2,
        answers: Optional[Dict[str, Any]] = None,
        fail_at: Optional[str] = None,
        nth: int = 1,
    ) -> None:
        self.ctx = ctx
        self.answers = dict(answers or {})
        self.fail_at, self.nth = fail_at, nth
        self.seen: List[str] = []
        self.trace: List[tuple] = []
        self.life = {d: RankLifecycle(ctx.pipeline_id, d) for d in range(ranks)}
        self.routable: set = set()

    def __call__(self, effect: Any) -> Any:
        name = type(effect).__name__
        fields = effect_fields(effect) if hasattr(effect, "__dataclass_fields__") else {}
        self.seen.append(name)
        self.trace.append((name, {k: v for k, v in fields.items() if k != "gen"}))
        if name == self.fail_at and self.seen.count(name) == self.nth:
            raise Injected(f"{name} failed")
        handler = getattr(self, "_" + name, None)
        if handler is not None:
            return handler(effect)
        answer = self.answers.get(name)
        return answer(effect) if callable(answer) else answer

    # the effects whose state the tests read
    def _BuildCache(self, e):
        self.ctx.versions.cache_built(e.version)

    def _PromoteCache(self, e):
        self.ctx.versions.promote(e.version)

    def _PublishVersion(self, e):
        self.ctx.versions.publish(e.version)
        return self.ctx.versions.published

    def _ActiveRanks(self, e):
        return sorted(self.routable)

    def _Wake(self, e):
        for d in e.ranks:
            self.life[d].on("wake")
            self.life[d].on("woken")

    def _SyncFromCache(self, e):
        for d in e.ranks:
            self.life[d].on("refreshed" if d in self.routable else "synced", version=e.version)

    def _Finalize(self, e):
        for d in e.ranks:
            self.life[d].on("finalized")

    def _Activate(self, e):
        for d in e.ranks:
            self.life[d].on("activated")
            self.routable.add(d)

    def _Abort(self, e):
        for d in e.ranks:
            self.routable.discard(d)
            self.life[d].on("abort")

    def _Sleep(self, e):
        for d in e.ranks:
            self.life[d].on("slept", level=e.level)

    def _RunControl(self, e):
        run_blocking(e.gen, self)


def nemo_ctx(steps: int = 2) -> PipelineContext:
    return _context("nemo_async", steps, sleep_level=2, step_target=4, gen_estimate=1, clamp_bootstrap=True)


def roll_ctx(steps: int = 2) -> PipelineContext:
    return _context("roll_sync", steps, sleep_level=1, step_target=8, gen_estimate=8, clamp_bootstrap=False)


def _context(kind: str, steps: int, *, clamp_bootstrap: bool, **sizes: Any) -> PipelineContext:
    """Pipeline p of ``kind``; its version book clamps the bootstrap version (NeMo) or not (ROLL)."""
    return PipelineContext("p", kind, steps, versions=VersionBook(clamp_bootstrap=clamp_bootstrap), **sizes)


def run(gen, script: Script) -> List[str]:
    run_blocking(gen, script)
    return script.seen


def promoted(ctx: PipelineContext, version: int = -1) -> PipelineContext:
    ctx.versions.cache_built(version)
    ctx.versions.promote(version)
    return ctx
