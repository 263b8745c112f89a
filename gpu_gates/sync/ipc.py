"""The refit gates' same-GPU transport: NeMo RL's colocated refit stream.

A receiver on the sender's own GPU cannot join the broadcast group (NCCL refuses two
ranks on one device), so the selective sync (``gpu_gates/sync/runtime.py``, the order
``harness.control.selective_sync``) hands it each staged bucket over the colocated
refit stream — the one protocol of ``harness/refit/stream.py`` over
``gpu_gates/transports/zmq_stream.py`` (pyzmq REQ/REP on a
private ``ipc://`` endpoint, two ping-pong staging buffers, at most one group un-ACKed,
COMPLETE, manifest check; CUDA IPC handles on GPU, ``/dev/shm`` buffers on CPU), exactly
as the refit gate runs it: one stream per bucket and receiver.

Endpoints are one per (sender, receiver) pair of a sync, named from the job's store port
and the sync id, so both sides derive them without a message. They live in the run's
private folder (:func:`gate_folders`); the socket file goes when the sender closes, and
the folder with whatever a killed rank left goes when the last rank leaves (or with the
launcher that owns it).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch

from gpu_gates.transports import private_dirs
from harness.refit import stream as proto
from gpu_gates.transports import staging as refit_staging, zmq_stream as zs

STREAM = "zmq_stream"
SHM_DIR_ENV = refit_staging.SHM_DIR_ENV  # staging files go here instead of /dev/shm (tests use a private folder)


def remove_own_files() -> List[str]:
    """Every exit path of a gate rank: unlink the staging files a cut-short stream left."""
    return refit_staging.remove_own_files()


def gate_folders(master_port: int) -> List[private_dirs.RunFolder]:
    """The run's socket folder and staging folder, joined by this rank. A launcher that
    owns them passes them down (``RLHARNESS_IPC_DIR``, ``RLHARNESS_SHM_DIR``) and removes
    them itself; otherwise they are derived from torchrun's pid and the rendezvous port
    (the same on every rank of the job), exported for this process, and removed by the
    last rank that leaves (:meth:`RunFolder.leave`, on every exit path of
    ``gpu_gates/runtime/gate.py``)."""
    owner = os.getppid()  # torchrun's agent: one per job, the same for every local rank
    folders = []
    for env, base in ((private_dirs.IPC_DIR_ENV, tempfile.gettempdir()), (SHM_DIR_ENV, private_dirs.shm_base())):
        given = os.environ.get(env)
        if given:
            folders.append(private_dirs.RunFolder(given, owned=False).join())
        else:
            path = os.path.join(base, private_dirs.folder_name(owner, f"gate-{master_port}"))
            folders.append(private_dirs.RunFolder(path, owned=True).join())
            os.environ[env] = path
    return folders


def ipc_dir() -> str:
    """The run's socket folder (``gate_folders`` set it; a bare call gets the temp folder)."""
    return os.environ.get(private_dirs.IPC_DIR_ENV) or tempfile.gettempdir()


def endpoint_for(ctx: Any, sync_id: str, receiver: int) -> str:
    """``ipc://`` path of one receiver's stream for one sync, in the run's socket folder
    (short: a unix socket path is limited to ~107 bytes)."""
    digest = hashlib.sha1(f"{ctx.env.master_port}/{sync_id}".encode()).hexdigest()[:12]
    return f"ipc://{ipc_dir()}/{digest}-r{receiver}.sock"


def stream_timeout(ctx: Any) -> float:
    """Socket timeout of a gate's stream: past the rank's watchdog deadline, like the
    gates' collectives, so a hung peer is reported by the watchdog with every rank's phase
    rather than as a knock-on stream error (the refit gate tests the stream's own timeout)."""
    return max(5.0, ctx.remaining_s() + 10.0)


def stream_budget(bucket_size_bytes: int) -> int:
    """Two ping-pong buffers of one bucket each: no cache tensor is ever oversized."""
    return 2 * max(proto.align_up(bucket_size_bytes), proto.ALIGNMENT_BYTES)


def stream_to(
    ctx: Any,
    sync_id: str,
    receiver: int,
    named: Sequence[Tuple[str, torch.Tensor]],
    budget: int,
    version: int,
    timeout_s: float,
) -> zs.SendResult:
    """Owner side: stream the cache to one colocated receiver; raises on a timeout or a
    broken peer (the error names the peer, the step and the group)."""
    endpoint = endpoint_for(ctx, sync_id, receiver)
    sender = zs.RefitSender(endpoint, peer=f"rank {receiver}", timeout_s=timeout_s, device=ctx.device, emit=ctx.emit)
    try:
        return sender.stream(named, budget, step=version)
    finally:
        sender.close()
        _remove(endpoint)


def receive_from(
    ctx: Any,
    sync_id: str,
    manifest: Dict[str, Tuple[Tuple[int, ...], str]],
    load: Callable[[proto.Slot, torch.Tensor], None],
    budget: int,
    version: int,
    owner: int,
    timeout_s: float,
) -> zs.ReceiveResult:
    """Receiver side: connect, load every group through ``load``, finalize only a complete
    transfer (a manifest problem raises after the COMPLETE was ACKed)."""
    receiver = zs.RefitReceiver(
        endpoint_for(ctx, sync_id, ctx.rank),
        peer=f"rank {owner}",
        timeout_s=timeout_s,
        device=ctx.device,
        emit=ctx.emit,
    )
    try:
        return receiver.receive(manifest, load, step=version, half_bytes=proto.half_buffer_bytes(budget))
    finally:
        receiver.close()


def load_into(model: Any) -> Callable[[proto.Slot, torch.Tensor], None]:
    """A loader that copies each received view into the model's tensor of that name."""
    state = model.state_dict()

    def load(slot: proto.Slot, view: torch.Tensor) -> None:
        state[slot.name].copy_(view)

    return load


def manifest_of_buckets(buckets_meta: Sequence[Dict[str, Any]]) -> Dict[str, Tuple[Tuple[int, ...], str]]:
    """``{name: (shape, dtype)}`` from the cache manifest's bucket metadata."""
    return {n: (tuple(s), d) for b in buckets_meta for n, s, d in zip(b["param_names"], b["shapes"], b["dtypes"])}


def _remove(endpoint: str) -> None:
    try:
        os.unlink(endpoint[len("ipc://") :])
    except FileNotFoundError:
        pass
