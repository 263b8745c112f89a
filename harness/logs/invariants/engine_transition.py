"""``engine_transition``: every engine event in the log is legal by the engine's transition
table (``harness/control/engine_table.py``, docs/engine-lifecycle.md). ``engine_stood_down``: no engine
ends the log paused and awake, with nothing left to wake it.

The events are read from what the runtimes record, one vocabulary for the simulator and the
gates:

| record | event of each named rank |
|---|---|
| ``effect_start`` ``Abort`` / ``Pause`` (``mode``) | ``pause(abort)`` / ``pause(mode)`` |
| ``effect_end`` ``Drain`` | ``drained`` (the pause's acknowledgement: no request left running) |
| ``effect_start`` ``Sleep`` (``level``) | ``sleep(level)`` |
| ``rank_state`` past ``waking`` whose tags are awake (not in ``asleep_tags``); ``effect_end`` ``Wake`` (every tag) | ``wake(...)`` of those tags that were asleep |
| ``engine_tag`` ``weights`` / ``kv_cache`` ``awake`` | ``wake(tag)``; ``prefix_cache`` ``invalidated``: ``invalidate`` |
| ``engine_tag`` ``memo_cache`` ``used`` / ``invalidated`` | ``memo_use`` / ``memo_invalidate`` |
| ``effect_start`` / ``effect_end`` ``SyncFromCache`` (one version) | ``load_start`` / ``load_end`` (``load_failed`` with an ``error``) |
| ``rank_state`` turning ``synced`` with no update open on the rank (a log without the effects) | ``load_start``, ``load_end``, ``finalize`` |
| ``sync_end`` with ``ok`` false (the sync of that version failed) | ``load_failed`` |
| ``effect_start`` ``Finalize`` | ``finalize`` |
| ``effect_start`` ``PauseGeneration`` / ``ContinueGeneration`` | ``pause(keep)`` / ``resume`` |
| ``effect_start`` ``PauseRollouts`` / ``ResumeRollouts`` | a single controller's whole generation side stands down / resumes (``engine_stood_down`` only) |
| ``rank_state`` ``routable`` after another state | ``resume`` |
| ``request_dispatch`` / ``request_resume`` | ``generate`` |

A rank enters the table at :data:`~harness.control.engine_table.INITIAL` (asleep, level 2) and leaves it
at ``stopped``. After an illegal event the replay moves on as the engine did (``apply``), so one
misstep is named once, at its record.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from harness.control import engine_table as table
from harness.logs.invariants.base import Records, Violation, invariant

Rank = Tuple[str, int]
_ASLEEP_STATES = ("asleep", "waking", "stopped")  # lifecycle states where no tag is awake
_MEMO_EVENTS = {"used": "memo_use", "invalidated": "memo_invalidate"}  # engine_tag memo_cache's states
_TAG_ASLEEP = {table.WEIGHTS: ("offloaded", "discarded"), table.KV: ("asleep",)}
#: an event -> 1 if it pauses the engine, -1 if it ends a pause (a resume or a sleep), else 0
_PAUSING: Dict[str, int] = {}


class _Replay:
    """Each rank's table state, driven by the log's records."""

    def __init__(self) -> None:
        self.state: Dict[Rank, Dict[str, str]] = {}
        self.life: Dict[Rank, str] = {}
        self.open: Dict[str, Dict[object, List[Rank]]] = {}  # pipeline -> version -> ranks its open sync writes
        self.out: List[Violation] = []
        self._memo: Dict[Tuple[Tuple[str, ...], str], Tuple[Optional[table.Illegal], Tuple[str, ...]]] = {}
        self.paused_at: Dict[Rank, dict] = {}  # rank -> the record of its pause not yet followed by a resume or sleep
        # a single controller's generation side -> its PauseRollouts not yet followed by a ResumeRollouts
        self.rollouts_paused_at: Dict[str, dict] = {}
        self.types: Dict[str, str] = {}  # pipeline -> its type (the header's meta)
        self.end: object = None  # the seq of the last record replayed
        # ranks whose state takes ``generate`` as legal and unchanged (the table's answer
        # depends only on the state): a dispatch to one is nothing to replay. Most of a
        # long run's engine events are dispatches to a rank serving as before; a rank
        # leaves the set when its state moves
        self._serving: set = set()

    def event(self, key: Rank, event: str, r: dict) -> None:
        state = self.state.get(key)
        if state is None:
            state = self.state[key] = dict(table.INITIAL)
        before = tuple(state.values())
        memo_key = (before, event)
        known = self._memo.get(memo_key)
        if known is None:  # the table's answer and move depend only on the state and the event
            moved = dict(state)
            table.apply(moved, event)
            known = self._memo[memo_key] = (table.illegal(state, event), tuple(moved.values()))
        why, after = known
        pausing = _PAUSING.get(event)
        if pausing is None:
            pausing = _PAUSING[event] = (
                1 if event.startswith("pause(") else (-1 if event == "resume" or event.startswith("sleep(") else 0)
            )
        if pausing == 1:
            self.paused_at.setdefault(key, r)
        elif pausing == -1:
            self.paused_at.pop(key, None)
        if why is not None:
            self.out.append(
                Violation(
                    "engine_transition",
                    r["seq"],
                    f"{key[0]} dp{key[1]}: illegal {why.describe()} "
                    f"(record {r['kind']}{' ' + r['effect'] if 'effect' in r else ''})",
                )
            )
        if after != before:
            state.update(zip(state, after))
            self._serving.discard(key)
        elif event == "generate" and why is None:
            self._serving.add(key)

    def on(self, r: dict) -> None:
        kind = r["kind"]
        pid = r.get("pipeline_id")
        if kind == "header":
            self.types = dict((r.get("meta") or {}).get("pipeline_types") or {})
        elif kind in ("request_dispatch", "request_resume"):
            key = (pid, r["dp_rank"])
            if key not in self._serving:  # (else legal, and it moves nothing: see _serving)
                self.event(key, "generate", r)
        elif kind == "rank_state":
            self._rank_state(r, (pid, r["dp_rank"]))
        elif kind == "engine_tag":
            key = (pid, r["dp_rank"])
            if r["tag"] == table.PREFIX and r["state"] == "invalidated":
                self.event(key, "invalidate", r)
            elif r["tag"] == table.MEMO and r["state"] in _MEMO_EVENTS:
                self.event(key, _MEMO_EVENTS[r["state"]], r)
            elif r["tag"] in _TAG_ASLEEP and r["state"] == "awake":
                self.event(key, f"wake({r['tag']})", r)
        elif kind == "sync_end" and pid is not None and r.get("ok") is False:
            self._load_ended(pid, r.get("version"), "load_failed", r)
        elif kind in ("effect_start", "effect_end"):
            self._effect(r, pid)

    def _update_unpaused(self, r: dict, pid: str) -> None:
        """A weight update into running generation, where the pipeline's type pauses first
        (``engine_table.UPDATE_NEEDS_PAUSE``; RLix's active refresh is not judged here)."""
        source = table.UPDATE_NEEDS_PAUSE.get(self.types.get(pid, ""))
        if source and pid not in self.rollouts_paused_at:
            self.out.append(
                Violation(
                    "engine_transition",
                    r["seq"],
                    f"{pid}: illegal update_unpaused: SyncWeights (version {r['args'].get('version')}) into "
                    f"generation that is running, no PauseRollouts before it ({self.types[pid]} pauses "
                    f"before every update; {source})",
                )
            )

    def _load_ended(self, pid: str, version, event: str, r: dict) -> None:
        syncs = self.open.get(pid) or {}
        for key in syncs.pop(version, ()):
            self.event(key, event, r)

    def _effect(self, r: dict, pid: str) -> None:
        name, start = r["effect"], r["kind"] == "effect_start"
        if name == "SyncFromCache":  # the update: one per version of a pipeline at a time
            version = r["args"].get("version")
            if start:
                ranks = [(pid, dp) for dp in r["args"]["ranks"]]
                self.open.setdefault(pid, {})[version] = ranks
                for key in ranks:
                    self.event(key, "load_start", r)
            else:
                self._load_ended(pid, version, "load_failed" if r.get("error") else "load_end", r)
            return
        if not start and name == "Wake" and not r.get("error"):  # RLix's wake returned: every tag is awake
            for dp in r["args"]["ranks"]:
                self._woken((pid, dp), [table.WEIGHTS, table.KV], r)
            return
        if start and name == "SyncWeights":
            self._update_unpaused(r, pid)
            return
        if start and name in ("PauseRollouts", "ResumeRollouts"):  # the whole generation side, not one engine
            if name == "PauseRollouts":
                self.rollouts_paused_at.setdefault(pid, r)
            else:
                self.rollouts_paused_at.pop(pid, None)
            return
        if start and name == "Abort":
            event = "pause(abort)"
        elif start and name == "Pause":
            event = f"pause({r['args']['mode']})"
        elif start and name == "Sleep":
            event = table.sleep_event(r["args"]["level"])
        elif start and name == "PauseGeneration":
            event = "pause(keep)"
        elif start and name == "ContinueGeneration":
            event = "resume"
        elif start and name == "Finalize":
            event = "finalize"
        elif not start and name == "Drain":
            event = "drained"
        else:
            return
        # an effect that names no ranks (a disaggregated pipeline pauses its whole generation
        # side) is not an engine call the table judges
        for dp in r["args"].get("ranks", ()):
            self.event((pid, dp), event, r)

    def _woken(self, key: Rank, awake, r: dict) -> None:
        """A record says ``awake`` tags are awake: those still asleep here woke (weights first)."""
        state = self.state.setdefault(key, dict(table.INITIAL))
        woke = [t for t in awake if state[t] in _TAG_ASLEEP[t]]
        if woke:  # (most lifecycle records: every tag already awake, no event)
            for event in table.wake_events(woke):
                self.event(key, event, r)

    def _rank_state(self, r: dict, key: Rank) -> None:
        new, old = r["state"], self.life.get(key)
        self.life[key] = new
        if new == "stopped":
            self.state.pop(key, None)
            self._serving.discard(key)
            self.paused_at.pop(key, None)
            return
        if new not in _ASLEEP_STATES:
            asleep = set(r.get("asleep_tags") or ())
            self._woken(key, [t for t in (table.WEIGHTS, table.KV) if t not in asleep], r)
        if new == "synced" and old != "synced" and self.state[key][table.WEIGHTS] not in ("loading", "loaded"):
            # a log whose only record of the update is the lifecycle's (no effects): the rank's
            # lifecycle activates only a finalized update, so the finalize is read from it too
            for event in ("load_start", "load_end", "finalize"):
                self.event(key, event, r)
        if new == "routable" and old != "routable":
            self.event(key, "resume", r)


#: the last replay made and the records it was made of: engine_transition and
#: engine_stood_down read the same records through the same replay, made once
_LAST: List = [None, None]


def engine_replay(records: Records) -> _Replay:
    """The replay of ``records`` (made once for both checks of the same records list)."""
    if isinstance(records, list) and _LAST[0] is records and _LAST[1].end == _end_seq(records):
        return _LAST[1]
    replay = _Replay()
    on = replay.on
    for r in records:
        on(r)
    replay.end = _end_seq(records)  # (after the pass: an online view knows its end then)
    _LAST[:] = [records, replay]
    return replay


def _end_seq(records: Records) -> object:
    return records[-1].get("seq", 0) if records else None


def on_replay(check, replay: _Replay, first: dict, last: dict) -> List[Violation]:
    """``check`` (engine_transition or engine_stood_down: each reads its records only
    through :func:`engine_replay` and the log's first and last record) of a log whose
    replay, made in one pass (harness/logs/invariants/online.py), is ``replay``."""
    ends = [first] if last is first else [first, last]
    replay.end = _end_seq(ends)
    _LAST[:] = [ends, replay]
    return check(ends)


@invariant(
    "engine_transition",
    reads=("effect_start", "effect_end", "rank_state", "engine_tag", "sync_end", "request_dispatch", "request_resume"),
    sees=("header",),
)
def engine_transition(records: Records) -> List[Violation]:
    """Every engine event the log records is a legal transition of the engine's table."""
    return list(engine_replay(records).out)


@invariant(
    "engine_stood_down",
    reads=("effect_start", "effect_end", "rank_state", "engine_tag", "sync_end", "request_dispatch", "request_resume"),
    sees=("header",),
)
def engine_stood_down(records: Records) -> List[Violation]:
    """No engine ends the log paused and awake: a pause that neither a resume nor a sleep
    followed has nothing left to wake it (NVIDIA-NeMo/RL #3730: a stood-down engine nobody
    wakes; rlops/rlix PR #14: a failed finalize left generation paused for good)."""
    replay = engine_replay(records)
    if not records:
        return []
    last = records[-1]["seq"]
    head = records[0] if records[0]["kind"] == "header" else {}
    timeouts = (head.get("meta") or {}).get("timeouts") or {}
    unbounded = (
        "; the drain has no deadline (an unbounded pause: NVIDIA-NeMo/RL #3929's refit_timeout_s: null)"
        if timeouts.get("shrink_drain_s") == 0
        else ""
    )
    ranks = [
        Violation(
            "engine_stood_down",
            last,
            f"{key[0]} dp{key[1]} paused at seq {r['seq']} (t={r['t']:g}, "
            f"{r['kind']} {r.get('effect', '')}) and never resumed or put to sleep: nothing in the log "
            f"wakes it{unbounded}",
        )
        for key, r in sorted(replay.paused_at.items(), key=lambda kv: (kv[0][0], kv[0][1]))
    ]
    return ranks + [
        Violation(
            "engine_stood_down",
            last,
            f"{pid} generation paused at seq {r['seq']} (t={r['t']:g}, "
            f"PauseRollouts) and never resumed: nothing in the log wakes it",
        )
        for pid, r in sorted(replay.rollouts_paused_at.items())
    ]
