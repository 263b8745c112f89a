"""Simulator behaviour on bundled scenarios: step order, overlap serving, versions,
routing, faults, determinism, and replay of the scheduler part."""

from __future__ import annotations

import dataclasses
import glob
import os
import subprocess
import sys

import pytest

from harness.logs.records import read_records
from harness.logs.writer import write_atomic
from harness.logs.expect import classify
from harness.logs.invariants import check_log
from harness.logs.replay import compare_decisions, replay_file
from simulators.selfcheck.determinism import first_divergence, other_hash_seed
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario
from simulators.scenario.spec import CostSpec, FaultSpec, default_scenario

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCENARIOS = sorted(glob.glob(os.path.join(ROOT, "examples", "scenarios", "*.yaml")))


def scenario(name):
    return load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))


_CACHE = {}


def run(name):
    """A scenario's run, once per module: "default" is default_scenario(), any other name
    the bundled file (the run :func:`run_file` keeps for it)."""
    if name != "default":
        return run_file(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))
    if name not in _CACHE:
        _CACHE[name] = Simulation(default_scenario()).run()
    return _CACHE[name]


def run_file(path):
    """A bundled scenario file's run, once per module."""
    key = ("file", os.path.abspath(path))
    if key not in _CACHE:
        _CACHE[key] = Simulation(load_scenario(path)).run()
    return _CACHE[key]


def effects(records, pid, kind="effect_start"):
    return [r for r in records if r["kind"] == kind and r.get("pipeline_id") == pid]


NEMO_STEP = [
    "WaitBatch",
    "RequestGpus",
    "ReloadTrainComm",
    "Compute",
    "BuildCache",
    "OffloadTraining",
    "DestroyTrainComm",
    "LockCoordinator",
    "PromoteCache",
    "ActiveRanks",
    "PublishVersion",
    "UnlockCoordinator",
    "ReleaseGpus",
    "BeginProgressBatch",
]


def test_default_scenario_completes_with_every_invariant_holding():
    res = run("default")
    assert res.reason == "done", res.detail
    assert check_log(res.records) == []


def test_partial_overlap_step_sequence_order():
    recs = run("tp2_broadcast").records
    for step in range(4):
        names = [r["effect"] for r in effects(recs, "ppl1") if r.get("scope") == "step" and r["step"] == step]
        core = [n for n in names if n not in ("SyncFromCache", "Finalize")]
        assert core == NEMO_STEP, (step, names)
        # the active refresh (sync + finalize of the ranks still serving) sits inside the lock
        i, j = names.index("ActiveRanks"), names.index("PublishVersion")
        assert names[i + 1 : j] == ["SyncFromCache", "Finalize"]
    # the overlap rank is shrunk between the ACTOR_TRAINING request and its grant
    req = next(
        r for r in effects(recs, "ppl1") if r["effect"] == "RequestGpus" and r["args"]["priority"] == "ACTOR_TRAINING"
    )
    grant = next(
        r for r in effects(recs, "ppl1", "effect_end") if r["seq"] > req["seq"] and r["effect"] == "RequestGpus"
    )
    shrinks = [
        r for r in recs if req["seq"] < r["seq"] < grant["seq"] and r["kind"] == "effect_end" and r["effect"] == "Sleep"
    ]
    assert shrinks and shrinks[0]["args"]["ranks"] == [0]


def test_non_overlap_ranks_keep_serving_during_training():
    recs = run("tp2_broadcast").records
    starts = [r for r in effects(recs, "ppl1") if r["effect"] == "Compute"]
    ends = [r for r in effects(recs, "ppl1", "effect_end") if r["effect"] == "Compute"]
    served = 0
    for s, e in zip(starts, ends):
        done = [r for r in recs if s["seq"] < r["seq"] < e["seq"] and r["kind"] == "request_done"]
        assert {r["dp_rank"] for r in done} <= {1}, "only the non-overlap rank may serve while training"
        served += len(done)
    assert served > 0
    # and it gets the active refresh over a cross-GPU broadcast (its GPUs are not the owner's)
    active = bucket_paths(recs, "active")
    assert active == {"broadcast"}
    assert bucket_paths(recs, "expand") == {
        "broadcast",
        "ipc",
    }  # rank 0 = GPU 0 (owner, same-GPU path) + GPU 1 (broadcast)


