"""The event log's vocabulary: one table of record kinds for scheduler inputs, decisions and
runtime events, which every runtime writes and every reader checks against.

Only the vocabulary lives in the model core; the file format (writing, reading, the JSON
Schema) is in ``harness/logs/``. See docs/trace-format.md.
"""

from harness.eventlog.kinds import SCHEMA_NAME, SCHEMA_VERSION, category

__all__ = ["SCHEMA_NAME", "SCHEMA_VERSION", "category"]
