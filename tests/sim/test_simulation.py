"""Simulator behaviour over the bundled scenarios as wholes: each runs to its expected end
with exactly its documented findings, runs byte-identically again (another process,
another hash seed, another order), and its scheduler part replays without divergence.
Step order, serving and versions: test_step_and_serving_order.py; the failure modes the
faults reproduce: test_failure_scenarios.py."""

from __future__ import annotations

import dataclasses
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
from simulators.scenario.spec import default_scenario
from tests.sim.scenario_runs import ROOT, SCENARIOS, run, run_file, scenario


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


def test_progress_printing_does_not_change_the_event_log():
    s = default_scenario()
    quiet = list(Simulation(s).run().log.lines())
    lines = []
    loud = list(Simulation(s, progress=lines.append).run().log.lines())
    assert quiet == loud