def bucket_paths(recs, lifecycle_path):
    """The transport paths of the sync buckets inside ppl1's SyncFromCache effects of one
    lifecycle path (expand | active)."""
    out, inside = set(), False
    for r in recs:
        if (
            r["kind"] in ("effect_start", "effect_end")
            and r.get("effect") == "SyncFromCache"
            and r["pipeline_id"] == "ppl1"
        ):
            inside = r["kind"] == "effect_start" and r["args"]["path"] == lifecycle_path
        elif inside and r["kind"] == "sync_bucket" and r.get("pipeline_id") == "ppl1":
            out.add(r["path"])
    return out


def test_no_double_version_bump():
    for name in ("default", "tp2_broadcast", "roll_dual_4gpu"):
        recs = run(name).records
        for pid in {r["pipeline_id"] for r in recs if r["kind"] == "effect_end"}:
            published = [r["result"] for r in effects(recs, pid, "effect_end") if r["effect"] == "PublishVersion"]
            built = [r["args"]["version"] for r in effects(recs, pid, "effect_end") if r["effect"] == "BuildCache"]
            bumps = sum(1 for a, b in zip([None] + published, published) if a is None or b > a)
            assert published == sorted(published), (name, pid, published)
            assert bumps <= len(built), (name, pid, published, built)


def test_expand_never_routes_before_publish():
    for name in ("default", "gap_ratio_3pipelines", "tp2_broadcast", "mixed_64gpu"):
        recs = run(name).records
        assert check_log(recs, ["activate_after_sync", "routing"]) == [], name
        # a rank becomes routable only holding the version its pipeline has just published
        # (a routable rank refreshed in flight publishes after its sync: not an activation)
        last_pub, state = {}, {}
        for r in recs:
            if r["kind"] == "effect_end" and r["effect"] == "PublishVersion":
                last_pub[r["pipeline_id"]] = r["result"]
            elif r["kind"] == "rank_state":
                key = (r["pipeline_id"], r["dp_rank"])
                if r["state"] == "routable" and state.get(key) != "routable":
                    published = last_pub.get(r["pipeline_id"])
                    assert published in (r["version"], max(r["version"], 0)), (name, r, published)
                state[key] = r["state"]


def test_level2_rank_never_serves_before_a_sync():
    base = default_scenario()
    s = dataclasses.replace(base, faults=(FaultSpec("skip_sync_on_expand", "ppl1", 1),))
    res = Simulation(s).run()
    assert res.reason == "failed"
    assert "finalized" in res.detail and "ppl1 dp" in res.detail  # refused by the rank lifecycle
    fired = [r for r in res.records if r["kind"] == "fault_fired"]
    assert fired and fired[0]["name"] == "skip_sync_on_expand"
    # no request was ever served by a rank without weights
    assert check_log(res.records, ["routing"]) == []


def test_oom_detected_when_wake_meets_resident_training_memory():
    res = run("oom_wake_before_offload")
    assert res.reason == "failed" and "OOM on GPU" in res.detail
    oom = [r for r in res.records if r["kind"] == "oom"]
    assert len(oom) == 1 and oom[0]["mem"] in ("kv_cache", "weights")
    fired = next(r for r in res.records if r["kind"] == "fault_fired")
    assert fired["name"] == "wake_before_offload" and fired["seq"] < oom[0]["seq"]
    # the leaked training state is still on the GPU that ran out
    train = [
        r
        for r in res.records
        if r["kind"] == "vram" and r["gpu"] == oom[0]["gpu"] and r["mem"] in ("params", "grads", "optimizer")
    ]
    assert sum(r["delta"] for r in train) > 0


def test_without_the_fault_the_same_topology_does_not_oom():
    s = dataclasses.replace(scenario("oom_wake_before_offload"), faults=())
    res = Simulation(s).run()
    assert res.reason == "done" and not [r for r in res.records if r["kind"] == "oom"]


