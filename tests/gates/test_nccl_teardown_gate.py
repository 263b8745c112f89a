"""Gate 2.5 Part 1 on gloo: teardown leaves no process group behind, and leaks are named."""

import importlib.util

import pytest

from harness.exit_codes import ExitCode

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gate

HAS_MEGATRON = (
    importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
)


def test_full_teardown_with_torch_groups_passes(gate_runner):
    # forked: this gate's plain torchrun runs are tests/gates/test_gate_command.py's
    # (`rlharness gate nccl_teardown`: a pass, a designed failure and a skip under torchrun)
    run = gate_runner("nccl_teardown", 2, "--mode", "full", "--builder", "torch", "--cycles", "3")
    report = run.report
    assert run.returncode == 0, run.output[-3000:]
    assert report["status"] == "passed"
    full = report["summary"]["modes"]["full"]
    assert full["status"] == "passed" and full["builder"] == "torch" and full["survived"] == []
    assert full["reinit_ok"] is True
    assert len(run.checks("groups_released")) == 2 * 3
    assert all(c["passed"] for c in run.checks("stale_handle_unregistered"))
    assert all(c["passed"] for c in run.checks("allreduce_tp") + run.checks("allreduce_dp"))


def test_leaked_group_is_named(gate_runner):
    run = gate_runner("nccl_teardown", 2, "--mode", "full", "--builder", "torch", "--cycles", "2", hook="leak_group")
    report = run.report
    assert report["status"] == "failed" and run.returncode != 0
    assert "groups_released" in report["message"] and "DATA_PARALLEL_GROUP" in report["message"]
    full = report["summary"]["modes"]["full"]
    assert full["status"] == "failed" and full["survived"] == ["DATA_PARALLEL_GROUP"]


# What megatron-core 0.16.1's destroy_model_parallel() leaves registered (2 ranks, tp=2):
# 17 of the 20 groups each initialize_model_parallel() call registers — only the gloo
# groups are destroyed. Megatron-LM issue #6897 reports the same leak.
MEGATRON_0_16_1_SURVIVORS = [
    "CONTEXT_PARALLEL_GROUP",
    "DATA_PARALLEL_GROUP",
    "DATA_PARALLEL_GROUP_WITH_CP",
    "EMBEDDING_GROUP",
    "EXPERT_DATA_PARALLEL_GROUP",
    "EXPERT_MODEL_PARALLEL_GROUP",
    "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP",
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP",
    "EXPERT_TENSOR_PARALLEL_GROUP",
    "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP",
    "MODEL_PARALLEL_GROUP",
    "PIPELINE_MODEL_PARALLEL_GROUP",
    "POSITION_EMBEDDING_GROUP",
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP",
    "TENSOR_AND_DATA_PARALLEL_GROUP",
    "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP",
    "TENSOR_MODEL_PARALLEL_GROUP",
]


@pytest.mark.skipif(not HAS_MEGATRON, reason="megatron-core not installed")
def test_megatron_modes_report_what_survived(gate_runner):
    run = gate_runner("nccl_teardown", 2, "--mode", "both", "--cycles", "2", preload=["megatron.core.parallel_state"])
    modes = run.report["summary"]["modes"]
    assert modes["full"]["status"] == "passed" and modes["full"]["builder"] == "megatron"
    megatron = modes["megatron"]
    assert megatron["megatron_core"] == run.report["megatron_core_version"]
    if run.report["megatron_core_version"] == "0.16.1":  # pinned: the version this repo's CI installs
        assert megatron["status"] == "failed" and run.report["status"] == "failed"
        assert megatron["survived"] == MEGATRON_0_16_1_SURVIVORS
        assert megatron["survived_count_by_rank"] == {"0": 17 * 2, "1": 17 * 2}  # 17 per cycle, 2 cycles
        assert "groups_released: mode megatron cycle 0: 17 process group(s) survived" in run.report["message"]
        cycles = [c for r in run.report["ranks"] for c in r["data"]["modes"]["megatron"]["cycles"]]
        assert [(c["created"], len(c["survived"])) for c in cycles] == [(20, 17)] * 4
    elif megatron["status"] == "failed":  # another version: whatever survives must be named
        assert megatron["survived"], "a failed megatron mode must name what survived"
        assert "groups_released: mode megatron" in run.report["message"]
    else:
        assert megatron["status"] == "passed" and megatron["survived"] == []


def test_megatron_missing_is_an_explicit_skip(gate_runner, tmp_path):
    fake = tmp_path / "hide_megatron" / "megatron"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'megatron'\")\n")
    run = gate_runner("nccl_teardown", 2, "--cycles", "1", extra_env={"PYTHONPATH": str(fake.parent)})
    modes = run.report["summary"]["modes"]
    assert modes["megatron"]["status"] == "skipped"
    assert modes["megatron"]["reason"] == "skipped: megatron-core not installed"
    assert modes["full"]["status"] == "passed" and modes["full"]["builder"] == "torch"
    assert run.report["status"] == "passed"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this node has CUDA")
def test_nccl_without_gpu_is_a_skip(gate_runner):
    run = gate_runner("nccl_teardown", 2, "--backend", "nccl")
    assert run.report["status"] == "skipped" and run.report["exit_code"] == ExitCode.SKIPPED
    assert "nccl requested" in run.report["message"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this node has CUDA")
def test_a_skip_waits_for_rank_0s_report(gate_runner):
    """Every rank skips with a non-zero exit, and torchrun's agent ends the job at the first
    one: the others must not leave before rank 0 has written the report (rank 0 late here)."""
    run = gate_runner("nccl_teardown", 2, "--backend", "nccl", hook="late_skip_report:1.5")
    assert run.report["status"] == "skipped" and run.report["exit_code"] == ExitCode.SKIPPED
    assert run.elapsed_s >= 1.5


@pytest.mark.skipif(torch.cuda.is_available(), reason="this node has CUDA")
def test_device_cuda_without_gpu_is_a_skip(gate_runner):
    run = gate_runner("refit_stream", 2, "--device", "cuda", "--cycles", "1")
    assert run.report["status"] == "skipped" and run.report["exit_code"] == ExitCode.SKIPPED
    assert "--device cuda requested" in run.report["message"]
