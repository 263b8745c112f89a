"""Where the refit stream's bytes live: its staging buffers, outside the socket.

Split out of ``zmq_stream.py`` (the socket side) because the buffers have a life of their
own: the sender creates and owns them, the receiver maps them, and every exit path of a
gate or test must find and remove what is left (a stream cut short by a signal or a
watchdog never reaches its ``finally``). On CPU a buffer is a file on ``/dev/shm`` (or
``$RLHARNESS_SHM_DIR``) that both processes map; on GPU the receiver opens the sender's
device tensor from a CUDA IPC handle (torch's reducer, pickled).
"""

from __future__ import annotations

import mmap
import os
import pickle
import uuid
from typing import List, Optional

import torch

from gpu_gates.transports import private_dirs

SHM_PREFIX = private_dirs.STAGING_PREFIX
SHM_DIR_ENV = "RLHARNESS_SHM_DIR"  # where staging files go instead of /dev/shm (tests use a private folder)
_OWN_FILES: set = set()  # staging files this process created and has not unlinked yet


def shm_dir() -> str:
    chosen = os.environ.get(SHM_DIR_ENV)
    if chosen:
        return chosen
    return private_dirs.shm_base()


def staging_name() -> str:
    """``rlharness_refit_<pid>_[<tag>_]<random>``: the owner's pid (a later sweep removes
    the files of a process that is gone) and the test session's tag, if any."""
    t = private_dirs.tag()
    return f"{SHM_PREFIX}{os.getpid()}_{t + '_' if t else ''}{uuid.uuid4().hex[:12]}"


def remove_own_files() -> List[str]:
    """Unlink every staging file this process still owns (a stream cut short by a signal or
    a watchdog never reached its ``finally``); returns what was removed."""
    left = sorted(p for p in _OWN_FILES if os.path.exists(p))
    for path in list(_OWN_FILES):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        _OWN_FILES.discard(path)
    return left


def leftover_shm(owner_pid: Optional[int] = None) -> List[str]:
    """Staging files still on disk (all of this module's, or one sender process's)."""
    prefix = SHM_PREFIX + (f"{owner_pid}_" if owner_pid is not None else "")
    return sorted(os.path.join(shm_dir(), n) for n in os.listdir(shm_dir()) if n.startswith(prefix))


class ShmBuffer:
    """A CPU staging buffer: a file on ``/dev/shm`` mapped into this process."""

    def __init__(self, nbytes: int, path: Optional[str] = None, create: bool = True) -> None:
        self.nbytes = nbytes
        self.path = path or os.path.join(shm_dir(), staging_name())
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.path, flags, 0o600)
        if create:
            _OWN_FILES.add(self.path)
        try:
            if create:
                os.ftruncate(fd, max(nbytes, 1))
            self._map = mmap.mmap(fd, max(nbytes, 1))
        finally:
            os.close(fd)
        self.owner = create
        self.tensor = (
            torch.frombuffer(self._map, dtype=torch.uint8, count=nbytes)
            if nbytes
            else torch.empty(0, dtype=torch.uint8)
        )

    def close(self) -> None:
        self.tensor = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still alive somewhere: the mapping goes with it
                pass
            self._map = None
        if self.owner:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            _OWN_FILES.discard(self.path)


def cuda_handle(buf: torch.Tensor) -> bytes:
    from torch.multiprocessing.reductions import reduce_tensor

    _rebuild, args = reduce_tensor(buf.detach())
    return pickle.dumps(args)  # the rebuild function is known on the other side


def open_cuda_handle(blob: bytes) -> torch.Tensor:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    args = list(pickle.loads(blob))
    args[6] = torch.cuda.current_device()  # storage_device: the receiver's local index of the same GPU
    return rebuild_cuda_tensor(*args)