def test_keep_nccl_on_sleep_fails_the_post_sleep_check():
    base = scenario("tp2_broadcast")
    costs = dataclasses.replace(base.costs, post_sleep_threshold_bytes=768 << 20)  # below two kept communicators
    s = dataclasses.replace(base, costs=costs, faults=(FaultSpec("keep_nccl_on_sleep", "ppl1", 0),))
    res = Simulation(s).run()
    assert res.reason == "failed" and "post-sleep VRAM" in res.detail and "dp0" in res.detail
    clean = Simulation(dataclasses.replace(base, costs=costs)).run()
    assert clean.reason == "done"  # the same threshold passes when sleep frees the communicators


def test_nccl_buffers_kept_on_sleep_accumulate_until_training_runs_out_of_memory():
    res = run("nccl_kept_on_sleep")
    assert res.reason == "failed" and "OOM on GPU 0" in res.detail, res.detail
    oom = next(r for r in res.records if r["kind"] == "oom")
    assert (oom["gpu"], oom["owner"]) == (0, "ppl1/train")  # training loading its state next to the leak
    fired = [r for r in res.records if r["kind"] == "fault_fired" and r["name"] == "keep_nccl_on_sleep"]
    assert len(fired) >= 1 and fired[-1]["seq"] < oom["seq"]
    # what the sleeping rank still holds on GPU 0: one set of buffers per sleep that kept them
    leaked = sum(
        r["delta"]
        for r in res.records
        if r["kind"] == "vram" and r["gpu"] == 0 and r["owner"] == "ppl1/dp0" and r["mem"] == "nccl"
    )
    nccl = res.scenario.costs.nccl_buffer_bytes
    assert leaked == len(fired) * nccl
    assert oom["used"] + oom["requested"] > oom["capacity"] >= oom["used"] - leaked + oom["requested"]
    clean = Simulation(dataclasses.replace(res.scenario, faults=())).run()
    assert clean.reason == "done" and check_log(clean.records) == []


SMALL_SCENARIOS = [p for p in SCENARIOS if "1024" not in p]


@pytest.fixture(scope="module")
def fresh_process_logs(tmp_path_factory):
    """Every small bundled scenario's event log from ONE fresh process with another hash
    seed (what ``check_determinism`` does per run, batched: a process start and its
    imports per scenario were most of this test's cost), run in the reverse of this
    module's order, so each scenario follows other runs there than here: state that leaked
    from one run into the next would show as a divergence."""
    out = tmp_path_factory.mktemp("fresh-logs")
    script = (
        "import os, sys\n"
        "from simulators.selfcheck.determinism import _fresh_run\n"
        "from simulators.scenario.loader import load_scenario\n"
        "for path in sys.argv[2:]:\n"
        "    _fresh_run(path, load_scenario(path).seed, os.path.join(sys.argv[1], os.path.basename(path) + '.jsonl'))\n"
    )
    env = dict(os.environ, PYTHONHASHSEED=other_hash_seed(os.environ.get("PYTHONHASHSEED")))
    subprocess.run(
        [sys.executable, "-c", script, str(out), *reversed(SMALL_SCENARIOS)], env=env, cwd=ROOT, check=True, timeout=600
    )
    return out


@pytest.mark.parametrize("path", SMALL_SCENARIOS, ids=os.path.basename)
def test_same_scenario_and_seed_give_byte_identical_event_logs(path, fresh_process_logs):
    # the module's run of the file, after other runs, against the fresh process's, after
    # other runs in another order and with another hash seed: nothing leaks between runs,
    # nothing comes from a process's hash seed or addresses
    first = list(run_file(path).log.lines())
    fresh = (fresh_process_logs / (os.path.basename(path) + ".jsonl")).read_text(encoding="utf-8").splitlines()
    assert first_divergence(first, fresh) is None, first_divergence(first, fresh)


