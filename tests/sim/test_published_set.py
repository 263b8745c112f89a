"""examples/published/comparison/set.yaml, the published comparison set: its held-out split is the
one its rule gives (recomputed here from the ids, independently of the benchmark's helper), every
row cites a source or a bundled scenario, every pair names rows of the set, and a verl row builds a
feasible scenario of the shape it names (no simulation: the comparison is a printed benchmark)."""

from __future__ import annotations

import hashlib
import os

import yaml

from tests.sim.benchmark_module import load_benchmark

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SET = os.path.join(ROOT, "examples", "published", "comparison", "set.yaml")


def _data():
    with open(SET, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _bench():
    return load_benchmark("published_comparison")


def test_recorded_split_is_the_hash_rule_and_a_third():
    rows = _data()["rows"]
    digests = sorted((hashlib.sha256(r["id"].encode()).hexdigest(), r["id"]) for r in rows)
    expected = {i for _, i in digests[: round(len(rows) / 3)]}
    assert {r["id"] for r in rows if r["split"] == "held_out"} == expected
    assert all(r["split"] in ("fitted", "held_out") for r in rows)
    assert len({r["id"] for r in rows}) == len(rows)
    assert _bench().held_out_ids([r["id"] for r in rows]) == expected


def test_every_row_is_sourced_and_every_pair_is_in_the_set():
    data = _data()
    ids = {r["id"] for r in data["rows"]}
    for r in data["rows"]:
        if "scenario" in r:
            assert os.path.exists(os.path.join(ROOT, "examples", "published", r["scenario"] + ".yaml"))
        else:
            src = r["source"]
            assert len(src["commit"]) == 40 and src["repo"] and src["path"] and src["where"]
            assert r["published"]["step"] > 0 and r["workload"] in data["workloads"]
    assert {r["gpu"] for r in data["rows"]} >= {"h100_sxm", "h20", "h800"}
    assert {r["framework"] for r in data["rows"]} >= {"nemo_rl", "verl", "areal"}
    for first, second, kind in data["pairs"]:
        assert first in ids and second in ids and kind in ("async_sync", "scaling")


def test_every_row_builds_the_shape_it_names():
    """A verl row's scenario is built from its workload, a NeMo RL row's is a file: either way
    the pipeline runs the row's shape on the row's split of GPUs, and a fully asynchronous row
    makes its batch the way its framework does (NeMo RL's replay buffer by target step, verl's
    message queue by completion)."""
    b, data = _bench(), _data()
    for r in data["rows"]:
        pipe = b.row_scenario(r, data).pipelines[0]
        if r["shape"] == "colocated_sync":
            assert pipe.type == "roll_sync" and len(pipe.train_gpus) == r["gpus"], r["id"]
        else:
            shape = {"disaggregated_sync": "sync"}.get(r["shape"], r["shape"])
            assert pipe.type == "disaggregated" and pipe.disaggregated.shape == shape, r["id"]
            assert len(pipe.infer_gpus) == r["rollout_gpus"], r["id"]
            assert len(pipe.train_gpus) + len(pipe.infer_gpus) == r["gpus"], r["id"]
            assert not set(pipe.train_gpus) & set(pipe.infer_gpus)
            if r["shape"] == "fully_async":  # each framework's own rule for the trainer's batch
                batching = {"nemo_rl": "target", "verl": "completion"}[r["framework"]]
                assert pipe.disaggregated.batching == batching, r["id"]


def test_a_row_publishing_only_its_step_cannot_move_the_colocated_training_factor():
    """The factor reads training seconds; a fitted pair that publishes none (NeMo RL's
    asynchronous rows) is skipped, not read as a zero or a failure."""
    data = _data()
    ids = {r["id"]: r for r in data["rows"]}
    pairs = [p for p in data["pairs"] if p[2] == "async_sync"]
    step_only = [p for p in pairs if "training" not in ids[p[1]].get("published", {"training": 0})]
    assert step_only, "the set has an asynchronous pair publishing step times only"
    before = _bench().fit_colocated_train_factor(data)
    data["pairs"] = [p for p in data["pairs"] if p not in step_only]
    assert _bench().fit_colocated_train_factor(data) == before


def test_the_cost_models_colocated_training_factor_is_the_fit_on_fitted_pairs_only():
    from simulators.costmodel.colocation import COLOCATED_TRAIN_FACTOR

    data = _data()
    assert round(_bench().fit_colocated_train_factor(data), 2) == COLOCATED_TRAIN_FACTOR
    for row in data["rows"]:  # a held-out row's figures cannot move the fit
        if row["split"] == "held_out" and "published" in row:
            row["published"] = {k: v * 3 for k, v in row["published"].items()}
    assert round(_bench().fit_colocated_train_factor(data), 2) == COLOCATED_TRAIN_FACTOR


def test_every_mixture_of_experts_row_names_its_experts():
    """A MoE row without ``num_experts`` gets neither the decode's expert coverage nor the
    routed experts' decode rate (simulators/costmodel/moe.py), nor an expert-parallel refit
    gather: every MoE row must carry what the property is applied from."""
    data, b = _data(), _bench()
    moe_rows = 0
    for r in data["rows"]:
        for pipe in b.row_scenario(r, data).pipelines:
            model = pipe.model
            if model.experts_per_token:
                moe_rows += 1
                assert model.num_experts > model.experts_per_token, r["id"]
    assert moe_rows == 8  # the NeMo RL Qwen3-30B-A3B (five) and Qwen3-235B-A22B (three) rows


def test_a_bundled_scenario_rows_gpu_count_is_its_scenarios():
    """The row's ``gpus`` (printed beside its figures) is the cluster its scenario runs."""
    from simulators.scenario.loader import load_scenario

    for r in _data()["rows"]:
        if "scenario" in r:
            scenario = load_scenario(os.path.join(ROOT, "examples", "published", r["scenario"] + ".yaml"))
            assert scenario.cluster.nodes * scenario.cluster.gpus_per_node == r["gpus"], r["id"]


def test_a_step_read_from_hours_is_the_hours_over_the_steps():
    """AReaL publishes a run's hours and steps; the row's step seconds are their quotient."""
    rows = [r for r in _data()["rows"] if "published_as" in r]
    assert len(rows) == 5
    for r in rows:
        hours, steps = r["published_as"]["hours"], r["published_as"]["steps"]
        assert abs(r["published"]["step"] - hours * 3600 / steps) < 0.1, r["id"]


def test_areals_fitted_mean_reads_only_fitted_rows(monkeypatch):
    """The AReaL mean is fitted on the step seconds of fitted rows; no held-out row is simulated
    for it (the simulation is replaced by a recorder: the test is about which rows are read)."""
    b, data = _bench(), _data()
    read = []

    def record(scenario):
        read.append(scenario.name)
        return 1.0, {}

    monkeypatch.setattr(b, "simulate", record)
    b.fit_areal_mean(data)
    splits = {r["id"]: r["split"] for r in data["rows"]}
    assert read and {splits[i] for i in read} == {"fitted"}
    assert {i for i in read} == {
        r["id"] for r in data["rows"] if r.get("workload", "").startswith("areal") and r["split"] == "fitted"
    }


def test_each_verl_table_runs_the_recipe_of_its_own_commit():
    """The one-step-off table's two FSDP2 runs come from the recipes beside it (volcengine/verl
    recipe/one_step_off_policy/dapo_7b_math_fsdp2_{colocate,4_12}.sh at e55d1431: 512 prompts
    x 12 answers, a mini-batch of 32 prompts, vLLM TP 2, the document's 20,480-token cap); its
    two Megatron runs from dapo_7b_math_megatron_{colocate,4_12}.sh at the same commit (16 and
    12 answers, vLLM TP 2, Megatron TP 2 x PP 2, 2 sequences a micro-batch, no recomputation,
    the document's 8,192 cap); the fully asynchronous table's from its own (16 answers, TP 4, a
    28,672 cap). The figures below are the scripts', not the benchmark's."""
    b, data = _bench(), _data()
    recipes = {  # workload -> (answers a prompt, vLLM TP, cap, answers an optimizer step trains, Megatron layout)
        "verl_dapo_qwen2.5_math_7b_one_step_off": (12, 2, 20480, 32 * 12, None),
        "verl_dapo_qwen2.5_math_7b": (16, 4, 28672, 32 * 16, None),
        "verl_dapo_qwen2.5_math_7b_megatron_colocate": (16, 2, 8192, 32 * 16, (2, 2, 2)),
        "verl_dapo_qwen2.5_math_7b_megatron_one_step_off": (12, 2, 8192, 32 * 12, (2, 2, 2)),
    }
    seen = set()
    for r in data["rows"]:
        if r.get("workload") not in recipes:
            continue
        answers, tp, cap, mini, megatron = recipes[r["workload"]]
        pipe = b.row_scenario(r, data).pipelines[0]
        train = r["gpus"] - r.get("rollout_gpus", 0)
        assert pipe.workload.prompts_per_step == 512 and pipe.workload.generations_per_prompt == answers, r["id"]
        assert pipe.infer_tp == tp and pipe.workload.decode_tokens_max == cap, r["id"]
        assert pipe.train_global_batch == mini, r["id"]
        if megatron is None:
            assert pipe.train_backend == "fsdp2" and pipe.train_micro_batch == mini * 4 // train, r["id"]
        else:
            layout = (pipe.train_tp, pipe.train_pp, pipe.train_micro_batch)
            assert pipe.train_backend == "megatron" and layout == megatron and not pipe.train_recompute, r["id"]
        seen.add(r["workload"])
    assert seen == set(recipes)


def test_the_verl_length_fit_reads_only_the_fully_asynchronous_tables_fitted_colocated_rows(monkeypatch):
    """The verl workload's two fitted figures are fitted on the rows whose workload they are:
    the one-step-off table's rows (another recipe) and every held-out row stay unread."""
    b, data = _bench(), _data()
    read = []
    monkeypatch.setattr(
        b, "simulate", lambda scenario: (read.append(scenario.name), (1.0, dict.fromkeys(b.STAGES, 1.0)))[1]
    )
    b.fit_workload(data)
    assert set(read) == {"verl-fa-colocated-sync-32", "verl-fa-colocated-sync-64", "verl-fa-colocated-sync-128"}
