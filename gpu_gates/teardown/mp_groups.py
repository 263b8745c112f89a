"""Model-parallel group builders and teardowns for the NCCL teardown gate.

Training in a time-sharing system must give its GPUs back, and that includes the NCCL
communicators of its model-parallel groups: a communicator that survives holds device
buffers, and the next wake-up of inference on that GPU runs out of memory. Two builders
make the same TP/DP layout: megatron-core's ``parallel_state`` (what real trainers use)
when it is installed and importable, and plain ``torch.distributed.new_group`` otherwise.
Two teardowns are compared:

* ``megatron``: ``destroy_model_parallel()`` alone, what a trainer would naturally call;
* ``full``: that, plus ``destroy_process_group`` on every group the build registered.

Which groups a build created is read from c10d's registry (before/after diff), so a
builder that creates more groups than the gate knows about is still fully accounted for.
"""

from __future__ import annotations

import datetime
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch.distributed as dist

from gpu_gates.runtime import pg_registry
from gpu_gates.runtime.pg_registry import GroupInfo

TP_DESC = "TENSOR_MODEL_PARALLEL_GROUP"
DP_DESC = "DATA_PARALLEL_GROUP"


def load_megatron() -> Tuple[Optional[Any], str]:
    """``(parallel_state module, version)`` or ``(None, reason it cannot be used)``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core import parallel_state  # noqa: WPS433 (optional dependency)
    except ModuleNotFoundError:
        return None, "megatron-core not installed"
    except Exception as exc:  # installed but broken: say so, do not pretend it is absent
        return None, f"megatron-core not importable: {type(exc).__name__}: {exc}"
    try:
        from importlib.metadata import version

        return parallel_state, version("megatron-core")
    except Exception:
        return parallel_state, "unknown"


@dataclass
class BuiltGroups:
    builder: str
    tp: Any
    dp: Any
    tp_ranks: List[int]
    dp_ranks: List[int]
    created: Dict[str, GroupInfo] = field(default_factory=dict)


def _new_group(ranks: List[int], timeout: datetime.timedelta, desc: str) -> Any:
    try:
        return dist.new_group(ranks=ranks, timeout=timeout, group_desc=desc)
    except TypeError:  # torch < 2.4 has no group_desc
        return dist.new_group(ranks=ranks, timeout=timeout)


def build_torch_groups(tp_size: int, timeout: datetime.timedelta) -> Tuple[Any, Any]:
    """Megatron's TP-then-DP layout with plain new_group; every rank creates every group."""
    world, rank = dist.get_world_size(), dist.get_rank()
    tp_mine = dp_mine = None
    for start in range(0, world, tp_size):
        ranks = list(range(start, start + tp_size))
        group = _new_group(ranks, timeout, TP_DESC)
        if rank in ranks:
            tp_mine = group
    for offset in range(tp_size):
        ranks = list(range(offset, world, tp_size))
        group = _new_group(ranks, timeout, DP_DESC)
        if rank in ranks:
            dp_mine = group
    return tp_mine, dp_mine


def build_groups(builder: str, tp_size: int, timeout: datetime.timedelta, megatron: Any = None) -> BuiltGroups:
    before = pg_registry.live_groups()
    if builder == "megatron":
        megatron.initialize_model_parallel(
            tensor_model_parallel_size=tp_size,
            distributed_timeout_minutes=max(1, math.ceil(timeout.total_seconds() / 60)),
        )
        tp, dp = megatron.get_tensor_model_parallel_group(), megatron.get_data_parallel_group()
    else:
        tp, dp = build_torch_groups(tp_size, timeout)
    after = pg_registry.live_groups()
    created = {name: info for name, info in after.items() if name not in before}
    return BuiltGroups(
        builder=builder,
        tp=tp,
        dp=dp,
        tp_ranks=dist.get_process_group_ranks(tp),
        dp_ranks=dist.get_process_group_ranks(dp),
        created=created,
    )


def destroy_created(built: BuiltGroups, keep: Optional[GroupInfo] = None) -> List[GroupInfo]:
    """``destroy_process_group`` on every group the build created that is still registered."""
    destroyed = []
    for name, info in sorted(built.created.items()):
        if keep is not None and name == keep.name:
            continue
        handle = pg_registry.handle_by_name(name)
        if handle is not None:
            dist.destroy_process_group(handle)
            destroyed.append(info)
    return destroyed


def destroy_leftovers(baseline: Dict[str, GroupInfo]) -> List[str]:
    """Destroy every registered group not in ``baseline`` (clean-up between modes)."""
    destroyed = []
    for name, info in sorted(pg_registry.live_groups().items()):
        if name in baseline:
            continue
        handle = pg_registry.handle_by_name(name)
        if handle is not None:
            dist.destroy_process_group(handle)
            destroyed.append(info.label())
    return destroyed