@pytest.mark.slow
def test_large_scenario_is_deterministic_over_its_first_100_simulated_seconds():
    # 100 s: about 84,000 lines, every record kind the first 300 s write, 230 publishes
    s = dataclasses.replace(scenario("large_1024gpu"), horizon_s=100.0)
    a = list(Simulation(s).run().log.lines())
    b = list(Simulation(s).run().log.lines())
    assert a == b and len(a) > 10_000


def test_a_different_seed_changes_the_run():
    s = default_scenario()
    a = list(Simulation(s).run().log.lines())
    b = list(Simulation(dataclasses.replace(s, seed=1)).run().log.lines())
    assert a != b


def test_default_event_log_replays_without_divergence(tmp_path):
    res = run("default")
    path = str(tmp_path / "events.jsonl")
    write_atomic(path, res.log.lines())
    replayed = replay_file(path)
    assert replayed.rejected == 0
    assert compare_decisions(replayed.decisions, read_records(path)) is None


def test_replay_detects_a_tampered_simulator_log(tmp_path):
    res = run("default")
    lines = list(res.log.lines())
    import json

    for i, line in enumerate(lines):
        d = json.loads(line)
        if d["kind"] == "plan" and d["expands"]:
            d["expands"][0]["bundles"][0]["gpus"] = [1 - d["expands"][0]["bundles"][0]["gpus"][0]]
            lines[i] = json.dumps(d)
            break
    path = str(tmp_path / "events.jsonl")
    write_atomic(path, lines)
    assert compare_decisions(replay_file(path).decisions, read_records(path)) is not None


