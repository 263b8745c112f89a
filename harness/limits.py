"""Size limits on every input rlharness reads: one table, quoted in every message.

A limit exists so that a typo or a hostile file (``nodes: 100000000``, a 5 000-digit
number, a name nested 20 000 deep, ``/dev/zero``) ends in one error line before any
work starts, instead of a traceback, a stack overflow or memory that grows until the
machine swaps. Each figure is far above what a real run needs (the bundled 1024-GPU
scenario simulates 32 pipelines x 100 steps) and far below what exhausts a laptop.
``docs/scenario-reference.md`` lists them with the scenario fields they bound.
"""

from __future__ import annotations

MiB = 1 << 20

#: GPUs in one cluster (nodes x gpus_per_node), in a scenario and in a log header.
MAX_GPUS = 16384
#: pipelines in one scenario.
MAX_PIPELINES = 256
#: training steps of one pipeline.
MAX_STEPS = 100_000
#: trajectories one pipeline generates per step (prompts_per_step x generations_per_prompt).
MAX_TRAJECTORIES_PER_STEP = 65_536
#: trajectories of a whole run (sum over pipelines of steps x trajectories per step):
#: about five records each, so this bounds the event log held in memory (~5 M records).
MAX_TRAJECTORIES_PER_RUN = 1_000_000
#: decode tokens of one trajectory (decode_tokens_max).
MAX_DECODE_TOKENS = 1_000_000
#: concurrent requests of one inference rank (max_concurrent_per_rank).
MAX_CONCURRENT_PER_RANK = 65_536
#: simulated seconds (horizon_s): 30 days. A stalled run polls its scheduler every
#: simulated second until the horizon, so the horizon bounds the work of a run that
#: never finishes.
MAX_HORIZON_S = 30 * 24 * 3600.0
#: any integer in a scenario or a record: a signed 64-bit value.
MAX_INT_DIGITS = 19
MAX_INT = (1 << 63) - 1
#: nesting of mappings/lists in a scenario file and of objects/arrays in one record.
MAX_NESTING = 32
#: size of a scenario file.
MAX_SCENARIO_BYTES = 8 * MiB
#: length of one event-log line (the longest bundled line is a few KiB).
MAX_LINE_BYTES = 16 * MiB


def fmt_limit(n: float) -> str:
    """``16384`` -> ``16,384``; ``2592000.0`` -> ``2,592,000``."""
    return f"{int(n):,}" if float(n).is_integer() else f"{n:g}"
