"""RLix-faithful scheduler model: pure state machine, no clock, no I/O.

Entry point: :class:`harness.scheduler.model.SchedulerModel`.
"""

from harness.scheduler.model import SchedulerModel, Ticket
from harness.scheduler.options import SchedulerOptions
from harness.scheduler.progress import CoordinatorProgress, ProgressReport
from harness.scheduler.types import Priority, Rejected

__all__ = ["SchedulerModel", "SchedulerOptions", "Ticket", "Priority", "Rejected", "ProgressReport", "CoordinatorProgress"]
