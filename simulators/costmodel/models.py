"""Model presets: the architecture numbers the formulas read, from each model's published
``config.json`` on the Hugging Face Hub (repository named per preset; parameter counts
from the model cards).

A preset fills ``model.params`` and the architecture fields that a pipeline's ``model``
section leaves out; for a model that is not here, give the numbers (``params``,
``layers``, ``hidden_size``, ``num_heads``, ``num_kv_heads``, ``head_dim``; and
``active_params`` and ``experts_per_token`` for a mixture of experts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict


@dataclass(frozen=True)
class ModelPreset:
    name: str
    source: str  # Hugging Face repository whose config.json gives the numbers
    params: float
    active_params: float  # = params for a dense model
    layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    experts_per_token: int = 0  # config.json's num_experts_per_tok; 0 = dense
    num_experts: int = 0  # config.json's num_experts (routed experts per MoE layer); 0 = dense


MODEL_PRESETS: Dict[str, ModelPreset] = {
    m.name: m
    for m in (
        ModelPreset("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct", 0.494e9, 0.494e9, 24, 896, 14, 2, 64, 151936),
        ModelPreset("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B-Instruct", 1.54e9, 1.54e9, 28, 1536, 12, 2, 128, 151936),
        ModelPreset("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", 7.62e9, 7.62e9, 28, 3584, 28, 4, 128, 152064),
        ModelPreset("qwen2.5-32b", "Qwen/Qwen2.5-32B-Instruct", 32.8e9, 32.8e9, 64, 5120, 40, 8, 128, 152064),
        ModelPreset("qwen3-8b", "Qwen/Qwen3-8B", 8.19e9, 8.19e9, 36, 4096, 32, 8, 128, 151936),
        ModelPreset("qwen3-32b", "Qwen/Qwen3-32B", 32.8e9, 32.8e9, 64, 5120, 64, 8, 128, 151936),
        ModelPreset("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", 30.5e9, 3.3e9, 48, 2048, 32, 4, 128, 151936, 8, 128),
        ModelPreset("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", 235e9, 22e9, 94, 4096, 64, 4, 128, 151936, 8, 128),
        ModelPreset("llama3.2-1b", "meta-llama/Llama-3.2-1B-Instruct", 1.24e9, 1.24e9, 16, 2048, 32, 8, 64, 128256),
        ModelPreset("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", 8.03e9, 8.03e9, 32, 4096, 32, 8, 128, 128256),
        ModelPreset("llama3.1-70b", "meta-llama/Llama-3.1-70B-Instruct", 70.6e9, 70.6e9, 80, 8192, 64, 8, 128, 128256),
    )
}

#: the ModelSpec fields a preset fills
PRESET_FIELDS = (
    "params",
    "active_params",
    "layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "vocab_size",
    "experts_per_token",
    "num_experts",
)
