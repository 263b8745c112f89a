"""Progress reporting: how generation demand reaches the gap-ratio planner.

Two halves, as in RLix (docs/modelled-systems.md#rlix-progress-reports):

* :class:`CoordinatorProgress` — the per-pipeline coordinator. Reporters send the raw
  ``collected`` count per stream; the coordinator clamps it to the stream's target, sums
  the streams and forwards a report only when the 2 % bucket changes (or when forced by a
  new batch or a cleared stream). This throttling is why the scheduler sees demand in
  coarse steps, which the simulator must reproduce to get the same decisions.
* :class:`ProgressStore` — scheduler ingress. It keeps the latest report per
  (pipeline, mode, stream) and derives ``remaining`` from ``completed`` (never from a wire
  ``remaining``), caching per-pipeline totals between changes so a cycle reads them in O(1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from harness.scheduler.types import Rejected

FULL_FINETUNE_STREAM = "__full_finetune__"
COORDINATOR_FULL_FT_KEY = "__fft__"
BUCKETS = 50  # 2 % granularity


@dataclass(frozen=True)
class ProgressReport:
    """A report as it arrives at the scheduler."""

    pipeline_id: str
    step_target: int
    completed: float
    mode: str = "train"
    adapter: Optional[str] = None


class ProgressStore:
    """Scheduler-side store: latest report per (pipeline, mode, stream)."""

    def __init__(self) -> None:
        self._reports: Dict[str, Dict[str, Dict[str, ProgressReport]]] = {}
        self._totals: Dict[str, Tuple[float, float]] = {}

    def report(self, rep: ProgressReport, *, wire_fields: Optional[Dict[str, object]] = None) -> None:
        """Store ``rep``; raise :class:`Rejected` for what RLix's ingress refuses."""
        if wire_fields and "remaining" in wire_fields:
            raise Rejected("progress report carries a wire-level 'remaining'; only 'completed' is accepted")
        if not isinstance(rep.step_target, int) or rep.step_target <= 0:
            raise Rejected(f"step_target_trajectories must be > 0, got {rep.step_target!r}")
        per_mode = self._reports.setdefault(rep.pipeline_id, {})
        has_full = has_lora = False
        for streams in per_mode.values():
            for k in streams:
                if k == FULL_FINETUNE_STREAM:
                    has_full = True
                else:
                    has_lora = True
        if rep.adapter is None:
            if has_lora:
                raise Rejected(
                    f"pipeline {rep.pipeline_id} already reports LoRA streams; a full-finetune report is a source-type mismatch"
                )
            key = FULL_FINETUNE_STREAM
        else:
            if rep.adapter == FULL_FINETUNE_STREAM:
                raise Rejected(f"adapter id {FULL_FINETUNE_STREAM!r} is reserved for the full-finetune stream")
            if has_full:
                raise Rejected(
                    f"pipeline {rep.pipeline_id} already reports a full-finetune stream; LoRA report for {rep.adapter!r} is a source-type mismatch"
                )
            key = rep.adapter
        per_mode.setdefault(rep.mode, {})[key] = rep
        self._totals.pop(rep.pipeline_id, None)

    def clear(self, pipeline_id: str) -> None:
        self._reports.pop(pipeline_id, None)
        self._totals.pop(pipeline_id, None)

    def totals(self, pipeline_id: str) -> Tuple[float, float]:
        """(remaining, required) summed over the pipeline's streams; (0, 0) if none.

        Summed afresh after each change, in RLix's iteration order, so float results are
        identical to RLix's (an incremental add/subtract would drift); cached between changes.
        """
        cached = self._totals.get(pipeline_id)
        if cached is not None:
            return cached
        rem = req = 0.0
        for streams in self._reports.get(pipeline_id, {}).values():
            for r in streams.values():
                # Per stream: target = float(max(int(step_target), 1)), done = min(max(0.0,
                # completed), target), remaining = max(target - done, 0.0). Spelled with
                # comparisons that pick the same operand as those builtins (max keeps its
                # first argument unless the second is greater, min unless it is smaller),
                # so -0.0 and NaN come out the same; this runs after every report.
                target = int(r.step_target)
                target = float(target if not 1 > target else 1)
                done = float(r.completed)
                done = done if done > 0.0 else 0.0
                if target < done:
                    done = target
                remaining = target - done
                if 0.0 > remaining:
                    remaining = 0.0
                rem += remaining
                req += target
        result = (rem if rem > 0.0 else 0.0, req)  # max(0.0, rem)
        self._totals[pipeline_id] = result
        return result

    def has_reports(self, pipeline_id: str) -> bool:
        return bool(self._reports.get(pipeline_id))


class _Stream:
    """One reporter stream's latest raw numbers (updated in place: the coordinator owns it)."""

    __slots__ = ("step_target", "collected")

    def __init__(self, step_target: int, collected: float) -> None:
        self.step_target = step_target
        self.collected = collected


