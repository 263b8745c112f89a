"""Launch environment, backend choice, device assignment and process-group init.

A gate runs under torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/... in the
environment) or as a plain single process. ``--backend auto`` picks NCCL only when CUDA
has a device for every local rank (NCCL cannot put two ranks on one GPU); otherwise gloo
on CPU, so CI runs the same gate code. Asking for NCCL on a node that cannot host the
world is not an error in the gate: it is a *skip* with a reason.

The TCP store is created explicitly (public API) rather than through ``env://`` so the
gates can keep using it after init: results, ACKs and IPC handles travel through it
without collectives, which still works when some rank is broken.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class LaunchEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    agent_store: bool  # torchrun hosts the store in its agent; every rank is a client

    @classmethod
    def from_environ(cls) -> "LaunchEnv":
        env = os.environ
        world = int(env.get("WORLD_SIZE", "1"))
        port = env.get("MASTER_PORT")
        return cls(
            rank=int(env.get("RANK", "0")),
            world_size=world,
            local_rank=int(env.get("LOCAL_RANK", "0")),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(port) if port else free_port(),
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
        )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def select_backend(requested: str, env: LaunchEnv) -> Tuple[Optional[str], Optional[str]]:
    """Return ``(backend, None)`` or ``(None, skip_reason)``."""
    cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl_built = dist.is_available() and dist.is_nccl_available()
    nccl_ok = nccl_built and cuda_devices >= env.local_world_size
    if requested == "auto":
        return ("nccl" if nccl_ok else "gloo"), None
    if requested == "nccl" and not nccl_ok:
        if not nccl_built:
            return None, "nccl requested but this torch build has no NCCL (CPU build?)"
        return None, (
            f"nccl requested but CUDA shows {cuda_devices} device(s) for "
            f"{env.local_world_size} local rank(s); NCCL needs one GPU per rank"
        )
    if requested == "gloo" and not dist.is_gloo_available():
        return None, "gloo requested but this torch build has no gloo"
    return requested, None


def device_for(backend: str, env: LaunchEnv, requested: str = "auto") -> torch.device:
    """Where a rank keeps its tensors.

    ``auto``: ``cuda:LOCAL_RANK`` under NCCL, the CPU under gloo (CI). ``cuda`` under gloo
    puts the ranks on the node's GPUs round robin, several ranks sharing one: that is the
    colocated layout itself (a trainer and its engines on one GPU), and the only way to run
    a gate's CUDA paths -- same-GPU IPC staging, VRAM ledgers -- on a one-GPU node, since
    NCCL refuses two ranks on one device. Gloo moves CUDA tensors through host memory for
    its collectives, so cross-GPU timings there say nothing about NVLink.
    """
    if backend == "nccl":
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
        return device
    if requested == "cuda":
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def device_skip_reason(backend: str, requested: str) -> Optional[str]:
    """Why ``--device`` cannot be honoured with this backend on this node (a skip), or None."""
    if requested == "cuda" and not torch.cuda.is_available():
        return "--device cuda requested but CUDA shows no device"
    if requested == "cpu" and backend == "nccl":
        return "--device cpu requested with the nccl backend, which keeps tensors on GPUs"
    return None


def connect_store(env: LaunchEnv, timeout: datetime.timedelta, host: bool) -> dist.Store:
    """A TCP store client (or the server on rank 0 when torchrun is not hosting one)."""
    return dist.TCPStore(
        env.master_addr,
        env.master_port,
        env.world_size if host else None,
        is_master=host,
        timeout=timeout,
        wait_for_workers=False,
    )


def init_world(backend: str, env: LaunchEnv, device: torch.device, timeout: datetime.timedelta) -> dist.Store:
    """Init the default group on a fresh store; returns the store for gate control traffic."""
    store = connect_store(env, timeout, host=(env.rank == 0 and not env.agent_store))
    kwargs = dict(
        backend=backend,
        store=dist.PrefixStore("rlharness_pg", store),
        rank=env.rank,
        world_size=env.world_size,
        timeout=timeout,
    )
    if backend == "nccl":  # gloo with device_id would split groups with NCCL-only calls
        try:
            dist.init_process_group(device_id=device, **kwargs)  # eager NCCL init, torch >= 2.3
            return store
        except TypeError:
            pass
    dist.init_process_group(**kwargs)
    return store