# Scenarios that reproduce a failure mode, and the invariant that catches it.
EXPECTED_FINDINGS = {
    # an OOM is the VRAM invariant's finding (vram) and ends the run (run_outcome); the leaked
    # training state is also seen at the grant, before the OOM (handover)
    "oom_wake_before_offload": ("failed", {"vram", "run_outcome", "handover", "handover_headroom"}),
    "nccl_kept_on_sleep": ("failed", {"vram", "run_outcome"}),  # RLix Bug 4: leaked communicator buffers end in an OOM
    "cache_built_after_offload": ("failed", {"run_outcome"}),  # debug #34/#35: the build finds no parameters
    # RLix's selective-sync timeout (test_timeouts.py); NeMo's init keeps the 4-GPU trainer's
    # Megatron groups (debug #24), whose buffers are on the GPUs its ranks first wake on
    "refit_over_slow_interconnect": ("failed", {"run_outcome", "handover"}),
    # RLix Bug 7: the shrink drain times out (test_timeouts.py); the aborted engine is left paused
    "abort_never_wakes": ("failed", {"run_outcome", "engine_stood_down"}),
    "whole_model_sync_bucket": (
        "failed",
        {"vram", "run_outcome"},
    ),  # RLix Bug 5: whole-model staging OOMs next to the KV cache
    # MILES B-13: the finished ppl1 keeps its GEN ranks, the TP=2 peer can form no bundle
    "finished_pipeline_keeps_gen": ("horizon", {"liveness"}),
    # RLix default (premature planned-release ack + re-expansion in the same cycle): ROLL
    # ranks that were never shrunk keep serving the previous weights after a publish.
    # (and, handover: NeMo's init keeps its multi-GPU trainers' groups, docs/residency.md)
    # The premature ack also lets a finished pipeline unregister while those ranks still run
    # requests (in_flight_at_sleep): it follows that pipeline's planned_release_ack.
    "mixed_64gpu": ("done", {"stale_serving", "planned_release_ack", "handover", "in_flight_at_sleep"}),
    # RLix's premature planned-release ack, which the faithful (faster) routing now times into
    "roll_dual_4gpu": ("done", {"planned_release_ack"}),
    # the RLix x ROLL OLD_LOG_PROBS hazard (docs/residency.md) and its two fixes
    "handover_old_log_probs_fits": ("done", {"handover"}),
    "handover_old_log_probs_oom": (
        "failed",
        {"handover", "handover_headroom", "planned_release_ack", "vram", "run_outcome"},
    ),
    # bulk tensors routed through the driver: data_plane (the 1-hop rule) fires
    "dataplane_via_driver": ("done", {"data_plane", "handover"}),
    # NeMo's init keeps its multi-GPU trainer's groups (docs/residency.md)
    "dataplane_one_hop": ("done", {"handover"}),
    # the 16-GPU mix: all three listed under its expect: (tests/sim/test_expected_findings.py)
    "mixed_16gpu_expected": ("done", {"handover", "planned_release_ack", "stale_serving"}),
    # the single controller's data plane with the bulk routed through the driver: data_plane
    "dataplane_single_controller_via_driver": ("done", {"data_plane"}),
    # NeMo's no-op progress hooks without the GENERATION watchdog: one-shot GENERATION starves
    # while its bundle idles (idle_bundle_starvation)
    "starve_one_shot_generation": ("horizon", {"liveness", "idle_bundle_starvation"}),
    # RLix keeps GEN shrinks made for a training request it cannot grant, and thrashes
    # (ungrantable_preemption); NeMo's init-kept groups; the premature ack
    "ungrantable_preemption": ("done", {"ungrantable_preemption", "handover", "planned_release_ack"}),
    # failures users reported (tests/sim/test_field_failures.py)
    "collector_dies_at_epoch_end": ("horizon", {"liveness"}),  # NeMo RL #2899
    "engines_crash_after_refit": ("horizon", {"liveness"}),  # NeMo RL #3488
    "stuck_rollout_straggler": ("horizon", {"liveness"}),  # NeMo RL #3238
    # NeMo RL #2775: handover at the grant, then the OOM on the next wake
    "offload_keeps_params": ("failed", {"handover", "handover_headroom", "vram", "run_outcome"}),
    # NeMo RL #3591: sync groups never destroyed (sync_groups) pile up until an OOM
    "stranded_sync_group": ("failed", {"sync_groups", "vram", "run_outcome"}),
    "gen_request_without_demand": ("horizon", {"liveness"}),  # RLix debug #27
    "expand_fails_midway": ("failed", {"run_outcome"}),  # no rollback, fail-fast
    # a single controller's finish_train_step never reaches the trainer: the sync ships a version no finish made
    "lost_finish": ("failed", {"streaming_step", "run_outcome"}),
    # costs from the cost model: NeMo's init keeps the 4-GPU trainer's groups (handover,
    # docs/residency.md); RLix's premature planned-release ack comes and goes with the timing
    # (gone with the age-0 fix; the per-step decode timing brought it back, the per-step host
    # overhead took it away again: the ROLL pipeline's release no longer lands mid-cycle)
    "costmodel_7b_and_1p5b_h100": ("done", {"handover"}),
    # the engine lifecycle's classes (docs/engine-lifecycle.md, tests/sim/test_engine_lifecycle.py)
    "level2_partial_reload": ("done", {"engine_weights"}),  # vllm #29341
    "resume_before_kv_wake": ("done", {"engine_resume", "kv_cache_asleep", "engine_transition"}),  # vllm #44483
    "kv_wake_before_weights": ("done", {"engine_resume", "engine_transition"}),
    "pause_wait_aborted": (
        "done",
        {"pause_lost_work", "idle_bundle_starvation"},
    ),  # miles #2372; the wait pause stalls the cycle
    "engine_pause_modes": ("done", {"idle_bundle_starvation"}),  # the wait-mode pause stalls the serial cycle
    "version_stamped_at_completion": ("done", {"version_at_dispatch"}),  # rllm #622
    # the realistic workloads (costs from the cost model): the same two by-design findings (the
    # 32-GPU mix's premature ack went with the per-step decode timing: a race of the releases)
    "realistic_mixed_32gpu": ("done", {"handover"}),
    # (the 70B's premature ack went when a level-1 wake and sleep were charged one host-link copy
    # each instead of two: the releases' race comes out the other way)
    "realistic_70b_64gpu": ("done", {"handover"}),
    # the MoE trains at moe_train_mfu (0.16, not the dense 0.35): the timings moved and the
    # premature planned-release ack (a race of the two pipelines' releases) no longer occurs
    "realistic_moe_16gpu": ("done", {"handover"}),
    # four pipelines under RLix's gap ratio (docs/policies.md compares the other policies): the same two
    # (with the per-step decode timing, a finished pipeline's premature ack also lets it unregister
    # while its ranks still run requests: in_flight_at_sleep, as in mixed_64gpu). With a level-1
    # wake and sleep charged one host-link copy each (not two), c32b's step-1 await_release had been
    # acked while its non-overlap dp3 still served (stale_serving); with each decode step reading its
    # sequences' KV caches at their own lengths seed 0 no longer meets that interleaving
    "policies_4pipelines_32gpu": ("done", {"handover", "planned_release_ack", "in_flight_at_sleep"}),
    # the weight-sync groups' field reports (tests/sim/test_waitfor_liveness.py): slime #2331's
    # deadlock needs an exploration seed (the fixed order is clean); vime #329's slot overwrite
    # is a cycle in every order; TRL #6913's broadcast waits on a dead receiver, and its fix
    # fails fast at the broadcast timeout
    "wsg_vime329_slot_overwrite": ("horizon", {"deadlock", "hot_state"}),
    "wsg_trl6913_receiver_died": ("horizon", {"lost_wakeup", "hot_state"}),
    "wsg_trl6913_broadcast_timeout": ("failed", {"run_outcome"}),
    # the MILES demand floor re-expands a ROLL cluster await_release emptied (docs/rlix-variants.md)
    "miles_floor_reactivates_after_release": (
        "failed",
        {"reactivated_after_release", "planned_release_ack", "versions", "run_outcome"},
    ),
    # a failed active refresh sync (fault active_sync_fails); MILES releases actor_train first
    "miles_release_after_failed_sync": ("failed", {"run_outcome"}),
    # the GENERATION watchdog keeps the resize lock across its re-request (fault
    # watchdog_request_under_lock): a cycle through the lock, the request and the expand,
    # until RLix's resize-lock deadline fails the run (tests/sim/test_waitfor_edges.py)
    "watchdog_request_under_lock": ("failed", {"deadlock", "run_outcome"}),
    # a new user's own layouts: NeMo's init keeps its Megatron groups (known upstream behaviour);
    # the two 8B pipelines also meet the premature planned-release ack and its unregister
    "user_qwen3_8b_two_nemo_16gpu": ("done", {"handover", "planned_release_ack", "in_flight_at_sleep"}),
    "user_llama70b_64gpu": ("done", {"handover"}),
    # the same residue where it leaves the wake under the scenario's margin
    # (with each decode step reading its sequences' KV caches at their own lengths, qa no longer
    # finishes in a cycle whose planned release is acked early: the timing-bound
    # planned_release_ack / in_flight_at_sleep pair of the earlier timings is gone)
    "handover_headroom_tight": ("done", {"handover", "handover_headroom"}),
    # memory released late (slime #579, miles #86): the grant comes while it is on the GPU
    # (handover); without RLix PR #11's wait, or past its timeout, the trainer's onload OOMs
    "late_release_wake_oom": ("failed", {"handover", "handover_headroom", "vram", "run_outcome"}),
    "late_release_wait_saves_wake": ("done", {"handover"}),
    # NeMo RL PR #3280: a vLLM upgrade grows the KV pool; the staged KV wake OOMs beside the kept groups
    "nemo_kv_pool_growth_oom": ("failed", {"handover", "handover_headroom", "vram", "run_outcome"}),
    "nemo_kv_pool_growth_pinned": ("done", {"handover"}),
    # RLinf #1456: the active refresh publishes on the sync's acknowledgement, before the apply
    "publish_on_ack": ("done", {"versions"}),
    # NVIDIA-NeMo/RL #3839, vime #168: the single controller's refit without its pause
    "nemo_refit_without_pause": ("done", {"engine_transition"}),
    "late_release_wait_times_out": ("failed", {"handover", "handover_headroom", "vram", "run_outcome"}),
    "miles_double_onload": ("failed", {"run_outcome"}),  # torch_memory_saver refuses the second onload
    # rlops/rlix PR #14: a failed finalize left generation paused; the fix resumes it (unflushed)
    "miles_finalize_fails_paused": ("failed", {"engine_stood_down", "run_outcome"}),
    "miles_finalize_fails_resumed": ("failed", {"engine_transition", "run_outcome"}),
    # NeMo RL #3929: abort_never_wakes without the drain's deadline hangs to the horizon
    "unbounded_pause_hangs": ("horizon", {"engine_stood_down", "liveness"}),
    # slime #2092: a requeue keeps a trajectory's tokens across syncs with partial rollout off;
    # AReaL #1388: a restarted count of started trajectories admits past the staleness window
    "slime_requeue_partial_rollout": ("done", {"version_span"}),
    "areal_staleness_capacity_restart": ("done", {"version_span"}),
    # verl #7423: the weight sync runs beside the trainer on its communicator; the next batch
    # starts generating before the synced weights land
    "verl_weight_sync_shared_comm": ("done", {"collective_order", "version_span"}),
    # verl #7423 fixed with a lock per communicator, taken in opposite orders: a deadlock
    "verl_comm_locks_inverted": ("horizon", {"collective_order", "deadlock", "hot_state", "liveness"}),
    # sglang PR #28676: the finalize after a level-2 sleep reads the memo the load did not drop
    "sglang_stale_weights_memo": ("done", {"engine_transition"}),
    # NeMo RL #3730's review: critic warm-up stands generation down and nothing resumes it
    "nemo_critic_warmup_no_wake": ("horizon", {"engine_stood_down"}),
}


