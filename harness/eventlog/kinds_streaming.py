"""Record kinds of the streaming single controller (docs/trace-format.md, "Streaming records").

Written by every runtime that interprets ``harness.control.train_pump`` (the simulator's
``single_controller`` pipelines, the real CPU runtime in ``gpu_gates/streaming/runtime.py``).
``trainer_step`` is written by the *trainer* for what it did (not by the driver for what
it asked), which is what ``staleness_window`` and ``streaming_step`` read next to the pumps' effect records.
A gate's records also carry the ``rank`` that wrote them.
"""

STREAMING_KINDS: dict = {
    "streaming_setup": {
        "required": {
            "pipeline_id": "str",
            "sampler": "str",
            "groups_per_step": "int",
            "max_buffered_rollouts": "int",
            "min_groups_for_streaming_train": "int",
        },
        "optional": {"max_age": "int?", "window": "int", "max_inflight_prompts": "int", "rank": "int"},
        "doc": "A single controller's configuration (max_age: the sampler's staleness bound in versions, null when it has none, e.g. ready_first).",
    },
    "trainer_step": {
        "required": {"pipeline_id": "str", "action": "str", "step": "int?", "version": "int"},
        "optional": {"groups": "int_list", "applied": "bool", "microbatches": "int", "aborted": "bool", "rank": "int"},
        "doc": "The trainer ran a split-API call (action begin|microbatch|finish|abort); version = trainer version after it.",
    },
    "buffer_checkpoint": {
        "required": {"pipeline_id": "str", "step": "int", "groups": "int_list", "reserve": "int"},
        "optional": {"lost_inflight": "int_list", "rank": "int"},
        "doc": "The rollout buffer was checkpointed after `step` steps: the finished groups saved, the spare prompts pooled; lost_inflight: reservations still generating, not saved.",
    },
    "buffer_restore": {
        "required": {"pipeline_id": "str", "step": "int", "groups": "int_list", "reserve": "int"},
        "optional": {"rank": "int"},
        "doc": "A run resumed from a buffer checkpoint at trainer version `step` with these groups and spare prompts; its steps are topped up to a full batch.",
    },
    "stall": {
        "required": {"pipeline_id": "str", "idle_s": "number", "action": "str"},
        "optional": {},
        "doc": "The stall watchdog saw no progress for idle_s (action warn|abort).",
    },
}
