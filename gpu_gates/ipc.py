"""Same-device bucket transport: CUDA IPC on GPU, ``cpu_serialize`` over tmpfs elsewhere.

A receiver on the sender's own GPU cannot join the broadcast group (NCCL refuses two
ranks on one device), so it gets each bucket through IPC, as in RLix's comm plan:

* ``cuda_ipc``: the sender shares its staging tensor's CUDA IPC handle (torch's own
  reducer), the receiver opens it and copies out; the sender keeps the staging buffer
  alive until the receiver's ACK.
* ``cpu_serialize``: the sender ``torch.save``s the bucket (metadata + CPU bytes) to a
  file on ``/dev/shm`` (a temp folder where there is none) and the receiver loads it; the
  sender deletes the file after the ACK and checks that no file of the sync is left
  (a tmpfs leak is a host-RAM leak).

Only the small handle or file path travels through the TCP store; the bytes never touch
a gloo or NCCL group. Messages are pickled (a CUDA IPC handle is a pickled reducer): the
store belongs to this job only, so nothing outside the job can inject one.
"""

from __future__ import annotations

import glob
import io
import os
import pickle
import tempfile
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch

from harness.refit.bucket_cache import BucketRecord

CUDA_IPC = "cuda_ipc"
CPU_SERIALIZE = "cpu_serialize"
FILE_PREFIX = "rlharness_bucket_"

#: tmpfs files this process created and has not removed yet: a rank that finishes on any
#: path (passed, failed, timed out, SIGTERM) removes them (:func:`remove_own_files`)
_OWN_FILES: Set[str] = set()


SHM_DIR_ENV = "RLHARNESS_SHM_DIR"  # where staging files go instead of /dev/shm (tests use a private folder)


def shm_dir() -> str:
    chosen = os.environ.get(SHM_DIR_ENV)
    if chosen:
        return chosen
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def _file_for(sync_id: str, bucket: int, receiver: int) -> str:
    safe = sync_id.replace("/", "_")
    return os.path.join(shm_dir(), f"{FILE_PREFIX}{safe}_{bucket}_r{receiver}_{os.getpid()}.pt")


def send_bucket(transport: str, record: BucketRecord, staging: torch.Tensor, sync_id: str,
                bucket: int, receiver: int) -> Tuple[bytes, List[str]]:
    """Return ``(message for the store, files the sender must delete after the ACK)``."""
    meta = record.metadata()
    if transport == CUDA_IPC:
        from torch.multiprocessing.reductions import reduce_tensor
        rebuild, args = reduce_tensor(staging)
        return pickle.dumps({"transport": CUDA_IPC, "meta": meta, "handle": (rebuild, args)}), []
    path = _file_for(sync_id, bucket, receiver)
    tmp = path + ".tmp"
    _OWN_FILES.update((path, tmp))
    buf = io.BytesIO()
    torch.save({"meta": meta, "buffer": staging.detach().to("cpu")}, buf)
    with open(tmp, "wb") as fh:
        fh.write(buf.getvalue())
    os.replace(tmp, path)
    _OWN_FILES.discard(tmp)
    return pickle.dumps({"transport": CPU_SERIALIZE, "path": path}), [path]


def receive_bucket(message: bytes) -> BucketRecord:
    """Open what :func:`send_bucket` produced and return a record with a private CPU buffer."""
    payload: Dict[str, Any] = pickle.loads(message)
    if payload["transport"] == CUDA_IPC:
        rebuild, args = payload["handle"]
        shared = rebuild(*args)
        buffer = shared.to("cpu", copy=True)
        del shared
        return BucketRecord.from_metadata(payload["meta"], buffer)
    blob = torch.load(payload["path"], map_location="cpu", weights_only=True)
    return BucketRecord.from_metadata(blob["meta"], blob["buffer"].clone())


def leftover_files(sync_id: str) -> List[str]:
    safe = sync_id.replace("/", "_")
    return sorted(glob.glob(os.path.join(shm_dir(), f"{FILE_PREFIX}{safe}_*")))


def remove_files(paths: List[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        _OWN_FILES.discard(path)


def remove_own_files() -> List[str]:
    """Remove every tmpfs file this process created and still owns (a sync cut short by a
    failure, a timeout or a signal never reached its ACKs). Returns what was removed."""
    left = sorted(p for p in _OWN_FILES if os.path.exists(p))
    remove_files(sorted(_OWN_FILES))
    return left


def send_bucket_to_targets(ctx: Any, transport: str, record: BucketRecord, staging: torch.Tensor, *,
                           key_prefix: str, sync_id: str, bucket: int, version: int, ipc_ranks: List[int],
                           broadcast_ranks: List[int], broadcast: Optional[Callable[[torch.Tensor], None]]) -> None:
    """One bucket of a selective sync, owner side: hand it to the IPC receivers through the
    store, broadcast it to the group, wait for every target's ACK, drop the tmpfs files,
    record the send. Both refit gates speak exactly this protocol."""
    files: List[str] = []
    for r in ipc_ranks:
        message, made = send_bucket(transport, record, staging, sync_id, bucket, r)
        files += made
        ctx.put(f"{key_prefix}/b{bucket}/r{r}", message)
    if broadcast is not None:
        broadcast(staging)
    for r in sorted(ipc_ranks + broadcast_ranks):
        ctx.wait_get(f"{key_prefix}/ack{bucket}/r{r}", f"ACK of bucket {bucket} from rank {r}")
    remove_files(files)
    for path, ranks in (("ipc", ipc_ranks), ("broadcast", broadcast_ranks)):
        if ranks:
            ctx.emit("bucket_send", version=version, bucket=bucket, bytes=record.used_bytes, path=path, targets=ranks)