#: bundled scenarios whose documented purpose is a red run (the file says so)
RED_BY_PURPOSE = {"handover_headroom_tight"}


def test_every_bundled_scenario_runs_to_its_expected_end():
    """... and is green the way ``rlharness simulate`` judges it: every finding is in the
    scenario's ``expect:`` list or is known upstream behaviour (harness.logs.known_upstream),
    unless the scenario's purpose is a red run. (The same runs, so no run is added.)"""
    from harness.logs.known_upstream import upstream_expectations
    from simulators.run import run_findings

    red = []
    for path in SCENARIOS:
        if "1024" in path:
            continue
        name = os.path.basename(path)[:-5]
        res = run_file(path)
        reason, findings = EXPECTED_FINDINGS.get(name, ("done", set()))
        assert res.reason == reason, (name, res.detail)
        violations = check_log(res.records)
        assert {v.invariant for v in violations} == findings, name
        verdict = classify(run_findings(res, violations), list(res.scenario.expect) + upstream_expectations())
        if verdict.failed() != (name in RED_BY_PURPOSE):
            red.append(f"{name}: {[str(f) for f in verdict.unexpected[:3]]}")
    assert not red, "\n".join(red)


def test_stale_serving_disappears_with_exact_planned_releases():
    s = scenario("mixed_64gpu")
    fixed = dataclasses.replace(s, scheduler={**s.scheduler, "ack_unplanned_releases": False})
    res = Simulation(fixed).run()
    # what is left is the other finding of this scenario: NeMo's init keeps its trainers'
    # groups (docs/residency.md), unrelated to planned releases
    assert res.reason == "done" and {v.invariant for v in check_log(res.records)} == {"handover"}


