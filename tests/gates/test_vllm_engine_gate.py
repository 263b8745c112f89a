"""The vLLM engine gate is GPU-only: on a node without vLLM or without CUDA,
``rlharness gate vllm_engine`` is a skip (exit 3) that says which is missing; where both
exist the gate itself runs (marker ``gpu``; see docs/gpu-runs.md)."""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")

from gpu_gates import vllm_engine  # noqa: E402
from tests.gates.test_gate_command import _rlharness  # noqa: E402

pytestmark = pytest.mark.gate


def test_the_skip_reason_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert "vllm is not installed" in vllm_engine.skip_reason()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no CUDA device" in vllm_engine.skip_reason()
    assert "exactly 1 rank" in vllm_engine.check_world(None, 2)


@pytest.mark.skipif(vllm_engine.skip_reason() is None, reason="this node can run the vLLM gate")
def test_rlharness_gate_prints_the_skip_and_exits_3(tmp_path, request):
    proc = _rlharness(tmp_path, request, "vllm_engine", "--report", str(tmp_path / "v.json"))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout.startswith("gate vllm_engine: SKIPPED")
    assert f"skipped: {vllm_engine.skip_reason()}" in proc.stdout
