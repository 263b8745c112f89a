"""What control logic may read about its pipeline while it runs.

The runtime owns this object and updates it as it interprets effects (a built cache
moves ``versions.cache_ready``; a publish moves ``versions.published``); control logic
only reads it. Keeping it a plain dataclass keeps the generators free of runtime types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

from harness.control.engine import EngineConfig
from harness.control.residency import PhaseResidency, TrainerSwitches, residency
from harness.control.versions import VersionBook


@dataclass
class PipelineContext:
    pipeline_id: str
    kind: str  # "nemo_async" | "roll_sync"
    steps: int
    sleep_level: int = 2
    step_target: int = 8  # trajectories per step (prompt groups x generations)
    gen_estimate: Optional[int] = None  # step_target_estimate sent with GENERATION requests
    versions: VersionBook = field(default_factory=VersionBook)
    step: int = 0  # step in progress (read by the runtime for labelling)
    trainer: TrainerSwitches = field(default_factory=TrainerSwitches)
    engine: EngineConfig = field(default_factory=EngineConfig)  # pause mode, wake order (engine.py)
    # RLix's MILES release-after-offload (scheduler option release_after_offload): the
    # training GPUs are released once the offload ran, even when the sync after it fails
    release_after_offload: bool = False
    # RLix's MILES wait for the engines' memory after the training grant (rlops/rlix PR #11:
    # pipeline option wait_offloaded; harness/control/effects.py WaitEnginesOffloaded)
    wait_offloaded: bool = False
    # RLix's MILES refit pauses the serving ranks around finalize (pipeline option
    # finalize_pause): "none" (RLix nemo), "continue_after" (continue_generation after a
    # finalize that returned: before rlops/rlix PR #14), "continue_finally" (in a finally: PR #14)
    finalize_pause: str = "none"
    # RLinf #1456's order, set only by a fault's runtime (fault publish_on_ack) for the refresh
    # it is in: the sync counts as done on the receivers' acknowledgement, so the version is
    # published before their finalize applies it
    publish_on_ack: bool = False

    @property
    def residency(self) -> Dict[str, PhaseResidency]:
        """What each training phase loads, offloads and destroys (harness/control/residency.py)."""
        return residency(self.kind, self.trainer)
