"""Rank 0 speaks first: the exits every rank takes at the same point, before any group.

A skip (exit 77) and a usage error (exit 2) end every rank before a process group exists,
and only rank 0 reports them (the skip's report, the usage message: one copy, not one per
rank). But torchrun's agent tears the whole job down at the first non-zero exit, so a peer
that left at once SIGTERMed rank 0 before it had written its report or printed its usage
(both seen on a loaded machine: a skip without its report, a usage line cut after
``usage: ...``). So the ranks meet on the launch's TCP store: rank 0 speaks, posts that it
has, and the others leave only once they have read it. Where rank 0 hosts the store itself
(no torchrun agent store), it stays until each peer has read it, as the store leaves with
its process. Every wait is bounded, and a rank that cannot reach the store leaves at once:
a lost store costs the message at worst, never a hang.
"""

from __future__ import annotations

import datetime
import sys
import time
from typing import Callable, List

from gpu_gates.runtime.context import KEY_PREFIX
from gpu_gates.runtime.dist_setup import LaunchEnv, connect_store

SPOKE = KEY_PREFIX + "rank0_spoke"


def rank0_speaks_first(env: LaunchEnv, until: float, speak: Callable[[], None], delay_s: float = 0.0) -> None:
    """Run ``speak`` on rank 0; every other rank returns only once it has (or at ``until``).
    ``delay_s``: rank 0 speaks that late (a test hook's way to make the race certain)."""
    store = None
    if env.world_size > 1:
        timeout = datetime.timedelta(seconds=max(1.0, until - time.monotonic()))
        try:
            store = connect_store(env, timeout, host=(env.rank == 0 and not env.agent_store))
        except Exception as exc:
            print(f"rank {env.rank}: leaving without the launch's store: {exc}", file=sys.stderr, flush=True)
    if env.rank == 0:
        if delay_s:
            time.sleep(delay_s)
        speak()
        if store is not None and _post(store, SPOKE) and not env.agent_store:
            wait_for_keys(store, [f"{KEY_PREFIX}rank0_heard/{r}" for r in range(1, env.world_size)], until)
    elif store is not None:
        wait_for_keys(store, [SPOKE], until)
        _post(store, f"{KEY_PREFIX}rank0_heard/{env.rank}")


def _post(store, key: str) -> bool:
    try:
        store.set(key, b"1")
        return True
    except Exception:
        return False


def wait_for_keys(store, keys: List[str], until: float) -> None:
    """Poll the store until every key is set, ``until`` passes, or the store is gone."""
    while keys and time.monotonic() < until:
        try:
            keys = [k for k in keys if not store.check([k])]
        except Exception:  # the store is gone: its host left, nobody is left to wait for
            return
        time.sleep(0.05)
