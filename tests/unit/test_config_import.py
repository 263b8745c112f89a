"""The config importers on small configs written here (the pinned upstream configs are
tests/cli/test_import_archives.py): inheritance and interpolation as OmegaConf gives
them, every field commented with its key, refusals naming the key, the CLI's contract."""

from __future__ import annotations

import os
import textwrap

import pytest
import yaml

from rlharness.cli import main
from simulators.config_import import nemo_rl, roll
from simulators.config_import.common import ConfigRefused, device_mapping, finish, get

PARENT = """
grpo:
  num_prompts_per_step: 8
  num_generations_per_prompt: 4
  max_num_steps: 100
  seed: 7
  async_grpo: {enabled: false, max_trajectory_age_steps: 1}
loss_fn: {reference_policy_kl_penalty: 0.01}
policy:
  model_name: "Qwen/Qwen2.5-1.5B"
  train_global_batch_size: 32
  train_micro_batch_size: 2
  max_total_sequence_length: 1024
  precision: bfloat16
  sequence_packing:
    train_mb_tokens: ${mul:${policy.max_total_sequence_length}, ${policy.train_micro_batch_size}}
  dtensor_cfg: {enabled: true, tensor_parallel_size: 1, context_parallel_size: 1, activation_checkpointing: false}
  megatron_cfg: {enabled: false, tensor_model_parallel_size: 1}
  generation:
    backend: vllm
    max_new_tokens: ${policy.max_total_sequence_length}
    temperature: 1.0
    val_temperature: ${.temperature}
    vllm_cfg: {tensor_parallel_size: 1, gpu_memory_utilization: 0.6}
    colocated: {enabled: true, resources: {gpus_per_node: null, num_nodes: null}}
  optimizer: {name: adamw, kwargs: {lr: 1.0e-6}}
cluster: {gpus_per_node: 4, num_nodes: 1}
"""

CHILD = """
defaults: parent.yaml
grpo:
  num_prompts_per_step: 16
policy:
  max_total_sequence_length: 2048
  optimizer:
    _override_: true
    name: sgd
  generation:
    temperature: 0.7
    vllm_cfg: {tensor_parallel_size: 2}
  megatron_cfg: {enabled: true, tensor_model_parallel_size: 2, pipeline_model_parallel_size: 2,
                 context_parallel_size: 1, expert_model_parallel_size: 1, activation_checkpointing: true}
"""


@pytest.fixture
def child(tmp_path):
    (tmp_path / "parent.yaml").write_text(PARENT)
    (tmp_path / "child.yaml").write_text(CHILD)
    return str(tmp_path / "child.yaml")


def _omegaconf_reference(path: str):
    """What NeMo RL's own loader gives (nemo_rl/utils/config.py's rules, on OmegaConf)."""
    oc = pytest.importorskip("omegaconf")
    OmegaConf = oc.OmegaConf
    if not OmegaConf.has_resolver("mul"):
        OmegaConf.register_new_resolver("mul", lambda a, b: a * b)
    child = OmegaConf.load(path)
    parent = OmegaConf.load(os.path.join(os.path.dirname(path), child.pop("defaults")))
    parent.policy.pop("optimizer")  # the child's _override_ section replaces the parent's
    child.policy.optimizer.pop("_override_")
    return OmegaConf.to_container(OmegaConf.merge(parent, child), resolve=True)


def test_inheritance_and_interpolation_match_omegaconf(child):
    cfg, chain = nemo_rl.load(child)
    ref = _omegaconf_reference(child)
    assert chain == ["parent.yaml"]
    for key in (
        "grpo.num_prompts_per_step",
        "grpo.num_generations_per_prompt",
        "policy.generation.max_new_tokens",
        "policy.generation.val_temperature",
        "policy.sequence_packing.train_mb_tokens",
        "policy.optimizer",
        "policy.megatron_cfg.pipeline_model_parallel_size",
        "policy.generation.vllm_cfg.gpu_memory_utilization",
    ):
        expected = ref
        for part in key.split("."):
            expected = expected[part]
        assert get(cfg, key) == expected, key
    assert get(cfg, "policy.sequence_packing.train_mb_tokens") == 4096


def test_overrides_follow_hydra(child):
    cfg, _ = nemo_rl.load(
        child,
        [
            "grpo.num_prompts_per_step=3",
            "+policy.extra=1",
            "++cluster.num_nodes=2",
            "~loss_fn.reference_policy_kl_penalty",
        ],
    )
    assert (get(cfg, "grpo.num_prompts_per_step"), get(cfg, "policy.extra"), get(cfg, "cluster.num_nodes")) == (3, 1, 2)
    assert get(cfg, "loss_fn.reference_policy_kl_penalty", None) is None
    with pytest.raises(ConfigRefused, match="add it with"):
        nemo_rl.load(child, ["policy.nope=1"])
    with pytest.raises(ConfigRefused, match="already has"):
        nemo_rl.load(child, ["+grpo.seed=1"])


