"""Progress reporting to the scheduler, and the request records, built once for every runtime.

A pipeline reports how much of its step's batch it has collected; its coordinator
(``harness.scheduler.progress.CoordinatorProgress``) forwards a report only when the 2 %
bucket moves or a new batch forces it, and clears the stream when the batch is done (or
the pipeline finishes). These functions turn that into the scheduler input to send —
record fields plus the call — so the simulator and the gates send the same inputs.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from harness.control.effects import RequestGpus
from harness.scheduler.model import SchedulerModel
from harness.scheduler.progress import CoordinatorProgress, ProgressReport

MODE, ADAPTER = "train", None  # full fine-tuning: one stream per pipeline


def progress_input(
    progress: CoordinatorProgress, pipeline_id: str, step_target: int, collected: float, new_batch: bool
) -> Optional[Tuple[Dict[str, Any], ProgressReport]]:
    """(``progress`` record fields, the report for ``SchedulerModel.report_progress``), or
    None when the coordinator throttles this update."""
    rep = progress.update(mode=MODE, adapter=ADAPTER, step_target=step_target, collected=collected, new_batch=new_batch)
    if not isinstance(rep, ProgressReport):
        return None
    return (
        {
            "pipeline_id": pipeline_id,
            "step_target": rep.step_target,
            "completed": rep.completed,
            "mode": rep.mode,
            "new_batch": new_batch,
        },
        rep,
    )


def clear_progress_due(progress: CoordinatorProgress) -> bool:
    """Drop the stream; True when none is left and the scheduler must be told
    (``clear_progress``)."""
    return progress.clear_stream(mode=MODE, adapter=ADAPTER) == "clear"


def request_input(model: SchedulerModel, cluster_id: str, e: RequestGpus) -> Tuple[Dict[str, Any], Callable[[], Any]]:
    """A :class:`RequestGpus` as a scheduler input: (the ``request`` record's fields,
    absent ones omitted; the call that applies it to ``model``, returning the ticket)."""
    fields: Dict[str, Any] = {"cluster_id": cluster_id, "priority": e.priority.name}
    if e.global_step is not None:
        fields["global_step"] = e.global_step
    if e.step_target_estimate is not None:
        fields["step_target_estimate"] = e.step_target_estimate
    return fields, lambda: model.request(
        cluster_id, e.priority, global_step=e.global_step, step_target_estimate=e.step_target_estimate
    )