_STREAM_KEYS: Dict[Tuple[str, Optional[str]], str] = {}  # (mode, adapter) -> CoordinatorProgress.stream_key
_NO_REPORTER = object()  # no mode or adapter is this: the key cache starts empty


class CoordinatorProgress:
    """Coordinator-side aggregation with 2 % bucket throttling.

    ``update`` and ``clear_stream`` return what the coordinator sends to the scheduler:
    a :class:`ProgressReport`, the string ``"clear"`` (no stream left), or ``None``
    (throttled: the bucket did not move and nothing forced a send).
    """

    def __init__(self, pipeline_id: str) -> None:
        self.pipeline_id = pipeline_id
        self._streams: Dict[str, _Stream] = {}
        self._last_bucket: Optional[int] = None
        # True while ``_last_bucket`` is the bucket of the streams as they are: every
        # ``_emit`` that gets past ``aggregate`` leaves it so (it sends, or the bucket is
        # the one it holds). An update that leaves every stream's numbers equal then has
        # nothing to send unless forced (see ``update``).
        self._settled = False
        # (mode, adapter, stream_key(mode, adapter)) of the last update: a coordinator's
        # reporters are few and repeat themselves, so the key is found by identity first
        self._key_of: Tuple[object, object, str] = (_NO_REPORTER, _NO_REPORTER, "")

    @staticmethod
    def stream_key(mode: str, adapter: Optional[str]) -> str:
        key = _STREAM_KEYS.get((mode, adapter))  # built once per (mode, adapter): every update asks
        if key is None:
            key = _STREAM_KEYS[(mode, adapter)] = (
                f"{mode}:{adapter if adapter is not None else COORDINATOR_FULL_FT_KEY}"
            )
        return key

    def update(
        self,
        *,
        mode: str,
        adapter: Optional[str],
        step_target: int,
        collected: float,
        new_batch: bool = False,
        wire_fields: Optional[Dict[str, object]] = None,
    ):
        if wire_fields and "remaining" in wire_fields:
            raise Rejected("reporter sent a wire-level 'remaining'; reporters send raw 'collected'")
        if step_target <= 0:
            raise Rejected(f"step_target must be > 0, got {step_target}")
        if mode is self._key_of[0] and adapter is self._key_of[1]:  # the same reporter again
            key = self._key_of[2]
        else:
            key = self.stream_key(mode, adapter)
            self._key_of = (mode, adapter, key)
        stream = self._streams.get(key)
        if stream is None:
            self._streams[key] = _Stream(step_target, collected)
            return self._emit(new_batch)
        # Equal numbers (3 and 3.0 too) give the same bucket, so when nothing forces a send
        # and the bucket held is the streams' own, _emit would return None: skip it. (A
        # reporter repeats its count often: a simulated sync pipeline reports on every
        # completion, and a stale trajectory does not move it.) The new values are stored
        # either way: same dict position and values as storing a fresh _Stream under the key.
        unchanged = stream.collected == collected and stream.step_target == step_target
        stream.step_target = step_target
        stream.collected = collected
        if unchanged and not new_batch and self._settled:
            return None
        return self._emit(new_batch)

    def clear_stream(self, *, mode: str, adapter: Optional[str]):
        if self._streams.pop(self.stream_key(mode, adapter), None) is None:
            return None  # never reported: nothing changes, nothing is sent (as RLix)
        if not self._streams:
            self._last_bucket = None
            return "clear"
        return self._emit(True)

    def aggregate(self) -> Tuple[int, float, float, int]:
        """(total_required, total_completed, total_collected, bucket)."""
        required = completed = collected = 0  # one pass, same summation order as sum()
        for s in self._streams.values():
            raw, target = s.collected, s.step_target
            required += target
            # min(max(0.0, raw), target) without the builtin calls: the same operand is
            # picked (max keeps 0.0 unless raw > 0.0; min keeps the value unless target < it)
            done = raw if raw > 0.0 else 0.0
            completed += target if target < done else done
            collected += raw
        if required > 0:
            ratio = completed / required
            if 1.0 < ratio:  # min(ratio, 1.0)
                ratio = 1.0
        else:
            ratio = 0.0
        return required, completed, collected, math.floor(ratio * BUCKETS)  # floor of a float is an int

    def _emit(self, force: bool):  # positional: called on every update
        self._settled = False  # until the bucket below is known (aggregate may raise)
        required, completed, _collected, bucket = self.aggregate()
        self._settled = True  # both ways out leave _last_bucket == bucket
        if not force and bucket == self._last_bucket:
            return None
        self._last_bucket = bucket
        # The aggregate is forwarded as one full-finetune stream in mode "aggregated".
        return ProgressReport(self.pipeline_id, required, completed, "aggregated", None)  # mode, adapter
