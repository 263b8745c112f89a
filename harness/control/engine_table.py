"""The inference engine's legal transitions: one table, after h11's state machines.

An engine (one DP rank of vLLM, SGLang or the gates' tiny engine) is four small machines
that move together; an event names the machines it moves (``ROWS``) and may require a state
of the others (``GUARDS``):

* ``scheduler`` — ``running``, ``pausing`` (a pause issued whose work has not left the
  engine: an abort not yet acknowledged, a ``wait`` still draining), ``paused`` (quiesced);
* ``weights`` — ``awake`` (whole and current), ``offloaded`` (level-1 sleep: a host copy),
  ``discarded`` (level-2 sleep), ``blank`` (mapped again after level 2 or a failed load, holding
  nothing usable), ``loading`` (a weight update writing them), ``loaded`` (written, not
  finalized);
* ``kv_cache`` — ``awake``, ``asleep``;
* ``prefix_cache`` — ``empty``, ``filled`` (entries computed by a forward), ``stale`` (entries
  computed with weights an update has since replaced);
* ``memo_cache`` — a memo the engine keeps in its weights' memory region (SGLang's MXFP8 MoE
  shuffle indices): ``empty``, ``filled`` (computed while the region stayed mapped), ``stale``
  (the region was released since: the memo still hits, its tensors hold whatever the resumed
  pages hold).

Anything the table has no row for is illegal, and so is a row whose guard fails. The runtime
asks :func:`step` before it applies an event (the simulator's and the gates' engines refuse what
it refuses, as vLLM does since its own guards); the oracle (``harness/logs/invariants/
engine_transition.py``) replays a log's events through the same :func:`step` and names each
illegal one. This module holds no state: a state is a plain dict the caller owns.

Each row and guard carries its source as "repository path-or-number commit". The diagram and
the reports behind each illegal transition are in docs/engine-lifecycle.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Tuple

SCHEDULER, WEIGHTS, KV, PREFIX, MEMO = "scheduler", "weights", "kv_cache", "prefix_cache", "memo_cache"
COMPONENTS = (SCHEDULER, WEIGHTS, KV, PREFIX, MEMO)
STATES: Dict[str, Tuple[str, ...]] = {
    SCHEDULER: ("running", "pausing", "paused"),
    WEIGHTS: ("awake", "offloaded", "discarded", "blank", "loading", "loaded"),
    KV: ("awake", "asleep"),
    PREFIX: ("empty", "filled", "stale"),
    MEMO: ("empty", "filled", "stale"),
}
#: an engine is created asleep (RLix offloads every engine after its init; the gates' engine too)
INITIAL: Dict[str, str] = {SCHEDULER: "paused", WEIGHTS: "discarded", KV: "asleep", PREFIX: "empty", MEMO: "empty"}

# ---------------------------------------------------------------------------------- sources
VLLM_PAUSE = "vllm-project/vllm PR #32351 (pause_generation(mode=abort|wait|keep))"
VLLM_SLEEP = "vllm-project/vllm vllm/entrypoints/llm.py (LLM.sleep(level), LLM.wake_up(tags))"
VLLM_44483 = "vllm-project/vllm PR #44483 (the scheduler stays paused until every sleeping tag is awake)"
VLLM_29341 = "vllm-project/vllm #29341 (a level-2 wake must reload every weight before serving)"
VLLM_57853 = "vllm-project/vllm #57853 (/update_weights after /sleep copies into unmapped memory)"
RLIX_SHRINK = (
    "rlops/rlix rlix/pipeline/nemo_rl_pipeline.py f77d913 (sleep_partial(level, mode='abort'), then the drain)"
)
RLIX_EXPAND = (
    "rlops/rlix rlix/pipeline/nemo_rl_pipeline.py f77d913 (wake_up_partial, selective sync, finalize, activate)"
)
RLIX_ACTIVE = (
    "rlops/rlix rlix/pipeline/coordinator.py f77d913 (sync_base_weights_to_active: an update into serving ranks)"
)
RLIX_FINALIZE = (
    "rlops/rlix rlix/pipeline/nemo_rl_model_update_service.py f77d913 (finalize_weight_update after the load)"
)
MILES_ONLOAD = (
    "rlops/rlix rlix/pipeline/miles_pipeline.py f73bfaf (_before_training: a second wake hits torch_memory_saver's "
    "'Cannot resume allocation that is not paused')"
)
VERL_OMNI_380 = (
    "verl-project/verl-omni #380 (an abort with no acknowledgement; default wake tags leave the KV cache asleep)"
)
VERL_7846 = "volcengine/verl #7846 (a KV restore resumes the scheduler and resume_generation resumes it again)"
OMNI_4473 = "vllm-project/vllm-omni #4473 (a repeated sleep is not idempotent)"
LMDEPLOY_4917 = "InternLM/lmdeploy #4917 (prefix-cache entries survive /update_weights)"
VLLM_RESET = "vllm-project/vllm vllm/entrypoints/llm.py (LLM.reset_prefix_cache)"
NEMO_3839 = "NVIDIA-NeMo/RL #3839 (a refit racing an in-flight forward; fixed with pause_generation(mode='keep'))"
VIME_168 = "vllm-project/vime #168 (weights changed under the running step loop: a device-to-host sync hangs)"
SGLANG_MEMO = (
    "sgl-project/sglang python/sglang/srt/layers/moe/moe_runner/flashinfer_trtllm.py 02962d7 "
    "(_flashinfer_trtllm_shuffle_row_indices_cache_mxfp8: shape-keyed GPU index tensors memoized by the "
    "post-load align, allocated in the pausable weights region)"
)
SGLANG_28676 = (
    "sgl-project/sglang PR #28676, 779ea4a (a release/resume of the weights region leaves the memo hitting on "
    "garbage; clear_mxfp8_shuffle_index_cache() in the weight-load funnel, fused_moe_triton/layer.py)"
)

#: pipeline types whose modelled system pauses generation before every weight update, so an
#: update into running generation is illegal there: NeMo RL's single controller (its refit pauses
#: the rollouts first). RLix's active refresh (``nemo_async``, ``roll_sync``) writes into serving
#: ranks by design (RLIX_ACTIVE), and a disaggregated ``in_flight`` sync does too: not listed.
UPDATE_NEEDS_PAUSE: Dict[str, str] = {"single_controller": f"{NEMO_3839}; {VIME_168}"}


@dataclass(frozen=True)
class Row:
    """One legal move of one machine: ``component`` goes ``src`` → ``dst`` on ``event``."""

    event: str
    component: str
    src: str
    dst: str
    source: str


@dataclass(frozen=True)
class Guard:
    """``event`` is legal only while ``component`` is in ``allowed``: the rule ``name``."""

    event: str
    component: str
    allowed: FrozenSet[str]
    name: str
    source: str


def _rows(event: str, component: str, moves: Dict[str, str], source: str) -> List[Row]:
    return [Row(event, component, src, dst, source) for src, dst in moves.items()]


_EVERY_PREFIX_TO_EMPTY = {"empty": "empty", "filled": "empty", "stale": "empty"}
_SLEEP_WEIGHTS = ("awake", "blank", "loaded")  # a sleep drops what the weights hold; never mid-write

ROWS: Tuple[Row, ...] = tuple(
    _rows("pause(abort)", SCHEDULER, {"running": "pausing"}, f"{VLLM_PAUSE}; {RLIX_SHRINK}")
    + _rows("pause(wait)", SCHEDULER, {"running": "pausing"}, VLLM_PAUSE)
    + _rows("pause(keep)", SCHEDULER, {"running": "paused"}, VLLM_PAUSE)
    + _rows("drained", SCHEDULER, {"pausing": "paused", "paused": "paused"}, f"{RLIX_SHRINK}; {VERL_OMNI_380}")
    + _rows("resume", SCHEDULER, {"paused": "running"}, f"{VLLM_44483}; {VERL_7846}")
    + _rows("generate", SCHEDULER, {"running": "running"}, VLLM_PAUSE)
    + _rows("generate", PREFIX, {"empty": "filled", "filled": "filled", "stale": "stale"}, RLIX_ACTIVE)
    + _rows("sleep(1)", WEIGHTS, {s: "offloaded" for s in _SLEEP_WEIGHTS}, f"{VLLM_SLEEP}; {OMNI_4473}")
    + _rows("sleep(2)", WEIGHTS, {s: "discarded" for s in _SLEEP_WEIGHTS}, f"{VLLM_SLEEP}; {OMNI_4473}")
    + [
        r
        for lv in ("sleep(1)", "sleep(2)")
        for r in _rows(lv, KV, {"awake": "asleep", "asleep": "asleep"}, VLLM_SLEEP)
        + _rows(lv, PREFIX, _EVERY_PREFIX_TO_EMPTY, VLLM_SLEEP)
    ]
    + _rows(
        "wake(weights)",
        WEIGHTS,
        {"offloaded": "awake", "discarded": "blank"},
        f"{VLLM_SLEEP}; {VLLM_29341}; {MILES_ONLOAD}",
    )
    + _rows("wake(kv_cache)", KV, {"asleep": "awake"}, f"{VLLM_SLEEP}; {MILES_ONLOAD}")
    + _rows("wake(kv_cache)", PREFIX, _EVERY_PREFIX_TO_EMPTY, VLLM_SLEEP)
    + _rows(
        "load_start",
        WEIGHTS,
        {"awake": "loading", "blank": "loading", "loaded": "loading"},
        f"{RLIX_EXPAND}; {RLIX_ACTIVE}; {VLLM_57853}",
    )
    + _rows("load_end", WEIGHTS, {"loading": "loaded"}, RLIX_EXPAND)
    + _rows("load_end", PREFIX, {"empty": "empty", "filled": "stale", "stale": "stale"}, LMDEPLOY_4917)
    + _rows("load_failed", WEIGHTS, {"loading": "blank"}, RLIX_EXPAND)
    + _rows("finalize", WEIGHTS, {"loaded": "awake"}, RLIX_FINALIZE)
    + _rows("invalidate", PREFIX, _EVERY_PREFIX_TO_EMPTY, f"{VLLM_RESET}; {LMDEPLOY_4917}")
    # the memo lives in the weights' region: a level-1 sleep's host copy brings its contents back
    # with the weights; a level-2 sleep (SGLang's release without a CPU backup) discards them
    + _rows("sleep(1)", MEMO, {"empty": "empty", "filled": "filled", "stale": "stale"}, VLLM_SLEEP)
    + _rows("sleep(2)", MEMO, {"empty": "empty", "filled": "stale", "stale": "stale"}, f"{VLLM_SLEEP}; {SGLANG_28676}")
    + _rows("memo_use", MEMO, {"empty": "filled", "filled": "filled"}, SGLANG_MEMO)
    + _rows("memo_invalidate", MEMO, {"empty": "empty", "filled": "empty", "stale": "empty"}, SGLANG_28676)
)

GUARDS: Tuple[Guard, ...] = (
    Guard("sleep(1)", SCHEDULER, frozenset({"paused"}), "sleep_unquiesced", f"{VLLM_SLEEP}; {VERL_OMNI_380}"),
    Guard("sleep(2)", SCHEDULER, frozenset({"paused"}), "sleep_unquiesced", f"{VLLM_SLEEP}; {VERL_OMNI_380}"),
    Guard(
        "wake(kv_cache)", WEIGHTS, frozenset({"awake", "blank", "loading", "loaded"}), "kv_before_weights", VLLM_44483
    ),
    Guard("load_start", SCHEDULER, frozenset({"running", "paused"}), "load_unacknowledged_abort", VERL_OMNI_380),
    Guard("resume", WEIGHTS, frozenset({"awake"}), "resume_weights_not_ready", f"{VLLM_29341}; {RLIX_EXPAND}"),
    Guard("resume", KV, frozenset({"awake"}), "resume_kv_asleep", f"{VLLM_44483}; {VERL_OMNI_380}"),
    Guard("resume", PREFIX, frozenset({"empty", "filled"}), "resume_stale_prefix_cache", LMDEPLOY_4917),
    Guard("generate", KV, frozenset({"awake"}), "generate_kv_asleep", VLLM_44483),
    Guard(
        "generate",
        WEIGHTS,
        frozenset({"awake", "loading", "loaded"}),
        "generate_weights_asleep",
        f"{VLLM_29341}; {RLIX_ACTIVE}",
    ),
)

EVENTS: Tuple[str, ...] = tuple(dict.fromkeys(r.event for r in ROWS))
_MOVES: Dict[Tuple[str, str], Dict[str, Row]] = {}
for _r in ROWS:
    _MOVES.setdefault((_r.event, _r.component), {})[_r.src] = _r
_GUARDS: Dict[str, List[Guard]] = {}
for _g in GUARDS:
    _GUARDS.setdefault(_g.event, []).append(_g)


@dataclass(frozen=True)
class Illegal:
    """Why an event is illegal in a state: a machine with no row for it (``guard`` None), or a
    guard that fails. ``name`` is what the oracle and the runtime's refusal print."""

    event: str
    component: str
    state: str
    guard: Optional[Guard] = None

    @property
    def name(self) -> str:
        if self.guard is not None:
            return f"{self.guard.name}: {self.event} with {self.component} {self.state}"
        return f"{self.component} {self.state} --{self.event}-->"

    def describe(self) -> str:
        if self.guard is not None:
            return f"{self.name} (allowed: {', '.join(sorted(self.guard.allowed))}; {self.guard.source})"
        legal = sorted(src for src in _MOVES.get((self.event, self.component), {}))
        return f"{self.name} (no such transition; {self.event} moves {self.component} only from {', '.join(legal)})"


