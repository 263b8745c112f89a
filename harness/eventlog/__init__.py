"""The event log: one JSONL schema for scheduler inputs, decisions and runtime events.

Writers stamp ``seq`` and ``t``; readers check every record against ``kinds``.
See docs/trace-format.md for the format and eventlog.schema.json for the JSON Schema.
"""

from harness.eventlog.kinds import SCHEMA_NAME, SCHEMA_VERSION, category
from harness.eventlog.records import InputError, Record, read_records
from harness.eventlog.writer import EventLog, EventLogWriter, dumps, header_record, write_atomic

__all__ = ["SCHEMA_NAME", "SCHEMA_VERSION", "category", "InputError", "Record", "read_records",
           "EventLog", "EventLogWriter", "dumps", "header_record", "write_atomic"]
