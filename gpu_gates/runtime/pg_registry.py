"""Which process groups torch.distributed still has registered, read version-tolerantly.

A group that a teardown "destroyed" but torch still holds keeps its communicator (and,
with NCCL, its device buffers) alive. The only ground truth is c10d's own registry,
which is private: newer torch keeps it on ``distributed_c10d._world`` (``pg_map``,
``pg_names``, ``pg_group_ranks``), older torch in module globals (``_pg_map``, ...).
Both are read here, and nothing else in the gates touches c10d internals.

A backend object built directly on a store prefix (gate 4's per-sync groups: see
``sync_runtime.SyncGroup``) is not in c10d's registry at all. Such groups are tracked here
(:func:`track_direct`) through a weak reference, so :func:`live_groups` lists them too
while they are alive — and "alive" means the object still exists, not that someone
called ``shutdown()`` on it (a no-op on gloo: a broadcast still works after it).
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch.distributed as dist


@dataclass(frozen=True)
class GroupInfo:
    name: str
    desc: Optional[str]
    ranks: List[int]

    def label(self) -> str:
        desc = self.desc or "unnamed"
        return f"{desc} (pg {self.name!r}, ranks {self.ranks})"

    def as_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "desc": self.desc, "ranks": self.ranks}


def _registry(attr: str) -> Dict[Any, Any]:
    c10d = dist.distributed_c10d
    world = getattr(c10d, "_world", None)
    table = getattr(world, attr, None) if world is not None else None
    if table is None:
        table = getattr(c10d, "_" + attr, None)
    if table is None:
        raise RuntimeError(
            f"cannot find torch.distributed's {attr} registry in torch {getattr(dist, '__version__', '')}"
        )
    return table


def is_registered(group: Any) -> bool:
    """True while c10d still holds ``group`` (a destroyed group is removed)."""
    if group is None or group == dist.GroupMember.NON_GROUP_MEMBER:
        return False
    return group in _registry("pg_map")


def group_desc(group: Any) -> Optional[str]:
    desc = getattr(group, "group_desc", None)
    return desc if isinstance(desc, str) and desc else None


DIRECT_PREFIX = "direct:"
_DIRECT: Dict[str, Tuple["weakref.ref[Any]", GroupInfo]] = {}


def track_direct(name: str, backend: Any, ranks: List[int], desc: Optional[str] = None) -> None:
    """Count a process-group backend built outside c10d's registry as live while it exists."""
    _DIRECT[DIRECT_PREFIX + name] = (weakref.ref(backend), GroupInfo(DIRECT_PREFIX + name, desc, sorted(ranks)))


def direct_alive(name: str) -> bool:
    """Whether the tracked backend ``name`` still exists (after a garbage collection: a
    reference cycle must not count as a leak, a real reference must)."""
    entry = _DIRECT.get(DIRECT_PREFIX + name)
    if entry is None or entry[0]() is None:
        return False
    gc.collect()
    return entry[0]() is not None


def _live_direct() -> Dict[str, GroupInfo]:
    for key in [k for k, (ref, _) in _DIRECT.items() if ref() is None]:
        del _DIRECT[key]
    return {key: info for key, (_, info) in _DIRECT.items()}


def live_groups() -> Dict[str, GroupInfo]:
    """Every live group of this rank: c10d's registered groups keyed by c10d's group name,
    and the directly built ones keyed ``direct:<name>``."""
    names = _registry("pg_names")
    ranks = _registry("pg_group_ranks")
    out: Dict[str, GroupInfo] = {}
    for group in list(_registry("pg_map")):
        name = str(names.get(group, id(group)))
        members = sorted(int(r) for r in ranks.get(group, {}))
        out[name] = GroupInfo(name=name, desc=group_desc(group), ranks=members)
    out.update(_live_direct())
    return out


def info_of(group: Any) -> Optional[GroupInfo]:
    """The registry entry of one group handle, or ``None`` if not registered."""
    if not is_registered(group):
        return None
    name = str(_registry("pg_names").get(group))
    return live_groups().get(name)


def handle_by_name(name: str) -> Any:
    """The group handle registered under c10d name ``name`` (``None`` if gone)."""
    for group, registered_name in list(_registry("pg_names").items()):
        if str(registered_name) == name:
            return group
    return None
