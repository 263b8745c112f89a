"""Import RLix's scheduler from a checkout (``scheduler: {implementation: rlix, source: PATH}``,
``--rlix PATH``), with the stand-in Ray, and say in one line what is missing when its
interfaces moved (version drift is reported, never papered over).

Several checkouts (the three pinned commits) load side by side in one process: each
load imports the ``rlix`` package afresh and keeps its module objects, then takes
``rlix`` out of ``sys.modules`` again so the next load (or the user's own ``rlix``) is not
shadowed.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from simulators.rlix_live.fake_ray import StandInRay, installed

#: what the driver calls, per module: the interface the model is compared against
REQUIRED = {
    "rlix.scheduler.scheduler": ("SchedulerImpl", "validate_execution_plan", "COORDINATOR_ACTOR_NAME_PREFIX"),
    "rlix.protocol.types": ("Priority", "ProgressReport"),
}
SCHEDULER_METHODS = (
    "initialize",
    "register_pipeline",
    "admit_pipeline",
    "unregister_pipeline",
    "request_gpus",
    "notify_release_gpus",
    "notify_release_then_request_gpus",
    "await_release_gpus",
    "report_progress",
    "clear_progress",
    "scheduling_cycle",
)


class RlixLoadError(Exception):
    """The checkout cannot be driven; ``str`` is the one line to print."""


@dataclass
class RlixModules:
    source: str
    version: str  # the checkout's commit when it is a git work tree, else "unknown commit"
    ray: StandInRay
    scheduler: Any  # rlix.scheduler.scheduler
    types: Any  # rlix.protocol.types
    sched_types: Any  # rlix.scheduler.types


def _commit(source: str) -> str:
    """The checkout's commit: git's, or the ``-<hash>`` of an unpacked archive's folder name."""
    import re

    named = re.search(r"-([0-9a-f]{7,40})$", os.path.basename(source.rstrip(os.sep)))
    if named:
        return named.group(1)
    try:
        out = subprocess.run(
            ["git", "-C", source, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or "unknown commit"
    except (OSError, subprocess.SubprocessError):
        return "unknown commit"


def drift(mods: Dict[str, Any]) -> List[str]:
    """The names the driver needs that this RLix lacks."""
    missing = [f"{m}.{name}" for m, names in REQUIRED.items() for name in names if not hasattr(mods[m], name)]
    impl = getattr(mods["rlix.scheduler.scheduler"], "SchedulerImpl", None)
    if impl is not None:
        missing += [f"SchedulerImpl.{m}" for m in SCHEDULER_METHODS if not hasattr(impl, m)]
    return missing


def load_rlix(source: str, version: Optional[str] = None) -> RlixModules:
    """RLix's scheduler modules from the checkout at ``source`` (the folder holding ``rlix/``)."""
    source = os.path.abspath(source)
    if not os.path.isfile(os.path.join(source, "rlix", "scheduler", "scheduler.py")):
        raise RlixLoadError(f"{source}: no rlix/scheduler/scheduler.py there (give the checkout's root)")
    ray = StandInRay()
    own = {k: v for k, v in sys.modules.items() if k == "rlix" or k.startswith("rlix.")}
    for k in own:
        del sys.modules[k]
    sys.path.insert(0, source)
    mods: Dict[str, Any] = {}
    try:
        with installed(ray), contextlib.redirect_stdout(io.StringIO()):
            for name in list(REQUIRED) + ["rlix.scheduler.types"]:
                try:
                    mods[name] = importlib.import_module(name)
                except Exception as e:  # an import error is drift too: say which and why
                    raise RlixLoadError(f"RLix at {source}: cannot import {name}: {type(e).__name__}: {e}") from None
    finally:
        sys.path.remove(source)
        for k in [k for k in sys.modules if k == "rlix" or k.startswith("rlix.")]:
            del sys.modules[k]
        sys.modules.update(own)
    missing = drift(mods)
    if missing:
        raise RlixLoadError(f"RLix at {source}: interfaces changed, missing {', '.join(missing)}")
    return RlixModules(
        source,
        version or _commit(source),
        ray,
        mods["rlix.scheduler.scheduler"],
        mods["rlix.protocol.types"],
        mods["rlix.scheduler.types"],
    )