def components(event: str) -> Tuple[str, ...]:
    """The machines ``event`` moves."""
    if event not in EVENTS:
        raise KeyError(f"unknown engine event {event!r} (events: {', '.join(EVENTS)})")
    return tuple(c for c in COMPONENTS if (event, c) in _MOVES)


def illegal(state: Dict[str, str], event: str) -> Optional[Illegal]:
    """The first reason ``event`` is illegal in ``state`` (guards first, then the moves), or None."""
    for g in _GUARDS.get(event, ()):
        if state[g.component] not in g.allowed:
            return Illegal(event, g.component, state[g.component], g)
    for c in components(event):
        if state[c] not in _MOVES[(event, c)]:
            return Illegal(event, c, state[c])
    return None


def apply(state: Dict[str, str], event: str) -> None:
    """Move ``state`` by ``event`` whatever its legality (what happened): a machine with no row
    stays where it is. The runtime's fault paths use it; the oracle uses it to go on after a finding."""
    for c in components(event):
        row = _MOVES[(event, c)].get(state[c])
        if row is not None:
            state[c] = row.dst


def step(state: Dict[str, str], event: str) -> Optional[Illegal]:
    """Apply ``event`` to ``state`` if it is legal; return why not otherwise (``state`` unchanged)."""
    why = illegal(state, event)
    if why is None:
        apply(state, event)
    return why


def sleep_event(level: int) -> str:
    return f"sleep({level})"


def wake_events(tags) -> List[str]:
    """The events of a wake of ``tags``, weights first: vLLM's one-call ``wake_up()`` maps the
    weights, then the KV cache."""
    return [f"wake({t})" for t in (WEIGHTS, KV) if t in tags]


def illegal_cases() -> List[Tuple[str, str, str, Optional[str]]]:
    """Every illegal (event, component, state, guard name) the table defines: a machine state an
    event has no row from, for each machine it moves, and each guard's refused states."""
    out: List[Tuple[str, str, str, Optional[str]]] = []
    for event in EVENTS:
        for g in _GUARDS.get(event, ()):
            out += [(event, g.component, s, g.name) for s in STATES[g.component] if s not in g.allowed]
        for c in components(event):
            out += [(event, c, s, None) for s in STATES[c] if s not in _MOVES[(event, c)]]
    return out
