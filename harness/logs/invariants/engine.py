"""Engine-lifecycle checks (docs/engine-lifecycle.md): the classes of vLLM's RL sequence —
pause → sleep → wake(weights) → load → finalize → wake(kv_cache) → resume — that the
field keeps reporting.

* ``kv_cache_asleep`` — no request runs on a rank whose KV cache is asleep (vllm #44395:
  a forward into a released KV cache is an illegal memory access).
* ``engine_resume`` — a rank is routable (resumed) only with every tag awake, and its KV
  cache wakes only after its weights (vllm #44483; the staged wake's order).
* ``engine_weights`` — a rank is routable only with weights that are awake, not being
  written, and, after a wake from level-2 sleep (or its first), wholly reloaded: every
  bucket the pipeline's syncs carry reached it since that wake (vllm #29341).
* ``version_at_dispatch`` — a finished request carries the version of the weights it was
  dispatched to, not of those its rank holds when it completes (rllm #622).
* ``pause_lost_work`` — a ``wait`` or ``keep`` pause drops no request (miles #2372: an
  update aborting every request a non-abort pause had kept).

Everything is read from the runtime's records: ``rank_state`` (the lifecycle, as
``rank_lifecycle`` reads it, with the ``asleep_tags`` an engine reports past waking),
``engine_tag``, the ``Sleep`` / ``Pause`` effects (level, mode), ``sync_*`` and the
request records. The tag rules are written here from vLLM's sequence, not imported from
``harness/control/engine.py`` that they judge.
"""

from __future__ import annotations

from typing import Dict, List, Set, Tuple, Union

from harness.logs.invariants.base import Records, Violation, invariant

Rank = Tuple[str, int]
_NO_TAGS = ("asleep", "waking", "stopped")  # lifecycle states where every tag is asleep


def _kv_awake(r: dict) -> bool:
    return r["state"] not in _NO_TAGS and "kv_cache" not in (r.get("asleep_tags") or ())


@invariant("kv_cache_asleep", reads=("request_dispatch", "request_resume"), sees=("rank_state", "engine_tag"))
def kv_cache_asleep(records: Records) -> List[Violation]:
    """No request is dispatched to, or resumed on, a rank whose KV cache is asleep."""
    out: List[Violation] = []
    kv: Dict[Rank, bool] = {}
    for r in records:
        k = r["kind"]
        if k == "rank_state":
            kv[(r["pipeline_id"], r["dp_rank"])] = _kv_awake(r)
        elif k == "engine_tag" and r["tag"] == "kv_cache":
            kv[(r["pipeline_id"], r["dp_rank"])] = r["state"] == "awake"
        elif k in ("request_dispatch", "request_resume"):
            key = (r["pipeline_id"], r["dp_rank"])
            if not kv.get(key, False):
                what = "dispatched to" if k == "request_dispatch" else "resumed on"
                out.append(
                    Violation(
                        "kv_cache_asleep",
                        r["seq"],
                        f"request {r['request']} {what} {key[0]} dp{key[1]}, "
                        "whose KV cache is asleep (a forward into released KV memory)",
                    )
                )
    return out


@invariant("engine_resume", reads=("rank_state", "engine_tag"))
def engine_resume(records: Records) -> List[Violation]:
    """A rank becomes routable only with no tag asleep, and wakes its KV cache only once
    its weights are awake."""
    out: List[Violation] = []
    state: Dict[Rank, str] = {}
    weights_awake: Dict[Rank, bool] = {}
    for r in records:
        if r["kind"] not in ("rank_state", "engine_tag"):
            continue
        key = (r["pipeline_id"], r["dp_rank"])
        if r["kind"] == "rank_state":
            asleep = list(r.get("asleep_tags") or ())
            if r["state"] == "routable" and asleep and state.get(key) != "routable":
                out.append(
                    Violation(
                        "engine_resume",
                        r["seq"],
                        f"{key[0]} dp{key[1]} resumed (routable) with "
                        f"{', '.join(asleep)} asleep; the engine must stay paused until every tag is awake",
                    )
                )
            state[key] = r["state"]
            weights_awake[key] = r["state"] not in _NO_TAGS and "weights" not in asleep
        elif r["kind"] == "engine_tag" and r["tag"] == "kv_cache" and r["state"] == "awake":
            if not weights_awake.get(key, False):
                out.append(
                    Violation(
                        "engine_resume",
                        r["seq"],
                        f"{key[0]} dp{key[1]} woke its KV cache while its "
                        f"weights were asleep ({state.get(key, 'asleep')}): weights first, KV cache after the refit",
                    )
                )
    return out


