"""The engine model after vLLM's RL sequence (harness/control/engine.py) and its five
checks (harness/logs/invariants/engine.py): the state machine's refusals, the orders the
control logic yields per mode, and each check firing, alone, on the default scenario's
log broken in exactly its way (the real runs that fire them are
tests/sim/test_engine_lifecycle.py).
"""

from __future__ import annotations

import copy

import pytest

from harness.control.context import PipelineContext
from harness.control.engine import EngineConfig, EngineStateError, EngineTags
from harness.control.interpret import Refused
from harness.control.resize import expand_order, shrink_order
from harness.logs.invariants import check_log
from tests.unit.test_mutations import index, reseq, sim_log  # noqa: F401 (a fixture)


def fires(log, name, text):
    found = check_log(reseq(log))
    assert {v.invariant for v in found} == {name}, [str(v) for v in found][:5]
    assert any(text in v.message for v in found), [v.message for v in found][:5]
    return found


# ---------------------------------------------------------------- the state machine


def test_a_level2_engine_resumes_only_after_both_tags_and_a_whole_reload():
    e = EngineTags("p dp0")  # created asleep at level 2, as RLix leaves every engine after init
    assert e.asleep_tags() == ["weights", "kv_cache"] and e.tags["weights"] == "discarded"
    with pytest.raises(EngineStateError, match="kv_before_weights"):
        e.wake(("kv_cache",))
    e.wake(("weights",))
    with pytest.raises(EngineStateError, match="resume_weights_not_ready"):
        e.resume()  # level 2 kept nothing: a wake alone is garbage (vllm #29341)
    e.wake(("kv_cache",))
    e.begin_load()
    e.load(complete=False)
    e.finalize()
    with pytest.raises(EngineStateError, match="fully reloaded"):
        e.resume()
    e.begin_load()
    e.load(complete=True)
    e.finalize()
    e.resume()
    assert not e.paused
    with pytest.raises(EngineStateError, match="sleep_unquiesced"):
        e.sleep(1)


def test_a_level1_engine_holds_its_whole_old_model_after_the_wake():
    e = EngineTags("p dp0")
    e.wake(("weights", "kv_cache"))
    e.begin_load()
    e.load(complete=True)
    e.finalize()
    e.resume()
    e.pause("keep")
    e.sleep(1)
    assert e.tags["weights"] == "offloaded"
    e.wake(("weights", "kv_cache"))
    e.resume()  # the old version, restored from host RAM: stale maybe, never garbage
    e.pause("abort")
    e.drained()
    e.sleep(2)
    with pytest.raises(EngineStateError, match="load_start"):
        e.begin_load()  # into sleeping weights (vllm #57853)


# ---------------------------------------------------------------- the orders per mode


def _names(gen, answers=None):
    """Effect names a control generator yields, answering each with None."""
    out, value = [], None
    try:
        while True:
            effect = gen.send(value)
            out.append((type(effect).__name__, getattr(effect, "mode", None) or getattr(effect, "tags", None)))
            value = None
    except StopIteration:
        return out


def _ctx(**engine):
    ctx = PipelineContext("p", "nemo_async", 1, engine=EngineConfig(**engine))
    ctx.versions.cache_built(0)
    ctx.versions.promote(0)
    return ctx


def test_the_shrink_pauses_with_the_pipelines_mode():
    assert [n for n, _ in _names(shrink_order(_ctx(), (1, 0)))] == [
        "LockCoordinator",
        "Abort",
        "Drain",
        "Sleep",
        "UnlockCoordinator",
    ]
    for mode in ("wait", "keep"):
        assert _names(shrink_order(_ctx(pause_mode=mode), (0,)))[1] == ("Pause", mode)


def test_the_staged_wake_brings_weights_before_the_refit_and_the_kv_cache_before_the_resume():
    assert [n for n, _ in _names(expand_order(_ctx(), (0,)))] == [
        "LockCoordinator",
        "MarkInactive",
        "Wake",
        "SyncFromCache",
        "Finalize",
        "PublishVersion",
        "Activate",
        "UnlockCoordinator",
    ]
    staged = _names(expand_order(_ctx(wake="staged"), (0,)))
    assert staged == [
        ("LockCoordinator", None),
        ("MarkInactive", None),
        ("WakeTags", ("weights",)),
        ("SyncFromCache", None),
        ("Finalize", None),
        ("WakeTags", ("kv_cache",)),
        ("PublishVersion", None),
        ("Activate", None),
        ("UnlockCoordinator", None),
    ]
    gone = expand_order(_ctx(wake="staged"), (0,))
    next(gone)
    with pytest.raises(StopIteration):
        gone.send(Refused("gone"))


# ---------------------------------------------------------------- the checks, on broken logs


def _routable(log, start=0):
    return index(log, lambda r: r["kind"] == "rank_state" and r["state"] == "routable", start)