def test_one_shot_generation_starves_without_the_watchdog_and_completes_with_it():
    s = scenario("starve_one_shot_generation")
    res = run("starve_one_shot_generation")
    stuck = [v.message for v in check_log(res.records, ["liveness"])]
    assert res.reason == "horizon" and any("stuck in WaitBatch" in m for m in stuck), stuck
    with_watchdog = dataclasses.replace(s, faults=tuple(f for f in s.faults if f.name != "no_gen_watchdog"))
    res = Simulation(with_watchdog).run()
    assert res.reason == "done" and check_log(res.records) == []
    # the watchdog is what re-requested GENERATION: estimate-1 requests after the first
    gen = [r for r in res.records if r["kind"] == "request" and r["priority"] == "GENERATION"]
    assert len(gen) > 2 and all(r.get("step_target_estimate") == 1 for r in gen)
    assert not [r for r in res.records if r["kind"] == "progress"]  # demand came from requests alone


def test_a_cache_built_after_the_offload_crashes_the_pipeline():
    res = run("cache_built_after_offload")
    assert res.reason == "failed" and "ppl1: cache v2 built after offload" in res.detail, res.detail
    fired = next(r for r in res.records if r["kind"] == "fault_fired")
    assert (fired["name"], fired["pipeline_id"], fired["step"]) == ("cache_after_offload", "ppl1", 1)
    build = [r for r in effects(res.records, "ppl1") if r["effect"] == "BuildCache"]
    assert len(build) == 3 and build[-1]["seq"] < fired["seq"]  # init, step 0, then the failing one
    freed = [
        r
        for r in res.records
        if r["kind"] == "vram"
        and r["owner"] == "ppl1/train"
        and r["mem"] in ("params", "grads", "optimizer")
        and r["seq"] > fired["seq"]
    ]
    assert freed and all(r["delta"] < 0 for r in freed)  # the offload ran before the build read anything
    clean = Simulation(dataclasses.replace(res.scenario, faults=())).run()
    assert clean.reason == "done" and check_log(clean.records) == []