class _Weights:
    """Per rank: the level it last slept at, the buckets it received since its wake, and
    whether a sync to it is open."""

    def __init__(self) -> None:
        self.full: Dict[str, Set[int]] = {}  # pipeline -> every bucket index its syncs carried (the whole log's)
        self.level: Dict[Rank, int] = {}
        self.got: Dict[Rank, Set[int]] = {}
        self.open: Dict[Rank, int] = {}  # rank -> seq of the sync_start still writing it
        self.state: Dict[Rank, str] = {}
        # the findings in log order; a level-2 wake's is judged at the end, against every
        # bucket the pipeline's syncs carried (later ones too): (seq, where, pipeline, buckets got)
        self.found: List[Union[Violation, Tuple[int, str, str, Set[int]]]] = []

    def on(self, r: dict) -> None:
        k, pid = r["kind"], r.get("pipeline_id")
        if k == "effect_start" and r.get("effect") == "Sleep":
            for dp in r["args"]["ranks"]:
                self.level[(pid, dp)] = r["args"]["level"]
        elif k == "sync_start" and pid is not None:
            for dp in r["dp_ranks"]:
                self.open[(pid, dp)] = r["seq"]
        elif k == "sync_end" and pid is not None:
            for key in [key for key in self.open if key[0] == pid]:
                del self.open[key]
        elif k == "sync_bucket" and pid is not None:
            self.full.setdefault(pid, set()).add(r["bucket"])
            for dp in r["dp_ranks"]:
                self.got.setdefault((pid, dp), set()).add(r["bucket"])
        elif k == "rank_state":
            self._state(r, (pid, r["dp_rank"]))

    def _state(self, r: dict, key: Rank) -> None:
        new, old = r["state"], self.state.get(key, "asleep")
        self.state[key] = new
        if new == "waking":
            self.got[key] = set()
        if new != "routable" or old == "routable":
            return
        where = f"{key[0]} dp{key[1]}"
        if "weights" in (r.get("asleep_tags") or ()):
            self._bad(r, f"{where} routable with its weights asleep")
        elif key in self.open:
            self._bad(r, f"{where} routable while a sync (seq {self.open[key]}) is still writing its weights")
        elif self.level.get(key, 2) == 2:
            self.found.append((r["seq"], where, key[0], set(self.got.get(key, ()))))

    def _bad(self, r: dict, message: str) -> None:
        self.found.append(Violation("engine_weights", r["seq"], message))

    def violations(self) -> List[Violation]:
        """The findings, a level-2 wake's now judged against the pipeline's whole bucket set."""
        out: List[Violation] = []
        for f in self.found:
            if isinstance(f, Violation):
                out.append(f)
                continue
            seq, where, pid, got = f
            full = self.full.get(pid, set())
            missing = sorted(full - got)
            if missing:
                out.append(
                    Violation(
                        "engine_weights",
                        seq,
                        f"{where} routable after a level-2 wake holding "
                        f"{len(got & full)} of the {len(full)} weight buckets (never reloaded: "
                        f"{missing[:5]}{'…' if len(missing) > 5 else ''})",
                    )
                )
        return out


@invariant("engine_weights", reads=("rank_state",), sees=("effect_start", "sync_start", "sync_end", "sync_bucket"))
def engine_weights(records: Records) -> List[Violation]:
    """A rank turns routable only with weights awake, no sync still writing them and,
    after a level-2 (or first) wake, every bucket reloaded since that wake."""
    walk = _Weights()
    for r in records:
        walk.on(r)
    return walk.violations()


@invariant("version_at_dispatch", reads=("request_done",), sees=("request_dispatch",))
def version_at_dispatch(records: Records) -> List[Violation]:
    """A finished request's version is the one stamped at its (last) dispatch. A
    completion ends the request's dispatch (its stamp is dropped: the state is the
    requests in flight, not every request of the run)."""
    out: List[Violation] = []
    stamped: Dict[Tuple[str, int], object] = {}
    unseen = object()
    for r in records:  # the hot loop of a 1024-GPU log (~1 M request records): one lookup each
        kind = r["kind"]
        if kind == "request_dispatch":
            stamped[(r["pipeline_id"], r["request"])] = r.get("version")
        elif kind == "request_done":
            key = (r["pipeline_id"], r["request"])
            at_dispatch, version = stamped.pop(key, unseen), r.get("version")
            if at_dispatch is not unseen and version != at_dispatch:
                out.append(
                    Violation(
                        "version_at_dispatch",
                        r["seq"],
                        f"request {key[1]} of {key[0]} finished stamped "
                        f"v{version} but was dispatched to v{at_dispatch}: stamped at completion, "
                        "its staleness is under-counted",
                    )
                )
    return out


@invariant("pause_lost_work", reads=("request_abort",), sees=("effect_start", "rank_state"))
def pause_lost_work(records: Records) -> List[Violation]:
    """A rank paused with ``wait`` or ``keep`` loses no request before it sleeps."""
    out: List[Violation] = []
    paused: Dict[Rank, str] = {}  # rank -> the non-abort mode it is paused with
    for r in records:
        k = r["kind"]
        if k == "effect_start" and r.get("effect") == "Pause":
            for dp in r["args"]["ranks"]:
                paused[(r["pipeline_id"], dp)] = r["args"]["mode"]
        elif k == "rank_state" and r["state"] in ("asleep", "routable", "stopped"):
            paused.pop((r["pipeline_id"], r["dp_rank"]), None)
        elif k == "request_abort":
            key = (r["pipeline_id"], r["dp_rank"])
            if key in paused:
                out.append(
                    Violation(
                        "pause_lost_work",
                        r["seq"],
                        f"request {r['request']} aborted on {key[0]} "
                        f"dp{key[1]}, paused with mode {paused[key]}: its decoded tokens are lost",
                    )
                )
    return out
