"""A tiny inference engine's memory after vLLM's sleep mode, for the cycle-trends gate.

What the gate needs of an engine is its memory, tagged as vLLM tags it (``weights`` and
``kv_cache``; ``LLM.sleep(level)`` / ``LLM.wake_up(tags=[...])``): level 1 keeps a host
copy of the weights and drops the device copy and the KV cache; level 2 drops both and
the weights must be reloaded (refit) before the engine may serve. The engine also needs
state that is not a parameter: per-layer FP8 KV-cache scales (``k_scale``, ``v_scale``),
which a refit must carry (NeMo RL #3226 left them out).

Every call is an event of the engine's transition table (``harness/control/engine_table.py``), asked
before the call is applied: an illegal one is refused (``EngineStateError``), as vLLM's own
guards refuse it, unless the engine is ``unguarded`` (an engine from before those guards: the
call goes through). Each call writes the record the simulator writes for it (the one record
vocabulary ``engine_transition`` reads): ``effect_start`` ``Abort`` / ``Pause``, ``effect_end``
``Drain``, ``effect_start`` ``Sleep``, ``engine_tag``, ``effect_start``/``effect_end``
``SyncFromCache``, ``effect_start`` ``Finalize``, ``rank_state``, ``request_dispatch``.

Residue after sleep is *measured*, not declared: on CUDA the caching allocator's
``memory_allocated``; on CPU the bytes of every device tensor this engine ever allocated
that is still alive (weak references: a tensor something still holds counts, one that
was dropped does not), the CPU stand-in for the allocator.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from harness.control import engine_table as table
from harness.control.engine import EngineStateError
from gpu_gates.sync.bucket_cache import dtype_from_name

KV_SCALE_NAMES = ("layers.0.attn.k_scale", "layers.0.attn.v_scale", "layers.1.attn.k_scale", "layers.1.attn.v_scale")
TAGS = ("weights", "kv_cache")


class TinyEngine:
    """Weights (parameters and KV-cache scales) and a KV cache on ``device``, with sleep and wake by tag.

    ``keep_kv_on_sleep`` is the fault ``residue_grows`` (NeMo RL #2619): every sleep keeps
    a reference to the KV cache it should free (a graph pool or allocator segment held
    past the sleep), so what is left after sleep grows by one KV cache per cycle."""

    def __init__(
        self,
        device: torch.device,
        weight_spec: Dict[str, Tuple[Tuple[int, ...], str]],
        kv_bytes: int,
        keep_kv_on_sleep: bool = False,
        emit: Optional[Callable[..., None]] = None,
        unguarded: bool = False,
        name: str = "engine",
    ) -> None:
        self.device = device
        self.emit = emit or (lambda kind, **fields: None)
        self.unguarded = unguarded
        self.name = name
        self.state = dict(table.INITIAL)  # created asleep, as RLix leaves every engine after its init
        self.spec = dict(weight_spec)
        self.kv_bytes = kv_bytes
        self.keep_kv_on_sleep = keep_kv_on_sleep
        self._tracked: List[weakref.ref] = []
        self._kept: List[torch.Tensor] = []  # the fault's references
        self.weights: Dict[str, torch.Tensor] = {}
        self.kv_cache: Optional[torch.Tensor] = None
        self.host_weights: Optional[Dict[str, torch.Tensor]] = None
        self.asleep: Dict[str, bool] = {t: True for t in TAGS}
        self.level: Optional[int] = None

    def required(self) -> List[str]:
        """Every tensor the engine must have loaded to serve: parameters and KV-cache scales."""
        return list(self.spec)

    def _alloc(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        t = torch.zeros(tuple(shape), dtype=dtype, device=self.device)
        self._tracked.append(weakref.ref(t))
        return t

    def device_bytes(self) -> int:
        """Device memory this engine still holds (see the module docstring)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.memory_allocated(self.device))
        alive = [r for r in self._tracked if r() is not None]
        self._tracked = alive
        return sum(t.numel() * t.element_size() for t in (r() for r in alive) if t is not None)

    # ------------------------------------------------------------------ the table's events
    def _event(self, event: str) -> None:
        """Ask the table; refuse an illegal call unless unguarded (then it happens anyway)."""
        why = table.illegal(self.state, event)
        if why is not None and not self.unguarded:
            raise EngineStateError(f"{self.name}: {why.name} refused ({why.describe()})")
        table.apply(self.state, event)

    def _record(self, kind: str, **fields: Any) -> None:
        self.emit(kind, pipeline_id=self.name, **fields)

    def _effect(self, kind: str, effect: str, **args: Any) -> None:
        self._record(kind, effect=effect, args={"ranks": [0], **args})

    def pause(self, mode: str) -> None:
        """``pause_generation(mode)``: the rank leaves routing (``abort``: RLix's shrink)."""
        self._event(f"pause({mode})")
        if mode == "abort":
            self._effect("effect_start", "Abort")
        else:
            self._effect("effect_start", "Pause", mode=mode)
        self._record("rank_state", dp_rank=0, state="draining", asleep_tags=self.asleep_tags())

    def drained(self) -> None:
        """The pause acknowledged: no request runs (the tiny engine runs one at a time)."""
        self._event("drained")
        self._effect("effect_end", "Drain")

    def begin_load(self, version: int) -> None:
        self._event("load_start")
        self._effect("effect_start", "SyncFromCache", version=version, path="expand")

    def end_load(self, version: int) -> None:
        self._event("load_end")
        self._effect("effect_end", "SyncFromCache", version=version, path="expand")

    def finalize(self) -> None:
        self._event("finalize")
        self._effect("effect_start", "Finalize")

    def invalidate(self) -> None:
        """``reset_prefix_cache``: no entry computed with the old weights is reused."""
        self._event("invalidate")
        self._record("engine_tag", dp_rank=0, tag="prefix_cache", state="invalidated")

    def resume(self) -> None:
        self._event("resume")
        self._record("rank_state", dp_rank=0, state="routable", asleep_tags=self.asleep_tags())

    def generate(self, request: int) -> torch.Tensor:
        """One forward of a request: the weights' sum, written into the KV cache's first bytes
        (a cache that is asleep is not written: the tiny engine's stand-in for a fault)."""
        self._event("generate")
        self._record("request_dispatch", dp_rank=0, request=request)
        out = sum(t.float().sum() for t in self.weights.values()) if self.weights else torch.zeros(())
        if self.kv_cache is not None:
            self.kv_cache[:4].copy_(torch.tensor([out.item()], dtype=torch.float32).view(torch.uint8))
        return out

    def asleep_tags(self) -> List[str]:
        return [t for t in TAGS if self.asleep[t]]

    # ------------------------------------------------------------------ memory
    def sleep(self, level: int) -> None:
        """vLLM's ``sleep(level)``: level 1 offloads the weights to host memory, level 2
        discards them; both discard the KV cache."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        self._event(table.sleep_event(level))
        self._effect("effect_start", "Sleep", level=level)
        self.host_weights = {n: t.cpu().clone() for n, t in self.weights.items()} if level == 1 else None
        if self.keep_kv_on_sleep and self.kv_cache is not None:
            self._kept.append(self.kv_cache)
        self.weights, self.kv_cache = {}, None
        self.asleep = {t: True for t in TAGS}
        self.level = level
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def wake(self, tags: Sequence[str]) -> None:
        """vLLM's ``wake_up(tags=...)``: ``weights`` reallocates the weights (restored from
        the host copy after level 1; zeros after level 2, to be reloaded by a refit);
        ``kv_cache`` reallocates the KV cache."""
        for tag in tags:
            if tag not in TAGS:
                raise ValueError(f"unknown memory tag {tag!r} (tags: {', '.join(TAGS)})")
        for tag in (t for t in TAGS if t in tags):  # weights first, as vLLM's wake_up() maps them
            self._event(f"wake({tag})")
            self._record("engine_tag", dp_rank=0, tag=tag, state="awake")
            if tag == "weights":
                for name, (shape, dt) in self.spec.items():
                    t = self._alloc(shape, dtype_from_name(dt))
                    if self.host_weights is not None:
                        t.copy_(self.host_weights[name].to(self.device))
                    self.weights[name] = t
                self.host_weights = None
            else:
                self.kv_cache = self._alloc((self.kv_bytes,), torch.uint8)
            self.asleep[tag] = False