def test_every_field_names_its_key(child):
    cfg, chain = nemo_rl.load(child)
    text, scenario = finish(nemo_rl.translate(cfg, child, chain, gpu="h100_sxm", steps=2), child)
    pipe = scenario.pipelines[0]
    assert (pipe.type, pipe.infer_tp, pipe.train_tp, pipe.train_pp, pipe.train_recompute) == (
        "roll_sync",
        2,
        2,
        2,
        True,
    )
    assert (pipe.workload.prompts_per_step, pipe.workload.decode_tokens_max, pipe.log_prob_passes) == (16, 2048, 2)
    assert pipe.train_gpus == pipe.infer_gpus == (0, 1, 2, 3) and pipe.refit_path == "colocated_ipc"
    for line in text.splitlines():
        if line.startswith("#") or line.rstrip().endswith(":"):
            continue
        assert "  # " in line, f"no source comment: {line}"
    assert "# grpo.num_prompts_per_step" in text and "# policy.megatron_cfg.pipeline_model_parallel_size" in text
    assert yaml.safe_load(text)["pipelines"][0]["workload"]["prompts_per_step"] == 16


@pytest.mark.parametrize(
    "override,key",
    [
        ("policy.dtensor_cfg.lora_cfg={enabled: true}", "policy.dtensor_cfg.lora_cfg.enabled"),
        ("policy.generation.backend=sglang", "policy.generation.backend"),
        ("policy.model_name=acme/unknown-7b", "policy.model_name"),
        ("policy.generation.colocated.enabled=false", "policy.generation.colocated.enabled"),
        ("policy.generation.vllm_cfg.tensor_parallel_size=3", "policy.generation.vllm_cfg.tensor_parallel_size"),
    ],
)
def test_refusals_name_the_key(child, override, key):
    overrides = [override if not override.startswith("policy.dtensor_cfg.lora") else "++" + override]
    with pytest.raises(ConfigRefused) as e:
        cfg, chain = nemo_rl.load(child, overrides)
        finish(nemo_rl.translate(cfg, child, chain, gpu="h100_sxm", steps=2), child)
    assert e.value.key == key


def test_roll_agentic_and_device_mappings(tmp_path):
    (tmp_path / "envs.yaml").write_text("custom_env: {Game: {max_steps: 5}}\n")
    (tmp_path / "agentic.yaml").write_text(
        textwrap.dedent("""
        defaults:
          - ./envs@_here_
        seed: 1
        num_gpus_per_node: 4
        max_steps: 10
        sequence_length: 2048
        max_actions_per_traj: 4
        pretrain: Qwen/Qwen2.5-7B
        actor_train:
          training_args: {per_device_train_batch_size: 2, gradient_accumulation_steps: 8}
          strategy_args: {strategy_name: megatron_train, strategy_config: {tensor_model_parallel_size: 2}}
          device_mapping: list(range(0,4))
        actor_infer:
          generating_args: {max_new_tokens: 128}
          strategy_args: {strategy_name: vllm, strategy_config: {gpu_memory_utilization: 0.7, sleep_level: 2}}
          device_mapping: "[0, 1, 2, 3, ]"
        train_env_manager: {num_env_groups: 16, group_size: 4}
    """)
    )
    cfg, chain = roll.load(str(tmp_path / "agentic.yaml"))
    assert chain == ["envs.yaml"] and get(cfg, "custom_env.Game.max_steps") == 5
    _, s = finish(roll.translate(cfg, "agentic.yaml", chain, gpu="h100_sxm", steps=2), "agentic.yaml")
    p = s.pipelines[0]
    assert (p.type, p.train_tp, p.sleep_level, p.train_global_batch) == ("roll_sync", 2, 2, 2 * 8 * 2)
    assert (p.workload.prompts_per_step, p.workload.generations_per_prompt, p.workload.decode_tokens_max) == (
        16,
        4,
        512,
    )
    assert device_mapping("list(range(2,6))", "k") == [2, 3, 4, 5]
    assert device_mapping("list([0,1,8,9])", "k") == [0, 1, 8, 9]
    with pytest.raises(ConfigRefused, match="k"):
        device_mapping("__import__('os')", "k")


def test_cli_refusal_is_one_line_and_writes_nothing(child, tmp_path, capsys):
    out = tmp_path / "s.yaml"
    assert (
        main(["import", "nemo-rl-config", child, "--set", "policy.generation.backend=sglang", "--out", str(out)]) == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "policy.generation.backend" in err and not out.exists()
    assert main(["import", "nemo-rl-config", child, "--gpu", "tpu", "--out", str(out)]) == 2
    assert "--gpu" in capsys.readouterr().err
    assert main(["import", "nemo-rl-config", child, "--out", str(out)]) == 0
    assert main(["validate", str(out)]) == 0
