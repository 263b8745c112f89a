"""A scenario written back out: the inverse of loading (``simulators/scenario/loader.py``).

``scenario_to_mapping`` turns a frozen :class:`~simulators.scenario.spec.Scenario` into the fully
resolved mapping a scenario file would hold (defaults applied, lists instead of tuples).
A run writes it as ``scenario.yaml`` next to its log, and the pytest plugin re-validates
from it. It lives apart from the loader so the loader stays one direction (text ->
validated spec) and this stays a plain field-by-field dump with nothing to validate.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Dict

from simulators.scenario.spec import Scenario

__all__ = ["scenario_to_mapping"]


def _flat_to_mapping(obj: Any) -> Dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


#: fields left out of the dump while unset: presets and architecture the scenario never named
_UNSET_OMITTED = {
    "gpu": "",
    "preset": "",
    "active_params": 0.0,
    "layers": 0,
    "hidden_size": 0,
    "num_heads": 0,
    "num_kv_heads": 0,
    "head_dim": 0,
    "vocab_size": 0,
    "experts_per_token": 0,
    "num_experts": 0,
    "decode_timing": "at_start",
    "decode_expert_read_s": 0.0,
    "decode_kv_s_per_token": 0.0,
}
#: a pipeline's training layout (the cost model's input), dumped where it is not the default
_LAYOUT = {
    "train_tp": 1,
    "train_pp": 1,
    "train_cp": 1,
    "train_ep": 1,
    "train_micro_batch": 1,
    "train_global_batch": 0,
    "train_pack_tokens": 0,
    "log_prob_pack_tokens": 0,
    "log_prob_passes": 1,
    "train_recompute": False,
    "train_backend": "megatron",
    "train_sp": 1,
}


def _sparse(obj: Any) -> Dict[str, Any]:
    return {k: v for k, v in _flat_to_mapping(obj).items() if not (k in _UNSET_OMITTED and v == _UNSET_OMITTED[k])}


def _costs_beyond(p_costs: Any, base: Any) -> Dict[str, Any]:
    """A pipeline's costs as the fields that differ from the scenario's."""
    return {
        f.name: getattr(p_costs, f.name) for f in fields(p_costs) if getattr(p_costs, f.name) != getattr(base, f.name)
    }


def scenario_to_mapping(s: Scenario) -> Dict[str, Any]:
    """The fully resolved mapping of ``s`` (no ``defaults`` section; lists, not tuples).

    ``scenario_from_mapping(scenario_to_mapping(s))`` equals ``s`` for any valid ``s``;
    ``yaml.safe_dump(..., sort_keys=False)`` of it is a loadable scenario file.
    """
    pipelines = []
    for p in s.pipelines:
        pipelines.append(
            {
                "name": p.name,
                "type": p.type,
                "train_gpus": list(p.train_gpus),
                "infer_gpus": list(p.infer_gpus),
                "infer_tp": p.infer_tp,
                **{k: getattr(p, k) for k, default in _LAYOUT.items() if getattr(p, k) != default},
                "steps": p.steps,
                "sleep_level": p.sleep_level,
                "start_s": p.start_s,
                "old_log_probs_offload_states": p.old_log_probs_offload_states,
                "offload_nccl": p.offload_nccl,
                # a single controller's engines never pause for a shrink: it has no such fields
                **({} if p.type == "single_controller" else {"pause_mode": p.pause_mode, "wake": p.wake}),
                **({"wait_offloaded": True} if p.wait_offloaded else {}),
                **({} if p.finalize_pause == "none" else {"finalize_pause": p.finalize_pause}),
                **({"weights_memo": True} if p.weights_memo else {}),
                **({} if p.refit_path == "cpu_cache" else {"refit_path": p.refit_path}),
                **({} if p.refit_export == "megatron_bridge" else {"refit_export": p.refit_export}),
                "model": _sparse(p.model),
                "workload": _sparse(p.workload),
                **({} if p.data_plane is None else {"data_plane": _flat_to_mapping(p.data_plane)}),
                **(
                    {}
                    if p.weight_sync_groups is None
                    else {"weight_sync_groups": _flat_to_mapping(p.weight_sync_groups)}
                ),
                **({} if p.costs is None else {"costs": _costs_beyond(p.costs, s.costs)}),
            }
        )
        if p.type == "single_controller":
            pipelines[-1]["streaming"] = _flat_to_mapping(p.streaming)
        if p.disaggregated is not None:
            flat = _flat_to_mapping(p.disaggregated)
            pipelines[-1]["disaggregated"] = {k: v for k, v in flat.items() if v or k != "comm_locks"}  # off: unset
    return {
        "name": s.name,
        "description": s.description,
        "seed": s.seed,
        "horizon_s": s.horizon_s,
        "cluster": _sparse(s.cluster),
        "costs": _flat_to_mapping(s.costs),
        "scheduler": dict(s.scheduler),
        "pipelines": pipelines,
        "faults": [_flat_to_mapping(f) for f in s.faults],
        **({"refit_calibration": s.refit_calibration} if s.refit_calibration else {}),
        **({"step_calibration": s.step_calibration} if s.step_calibration else {}),
        **({"expect": [e.as_mapping() for e in s.expect]} if s.expect else {}),
    }
