"""Effects: what pipeline control logic asks a runtime to do.

Control logic (``harness.control.*``) is written as generators that ``yield`` these
objects and receive each one's result back. It never sleeps, never touches a device,
never calls the scheduler directly. A runtime interprets every effect: the simulator
with modelled durations and state (``simulators/``), a GPU gate with real process groups,
tensors and sockets (``gpu_gates/``). Both record an ``effect_start`` and an
``effect_end`` per effect in the event log, which is what the invariants read.

Every effect is a frozen dataclass; :func:`effect_fields` turns one into log fields.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Dict, Optional, Tuple

from harness.scheduler.types import Priority

Ranks = Tuple[int, ...]


# ---- scheduler calls (blocking in RLix; the runtime resumes the generator on signal)
@dataclass(frozen=True)
class RequestGpus:
    cluster: str  # cluster name (actor_train, actor_infer, ...)
    priority: Priority
    global_step: Optional[int] = None
    step_target_estimate: Optional[int] = None


@dataclass(frozen=True)
class ReleaseGpus:
    cluster: str
    global_step: Optional[int] = None


@dataclass(frozen=True)
class ReleaseThenRequest:
    release_cluster: str
    request_cluster: str
    priority: Priority
    global_step: Optional[int] = None


@dataclass(frozen=True)
class AwaitRelease:
    """Planned shrink-to-zero of this pipeline's GENERATION cluster (ROLL step start/end)."""

    global_step: Optional[int] = None


# ---- training side
@dataclass(frozen=True)
class ReloadTrainComm:
    """Re-create the Megatron NCCL groups destroyed after the previous step."""


@dataclass(frozen=True)
class Compute:
    """A training-cluster computation: 'old_log_probs', 'ref_log_probs', 'train'."""

    what: str
    global_step: int


@dataclass(frozen=True)
class BuildCache:
    """Owner builds the CPU bucket cache while parameters are still on the GPU."""

    version: int


@dataclass(frozen=True)
class PromoteCache:
    """Make a built cache version the active one that syncs read (under the coordinator
    lock, so no sync is reading while the active pointer moves)."""

    version: int


@dataclass(frozen=True)
class OffloadTraining:
    """Weights, grads and optimizer state leave the GPU."""


@dataclass(frozen=True)
class DestroyTrainComm:
    """Destroy training NCCL groups (their buffers would block a wake on the GPU)."""


# ---- coordinator lock (RLix _resize_sync_lock: resize_infer vs weight syncs)
@dataclass(frozen=True)
class LockCoordinator:
    purpose: str


@dataclass(frozen=True)
class UnlockCoordinator:
    purpose: str


# ---- inference ranks and refit
@dataclass(frozen=True)
class ActiveRanks:
    """Query: the currently routable ranks (the active-refresh targets)."""


@dataclass(frozen=True)
class MarkInactive:
    ranks: Ranks


@dataclass(frozen=True)
class Wake:
    """Wake ranks but keep them off routing (pre-activation)."""

    ranks: Ranks


@dataclass(frozen=True)
class SyncFromCache:
    """Push the cache's active version to ranks; path is 'active' or 'expand'."""

    ranks: Ranks
    version: int
    path: str


@dataclass(frozen=True)
class Finalize:
    """Receiver post-load processing, once after all buckets."""

    ranks: Ranks


@dataclass(frozen=True)
class PublishVersion:
    version: int
    path: str


@dataclass(frozen=True)
class Activate:
    """Put ranks on routing."""

    ranks: Ranks


@dataclass(frozen=True)
class Abort:
    ranks: Ranks


@dataclass(frozen=True)
class Pause:
    """Pause the ranks' engines with a mode other than abort (harness/control/engine.py):
    ``wait`` lets the requests they hold finish, ``keep`` freezes them until the resume.
    They leave routing either way."""

    ranks: Ranks
    mode: str


@dataclass(frozen=True)
class PauseGeneration:
    """Pause the serving ranks' schedulers around the refit's finalize (RLix's MILES model
    update service: ``pause_generation(mode="retract")``, rlops/rlix
    ``rlix/pipeline/miles_model_update_service.py`` at a8460a9): in-flight requests are kept
    and go on at :class:`ContinueGeneration`; the ranks stay in routing's active set."""

    ranks: Ranks


@dataclass(frozen=True)
class ContinueGeneration:
    """``continue_generation``: the paused schedulers run again."""

    ranks: Ranks


@dataclass(frozen=True)
class WaitEnginesOffloaded:
    """RLix's MILES wait after the training grant (rlops/rlix PR #11, f73bfaf,
    ``MilesPipeline._wait_for_overlap_engines_offloaded``): phase 1 polls the engines on the
    granted GPUs until they are offloaded, phase 2 polls the GPUs' used memory until the
    largest is at most the residual target; each phase gives up after its timeout, and the
    second one's expiry only warns ("wake_up may OOM") before training goes on."""


@dataclass(frozen=True)
class WakeTags:
    """Wake some memory tags of the ranks (vLLM ``wake_up(tags=[...])``): the staged wake
    brings the weights back for the refit and the KV cache only after it."""

    ranks: Ranks
    tags: Tuple[str, ...]


@dataclass(frozen=True)
class Drain:
    ranks: Ranks


@dataclass(frozen=True)
class Sleep:
    ranks: Ranks
    level: int


# ---- workload
@dataclass(frozen=True)
class WaitBatch:
    """Wait until the replay buffer can give the trainer a batch for this step."""

    global_step: int


@dataclass(frozen=True)
class BeginProgressBatch:
    """Open demand for a step (progress reports for this step start flowing)."""

    global_step: int


@dataclass(frozen=True)
class EndProgressBatch:
    global_step: int


#: Effects that run on the training cluster (its GPUs are the trainer's): the simulator
#: places them there and the outputs count them as training time.
TRAINER_EFFECTS = ("Compute", "OffloadTraining", "ReloadTrainComm", "DestroyTrainComm", "BuildCache")


def effect_name(effect: Any) -> str:
    return type(effect).__name__


_FIELD_NAMES: Dict[type, Tuple[str, ...]] = {}  # effect class -> its field names (fixed per class)


def effect_fields(effect: Any) -> Dict[str, Any]:
    """Log fields of an effect: enums by name, tuples as lists."""
    out: Dict[str, Any] = {}
    cls = type(effect)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(effect))
    for name in names:
        v = getattr(effect, name)
        value_type = type(v)
        if value_type is tuple:
            v = list(v)
        elif value_type is not int and value_type is not str and v is not None:  # common: kept as is
            if isinstance(v, Priority):
                v = v.name
            elif isinstance(v, tuple):
                v = list(v)
        out[name] = v
    return out
