"""RLix's multi-pipeline setups (``examples/*/…pipeline*.yaml``: one YAML per pipeline) ->
one scenario with a pipeline each, on the GPUs RLix gives them.

An RLix pipeline YAML names its kind in ``pipeline_cls``: a NeMo RL pipeline wraps a
NeMo RL config (``nemo_config_path``, with ``nemo_config_overrides`` applied as NeMo RL's
command line applies them) and maps it with ``train_device_mapping`` /
``infer_device_mapping``; a ROLL pipeline is a ROLL config whose ``actor_train`` /
``actor_infer`` device mappings are the GPUs. RLix drives both: refit through its CPU
bucket cache, the inference ranks' vLLM sleep level from ``actor_infer``'s strategy config.
``nemo_config_path`` is a path on the machine the pipeline ran on; ``nemo_configs``
(``--nemo-configs DIR``) is tried for its part after ``examples/configs/``.
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from simulators.config_import import nemo_rl, roll
from simulators.config_import.common import (
    ConfigRefused,
    apply_overrides,
    device_mapping,
    get,
    scenario_name,
    start_draft,
    typed,
)
from simulators.config_import.draft import ScenarioDraft


class PipelineRefused(ConfigRefused):
    """A refusal in one of several files: ``file`` says which."""

    def __init__(self, file: str, inner: ConfigRefused) -> None:
        super().__init__(inner.key, f"{inner.problem} (in {os.path.basename(file)})")
        self.file = file


def _nemo_config(cfg: Dict[str, Any], path: str, nemo_configs: Optional[str]) -> Tuple[Dict[str, Any], List[str]]:
    raw = str(get(cfg, "nemo_config_path"))
    candidates = [raw if os.path.isabs(raw) else os.path.join(os.path.dirname(path), raw)]
    marker = "examples/configs/"
    if nemo_configs and marker in raw:
        candidates.append(os.path.join(nemo_configs, raw.split(marker, 1)[1]))
    found = next((c for c in candidates if os.path.isfile(c)), None)
    if found is None:
        raise ConfigRefused(
            "nemo_config_path",
            f"{raw!r} not found"
            + ("" if nemo_configs else "; give --nemo-configs DIR (a NeMo RL checkout's examples/configs)"),
        )
    nemo, chain = nemo_rl.load(found)
    overrides = get(cfg, "nemo_config_overrides", []) or []
    if not isinstance(overrides, list):
        raise ConfigRefused("nemo_config_overrides", f"expected a list of KEY=VALUE overrides, got {overrides!r}")
    apply_overrides(nemo, overrides)
    return nemo, [os.path.basename(found)] + chain


def _add(d: ScenarioDraft, index: int, path: str, steps: int, nemo_configs: Optional[str]) -> Tuple[int, List[int]]:
    cfg, _ = roll.load(path)
    cls = str(get(cfg, "pipeline_cls"))
    name = str(get(cfg, "exp_name", scenario_name(path)))
    gpn = typed(cfg, "num_gpus_per_node", int, 8)
    level = get(cfg, "actor_infer.strategy_args.strategy_config.sleep_level", None)
    rlix = {"sleep_level": str(level)} if isinstance(level, int) else {}
    if "multi_lora" in cls.lower() or "lora" in cls.lower().rsplit(".", 1)[-1]:
        raise ConfigRefused("pipeline_cls", f"{cls}: LoRA adapters are not modelled")
    if "nemo_rl" in cls:
        nemo, chain = _nemo_config(cfg, path, nemo_configs)
        nemo_rl._refuse_unsupported(nemo)
        train = device_mapping(get(cfg, "train_device_mapping"), "train_device_mapping")
        infer = device_mapping(get(cfg, "infer_device_mapping"), "infer_device_mapping")
        nemo_rl.add_pipeline(
            d,
            index,
            nemo,
            name,
            train,
            infer,
            steps,
            ("train_device_mapping (RLix)", "infer_device_mapping (RLix)"),
            rlix=rlix,
        )
        gpus = train + infer
    elif "roll" in cls.lower():
        train, infer = roll.gpus(cfg)
        roll.add_pipeline(d, index, cfg, name, steps, train, infer)
        gpus = train + infer
    else:
        raise ConfigRefused("pipeline_cls", f"{cls!r}: neither a NeMo RL nor a ROLL pipeline of RLix")
    return gpn, gpus


def translate(
    paths: Sequence[str], *, gpu: str, steps: int, name: Optional[str] = None, nemo_configs: Optional[str] = None
) -> ScenarioDraft:
    """One scenario from the pipeline files ``paths``; a refusal names the file and its key."""
    name = name or scenario_name(paths[0]) + (f"_and_{len(paths) - 1}_more" if len(paths) > 1 else "")
    d = start_draft(
        "the RLix pipeline configs", "rlix-pipelines", ", ".join(os.path.basename(p) for p in paths), (), name
    )
    node_sizes, every_gpu = [], []
    for i, path in enumerate(paths):
        try:
            gpn, gpus = _add(d, i, path, steps, nemo_configs)
        except ConfigRefused as e:
            raise PipelineRefused(path, e) from None
        node_sizes.append(gpn)
        every_gpu += gpus
    if len(set(node_sizes)) > 1:
        raise ConfigRefused(
            "num_gpus_per_node", f"the pipelines disagree: {node_sizes} (one cluster has one node size)"
        )
    gpn = node_sizes[0]
    d.set(
        ("cluster", "nodes"),
        math.ceil((max(every_gpu) + 1) / gpn),
        "the highest GPU any pipeline maps / num_gpus_per_node, rounded up",
    )
    d.set(("cluster", "gpus_per_node"), gpn, "num_gpus_per_node")
    d.set(("cluster", "gpu"), gpu, "--gpu (RLix's configs name no GPU type)")
    return d