def test_a_whole_model_sync_bucket_runs_out_of_memory_next_to_the_live_kv_cache():
    res = run("whole_model_sync_bucket")
    assert res.reason == "failed" and "OOM on GPU 0" in res.detail, res.detail
    oom = next(r for r in res.records if r["kind"] == "oom")
    weights = res.scenario.pipelines[0].model.weight_bytes
    assert (oom["owner"], oom["mem"], oom["requested"]) == ("ppl1/sync", "staging", weights)
    resident = {}
    for r in res.records:
        if r["kind"] == "vram" and r["gpu"] == oom["gpu"]:
            resident[(r["owner"], r["mem"])] = resident.get((r["owner"], r["mem"]), 0) + r["delta"]
    kv = sum(v for (owner, mem), v in resident.items() if mem == "kv_cache")
    assert kv > 0 and oom["used"] + 2 * CostSpec().bucket_bytes <= oom["capacity"]
    # the default bucket size (two ping-pong buffers of 256 MiB) fits beside the same KV cache
    clean = Simulation(dataclasses.replace(res.scenario, costs=CostSpec())).run()
    assert clean.reason == "done" and check_log(clean.records) == []


def test_a_finished_pipeline_that_keeps_its_gen_ranks_starves_its_tp2_peer():
    res = run("finished_pipeline_keeps_gen")
    stuck = [v.message for v in check_log(res.records, ["liveness"])]
    assert res.reason == "horizon" and any(m.startswith("ppl2 stuck in RequestGpus") for m in stuck), stuck
    assert not any(m.startswith("ppl1") for m in stuck)  # ppl1 itself finished all its steps
    # ppl1 never released nor unregistered, and still holds GEN ranks in both of ppl2's bundles
    assert not [
        r for r in res.records if r.get("pipeline_id") == "ppl1" and r["kind"] in ("await_release", "unregister")
    ]
    last = {r["dp_rank"]: r for r in res.records if r["kind"] == "rank_state" and r["pipeline_id"] == "ppl1"}
    held = {g for r in last.values() if r["state"] == "routable" for g in r["gpus"]}
    assert held & {0, 1} and held & {2, 3}, last  # ppl2's TP=2 bundles are [0, 1] and [2, 3]
    s = scenario("finished_pipeline_keeps_gen")
    clean = Simulation(dataclasses.replace(s, faults=())).run()
    assert clean.reason == "done" and check_log(clean.records) == []


def test_progress_printing_does_not_change_the_event_log():
    s = default_scenario()
    quiet = list(Simulation(s).run().log.lines())
    lines = []
    loud = list(Simulation(s, progress=lines.append).run().log.lines())
    assert quiet == loud
