"""RLix-faithful scheduler model: pure state machine, no clock, no I/O.

Entry point: :class:`harness.scheduler.model.SchedulerModel`. The names below are
loaded lazily so that low-level modules (``types``) import without pulling in the model
(``harness.scheduler.topology`` needs ``types``; the model needs ``harness.scheduler.topology``).
"""

from importlib import import_module

_EXPORTS = {
    "SchedulerModel": "harness.scheduler.model",
    "Ticket": "harness.scheduler.model",
    "SchedulerOptions": "harness.scheduler.options",
    "CoordinatorProgress": "harness.scheduler.progress",
    "ProgressReport": "harness.scheduler.progress",
    "Priority": "harness.scheduler.types",
    "Rejected": "harness.scheduler.types",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'harness.scheduler' has no attribute {name!r}")
    return getattr(import_module(module), name)
