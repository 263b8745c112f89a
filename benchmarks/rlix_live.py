"""RLix's own scheduler, timed on the workload of benchmarks/scheduler_cycles.py.

The RLix source comes from a checkout (``--rlix DIR``) or the pinned archive of
``rlops/rlix`` at f77d913 (``rlix-f77d913.tar.gz`` in ``$RLHARNESS_UPSTREAM`` or in
``shared/upstream`` beside the project), unpacked into a temporary folder for the run,
never into the project. RLix's scheduler
(``rlix/scheduler/scheduler.py`` ``SchedulerImpl``) runs without a Ray cluster here: its
ResourceManager and each pipeline's coordinator are stand-ins whose ``.remote()`` calls
return at once, so a cycle's time is RLix's planning, validation and commit (plus its
``print`` lines, sent to a buffer), with resize calls that cost nothing — the part the
harness's model reproduces. The central loop is stopped; each cycle is driven directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import sys
import tarfile
import tempfile
import time
from typing import Any, Callable, Iterator, Optional

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
ARCHIVE_NAME = "rlix-f77d913.tar.gz"


def _archive() -> Optional[str]:
    """The pinned archive: in ``$RLHARNESS_UPSTREAM``, else ``shared/upstream`` beside the
    project (or beside the folder of its worktrees)."""
    places = [os.environ.get("RLHARNESS_UPSTREAM", "")] + [
        os.path.join(ROOT, *[".."] * up, "shared", "upstream") for up in (1, 2)
    ]
    return next(
        (os.path.join(p, ARCHIVE_NAME) for p in places if p and os.path.isfile(os.path.join(p, ARCHIVE_NAME))), None
    )


@contextlib.contextmanager
def rlix_source(checkout: Optional[str]) -> Iterator[Optional[str]]:
    """The folder holding the ``rlix`` package: ``checkout``, or the pinned archive
    unpacked into a temporary folder (removed after); ``None`` when neither is there."""
    if checkout:
        yield checkout
        return
    archive = _archive()
    if archive is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="rlix-live-") as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        (top,) = [d for d in os.listdir(tmp) if os.path.isdir(os.path.join(tmp, d))]
        yield os.path.join(tmp, top)


class _Call:
    """A Ray method stand-in: ``.remote(...)`` returns a finished future of ``fn(...)``."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> "asyncio.Future[Any]":
        done = asyncio.get_running_loop().create_future()
        done.set_result(self.fn(*args, **kwargs))
        return done


class _ResourceManager:
    def __init__(self, gpus: int) -> None:
        self.get_required_gpus_per_node = _Call(lambda: 8)
        self.get_num_gpus = _Call(lambda: gpus)


class _Coordinator:
    def __init__(self) -> None:
        self.resize_infer = _Call(lambda **_kwargs: None)


def pipeline_id(i: int) -> str:
    return f"ft_{i:012x}"


class RLixBootstrap:
    """One bootstrap cycle of RLix's scheduler: ``pipelines`` registered with the windows
    of scheduler_cycles.build, each asking for GENERATION, one cycle grants them all."""

    def __init__(self, source: str) -> None:
        if source not in sys.path:
            sys.path.insert(0, source)
        from rlix.protocol.types import Priority  # noqa: E402  (RLix's own modules)
        from rlix.scheduler.scheduler import SchedulerImpl

        self.priority, self.scheduler_class = Priority, SchedulerImpl

    def time_ms(self, gpus: int, pipelines: int) -> float:
        with contextlib.redirect_stdout(io.StringIO()):
            return asyncio.run(self._bootstrap(gpus, pipelines)) * 1e3

    async def _bootstrap(self, gpus: int, pipelines: int) -> float:
        s = self.scheduler_class()
        await s.initialize(resource_manager=_ResourceManager(gpus))
        s._loop_task.cancel()  # cycles are driven here, one at a time
        with contextlib.suppress(asyncio.CancelledError):
            await s._loop_task
        stride = gpus // pipelines
        for i in range(pipelines):
            pid = pipeline_id(i)
            window = sorted({(i * stride + k) % gpus for k in range(2 * stride)})
            await s.register_pipeline(
                pipeline_id=pid,
                ray_namespace="bench",
                cluster_tp_configs={"actor_infer": 1},
                cluster_device_mappings={"actor_infer": window},
            )
            await s.admit_pipeline(pipeline_id=pid)
            s._coordinator_handle_cache[pid] = ("bench", _Coordinator())
        waiters = [
            asyncio.create_task(
                s.request_gpus(
                    cluster_id=f"{pipeline_id(i)}_actor_infer",
                    priority=self.priority.GENERATION,
                    step_target_estimate=16,
                )
            )
            for i in range(pipelines)
        ]
        for _ in range(3):
            await asyncio.sleep(0)  # every request is queued
        t0 = time.perf_counter()
        await s.scheduling_cycle()
        dt = time.perf_counter() - t0
        granted = await asyncio.wait_for(asyncio.gather(*waiters), timeout=10)
        assert len(granted) == pipelines and all(granted), "RLix's bootstrap cycle must grant every pipeline"
        return dt