def test_kv_cache_asleep_fires_on_a_dispatch_between_the_two_halves_of_a_wake(sim_log):
    log = copy.deepcopy(sim_log)
    i = _routable(log)
    rank = log[i]
    log[i] = dict(rank, asleep_tags=["kv_cache"])
    # ... and the KV cache is woken a moment later, after the first dispatch there
    j = index(
        log,
        lambda r: (
            r["kind"] == "request_dispatch"
            and r["pipeline_id"] == rank["pipeline_id"]
            and r["dp_rank"] == rank["dp_rank"]
        ),
        i,
    )
    log.insert(
        j + 1,
        {
            "seq": 0,
            "t": log[j]["t"],
            "kind": "engine_tag",
            "pipeline_id": rank["pipeline_id"],
            "dp_rank": rank["dp_rank"],
            "tag": "kv_cache",
            "state": "awake",
        },
    )
    found = check_log(reseq(log))
    # engine_transition: the log's wake had both tags awake, so the inserted one is a second KV onload
    assert {v.invariant for v in found} == {"kv_cache_asleep", "engine_resume", "engine_transition"}, [
        str(v) for v in found
    ][:4]
    assert [v.message for v in found if v.invariant == "engine_transition"][0].count(
        "kv_cache awake --wake(kv_cache)-->"
    )
    assert [v.seq for v in found if v.invariant == "kv_cache_asleep"] == [log[j]["seq"]]


def test_engine_resume_fires_on_a_kv_wake_before_the_weights(sim_log):
    log = copy.deepcopy(sim_log)
    i = index(log, lambda r: r["kind"] == "rank_state" and r["state"] == "waking")
    log.insert(
        i,
        {
            "seq": 0,
            "t": log[i]["t"],
            "kind": "engine_tag",
            "pipeline_id": log[i]["pipeline_id"],
            "dp_rank": log[i]["dp_rank"],
            "tag": "kv_cache",
            "state": "awake",
        },
    )
    found = check_log(reseq(log))
    assert {v.invariant for v in found} == {"engine_resume", "engine_transition"}, [str(v) for v in found][:4]
    assert any("woke its KV cache while its weights were asleep" in v.message for v in found)
    assert [v.seq for v in found if "kv_before_weights" in v.message] == [log[i]["seq"]]


def test_engine_weights_fires_when_a_level2_rank_serves_with_a_bucket_never_reloaded(sim_log):
    log = copy.deepcopy(sim_log)
    i = _routable(log)
    pid, dp = log[i]["pipeline_id"], log[i]["dp_rank"]
    j = max(
        k
        for k in range(i)
        if log[k]["kind"] == "sync_bucket" and log[k]["pipeline_id"] == pid and dp in log[k]["dp_ranks"]
    )
    bucket = log[j]["bucket"]
    del log[j]  # that bucket never reached the rank
    fires(log, "engine_weights", f"never reloaded: [{bucket}]")


def test_engine_weights_takes_a_level1_wake_as_holding_its_model(sim_log):
    log = copy.deepcopy(sim_log)
    for r in log:  # every sleep at level 1: the weights come back from host RAM
        if r["kind"] in ("effect_start", "effect_end") and r["effect"] == "Sleep":
            r["args"] = dict(r["args"], level=1)
    shrunk = index(log, lambda r: r["kind"] == "rank_state" and r["state"] == "asleep")
    pid, dp = log[shrunk]["pipeline_id"], log[shrunk]["dp_rank"]
    i = _routable(log, shrunk)
    while (log[i]["pipeline_id"], log[i]["dp_rank"]) != (pid, dp):
        i = _routable(log, i + 1)
    j = max(
        k
        for k in range(i)
        if log[k]["kind"] == "sync_bucket" and log[k]["pipeline_id"] == pid and dp in log[k]["dp_ranks"]
    )
    del log[j]
    assert [v for v in check_log(reseq(log), ["engine_weights"])] == []


def test_engine_weights_fires_on_a_rank_routable_while_its_sync_is_open(sim_log):
    log = copy.deepcopy(sim_log)
    i = _routable(log)
    j = max(k for k in range(i) if log[k]["kind"] == "sync_end" and log[k]["pipeline_id"] == log[i]["pipeline_id"])
    log.insert(i + 1, log.pop(j))  # the sync ends only after the activation
    found = check_log(reseq(log), ["engine_weights"])
    assert found and "still writing its weights" in found[0].message


def test_version_at_dispatch_fires_on_a_version_stamped_at_completion(sim_log):
    log = copy.deepcopy(sim_log)
    i = index(log, lambda r: r["kind"] == "request_done" and r.get("version") is not None)
    log[i] = dict(log[i], version=log[i]["version"] + 1)
    found = check_log(reseq(log))
    assert "version_at_dispatch" in {v.invariant for v in found}
    assert any("stamped at completion" in v.message for v in found if v.invariant == "version_at_dispatch")


def test_pause_lost_work_fires_on_an_abort_inside_a_wait_pause(sim_log):
    log = copy.deepcopy(sim_log)
    i = index(
        log,
        lambda r: (
            r["kind"] == "effect_start"
            and r["effect"] == "Abort"
            and r.get("scope") == "shrink"
            and any(x["kind"] == "request_abort" for x in log[log.index(r) : log.index(r) + 6])
        ),
    )
    for k in (i, index(log, lambda r: r["kind"] == "effect_end" and r["effect"] == "Abort", i)):
        log[k] = dict(log[k], effect="Pause", args=dict(log[k]["args"], mode="wait"))
    fires(log, "pause_lost_work", "paused with mode wait")
